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
from .loading import (LoadReport, convert_for_model, load_pretrained,
                      prepare_state_dict)
from .plain_vit import (convert_official_cait, convert_official_deepvit,
                        convert_official_refiner, export_official_cait, export_official_deepvit,
                        export_official_refiner)
from .pvt_v2 import (convert_hf_pvtv2, convert_mmdet_pvtv2, convert_official_pvtv2,
                     convert_timm_pvtv2, export_official_pvtv2)
from .swin import (convert_hf_swin, convert_official_swin, convert_openmmlab_swin,
                   convert_timm_swin, export_official_swin)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f'{__name__}.{_module.name}')

__all__ = [
    'CheckpointError', 'read_checkpoint', 'save_state_dict', 'unwrap_state_dict', 'is_url',
    'hub_cache_path', 'resolve_checkpoint', 'LAYOUTS', 'Layout', 'detect_layout',
    'detect_layouts', 'register_layout', 'LoadReport', 'convert_for_model', 'load_pretrained',
    'prepare_state_dict', 'convert_timm_swin', 'convert_openmmlab_swin',
    'convert_hf_swin', 'convert_timm_pvtv2', 'convert_mmdet_pvtv2', 'convert_hf_pvtv2',
    'convert_official_swin', 'convert_official_pvtv2',
    'export_official_swin', 'export_official_pvtv2', 'convert_official_cait',
    'convert_official_deepvit', 'convert_official_refiner', 'export_official_cait',
    'export_official_deepvit', 'export_official_refiner',
]
