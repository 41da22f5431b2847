"""Backbones, one file per family; each registers into the ``mmvit_ext`` scope."""
from .base import BaseBackbone
from .cait import CaiT
from .deepvit import DeepViT
from .plain_vit import PlainViTBase
from .pvt_v2 import PyramidVisionTransformerV2
from .refined_vit import RefinedViT
from .swin import SwinTransformer

# family name (as in ``FAMILY:ARCH`` presets of the tools) -> registered class name
FAMILIES = {cls.family: cls.__name__ for cls in (SwinTransformer, PyramidVisionTransformerV2,
                                                 DeepViT, CaiT, RefinedViT)}


def preset_config(spec: str, **settings) -> dict:
    """``'deepvit:s'`` -> ``dict(type='mmvit_ext.DeepViT', arch='s', **settings)``."""
    family, _, arch = spec.partition(':')
    if family not in FAMILIES or not arch:
        raise ValueError(f'backbone must be FAMILY:ARCH with FAMILY in {sorted(FAMILIES)}, '
                         f'got {spec!r}')
    return dict(type=f'mmvit_ext.{FAMILIES[family]}', arch=arch, **settings)


__all__ = ['BaseBackbone', 'PlainViTBase', 'SwinTransformer', 'PyramidVisionTransformerV2',
           'DeepViT', 'CaiT', 'RefinedViT', 'FAMILIES', 'preset_config']
