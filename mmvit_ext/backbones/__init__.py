"""Backbones, one file per family; each registers into the ``mmvit_ext`` scope.

Every module of this package is imported here, so a new family is one new file: its class
registers itself, becomes importable from this package, and :func:`family_classes` (the
``FAMILY:ARCH`` names of the tools) reads it from the registry.
"""
import importlib
import pkgutil
from typing import Dict, Type

from ..registry import MODELS
from .base import BaseBackbone, ExportLimits

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f'{__name__}.{_module.name}')


def family_classes() -> Dict[str, Type[BaseBackbone]]:
    """family name -> registered class, for every backbone family in our scope."""
    return {cls.family: cls for _, cls in sorted(MODELS.module_dict.items())
            if isinstance(cls, type) and issubclass(cls, BaseBackbone) and cls.family}


def registered_families() -> Dict[str, str]:
    """family name -> registered class name."""
    return {family: cls.__name__ for family, cls in family_classes().items()}


def family_class(family: str) -> Type[BaseBackbone]:
    """The registered class of ``family``; a clear error naming the known ones."""
    classes = family_classes()
    if family not in classes:
        raise ValueError(f'unknown backbone family {family!r}; registered: {sorted(classes)}')
    return classes[family]


# every registered backbone class, importable from here (``from mmvit_ext.backbones import X``)
globals().update({cls.__name__: cls for cls in family_classes().values()})


def preset_config(spec: str, **settings) -> dict:
    """``'deepvit:s'`` -> ``dict(type='mmvit_ext.DeepViT', arch='s', **settings)``."""
    family, _, arch = spec.partition(':')
    families = registered_families()
    if family not in families or not arch:
        raise ValueError(f'backbone must be FAMILY:ARCH with FAMILY in {sorted(families)}, '
                         f'got {spec!r}')
    return dict(type=f'mmvit_ext.{families[family]}', arch=arch, **settings)


__all__ = ['BaseBackbone', 'ExportLimits', 'family_classes', 'family_class',
           'registered_families', 'preset_config', *(cls.__name__
                                                      for cls in family_classes().values())]
