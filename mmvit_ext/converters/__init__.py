"""Official checkpoint layouts -> ours: pure, idempotent converters, auto-detected on load."""
from . import plain_vit, pvt_v2, swin  # noqa: F401  (register their layouts)
from .io import CheckpointError, read_checkpoint, save_state_dict, unwrap_state_dict
from .layouts import LAYOUTS, Layout, detect_layouts, register_layout
from .loading import LoadReport, convert_for_model, load_pretrained
from .plain_vit import (convert_official_cait, convert_official_deepvit,
                        convert_official_refiner, export_official_cait, export_official_deepvit,
                        export_official_refiner)
from .pvt_v2 import convert_official_pvtv2, export_official_pvtv2
from .swin import convert_official_swin, export_official_swin

__all__ = [
    'CheckpointError', 'read_checkpoint', 'save_state_dict', 'unwrap_state_dict', 'LAYOUTS',
    'Layout', 'detect_layouts', 'register_layout', 'LoadReport', 'convert_for_model',
    'load_pretrained', 'convert_official_swin', 'convert_official_pvtv2',
    'export_official_swin', 'export_official_pvtv2', 'convert_official_cait',
    'convert_official_deepvit', 'convert_official_refiner', 'export_official_cait',
    'export_official_deepvit', 'export_official_refiner',
]
