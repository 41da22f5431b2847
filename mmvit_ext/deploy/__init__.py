"""Deployment: ONNX export with dynamic shapes, checked against PyTorch in ONNX Runtime
(``tools/deployment/export_onnx.py``, ``tools/deployment/ort_benchmark.py``). Needs the
``deploy`` extra (onnx, onnxruntime, onnxscript)."""
from .build import build_from_config, load_any_checkpoint
from .export import (DEFAULT_OPSET, BackboneOutputs, ModelOutputs, check_sizes, export_onnx,
                     export_root, export_shape, max_relative_diff, median_latency,
                     min_dynamic_size, ort_session)
from .rewrites import export_rewrites

__all__ = ['build_from_config', 'load_any_checkpoint', 'DEFAULT_OPSET', 'BackboneOutputs',
           'ModelOutputs', 'check_sizes', 'export_onnx', 'export_root', 'export_shape',
           'max_relative_diff', 'median_latency', 'min_dynamic_size', 'ort_session',
           'export_rewrites']
