"""EoMT in mmdet: panoptic and instance segmentation as mmdet's ``Mask2Former`` detector whose
backbone is the :class:`~mmvit_ext.models.EoMT` network and whose panoptic head holds only the
loss (:class:`EoMTPanopticHead`); mmdet's ``MaskFormerFusionHead`` makes the panoptic / instance
results. Import it from a config (``custom_imports = dict(imports=['mmvit_ext',
'mmvit_ext.models.eomt_det'])``); mmdet is needed here only.

The official instance inference (``training/mask_classification_instance.py``: the top 100 of
the query x class scores, binary masks at logit 0, score x mean mask probability inside the
mask) is mmdet's ``instance_postprocess`` with ``max_per_image=100``; the official panoptic one
(``to_per_pixel_preds_panoptic``: queries kept above score 0.8, pixels to the best
score x probability, segments dropped below 0.8 of their own area, stuff merged per class) is
mmdet's ``panoptic_postprocess`` with ``object_mask_thr=0.8, iou_thr=0.8,
filter_low_score=True``.
"""
from typing import Optional

from mmdet.models.dense_heads import Mask2FormerHead
from mmengine.model import BaseModule

from ..registry import MODELS
from .eomt_loss import EoMTLossMixin


@MODELS.register_module()
class EoMTPanopticHead(EoMTLossMixin, Mask2FormerHead):
    """The loss of EoMT for mmdet's ``MaskFormer`` / ``Mask2Former`` detector over the
    network's stacked predictions (mmdet's ``Mask2FormerHead`` without its decoders; its
    ``predict`` upsamples the last prediction to the padded input).

    Args:
        num_things_classes / num_stuff_classes: as mmdet's head (instance: stuff 0).
        num_queries: the network's queries.
        no_object_weight, loss_cls / loss_mask / loss_dice, train_cfg: as
            :class:`~mmvit_ext.models.eomt_seg.EoMTSemanticHead`.
    """

    def __init__(self, num_things_classes: int = 80, num_stuff_classes: int = 53,
                 num_queries: int = 200, no_object_weight: float = 0.1,
                 loss_cls: Optional[dict] = None, loss_mask: Optional[dict] = None,
                 loss_dice: Optional[dict] = None, train_cfg: Optional[dict] = None,
                 test_cfg: Optional[dict] = None, init_cfg: Optional[dict] = None) -> None:
        BaseModule.__init__(self, init_cfg=init_cfg)  # no decoders to build
        self.num_things_classes, self.num_stuff_classes = num_things_classes, num_stuff_classes
        self.num_classes = num_things_classes + num_stuff_classes
        self.num_queries = num_queries
        self.init_loss(self.num_classes, no_object_weight, loss_cls, loss_mask, loss_dice,
                       train_cfg)
        self.test_cfg = test_cfg
