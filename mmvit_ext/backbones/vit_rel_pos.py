"""ViTDet's decomposed relative positions (Li et al., 2022): the tables, their lookup and
the fold into q / k that lets the fused kernel run without an (N, N) bias."""
from typing import Tuple

import torch

from ..layers import Size2, interpolation_matrix, known_equal


def resize_rel_pos(table: torch.Tensor, size: int) -> torch.Tensor:
    """(L, d) table of offsets -> the (2 * size - 1, d) table a side of ``size`` tokens reads:
    resized linearly where L differs, as ViTDet's ``get_rel_pos``."""
    length = 2 * size - 1
    if known_equal(table.shape[0], length):
        return table
    return interpolation_matrix(table.shape[0], length, 'bilinear', device=table.device,
                                dtype=table.dtype) @ table


def rel_pos_lookup(table: torch.Tensor, size: int) -> torch.Tensor:
    """(L, d) table of offsets -> (size, size, d) entries ``R[i - j]`` (:func:`resize_rel_pos`
    first)."""
    table = resize_rel_pos(table, size)
    coords = torch.arange(size, device=table.device)
    return table[coords[:, None] - coords[None, :] + (size - 1)]


def rel_pos_factors(q: torch.Tensor, rel_pos_h: torch.Tensor, rel_pos_w: torch.Tensor,
                    grid: Size2) -> Tuple[torch.Tensor, torch.Tensor]:
    """The two factors of the decomposed bias for queries (..., H, h*w, d):
    ``q_ij . R_h[i - k]`` (..., H, h, w, h) and ``q_ij . R_w[j - l]`` (..., H, h, w, w)."""
    height, width = grid
    r_q = q.unflatten(-2, (height, width))
    return (torch.einsum('...hwc,hkc->...hwk', r_q, rel_pos_lookup(rel_pos_h, height)),
            torch.einsum('...hwc,wkc->...hwk', r_q, rel_pos_lookup(rel_pos_w, width)))


def decomposed_rel_pos(q: torch.Tensor, rel_pos_h: torch.Tensor, rel_pos_w: torch.Tensor,
                       grid: Size2) -> torch.Tensor:
    """ViTDet / MViTv2 decomposed relative position bias for queries (..., H, h*w, d) of an
    h x w grid: ``bias[(i, j), (k, l)] = q_ij . R_h[i - k] + q_ij . R_w[j - l]`` (..., H, N, N)."""
    height, width = grid
    bias_h, bias_w = rel_pos_factors(q, rel_pos_h, rel_pos_w, grid)
    bias = bias_h.unsqueeze(-1) + bias_w.unsqueeze(-2)  # (..., h, w, h, w)
    n = height * width
    return bias.reshape(*q.shape[:-2], n, n)


def fold_width(q: torch.Tensor, grid: Size2) -> int:
    """The head dim of q and k widened by :func:`fold_decomposed_rel_pos` over ``grid``."""
    return -(-(q.shape[-1] + grid[0] + grid[1]) // 8) * 8


def fold_decomposed_rel_pos(q: torch.Tensor, k: torch.Tensor, rel_pos_h: torch.Tensor,
                            rel_pos_w: torch.Tensor, grid: Size2, scale: float
                            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys (..., H, N, d) widened so that ``q' k'^T`` equals ``scale * q k^T`` plus
    :func:`decomposed_rel_pos`, with no (N, N) bias: each query carries its two bias rows
    ``q . R_h`` (h entries) and ``q . R_w`` (w entries), each key the one-hot row and column of
    its position, zero columns pad the width to a multiple of 8 (the fused kernels' alignment).
    The fused attention then runs without a mask, at scale 1. :class:`RelPosAttention` folds
    grids of Python ints; a symbolic grid (export, dynamic shapes) keeps the mask, whose kernel
    alignment does not depend on the grid."""
    height, width = grid
    bias_h, bias_w = rel_pos_factors(q, rel_pos_h, rel_pos_w, grid)
    n = height * width
    # one-hot rows built in float32 (torch 2.1 has no bfloat16 ``eye`` on CPU)
    rows = torch.eye(height, device=k.device).to(k.dtype)[:, None].expand(height, width, height)
    cols = torch.eye(width, device=k.device).to(k.dtype)[None].expand(height, width, width)
    zeros = q.new_zeros(*q.shape[:-1], fold_width(q, grid) - q.shape[-1] - height - width)
    q = torch.cat([q * scale, bias_h.flatten(-3, -2).to(q.dtype),
                   bias_w.flatten(-3, -2).to(q.dtype), zeros], dim=-1)
    k = torch.cat([k, rows.reshape(n, height).expand(*k.shape[:-1], height),
                   cols.reshape(n, width).expand(*k.shape[:-1], width), zeros.to(k.dtype)], dim=-1)
    return q, k
