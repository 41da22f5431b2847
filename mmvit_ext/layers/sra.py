"""Spatial-reduction attention (PVT): keys and values from a reduced copy of the map."""
from typing import Optional, Sequence, Tuple

import torch
from torch import nn

from .attention import AttentionBase, MapTransform
from .resample import adaptive_avg_pool2d
from .shapes import map_to_tokens, tokens_to_map


class SpatialReductionAttention(AttentionBase):
    """Attention of (B, H*W, C) tokens over keys/values from a spatially reduced map.

    ``sr_ratio > 1``: a strided ``sr_ratio`` x ``sr_ratio`` conv + LayerNorm shrinks the map by
    ``sr_ratio`` per side (SRA). ``linear=True`` (linear SRA, PVTv2-li): adaptive average pooling to
    ``pool_size`` x ``pool_size`` (as matrix products: deterministic, any input size), a 1x1
    conv, LayerNorm and GELU, so cost is linear in pixels.
    """

    def __init__(self, dim: int, num_heads: int, sr_ratio: int = 1, linear: bool = False,
                 qkv_bias: bool = True, qk_scale: Optional[float] = None, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, pool_size: int = 7, norm_eps: float = 1e-5,
                 map_transforms: Sequence[MapTransform] = (), fused: bool = True) -> None:
        super().__init__(dim, num_heads, qk_scale, attn_drop, proj_drop, map_transforms, fused)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.linear = linear
        self.sr_ratio = sr_ratio
        self.pool_size = (pool_size, pool_size)
        if linear:
            self.sr = nn.Conv2d(dim, dim, kernel_size=1, stride=1)
            self.norm = nn.LayerNorm(dim, eps=norm_eps)
            self.act = nn.GELU()
        elif sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim, eps=norm_eps)

    def reduce(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """Tokens (B, N, C) -> reduced tokens (B, M, C) for keys and values."""
        if not self.linear and self.sr_ratio == 1:
            return x
        grid = tokens_to_map(x, hw)
        if self.linear:
            pooled = adaptive_avg_pool2d(grid, self.pool_size)
            return self.act(self.norm(map_to_tokens(self.sr(pooled))))
        return self.norm(map_to_tokens(self.sr(grid)))

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        kv = self.kv(self.reduce(x, hw)).reshape(b, -1, 2, self.num_heads, self.head_dim)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)
        return self.attend(q, k, v)
