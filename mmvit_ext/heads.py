"""mmseg decode heads in the ``mmvit_ext`` scope. mmseg is needed here only: a config that uses a
head imports this module (``custom_imports = dict(imports=['mmvit_ext', 'mmvit_ext.heads'])``),
the backbones never do."""
from typing import List, Sequence, Union

import torch
from mmcv.cnn import build_norm_layer
from mmseg.models.decode_heads.decode_head import BaseDecodeHead

from .registry import MODELS


@MODELS.register_module()
class BNLinearHead(BaseDecodeHead):
    """The linear probe of DINOv2 / DINOv3 dense evaluation (``dinov3/eval/segmentation/
    models/heads/linear_head.py``): the selected maps resized to the first one's size and
    concatenated (``input_transform='resize_concat'``), then dropout, BatchNorm and one 1x1
    conv, in that order; no hidden layer.

    Args:
        in_channels: channels of each selected map; ``channels`` is their sum (it may be left
            out, a different value is refused).
        norm_cfg: the BatchNorm (the official head: ``SyncBatchNorm``).
    """

    def __init__(self, in_channels: Union[int, Sequence[int]], channels: int = 0,
                 norm_cfg: dict = dict(type='SyncBN', requires_grad=True), **kwargs) -> None:
        total = sum(in_channels) if isinstance(in_channels, (list, tuple)) else int(in_channels)
        if channels not in (0, total):
            raise ValueError(f'BNLinearHead: channels must be the summed in_channels ({total}) '
                             f'or left out, got {channels}')
        super().__init__(in_channels, total, norm_cfg=norm_cfg, **kwargs)
        self.bn = build_norm_layer(norm_cfg, total)[1]

    def forward(self, inputs: List[torch.Tensor]) -> torch.Tensor:
        """(B, sum C_i, H, W) logits at the first selected map's size."""
        feats = self._transform_inputs(inputs)
        if self.dropout is not None:
            feats = self.dropout(feats)
        return self.conv_seg(self.bn(feats))


__all__ = ['BNLinearHead']
