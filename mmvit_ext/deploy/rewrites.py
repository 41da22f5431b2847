"""Export rewrites for peer modules whose forward freezes a size into an exported graph.

``torch.export`` does not refuse every Python int taken from a symbolic size: mmseg's
``Upsample`` computes ``int(size * scale)`` in Python, and the exported graph then upsamples to the
example's size at every input size (a later resize to the skip connection's size hides it: the
output has the right shape and wrong values). ``nn.AdaptiveAvgPool2d`` (mmseg's PPM) exports a
gather whose indices hold at the example's size only. While :func:`export_rewrites` is active,
such modules of a model run an equivalent forward built from symbolic sizes; the checks against
PyTorch (:func:`..export.max_relative_diff`) run the original modules.
"""
import types
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import adaptive_avg_pool2d


def _integer_factors(module: nn.Module) -> Tuple[int, int]:
    factor = module.scale_factor
    factors = tuple(factor) if isinstance(factor, (tuple, list)) else (factor, factor)
    if not all(float(f).is_integer() for f in factors):
        raise ValueError(f'{type(module).__name__} with scale_factor {factor}: the output size '
                         'int(size * scale) is a Python int; only integer factors export with '
                         'dynamic shapes')
    return int(factors[0]), int(factors[1])


def _mmseg_upsample(module: nn.Module) -> Optional[Callable]:
    """mmseg ``Upsample`` without a fixed size: ``size * factor`` as symbolic sizes."""
    if module.size:
        return None
    fh, fw = _integer_factors(module)

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        size = (x.shape[-2] * fh, x.shape[-1] * fw)
        return F.interpolate(x, size, None, self.mode, self.align_corners)
    return forward


def _adaptive_avg_pool(module: nn.Module) -> Optional[Callable]:
    """``nn.AdaptiveAvgPool2d`` as pooling matrices (:func:`layers.adaptive_avg_pool2d`)."""
    size = module.output_size
    size = (size, size) if isinstance(size, int) else tuple(size)
    if any(s is None for s in size):
        raise ValueError(f'AdaptiveAvgPool2d(output_size={module.output_size}) keeps an input '
                         'size; give both output sides to export it')

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return adaptive_avg_pool2d(x, size)
    return forward


def _rewrite_for(module: nn.Module) -> Optional[Callable]:
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return _adaptive_avg_pool(module)
    if type(module).__name__ == 'Upsample' and type(module).__module__.startswith('mmseg.'):
        return _mmseg_upsample(module)
    return None


@contextmanager
def export_rewrites(model: nn.Module) -> Iterator[List[str]]:
    """Swap in the export forwards of ``model``'s modules for the duration; yields the names of
    the rewritten modules and restores the original forwards afterwards."""
    patched = []
    try:
        for name, module in model.named_modules():
            forward = _rewrite_for(module)
            if forward is not None:
                patched.append((name, module, module.__dict__.get('forward')))
                module.forward = types.MethodType(forward, module)
        yield [name for name, _, _ in patched]
    finally:
        for _, module, previous in patched:
            del module.forward
            if previous is not None:
                module.forward = previous


__all__ = ['export_rewrites']
