"""Resampling of token grids as matrix products: deterministic on every device, exportable.

``F.interpolate`` (bicubic / bilinear) and ``F.adaptive_avg_pool2d`` are linear maps that act
on each axis separately, so ``out = R_h @ grid @ R_w^T`` with per-axis matrices computes them
exactly (up to rounding). Their CUDA backward kernels are non-deterministic and torch refuses
them under ``torch.use_deterministic_algorithms(True)``; the matrix form's backward is two
matrix products. The matrices are built from the sizes on the grid's device.
"""
from typing import Tuple

import torch
import torch.nn.functional as F

INTERPOLATE_MODES = ('bicubic', 'bilinear', 'nearest')


def interpolation_matrix(src: int, dst: int, mode: str = 'bicubic', *,
                         device: torch.device = None, dtype: torch.dtype = torch.float32
                         ) -> torch.Tensor:
    """(dst, src) matrix of ``F.interpolate`` along one axis (``align_corners=False``)."""
    if mode not in INTERPOLATE_MODES:
        raise ValueError(f'interpolation mode must be one of {INTERPOLATE_MODES}, got {mode!r}')
    eye = torch.eye(src, device=device, dtype=dtype).view(1, 1, src, src)
    kwargs = {} if mode == 'nearest' else dict(align_corners=False)
    # resizing rows only: every column of the identity is one unit impulse
    return F.interpolate(eye, size=(dst, src), mode=mode, **kwargs)[0, 0]


def resize_grid(grid: torch.Tensor, size: Tuple[int, int], mode: str = 'bicubic') -> torch.Tensor:
    """(..., h, w) -> (..., H, W) as ``F.interpolate(grid, size, mode)`` would resize it."""
    h, w = grid.shape[-2:]
    rows = interpolation_matrix(h, size[0], mode, device=grid.device, dtype=grid.dtype)
    cols = interpolation_matrix(w, size[1], mode, device=grid.device, dtype=grid.dtype)
    return rows @ grid @ cols.T


def adaptive_pool_matrix(length: int, out: int, *, device: torch.device = None,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(out, length) averaging matrix of ``F.adaptive_avg_pool1d``: output i averages inputs
    ``floor(i * L / out)`` to ``ceil((i + 1) * L / out)`` (exclusive)."""
    index = torch.arange(out, device=device)
    start = torch.div(index * length, out, rounding_mode='floor')
    end = torch.div((index + 1) * length + out - 1, out, rounding_mode='floor')
    position = torch.arange(length, device=device)
    inside = (position[None, :] >= start[:, None]) & (position[None, :] < end[:, None])
    return inside.to(dtype) / (end - start)[:, None].to(dtype)


def adaptive_avg_pool2d(x: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """``F.adaptive_avg_pool2d(x, size)`` for (..., H, W), also where ``size`` does not divide
    the input."""
    h, w = x.shape[-2:]
    rows = adaptive_pool_matrix(h, size[0], device=x.device, dtype=x.dtype)
    cols = adaptive_pool_matrix(w, size[1], device=x.device, dtype=x.dtype)
    return rows @ x @ cols.T
