"""Checkpoint layouts (official, timm, Hugging Face, OpenMMLab, ours) -> ours: pure, idempotent
converters, auto-detected on every load path.

Every module of this package is imported here and registers its layouts
(:func:`register_layout`), so a new family's converters are one new file.
"""
import importlib
import pkgutil

from .io import (CheckpointError, hub_cache_path, is_url, read_checkpoint, resolve_checkpoint,
                 save_state_dict, unwrap_state_dict)
from .layouts import LAYOUTS, Layout, detect_layout, detect_layouts, register_layout
from .loading import (LoadReport, convert_for_model, load_pretrained, partial_loading,
                      prepare_state_dict)
# every family's converters (``convert_*``: a layout -> ours; ``export_official_*``: ours ->
# official), importable from here without this file naming the families
_FAMILY_FUNCTIONS = {}
for _info in pkgutil.iter_modules(__path__):
    _module = importlib.import_module(f'{__name__}.{_info.name}')
    _FAMILY_FUNCTIONS.update({name: value for name, value in vars(_module).items()
                              if name.startswith(('convert_', 'export_official_'))
                              and getattr(value, '__module__', None) == _module.__name__
                              and name not in globals()})
globals().update(_FAMILY_FUNCTIONS)

__all__ = [
    'CheckpointError', 'read_checkpoint', 'save_state_dict', 'unwrap_state_dict', 'is_url',
    'hub_cache_path', 'resolve_checkpoint', 'LAYOUTS', 'Layout', 'detect_layout',
    'detect_layouts', 'register_layout', 'LoadReport', 'convert_for_model', 'load_pretrained',
    'partial_loading', 'prepare_state_dict', *sorted(_FAMILY_FUNCTIONS),
]
