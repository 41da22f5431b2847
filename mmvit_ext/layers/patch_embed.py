"""Convolutional patch embedding."""
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .shapes import map_to_tokens, pad_to_multiple, to_2tuple


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
            x = pad_to_multiple(x, self.stride)
        x = self.proj(x)
        hw = (x.shape[2], x.shape[3])
        return self.norm(map_to_tokens(x)), hw


class ConvStemEmbed(nn.Module):
    """Convolutional stem (DeepViT-S/L, Refined-ViT; after T2T-ViT) -> tokens at ``patch_size``.

    A 7x7 stride-2 conv, then 3x3 convs (each conv + BatchNorm + ReLU) through ``channels``, then a
    (patch/2) x (patch/2) projection. The input is zero-padded to a multiple of ``patch_size`` so
    the grid is ``ceil(H / patch_size)``, like :class:`PatchEmbed`.
    """

    def __init__(self, in_channels: int = 3, embed_dims: int = 384, patch_size: int = 16,
                 channels: Tuple[int, ...] = (64, 64)) -> None:
        super().__init__()
        if patch_size % 2 or not channels:
            raise ValueError(f'ConvStemEmbed needs an even patch_size and at least one stem '
                             f'channel, got patch_size={patch_size}, channels={channels}')
        self.in_channels = in_channels
        self.patch_size = to_2tuple(patch_size)
        self.num_convs = len(channels)
        prev = in_channels
        for i, width in enumerate(channels, start=1):
            kernel = 7 if i == 1 else 3
            conv = nn.Conv2d(prev, width, kernel, stride=2 if i == 1 else 1, padding=kernel // 2,
                             bias=False)
            self.add_module(f'conv{i}', conv)
            self.add_module(f'bn{i}', nn.BatchNorm2d(width))
            prev = width
        self.proj = nn.Conv2d(prev, embed_dims, patch_size // 2, stride=patch_size // 2)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = pad_to_multiple(x, self.patch_size)
        for i in range(1, self.num_convs + 1):
            x = F.relu(getattr(self, f'bn{i}')(getattr(self, f'conv{i}')(x)))
        x = self.proj(x)
        return map_to_tokens(x), (x.shape[2], x.shape[3])
