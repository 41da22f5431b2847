"""The loss parts EoMT's heads share: mmdet's Mask2Former loss with the official weights
(tue-mps/eomt ``training/mask_classification_loss.py``), and the network's stacked predictions
as the per-prediction lists mmdet's ``loss_by_feat`` takes. mmdet is needed here."""
from typing import List, Optional, Tuple

from mmdet.registry import MODELS as MMDET_MODELS
from mmdet.registry import TASK_UTILS
from torch import Tensor

from ..errors import ConfigError

PredictionStack = Tuple[Tensor, Tensor]


def _default_loss_cls(num_classes: int, no_object_weight: float) -> dict:
    return dict(type='mmdet.CrossEntropyLoss', use_sigmoid=False, loss_weight=2.0,
                reduction='mean', class_weight=[1.0] * num_classes + [no_object_weight])


DEFAULT_LOSS_MASK = dict(type='mmdet.CrossEntropyLoss', use_sigmoid=True, reduction='mean',
                         loss_weight=5.0)
DEFAULT_LOSS_DICE = dict(type='mmdet.DiceLoss', use_sigmoid=True, activate=True,
                         reduction='mean', naive_dice=True, eps=1.0, loss_weight=5.0)
DEFAULT_TRAIN_CFG = dict(
    num_points=12544, oversample_ratio=3.0, importance_sample_ratio=0.75,
    assigner=dict(type='mmdet.HungarianAssigner', match_costs=[
        dict(type='mmdet.ClassificationCost', weight=2.0),
        dict(type='mmdet.CrossEntropyLossCost', weight=5.0, use_sigmoid=True),
        dict(type='mmdet.DiceCost', weight=5.0, pred_act=True, eps=1.0)]),
    sampler=dict(type='mmdet.MaskPseudoSampler'))


class EoMTLossMixin:
    """For an mmdet ``Mask2FormerHead`` (or mmseg's) built without its decoders: the loss parts
    its ``loss_by_feat`` reads, and the network's stacked predictions as its lists."""

    def init_loss(self, num_classes: int, no_object_weight: float, loss_cls: Optional[dict],
                  loss_mask: Optional[dict], loss_dice: Optional[dict],
                  train_cfg: Optional[dict]) -> None:
        """Assigner, sampler, point counts and the three losses (official defaults)."""
        name = type(self).__name__
        train_cfg = dict(DEFAULT_TRAIN_CFG, **(train_cfg or {}))
        self.train_cfg = train_cfg
        self.assigner = TASK_UTILS.build(train_cfg['assigner'])
        self.sampler = TASK_UTILS.build(train_cfg['sampler'], default_args=dict(context=self))
        self.num_points = train_cfg['num_points']
        self.oversample_ratio = train_cfg['oversample_ratio']
        self.importance_sample_ratio = train_cfg['importance_sample_ratio']
        loss_cls = loss_cls or _default_loss_cls(num_classes, no_object_weight)
        if len(loss_cls.get('class_weight') or []) != num_classes + 1:
            raise ConfigError(f'{name}: loss_cls.class_weight needs num_classes + 1 = '
                              f'{num_classes + 1} entries (the last: no-object)')
        self.class_weight = loss_cls['class_weight']
        self.loss_cls = MMDET_MODELS.build(loss_cls)
        self.loss_mask = MMDET_MODELS.build(loss_mask or DEFAULT_LOSS_MASK)
        self.loss_dice = MMDET_MODELS.build(loss_dice or DEFAULT_LOSS_DICE)

    def init_weights(self) -> None:
        """Nothing to initialise: the head has no parameters."""

    def forward(self, x: PredictionStack, batch_data_samples=None
                ) -> Tuple[List[Tensor], List[Tensor]]:
        """The network's (mask logits (P, B, Q, h, w), class logits (P, B, Q, K + 1)) -> the
        per-prediction lists of class and mask logits mmdet's loss takes."""
        mask_logits, class_logits = x
        return list(class_logits.unbind(0)), list(mask_logits.unbind(0))
