"""Multi-scale deformable attention (Zhu et al., Deformable DETR, 2021): a portable definition
and, where one runs, a compiled kernel.

Each query looks at ``num_points`` bilinearly sampled locations per head and level and sums
them with softmax weights. :func:`multi_scale_deformable_attention` is the definition: the
sampling is ``F.grid_sample`` (bilinear, zero padding, ``align_corners=False``, as the CUDA
kernel of Deformable DETR), so it needs no compiled op, runs on every device and dtype
``grid_sample`` supports, and exports to ONNX (opset >= 16). :class:`MSDeformAttn` picks a
compiled kernel when built (:func:`mmvit_ext.ops.find_deform_attn_kernel`, shown in its repr)
and runs it where it can (:func:`why_portable`); the definition everywhere else.

The kernel and the definition agree to float32 rounding in the output and the value / weight
gradients (the kernel sums with ``atomicAdd`` in no fixed order). The location gradients agree
except where a sample sits exactly on a pixel row or column (integer pixel coordinates, e.g.
every reference point plus an integer offset at Deformable DETR's initialisation): bilinear
sampling has a kink there, and the kernel and ``grid_sample`` take different one-sided
derivatives. tests/test_deform_attn.py states the tolerances.
"""
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..ops import DeformAttnKernel, why_portable_call, find_deform_attn_kernel
from .shapes import Size2

SpatialShapes = Union[torch.Tensor, Sequence[Size2]]
# samples held at once by the definition: one (level, query chunk) piece of at most this many
# elements (64 MiB in float32), so the transient memory does not grow with the query count
PIECE_ELEMENTS = 1 << 24
IM2COL_STEP = 64  # images per kernel launch (the kernel needs it to divide the batch)


def _level_sizes(spatial_shapes: SpatialShapes) -> List[Size2]:
    if isinstance(spatial_shapes, torch.Tensor):
        return [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    return [(h, w) for h, w in spatial_shapes]


def _weighted_samples(level_map: torch.Tensor, locations: torch.Tensor,
                      weights: torch.Tensor) -> torch.Tensor:
    """One level and query chunk: map (B*heads, C/heads, H, W), locations (B, q, heads, P, 2),
    weights (B, q, heads, P) -> (B*heads, C/heads, q)."""
    # one sampling batch per (image, head), contiguous (the CPU kernel's fast path)
    grid = (2 * locations - 1).transpose(1, 2).flatten(0, 1)  # (B*heads, q, P, 2)
    samples = F.grid_sample(level_map, grid, mode='bilinear', padding_mode='zeros',
                            align_corners=False)  # (B*heads, C/heads, q, P)
    return (samples * weights.transpose(1, 2).flatten(0, 1)[:, None]).sum(-1)


def _definition(value: torch.Tensor, locations: torch.Tensor, weights: torch.Tensor,
                sizes: List[Size2], recompute: bool) -> torch.Tensor:
    """The attention with the caller's shapes, as (B, C, Q), one (level, query chunk) piece at
    a time; with ``recompute`` each piece is checkpointed on its own."""
    batch, _, heads, head_dim = value.shape
    dtype = torch.promote_types(value.dtype, locations.dtype)
    locations, weights = locations.to(dtype), weights.to(dtype)
    maps, start = [], 0
    for height, width in sizes:
        level = value[:, start:start + height * width].to(dtype).permute(0, 2, 3, 1)
        maps.append(level.reshape(batch * heads, head_dim, height, width))
        start = start + height * width
    queries, points = locations.shape[1], locations.shape[4]
    step = max(1, PIECE_ELEMENTS // max(1, batch * heads * head_dim * points))
    chunks = []
    for first in range(0, queries, step):
        chunk = slice(first, first + step)
        out = None
        for level, level_map in enumerate(maps):
            pieces = (level_map, locations[:, chunk, :, level], weights[:, chunk, :, level])
            term = (checkpoint(_weighted_samples, *pieces, use_reentrant=False) if recompute
                    else _weighted_samples(*pieces))
            out = term if out is None else out + term
        chunks.append(out)
    output = chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=-1)
    return output.unflatten(0, (batch, heads)).flatten(1, 2)


def why_portable(kernel: Optional[DeformAttnKernel], value: torch.Tensor) -> Optional[str]:
    """Why this call runs the definition instead of ``kernel``, or ``None`` if it runs it."""
    return 'no kernel' if kernel is None else why_portable_call(kernel.devices, value)


def _run_kernel(kernel: DeformAttnKernel, value: torch.Tensor, sizes: List[Size2],
                locations: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``kernel`` in the dtype the definition would compute in (cast to the kernel's first dtype
    at the boundary and back if it has no kernel for it), as (B, Q, C)."""
    dtype = torch.promote_types(value.dtype, locations.dtype)
    compute = dtype if dtype in kernel.dtypes else kernel.dtypes[0]
    shapes = torch.tensor(sizes, dtype=torch.long, device=value.device)
    starts = torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]])
    batch = value.shape[0]
    step = batch if batch <= IM2COL_STEP else math.gcd(batch, IM2COL_STEP)
    inputs = (t.to(compute).contiguous() for t in (value, locations, weights))
    value, locations, weights = inputs
    with torch.autocast(value.device.type, enabled=False):  # its inputs stay as cast here
        output = kernel.forward(value, shapes, starts, locations, weights, step)
    return output.to(dtype)


def multi_scale_deformable_attention(value: torch.Tensor, spatial_shapes: SpatialShapes,
                                     sampling_locations: torch.Tensor,
                                     attention_weights: torch.Tensor,
                                     recompute: bool = False,
                                     kernel: Optional[DeformAttnKernel] = None) -> torch.Tensor:
    """Weighted sum of bilinear samples of every level.

    Args:
        value: (B, S, heads, C / heads), the levels' tokens one after the other (S = sum H*W).
        spatial_shapes: (L, 2) tensor or (H, W) pairs of the levels, in ``value``'s order.
        sampling_locations: (B, Q, heads, L, P, 2) in [0, 1], (x, y), (0, 0) the top-left
            corner of the map.
        attention_weights: (B, Q, heads, L, P), normalised over (L, P) by the caller.
        recompute: when a gradient is needed, keep nothing but the inputs for backward and
            sample again there, one piece at a time (the samples, Q * L * P per channel, dwarf
            the inputs). The kernel keeps only its inputs anyway.
        kernel: a compiled kernel to run where :func:`why_portable` allows (first-order
            gradients only: double backward and ``torch.func`` need the definition).

    Returns (B, Q, C) in the wider dtype of ``value`` and the locations (fp32 locations keep
    sub-pixel precision under autocast, and ``grid_sample`` needs one dtype). The definition
    samples one level and query chunk (:data:`PIECE_ELEMENTS`) at a time and accumulates, so
    no stack of all samples is built.
    """
    sizes = _level_sizes(spatial_shapes)
    if why_portable(kernel, value) is None:
        return _run_kernel(kernel, value, sizes, sampling_locations, attention_weights)
    inputs = (value, sampling_locations, attention_weights)
    recompute = recompute and torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    return _definition(*inputs, sizes, recompute).transpose(1, 2)


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

    The compiled kernel is looked up when the module is built (``kernel`` attribute; ``None``
    with the reason in ``kernel_note``) and shown in its repr, with what an eager call on the
    module's device runs (``deform: pytorch grid_sample (float32)``, :meth:`runs`);
    ``MMVIT_EXT_KERNELS=portable`` builds it without one.
    """

    # read by mmvit_ext.engine.determinism: a deterministic CUDA run is refused before it starts
    nondeterministic_cuda_backward = ('deformable attention: atomicAdd in the CUDA backward of '
                                      'the compiled kernel and of grid_sample alike')

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
        self.kernel, self.kernel_note = find_deform_attn_kernel()
        self.reset_parameters()

    def extra_repr(self) -> str:
        kernel = self.kernel.describe() if self.kernel else f'pytorch ({self.kernel_note})'
        return (f'levels={self.num_levels}, heads={self.num_heads}, points={self.num_points}, '
                f'recompute={self.recompute}, kernel={kernel}, deform: {self.runs()}')

    def runs(self) -> str:
        """What an eager call on the module's device runs, and in which dtype, whatever the
        autocast dtype: ``'pytorch grid_sample (float32)'``, or the kernel's name where the
        kernel runs on that device."""
        device = self.value_proj.weight.device.type
        path = self.kernel.name if self.kernel and device in self.kernel.devices else \
            'pytorch grid_sample'
        return f'{path} ({str(self.sampling_dtype())[6:]})'

    def sampling_dtype(self) -> torch.dtype:
        """The dtype the sampling and weighting run in: the wider of the values' and the
        locations' dtypes (:func:`multi_scale_deformable_attention`), the locations being
        float32 (float32 reference points plus offsets), so float32 under bf16 / fp16 autocast
        and in a ``.half()`` model; float64 in a float64 one. The kernel computes in the same
        dtype."""
        return torch.promote_types(self.value_proj.weight.dtype, torch.float32)

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
                                               self.recompute, self.kernel)
        return self.output_proj(out.to(value.dtype))


__all__: Tuple[str, ...] = ('multi_scale_deformable_attention', 'why_portable',
                            'reference_points', 'MSDeformAttn')
