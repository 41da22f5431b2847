"""Relative position bias for window attention, and its table resizing."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .shapes import Size2
from .utils import known_equal


def relative_position_index(window_size: Size2, table_window: Optional[Size2] = None,
                            device: Optional[torch.device] = None) -> torch.Tensor:
    """(N, N) indices into a ((2*Th-1)*(2*Tw-1)) table for every pair of tokens of a window.

    ``table_window`` (default: the window itself) lets a smaller window read the exact entries
    of a larger table, which is how windows truncated to a small feature map reuse the weights.
    """
    table_window = table_window or window_size
    if window_size[0] > table_window[0] or window_size[1] > table_window[1]:
        raise ValueError(f'window {window_size} is larger than the bias table window {table_window}')
    coords = torch.stack(torch.meshgrid(torch.arange(window_size[0], device=device),
                                        torch.arange(window_size[1], device=device),
                                        indexing='ij')).flatten(1)  # (2, N)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)  # (N, N, 2)
    return (rel[..., 0] + table_window[0] - 1) * (2 * table_window[1] - 1) + rel[..., 1] + table_window[1] - 1


class RelativePositionBias(nn.Module):
    """Learned bias per head and relative offset inside a window: returns (H, N, N).

    A window smaller than the table's (a map smaller than the window) reads the entries of its
    own offsets: the sub-block of the full index for its tokens.
    """

    def __init__(self, window_size: Size2, num_heads: int) -> None:
        super().__init__()
        self.window_size = tuple(window_size)
        self.num_heads = num_heads
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.register_buffer('relative_position_index', relative_position_index(self.window_size),
                             persistent=False)

    def forward(self, window_size: Optional[Size2] = None) -> torch.Tensor:
        index = self.relative_position_index
        if window_size is not None and not known_equal(tuple(window_size), self.window_size):
            rows = torch.arange(window_size[0], device=index.device)
            cols = torch.arange(window_size[1], device=index.device)
            tokens = (rows[:, None] * self.window_size[1] + cols[None, :]).flatten()
            index = index[tokens][:, tokens]
        n = index.shape[0]
        bias = self.relative_position_bias_table[index.reshape(-1)].view(n, n, self.num_heads)
        # contiguous: a head-strided bias makes the add to every window's logits slow on CPU
        return bias.permute(2, 0, 1).contiguous()


def resize_rel_pos_table(table: torch.Tensor, src_window: Size2, dst_window: Size2) -> torch.Tensor:
    """Bicubic resize of a ((2*h-1)*(2*w-1), H) table between window sizes."""
    src = (2 * src_window[0] - 1, 2 * src_window[1] - 1)
    dst = (2 * dst_window[0] - 1, 2 * dst_window[1] - 1)
    if src == dst:
        return table
    if table.shape[0] != src[0] * src[1]:
        raise ValueError(f'bias table has {table.shape[0]} rows, expected {src[0] * src[1]} '
                         f'for window {src_window}')
    grid = table.T.reshape(1, table.shape[1], *src).float()
    grid = F.interpolate(grid, size=dst, mode='bicubic', align_corners=False)
    return grid.reshape(table.shape[1], -1).T.to(table.dtype).contiguous()
