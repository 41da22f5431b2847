"""Backbones, one file per family; each registers into the ``mmvit_ext`` scope.

Every module of this package is imported here, so a new family is one new file: its class
registers itself, and :data:`FAMILIES` (the ``FAMILY:ARCH`` names of the tools) is read from
the registry.
"""
import importlib
import pkgutil
from typing import Dict

from ..registry import MODELS
from .base import BaseBackbone
from .cait import CaiT
from .deepvit import DeepViT
from .plain_vit import PlainViTBase
from .pvt_v2 import PyramidVisionTransformerV2
from .refined_vit import RefinedViT
from .swin import SwinTransformer

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f'{__name__}.{_module.name}')


def registered_families() -> Dict[str, str]:
    """family name -> registered class name, for every backbone family in our scope."""
    return {cls.family: name for name, cls in sorted(MODELS.module_dict.items())
            if isinstance(cls, type) and issubclass(cls, BaseBackbone) and cls.family}


# family name (as in ``FAMILY:ARCH`` presets of the tools) -> registered class name
FAMILIES = registered_families()


def preset_config(spec: str, **settings) -> dict:
    """``'deepvit:s'`` -> ``dict(type='mmvit_ext.DeepViT', arch='s', **settings)``."""
    family, _, arch = spec.partition(':')
    families = registered_families()
    if family not in families or not arch:
        raise ValueError(f'backbone must be FAMILY:ARCH with FAMILY in {sorted(families)}, '
                         f'got {spec!r}')
    return dict(type=f'mmvit_ext.{families[family]}', arch=arch, **settings)


__all__ = ['BaseBackbone', 'PlainViTBase', 'SwinTransformer', 'PyramidVisionTransformerV2',
           'DeepViT', 'CaiT', 'RefinedViT', 'FAMILIES', 'registered_families', 'preset_config']
