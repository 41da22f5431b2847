"""Multi-scale deformable attention (Zhu et al., Deformable DETR, 2021) in plain PyTorch.

Each query looks at ``num_points`` bilinearly sampled locations per head and level and sums
them with softmax weights. The sampling is ``F.grid_sample`` (bilinear, zero padding,
``align_corners=False``, as the CUDA kernel of Deformable DETR), so the layer needs no compiled
op, runs on every device and dtype ``grid_sample`` supports, and exports to ONNX (opset >= 16).
"""
import math
from typing import List, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .shapes import Size2

SpatialShapes = Union[torch.Tensor, Sequence[Size2]]


def _level_sizes(spatial_shapes: SpatialShapes) -> List[Size2]:
    if isinstance(spatial_shapes, torch.Tensor):
        return [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    return [(h, w) for h, w in spatial_shapes]


def _sample_levels(value: torch.Tensor, locations: torch.Tensor, weights: torch.Tensor,
                   sizes: List[Size2]) -> torch.Tensor:
    """The attention with the caller's shapes (see :func:`multi_scale_deformable_attention`),
    as (B, C, Q)."""
    batch, _, heads, head_dim = value.shape
    dtype = torch.promote_types(value.dtype, locations.dtype)
    grids = 2 * locations.to(dtype) - 1
    weights = weights.to(dtype)
    output = None
    start = 0
    for level, (height, width) in enumerate(sizes):
        # one sampling batch per (image, head), contiguous (the CPU kernel's fast path):
        # map (B*heads, C/heads, H, W), grid (B*heads, Q, P, 2), weights (B*heads, 1, Q, P)
        level_map = value[:, start:start + height * width].to(dtype).permute(0, 2, 3, 1)
        level_map = level_map.reshape(batch * heads, head_dim, height, width)
        start = start + height * width
        grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        samples = F.grid_sample(level_map, grid, mode='bilinear', padding_mode='zeros',
                                align_corners=False)
        term = (samples * weights[:, :, :, level].transpose(1, 2).flatten(0, 1)[:, None]).sum(-1)
        output = term if output is None else output + term
    return output.unflatten(0, (batch, heads)).flatten(1, 2)


def multi_scale_deformable_attention(value: torch.Tensor, spatial_shapes: SpatialShapes,
                                     sampling_locations: torch.Tensor,
                                     attention_weights: torch.Tensor,
                                     recompute: bool = False) -> torch.Tensor:
    """Weighted sum of bilinear samples of every level.

    Args:
        value: (B, S, heads, C / heads), the levels' tokens one after the other (S = sum H*W).
        spatial_shapes: (L, 2) tensor or (H, W) pairs of the levels, in ``value``'s order.
        sampling_locations: (B, Q, heads, L, P, 2) in [0, 1], (x, y), (0, 0) the top-left
            corner of the map.
        attention_weights: (B, Q, heads, L, P), normalised over (L, P) by the caller.
        recompute: when a gradient is needed, keep nothing but the inputs for backward and
            sample again there (the samples, Q * L * P per channel, dwarf the inputs).

    Returns (B, Q, C). The levels are sampled one at a time and accumulated, so no
    (B*heads, C/heads, Q, L, P) stack of all samples is built. Sampling runs in the wider dtype
    of ``value`` and the locations (fp32 locations keep sub-pixel precision under autocast, and
    ``grid_sample`` needs one dtype).
    """
    sizes = _level_sizes(spatial_shapes)
    inputs = (value, sampling_locations, attention_weights)
    if recompute and torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        output = checkpoint(_sample_levels, *inputs, sizes, use_reentrant=False)
    else:
        output = _sample_levels(*inputs, sizes)
    return output.transpose(1, 2)


def reference_points(sizes: Sequence[Size2], device: torch.device = None) -> torch.Tensor:
    """Pixel centres of every level, (1, sum H*W, 1, 2) as (x, y) in [0, 1], levels in order."""
    points = []
    for height, width in sizes:
        ys = (torch.arange(height, device=device, dtype=torch.float32) + 0.5) / height
        xs = (torch.arange(width, device=device, dtype=torch.float32) + 0.5) / width
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing='ij')
        points.append(torch.stack([grid_x.flatten(), grid_y.flatten()], dim=-1))
    return torch.cat(points, dim=0)[None, :, None]


class MSDeformAttn(nn.Module):
    """Multi-scale deformable attention module (Deformable DETR's ``MSDeformAttn``).

    Queries (B, Q, C) predict ``num_points`` offsets and weights per head and level around
    their reference points; the values are a projection of the levels' tokens to
    ``dim * value_ratio`` channels (ViT-Adapter's ``deform_ratio``).

    Args:
        dim: query / output channels.
        num_levels: levels of the value tokens.
        num_heads: attention heads; ``dim * value_ratio`` must divide by it.
        num_points: samples per head and level.
        value_ratio: value channels over ``dim``.
        recompute: sample again in backward instead of keeping the samples
            (:func:`multi_scale_deformable_attention`).
    """

    def __init__(self, dim: int, num_levels: int = 4, num_heads: int = 8, num_points: int = 4,
                 value_ratio: float = 1.0, recompute: bool = False) -> None:
        super().__init__()
        self.recompute = recompute
        value_dim = int(dim * value_ratio)
        if value_dim % num_heads:
            raise ValueError(f'MSDeformAttn: value channels {value_dim} (dim {dim} x ratio '
                             f'{value_ratio}) must divide by num_heads={num_heads}')
        self.num_levels, self.num_heads, self.num_points = num_levels, num_heads, num_points
        self.sampling_offsets = nn.Linear(dim, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(dim, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(dim, value_dim)
        self.output_proj = nn.Linear(value_dim, dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deformable DETR's init: zero offset weights, biases on a ring of directions (one per
        head) at distances 1..P, uniform attention, Xavier projections."""
        nn.init.zeros_(self.sampling_offsets.weight)
        angles = torch.arange(self.num_heads, dtype=torch.float32) * (2 * math.pi / self.num_heads)
        ring = torch.stack([angles.cos(), angles.sin()], -1)
        ring = ring / ring.abs().max(-1, keepdim=True)[0]
        distance = torch.arange(1, self.num_points + 1, dtype=torch.float32)
        bias = ring[:, None, None, :] * distance[None, None, :, None]  # (heads, 1, P, 2)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(bias.expand(-1, self.num_levels, -1, -1).flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for proj in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def forward(self, query: torch.Tensor, ref_points: torch.Tensor, feat: torch.Tensor,
                spatial_shapes: Sequence[Size2]) -> torch.Tensor:
        """query (B, Q, C), ref_points (B or 1, Q, 1 or L, 2) in [0, 1], feat (B, S, C) with
        the levels of ``spatial_shapes`` -> (B, Q, C)."""
        batch, queries, _ = query.shape
        heads, levels, points = self.num_heads, self.num_levels, self.num_points
        value = self.value_proj(feat).unflatten(-1, (heads, -1))
        offsets = self.sampling_offsets(query).view(batch, queries, heads, levels, points, 2)
        weights = self.attention_weights(query).view(batch, queries, heads, levels * points)
        weights = weights.softmax(-1).view(batch, queries, heads, levels, points)
        # offsets are in pixels of each level: normalise by (W, H)
        normaliser = torch.tensor([[w, h] for h, w in spatial_shapes], dtype=torch.float32,
                                  device=query.device)
        locations = ref_points[:, :, None, :, None, :] + offsets / normaliser[:, None, :]
        out = multi_scale_deformable_attention(value, spatial_shapes, locations, weights,
                                               self.recompute)
        return self.output_proj(out.to(value.dtype))


__all__: Tuple[str, ...] = ('multi_scale_deformable_attention', 'reference_points',
                            'MSDeformAttn')
