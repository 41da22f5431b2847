"""Simple feature pyramid (ViTDet, Li et al., 2022): one stride-16 map -> strides 4/8/16/32."""
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .shapes import pad_to_multiple

PYRAMID_SCALES = (4.0, 2.0, 1.0, 0.5)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias,
                         self.eps)
        return x.permute(0, 3, 1, 2)


class CeilMaxPool2x2(nn.Module):
    """``nn.MaxPool2d(2, stride=2, ceil_mode=True)``: -inf padding to even sides, then the max
    over each 2x2 block of a reshaped view. The same values; written without a pooling op,
    whose output-size arithmetic branches on the parity of the size (a dynamic-shape export
    would be frozen to the example's parity)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_to_multiple(x, (2, 2), value=float('-inf'))
        b, c, h, w = x.shape
        return x.view(b, c, h // 2, 2, w // 2, 2).amax(dim=(3, 5))


def pyramid_channels(dim: int, scales: Sequence[float] = PYRAMID_SCALES) -> List[int]:
    """Channels per level: dim/4 at x4, dim/2 at x2, dim at x1 and below (as ViTDet)."""
    return [dim // 4 if s == 4 else dim // 2 if s == 2 else dim for s in scales]


def level_sizes(image_hw: Sequence[int], strides: Sequence[int]) -> List[Tuple[int, int]]:
    """Each level's map size, ``ceil(side / stride)``: a floor of non-negative sizes, safe for
    symbolic sizes and exact in ONNX (whose integer division truncates, so ``-(-h // s)``
    would floor the wrong way there)."""
    height, width = image_hw
    return [((height + s - 1) // s, (width + s - 1) // s) for s in strides]


class SimplePyramid(nn.Module):
    """Resample stride-16 maps to strides 4/8/16/32: two 2x2 deconvolutions (with LayerNorm and
    GELU between), one deconvolution, identity, 2x2 max-pool.

    ``forward`` takes one map per level (the same map four times for ViTDet, four block outputs
    for the BEiT/mmseg multi-level variant) and the target sizes, to which the upsampled maps are
    cropped (their extra rows and columns come from the right/bottom input padding).
    """

    def __init__(self, dim: int, scales: Sequence[float] = PYRAMID_SCALES) -> None:
        super().__init__()
        if dim % 4:
            raise ValueError(f'SimplePyramid needs channels divisible by 4, got {dim}')
        self.scales = tuple(scales)
        self.levels = nn.ModuleList()
        for scale in self.scales:
            if scale == 4:
                level = nn.Sequential(nn.ConvTranspose2d(dim, dim // 2, 2, stride=2),
                                      LayerNorm2d(dim // 2, eps=1e-6), nn.GELU(),
                                      nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2))
            elif scale == 2:
                level = nn.ConvTranspose2d(dim, dim // 2, 2, stride=2)
            elif scale == 1:
                level = nn.Identity()
            elif scale == 0.5:
                level = CeilMaxPool2x2()
            else:
                raise ValueError(f'SimplePyramid: unsupported scale {scale}; use 4, 2, 1 or 0.5')
            self.levels.append(level)

    def forward(self, maps: Sequence[torch.Tensor], sizes: Sequence[Sequence[int]]
                ) -> List[torch.Tensor]:
        outs = []
        for level, x, (h, w) in zip(self.levels, maps, sizes):
            outs.append(level(x)[..., :h, :w])
        return outs
