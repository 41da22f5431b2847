"""Backbones, one file per family; each registers into the ``mmvit_ext`` scope."""
from .base import BaseBackbone
from .cait import CaiT
from .deepvit import DeepViT
from .plain_vit import PlainViTBase
from .pvt_v2 import PyramidVisionTransformerV2
from .refined_vit import RefinedViT
from .swin import SwinTransformer

__all__ = ['BaseBackbone', 'PlainViTBase', 'SwinTransformer', 'PyramidVisionTransformerV2',
           'DeepViT', 'CaiT', 'RefinedViT']
