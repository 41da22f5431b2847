"""EoMT in mmseg: semantic segmentation as an ``EncoderDecoder`` whose backbone is the
:class:`~mmvit_ext.models.EoMT` network and whose decode head holds only the loss and the
semantic inference. Import it from a config (``custom_imports = dict(imports=['mmvit_ext',
'mmvit_ext.models.eomt_seg'])``); mmseg and mmdet are needed here only.

- Loss: mmdet's Mask2Former loss (Hungarian matching on 12544 sampled points, class CE with
  the no-object weight 0.1, mask BCE and dice on importance-sampled points; weights 2 / 5 / 5),
  which is the loss of the official code (transformers' ``Mask2FormerLoss``), on every
  per-block prediction (deep supervision: ``d{i}.`` prefixes, the last unprefixed).
- Inference: the official semantic one: per-pixel scores ``sigmoid(masks) . softmax(classes)``
  without the no-object class; ``test_cfg=dict(mode='window', crop_size=(512, 512))`` (default
  crop: ``data_preprocessor.size``, the training crop, as the official ``img_size``) cuts the
  image (resized so its short side is the crop side) into the official evenly overlapping
  crops along the long side and averages the scores; ``'whole'`` / ``'slide'`` are mmseg's.
"""
from typing import List, Optional

import torch.nn.functional as F
from mmengine.model import BaseModule
from mmseg.models.decode_heads import Mask2FormerHead
from mmseg.models.segmentors import EncoderDecoder
from torch import Tensor

from ..errors import ConfigError
from ..registry import MODELS
from .eomt import semantic_scores
from .eomt_loss import EoMTLossMixin, PredictionStack


@MODELS.register_module()
class EoMTSemanticHead(EoMTLossMixin, Mask2FormerHead):
    """The loss and semantic inference of EoMT over the network's stacked predictions (mmseg's
    ``Mask2FormerHead`` without its pixel decoder and transformer decoder: EoMT's trunk is
    both).

    Args:
        num_classes: classes (the network predicts one more, no-object).
        num_queries: the network's queries.
        no_object_weight: class-CE weight of the no-object class (official 0.1).
        loss_cls / loss_mask / loss_dice: mmdet loss configs (default: the official weights).
        train_cfg: points, assigner and sampler (default: the official ones).
        ignore_index: label ignored in the semantic maps.
    """

    def __init__(self, num_classes: int, num_queries: int = 100, no_object_weight: float = 0.1,
                 loss_cls: Optional[dict] = None, loss_mask: Optional[dict] = None,
                 loss_dice: Optional[dict] = None, train_cfg: Optional[dict] = None,
                 ignore_index: int = 255, align_corners: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        BaseModule.__init__(self, init_cfg=init_cfg)  # no decoders to build
        self.num_classes = self.out_channels = num_classes
        self.num_queries = num_queries
        self.ignore_index, self.align_corners = ignore_index, align_corners
        self.init_loss(num_classes, no_object_weight, loss_cls, loss_mask, loss_dice, train_cfg)
        self.test_cfg = None

    def predict(self, x: PredictionStack, batch_img_metas: List[dict], test_cfg: dict) -> Tensor:
        """(B, K, H, W) per-pixel scores of the last prediction at the input size."""
        mask_logits, class_logits = x[0][-1], x[1][-1]
        meta = batch_img_metas[0]
        size = meta.get('pad_shape', meta['img_shape'])[:2]
        mask_logits = F.interpolate(mask_logits, size=size, mode='bilinear', align_corners=False)
        return semantic_scores(mask_logits, class_logits)


def window_origins(length: int, crop: int) -> List[int]:
    """Starts of the official crops along a side of ``length`` (>= crop): ``ceil(length /
    crop)`` crops, the overlap spread evenly."""
    num = -(-length // crop)
    overlap = num * crop - length
    step = crop - (overlap / (num - 1) if overlap > 0 else 0)
    return [int(j * step) for j in range(num)]


@MODELS.register_module()
class EoMTSegmentor(EncoderDecoder):
    """mmseg ``EncoderDecoder`` for EoMT: ``backbone`` is the network
    (``type='mmvit_ext.EoMT'``), ``decode_head`` an :class:`EoMTSemanticHead`; ``test_cfg``
    mode ``'window'`` is the official sliding crops (module docstring)."""

    def __init__(self, backbone: dict, decode_head: dict, **kwargs) -> None:
        if kwargs.get('neck') or kwargs.get('auxiliary_head'):
            raise ConfigError('EoMTSegmentor: EoMT has no neck or auxiliary head')
        super().__init__(backbone=backbone, decode_head=decode_head, **kwargs)

    def inference(self, inputs: Tensor, batch_img_metas: List[dict]) -> Tensor:
        if self.test_cfg.get('mode') != 'window':
            return super().inference(inputs, batch_img_metas)
        return self.window_inference(inputs, batch_img_metas)

    def window_inference(self, inputs: Tensor, batch_img_metas: List[dict]) -> Tensor:
        """Scores (B, K, H, W) at the input size from the official crops of side
        ``test_cfg.crop_size``: the input resized so its short side is the crop side, cut along
        its long side, scores averaged where crops overlap, resized back."""
        crop = self.test_cfg.get('crop_size') or getattr(self.data_preprocessor, 'size', None)
        if not crop:
            raise ConfigError("EoMTSegmentor: test_cfg mode 'window' needs crop_size (or "
                              "data_preprocessor.size, the training crop)")
        crop = min(crop)
        height, width = inputs.shape[-2:]
        factor = max(crop / height, crop / width)
        size = (round(height * factor), round(width * factor))
        resized = F.interpolate(inputs, size=size, mode='bilinear', align_corners=False)
        tall = size[0] > size[1]
        sums = inputs.new_zeros(inputs.shape[0], self.out_channels, *size)
        counts = inputs.new_zeros(1, 1, *size)
        for start in window_origins(max(size), crop):
            window = (slice(None), slice(None), slice(start, start + crop)) if tall else \
                (slice(None), slice(None), slice(None), slice(start, start + crop))
            part = resized[window]
            metas = [dict(meta, img_shape=tuple(part.shape[-2:]), pad_shape=tuple(part.shape[-2:]))
                     for meta in batch_img_metas]
            sums[window] += self.encode_decode(part, metas)
            counts[window] += 1
        scores = sums / counts
        return F.interpolate(scores, size=(height, width), mode='bilinear', align_corners=False)
