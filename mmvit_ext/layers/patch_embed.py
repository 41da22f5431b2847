"""Convolutional patch embedding."""
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .utils import to_2tuple


class PatchEmbed(nn.Module):
    """Image or feature map (B, C_in, H, W) -> tokens (B, h*w, C) and their grid (h, w).

    Non-overlapping (``stride == patch_size``, ``padding=0``): the input is zero-padded on the
    right/bottom to a multiple of the stride, so the grid is ``ceil(H / stride)``. Overlapping
    (PVTv2): ``padding = patch_size // 2`` also gives ``ceil(H / stride)`` for odd kernels.
    """

    def __init__(self, in_channels: int = 3, embed_dims: int = 768, patch_size: int = 16,
                 stride: Optional[int] = None, padding: Optional[int] = None,
                 norm_layer: Optional[Callable[[int], nn.Module]] = None) -> None:
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.stride = to_2tuple(stride or patch_size)
        self.in_channels = in_channels
        self.embed_dims = embed_dims
        self.overlapping = self.stride != self.patch_size
        if padding is None:
            padding = patch_size // 2 if self.overlapping else 0
        self.proj = nn.Conv2d(in_channels, embed_dims, kernel_size=self.patch_size,
                              stride=self.stride, padding=padding)
        self.norm = norm_layer(embed_dims) if norm_layer else nn.Identity()

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'{type(self).__name__} expects input of shape (B, {self.in_channels}, H, W), '
                             f'got {tuple(x.shape)}')
        if not self.overlapping:
            pad_h = -x.shape[2] % self.stride[0]
            pad_w = -x.shape[3] % self.stride[1]
            if pad_h or pad_w:
                x = F.pad(x, (0, pad_w, 0, pad_h))
        x = self.proj(x)
        hw = (x.shape[2], x.shape[3])
        return self.norm(x.flatten(2).transpose(1, 2)), hw
