"""Sizes and layouts shared by layers and backbones: (H, W) pairs, tokens <-> NCHW maps, and
padding to multiples. Sizes may be symbolic (``torch.export``): nothing here branches on them."""
from typing import Tuple, Union

import torch
import torch.nn.functional as F

from .utils import known_zero

Size2 = Tuple[int, int]  # (height, width)


def to_2tuple(value: Union[int, Tuple[int, int]]) -> Size2:
    """``7 -> (7, 7)``; a pair is returned as a tuple."""
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    if len(value) != 2:
        raise ValueError(f'expected an int or a pair, got {value}')
    return value  # type: ignore[return-value]


def tokens_to_map(tokens: torch.Tensor, hw: Size2) -> torch.Tensor:
    """Tokens (B, H*W, C) of an H x W map -> the map (B, C, H, W) (a contiguous copy)."""
    b, _, c = tokens.shape
    return tokens.transpose(1, 2).reshape(b, c, hw[0], hw[1])


def map_to_tokens(grid: torch.Tensor) -> torch.Tensor:
    """A map (B, C, H, W) -> tokens (B, H*W, C)."""
    return grid.flatten(2).transpose(1, 2)


def pad_to_multiple(x: torch.Tensor, multiple: Size2, channels_last: bool = False,
                    value: float = 0.0) -> torch.Tensor:
    """Pad the two spatial dims on the bottom / right to multiples of ``multiple`` with
    ``value``: (B, C, H, W), or (B, H, W, C) with ``channels_last``. Skipped where the padding
    is known to be zero (exported graphs pad by arithmetic, never by a branch)."""
    h_dim, w_dim = (1, 2) if channels_last else (-2, -1)
    pad_h = -x.shape[h_dim] % multiple[0]
    pad_w = -x.shape[w_dim] % multiple[1]
    if known_zero((pad_h, pad_w)):
        return x
    pad = (0, 0, 0, pad_w, 0, pad_h) if channels_last else (0, pad_w, 0, pad_h)
    return F.pad(x, pad, value=value)
