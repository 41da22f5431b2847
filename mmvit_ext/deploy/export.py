"""ONNX export of a backbone or a whole mmdet / mmseg model, with dynamic batch / height / width,
and its check against PyTorch in ONNX Runtime.

The exporter is ``torch.onnx.export(..., dynamo=True)`` (``torch.export`` + onnxscript): sizes are
symbols, so every shape computation of our backbones (window padding and shifts, shift masks,
position-embedding resizing, the PVTv2-li pooling matrices) becomes graph arithmetic on the
input's shape. The TorchScript exporter (``dynamo=False``) instead records each Python ``if`` on
a size as taken at the example, freezing the graph to it. The model code is the same on every
device, so the graph holds what a GPU runs.
"""
import logging
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from .. import torch_compat
from .rewrites import export_rewrites

DEFAULT_OPSET = 18
PathLike = Union[str, Path]


class BackboneOutputs(nn.Module):
    """A backbone as an export root: image (B, 3, H, W) -> its tuple of NCHW maps, named
    ``feat{i}_s{stride}``."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def output_names(self, example: torch.Tensor) -> List[str]:
        return [f'feat{i}_s{stride}' for i, stride in enumerate(self.backbone.strides)]

    def forward(self, inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.backbone(inputs))


class ModelOutputs(nn.Module):
    """A whole model's tensor forward (``model._forward``) on a preprocessed batch, flattened
    into one tuple: mmseg -> ``seg_logits`` (B, classes, H/4, W/4) as the decode head gives
    them; mmdet single-stage -> the head's raw outputs per level (``cls_score_{i}``,
    ``bbox_pred_{i}``, ...)."""

    GROUPS = ('cls_score', 'bbox_pred', 'centerness')

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not hasattr(model, '_forward'):
            raise ValueError(f'{type(model).__name__} has no tensor forward (_forward) to export')
        if getattr(model, 'roi_head', None) is not None:
            raise ValueError(f'{type(model).__name__}: the RoI head runs mmcv RoIAlign, an op '
                             'with no ONNX export here; export --part backbone, or a '
                             'single-stage detector (RetinaNet, FCOS, ...) as a whole')
        self.model = model

    def output_names(self, example: torch.Tensor) -> List[str]:
        with torch.no_grad():
            outs = self.model._forward(example)
        if isinstance(outs, torch.Tensor):
            return ['seg_logits']
        groups = self.GROUPS[:len(outs)] if len(outs) <= len(self.GROUPS) else \
            [f'out{i}' for i in range(len(outs))]
        return [f'{group}_{i}' for group, maps in zip(groups, outs) for i in range(len(maps))]

    def forward(self, inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        outs = self.model._forward(inputs)
        if isinstance(outs, torch.Tensor):
            return (outs,)
        return tuple(t for group in outs for t in group)


def export_root(model: nn.Module, part: str) -> nn.Module:
    """What ``--part`` exports: ``backbone`` (the model's, or the model if it is one) or
    ``model`` (the whole tensor forward)."""
    if part == 'backbone':
        return BackboneOutputs(getattr(model, 'backbone', model)).eval()
    if part == 'model':
        return ModelOutputs(model).eval()
    raise ValueError(f"part must be 'backbone' or 'model', got {part!r}")


def min_dynamic_size(root: nn.Module, fixed_windows: bool = True) -> int:
    """Smallest image side a dynamic graph of ``root`` serves: the backbone's
    ``export_limits().min_size`` (its deepest map at least 2 pixels, since torch specialises
    size-1 dims) and a detector's deepest prior level (RetinaNet: stride 128) at least 2 pixels.
    ``fixed_windows``: also keep the window layout fixed where windows shrink to fit small maps
    (``fixed_window_size``). Below that the window fitting becomes graph arithmetic too; the
    graph is still exact, but slower to export (docs/deployment.md)."""
    backbone = root.backbone if isinstance(root, BackboneOutputs) else root.model.backbone
    limits = backbone.export_limits()
    low = max(limits.min_size, limits.fixed_window_size if fixed_windows else 0)
    prior = getattr(getattr(getattr(root, 'model', None), 'bbox_head', None),
                    'prior_generator', None)
    if prior is not None:
        low = max(low, 2 * max(max(np.atleast_1d(s)) for s in prior.strides))
    return int(low)


def export_onnx(root: nn.Module, example: torch.Tensor, path: PathLike,
                dynamic: bool = True, min_size: int = 64, max_size: int = 4096,
                opset: int = DEFAULT_OPSET) -> Path:
    """Export ``root(example)`` to ``path``: input ``inputs``, outputs named by the root;
    ``dynamic``: batch, height and width are symbols (sides in [min_size, max_size]). Peer
    modules that would freeze a size run their export rewrite (:mod:`.rewrites`). Runs
    ``onnx.checker`` (full check) on the file."""
    torch_compat.require('ONNX export')
    import onnx
    from torch.export import Dim
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dynamic_shapes = None
    if dynamic:
        if example.shape[0] < 2:  # a size-1 example dim would be specialised
            example = example.expand(2, *example.shape[1:]).contiguous()
        dynamic_shapes = ({0: Dim('batch', min=1, max=1024),  # by position: any arg name
                           2: Dim('height', min=min_size, max=max_size),
                           3: Dim('width', min=min_size, max=max_size)},)
    names = root.output_names(example)
    quiet = logging.getLogger('torch.onnx')
    level, quiet.level = quiet.level, logging.ERROR
    try:
        with torch.no_grad(), export_rewrites(root):
            program = torch.onnx.export(root.eval(), (example,), dynamo=True,
                                        opset_version=opset, input_names=['inputs'],
                                        output_names=names, dynamic_shapes=dynamic_shapes,
                                        verbose=False, external_data=False)
    finally:
        quiet.level = level
    program.save(str(path), external_data=False)
    onnx.checker.check_model(str(path), full_check=True)
    return path


def ort_session(path: PathLike, threads: Optional[int] = None) -> Any:
    """An ONNX Runtime CPU session for ``path``."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=['CPUExecutionProvider'])


def max_relative_diff(root: nn.Module, session: Any, inputs: torch.Tensor) -> float:
    """max over outputs of max |ort - torch| / max |torch| (PyTorch eager, original modules);
    raises if the output count or any shape differs."""
    with torch.no_grad():
        ref = root(inputs)
    got = session.run(None, {session.get_inputs()[0].name: inputs.numpy()})
    if len(got) != len(ref):
        raise AssertionError(f'ONNX Runtime gave {len(got)} outputs, PyTorch {len(ref)}')
    worst = 0.0
    for expected, actual in zip(ref, got):
        if tuple(expected.shape) != actual.shape:
            raise AssertionError(f'output shape {actual.shape} != PyTorch {tuple(expected.shape)}')
        expected = expected.double().numpy()
        diff = np.abs(actual.astype(np.float64) - expected).max()
        worst = max(worst, float(diff / max(np.abs(expected).max(), 1e-12)))
    return worst


def export_shape(min_size: int) -> Tuple[int, int]:
    """Default (H, W) to export a dynamic graph at: above the minimum, unequal sides, and no
    multiple of a stride, so that no size coincidence of the example is taken for a rule."""
    return min_size + 35, min_size + 67


def check_sizes(height: int, width: int, min_size: int) -> List[Tuple[int, int, int]]:
    """Two (batch, H, W) checks other than the export's (2, height, width), at least
    ``min_size`` per side: batch 1 taller and narrower, batch 3 shorter and wider."""
    taller = (1, height + 19, max(min_size, width - 13))
    wider = (3, max(min_size, height - 21), width + 44)
    if taller[1:] == (height, width) or wider[1:] == (height, width):
        raise AssertionError('check sizes must differ from the export size')
    return [taller, wider]


def median_latency(fn: Callable[[], Any], runs: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


__all__ = ['BackboneOutputs', 'ModelOutputs', 'export_root', 'min_dynamic_size', 'export_onnx',
           'ort_session', 'max_relative_diff', 'export_shape', 'check_sizes', 'median_latency',
           'DEFAULT_OPSET']
