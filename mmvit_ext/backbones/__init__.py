"""Backbones, one file per family; each registers into the ``mmvit_ext`` scope."""
from .base import BaseBackbone
from .pvt_v2 import PyramidVisionTransformerV2
from .swin import SwinTransformer

__all__ = ['BaseBackbone', 'SwinTransformer', 'PyramidVisionTransformerV2']
