"""Export rewrites for peer modules whose forward freezes a size into an exported graph.

``torch.export`` does not refuse every Python int taken from a symbolic size: mmseg's
``Upsample`` computes ``int(size * scale)`` in Python, and the exported graph then upsamples to the
example's size at every input size (a later resize to the skip connection's size hides it: the
output has the right shape and wrong values). ``nn.AdaptiveAvgPool2d`` (mmseg's PPM) exports a
gather whose indices hold at the example's size only. While :func:`export_rewrites` is active,
such modules of a model are replaced by equivalent modules built from symbolic sizes; the checks against
PyTorch (:func:`..export.max_relative_diff`) run the original modules.
"""
from contextlib import contextmanager
from typing import Iterator, List, Optional, Tuple

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


class SymbolicUpsample(nn.Module):
    """mmseg ``Upsample`` without a fixed size, its output size ``size * factor`` as symbolic
    sizes."""

    def __init__(self, factors: Tuple[int, int], mode: str, align_corners: Optional[bool]) -> None:
        super().__init__()
        self.factors, self.mode, self.align_corners = factors, mode, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = (x.shape[-2] * self.factors[0], x.shape[-1] * self.factors[1])
        return F.interpolate(x, size, None, self.mode, self.align_corners)


class MatrixAdaptiveAvgPool2d(nn.Module):
    """``nn.AdaptiveAvgPool2d`` as pooling matrices (:func:`layers.adaptive_avg_pool2d`)."""

    def __init__(self, size: Tuple[int, int]) -> None:
        super().__init__()
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return adaptive_avg_pool2d(x, self.size)


def _rewrite_for(module: nn.Module) -> Optional[nn.Module]:
    """The export stand-in for ``module``, or ``None``."""
    if isinstance(module, nn.AdaptiveAvgPool2d):
        size = module.output_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        if any(s is None for s in size):
            raise ValueError(f'AdaptiveAvgPool2d(output_size={module.output_size}) keeps an '
                             f'input size; give both output sides to export it')
        return MatrixAdaptiveAvgPool2d(size)
    if type(module).__name__ == 'Upsample' and type(module).__module__.startswith('mmseg.') \
            and not module.size:
        return SymbolicUpsample(_integer_factors(module), module.mode, module.align_corners)
    return None


@contextmanager
def export_rewrites(model: nn.Module) -> Iterator[List[str]]:
    """Swap the export stand-ins in for ``model``'s modules for the duration (as children of
    the same parents, no parameters involved); yields the names of the rewritten modules and
    puts the originals back afterwards."""
    swapped = []
    try:
        for name, module in list(model.named_modules()):
            stand_in = _rewrite_for(module)
            if stand_in is not None and name:
                parent_name, _, child = name.rpartition('.')
                parent = model.get_submodule(parent_name)
                setattr(parent, child, stand_in)
                swapped.append((name, parent, child, module))
        yield [name for name, _, _, _ in swapped]
    finally:
        for _, parent, child, module in reversed(swapped):
            setattr(parent, child, module)


__all__ = ['export_rewrites', 'SymbolicUpsample', 'MatrixAdaptiveAvgPool2d']
