"""Absolute position-embedding resizing."""
from typing import Tuple

import torch

from .resample import resize_grid
from .shapes import map_to_tokens, tokens_to_map
from .utils import known_equal


def resize_pos_embed(pos_embed: torch.Tensor, src_hw: Tuple[int, int], dst_hw: Tuple[int, int],
                     num_prefix_tokens: int = 0, mode: str = 'bicubic') -> torch.Tensor:
    """Resize (1, P + h*w, C) grid embeddings from ``src_hw`` to ``dst_hw``; the P prefix
    (class / distillation) tokens are kept as they are. Deterministic (matrix products)."""
    if known_equal(tuple(src_hw), tuple(dst_hw)):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    if grid.shape[1] != src_hw[0] * src_hw[1]:
        raise ValueError(f'position embedding has {grid.shape[1]} grid tokens, expected '
                         f'{src_hw[0]}x{src_hw[1]}')
    grid = resize_grid(tokens_to_map(grid, src_hw).float(), tuple(dst_hw), mode)
    grid = map_to_tokens(grid).to(pos_embed.dtype)
    return torch.cat([prefix, grid], dim=1)
