"""ONNX export of our backbones and of whole mmdet / mmseg models, with dynamic shapes.

The exporter is ``torch.onnx.export(..., dynamo=True)`` (``torch.export`` + onnxscript): sizes
are symbols, every shape computation of the model (window padding and shifts, shift masks,
position-embedding resizing, the PVTv2-li pooling matrices) becomes graph arithmetic on the
input's shape, and a branch that would freeze a size raises a constraint error at export
instead of silently baking the example's size into the graph -- which is what the TorchScript
exporter (``dynamo=False``) does with every Python ``if`` on a shape.

The CPU kernels of :mod:`mmvit_ext.ops` (and their custom autograd functions) are skipped while
exporting (:func:`mmvit_ext.ops.cpu_kernels_apply`): the graph holds the portable model code.
"""
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn


DEFAULT_OPSET = 18
PathLike = Union[str, Path]


# ---- what is exported --------------------------------------------------------------------------
class BackboneOutputs(nn.Module):
    """A backbone as an export root: image (B, 3, H, W) -> its tuple of NCHW maps."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def output_names(self) -> List[str]:
        return [f'feat{i}_s{stride}' for i, stride in enumerate(self.backbone.strides)]

    def forward(self, inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.backbone(inputs))


class ModelOutputs(nn.Module):
    """A whole mmdet / mmseg model's tensor forward (``model._forward``) on a preprocessed
    batch: mmseg -> segmentation logits (B, classes, H/4, W/4) as the decode head gives them;
    mmdet single-stage -> the head's raw outputs per level (e.g. RetinaNet ``cls_score_s8``...,
    ``bbox_pred_s8``...), flattened into one tuple."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def output_names(self, example: torch.Tensor) -> List[str]:
        with torch.no_grad():
            outs = self.model._forward(example)
        if isinstance(outs, torch.Tensor):
            return ['seg_logits']
        names = []
        for group, maps in zip(self._group_names(len(outs)), outs):
            names += [f'{group}_{i}' for i in range(len(maps))]
        return names

    @staticmethod
    def _group_names(count: int) -> List[str]:
        return ['cls_score', 'bbox_pred', 'centerness'][:count] if count <= 3 else \
            [f'out{i}' for i in range(count)]

    def forward(self, inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        outs = self.model._forward(inputs)
        if isinstance(outs, torch.Tensor):
            return (outs,)
        return tuple(t for group in outs for t in group)


def min_dynamic_size(backbone: nn.Module) -> int:
    """Smallest image side the dynamic graph serves: the deepest map at least 2 pixels (torch
    specialises size-1 dims), and maps at least one window longer than the window where the
    model shrinks windows on small maps (official Swin, windowed plain ViTs): there a smaller
    input runs a different window layout, i.e. another graph."""
    strides = [s for s in getattr(backbone, 'level_strides', (32,))]
    low = 2 * max(max(strides), max(getattr(backbone, 'strides', None) or strides))
    window = getattr(backbone, 'window_size', None)
    if isinstance(window, int) and not getattr(backbone, 'pad_small_map', False):
        layers = getattr(backbone, 'layers', None)  # Swin: the deepest built stage
        deepest = strides[len(layers) - 1] if layers is not None else max(strides)
        low = max(low, deepest * window + 1)
    return low


# ---- export and check --------------------------------------------------------------------------
def export_onnx(module: nn.Module, example: torch.Tensor, path: PathLike,
                output_names: Sequence[str], dynamic: bool = True, min_size: int = 64,
                max_size: int = 4096, opset: int = DEFAULT_OPSET) -> Path:
    """Export ``module(example)`` to ``path`` with the input named ``inputs``; ``dynamic``: the
    batch, height and width are symbols (height / width in [min_size, max_size]). Runs
    ``onnx.checker`` on the result."""
    import onnx
    from torch.export import Dim
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dynamic_shapes = None
    if dynamic:
        if example.shape[0] < 2:  # a size-1 example dim would be specialised
            example = example.expand(2, *example.shape[1:]).contiguous()
        dynamic_shapes = {'inputs': {0: Dim('batch', min=1, max=1024),
                                     2: Dim('height', min=min_size, max=max_size),
                                     3: Dim('width', min=min_size, max=max_size)}}
    module = module.eval()
    with torch.no_grad():
        program = torch.onnx.export(module, (example,), dynamo=True, opset_version=opset,
                                    input_names=['inputs'], output_names=list(output_names),
                                    dynamic_shapes=dynamic_shapes, verbose=False,
                                    external_data=False)
    program.save(str(path), external_data=False)
    onnx.checker.check_model(str(path), full_check=True)
    return path


def ort_session(path: PathLike, threads: Optional[int] = None):
    """An ONNX Runtime CPU session for ``path``."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=['CPUExecutionProvider'])


def max_relative_diff(module: nn.Module, session: Any, inputs: torch.Tensor
                      ) -> Tuple[float, List[Tuple[int, ...]]]:
    """max |ort - torch| / max |torch| over the outputs, and the output shapes; raises if the
    output count or shapes differ."""
    with torch.no_grad():
        ref = module(inputs)
    got = session.run(None, {session.get_inputs()[0].name: inputs.numpy()})
    if len(got) != len(ref):
        raise AssertionError(f'ONNX Runtime gave {len(got)} outputs, PyTorch {len(ref)}')
    worst = 0.0
    for expected, actual in zip(ref, got):
        if tuple(expected.shape) != actual.shape:
            raise AssertionError(f'output shape {actual.shape} != PyTorch {tuple(expected.shape)}')
        expected = expected.numpy().astype(np.float64)
        diff = np.abs(actual.astype(np.float64) - expected).max()
        worst = max(worst, float(diff / max(np.abs(expected).max(), 1e-12)))
    return worst, [tuple(t.shape) for t in ref]


def median_latency(fn: Any, runs: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


# ---- building from a config --------------------------------------------------------------------
def build_from_config(config: PathLike, checkpoint: Optional[str] = None,
                      overrides: Optional[Dict[str, Any]] = None) -> nn.Module:
    """The config's model in its scope (``default_scope``: mmdet / mmseg / mmpretrain), in
    eval mode, with ``checkpoint`` loaded: a whole-model checkpoint (``backbone.*``, ``neck.*``
    ...) through mmengine, a backbone checkpoint of any layout our loader knows into the
    backbone (``'none'``: keep the random initialisation)."""
    import importlib

    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    cfg = Config.fromfile(str(config))
    if overrides:
        cfg.merge_from_dict(overrides)
    scope = cfg.get('default_scope', 'mmdet')
    importlib.import_module('mmvit_ext')
    importlib.import_module(f'{scope}.models')
    registry = importlib.import_module(f'{scope}.registry').MODELS
    model_cfg = cfg.model
    if 'backbone' in model_cfg:
        model_cfg.backbone.init_cfg = None  # weights come from ``checkpoint``
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.build(model_cfg)
    model.init_weights()
    if checkpoint and checkpoint != 'none':
        load_any_checkpoint(model, checkpoint)
    return model.eval()


def load_any_checkpoint(model: nn.Module, checkpoint: str) -> None:
    """Whole-model checkpoints load into ``model``; backbone-only ones (ours or any official
    layout) into ``model.backbone`` through :func:`mmvit_ext.converters.load_pretrained`."""
    from mmengine.runner import load_checkpoint

    from .converters import load_pretrained, read_checkpoint, unwrap_state_dict
    state = unwrap_state_dict(read_checkpoint(checkpoint), source=checkpoint) \
        if hasattr(model, 'backbone') else None
    heads = ('neck.', 'decode_head.', 'bbox_head.', 'rpn_head.', 'roi_head.', 'head.',
             'auxiliary_head.')
    if state is not None and not any(k.startswith(heads) for k in state):
        load_pretrained(model.backbone, checkpoint)
    else:
        load_checkpoint(model, checkpoint, map_location='cpu', strict=False)


def export_root(model: nn.Module, part: str) -> nn.Module:
    """The module to export: ``backbone`` (the model's, or the model itself if it is one)
    or ``model`` (the whole tensor forward)."""
    if part == 'backbone':
        return BackboneOutputs(getattr(model, 'backbone', model))
    if part == 'model':
        if not hasattr(model, '_forward'):
            raise ValueError(f'{type(model).__name__} has no tensor forward (_forward) to export')
        return ModelOutputs(model)
    raise ValueError(f"part must be 'backbone' or 'model', got {part!r}")


def names_of(root: nn.Module, example: torch.Tensor) -> List[str]:
    return root.output_names(example) if isinstance(root, ModelOutputs) else root.output_names()


def min_size_of(root: nn.Module) -> int:
    """:func:`min_dynamic_size` of the root's backbone; a whole detector also needs its deepest
    neck level (e.g. RetinaNet's stride 128) at least 2 pixels."""
    backbone = root.backbone if isinstance(root, BackboneOutputs) else root.model.backbone
    low = min_dynamic_size(backbone)
    if isinstance(root, ModelOutputs):
        prior = getattr(getattr(root.model, 'bbox_head', None), 'prior_generator', None)
        if prior is not None:
            low = max(low, 2 * max(max(s) if isinstance(s, tuple) else s
                                   for s in prior.strides))
    return low


__all__ = ['BackboneOutputs', 'ModelOutputs', 'min_dynamic_size', 'export_onnx', 'ort_session',
           'max_relative_diff', 'median_latency', 'build_from_config', 'load_any_checkpoint',
           'export_root', 'names_of', 'min_size_of', 'DEFAULT_OPSET']
