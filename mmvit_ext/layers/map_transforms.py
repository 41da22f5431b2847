"""Attention-map transforms of the deep-ViT papers, each acting on (..., H, N, M) maps.

* :class:`ReAttention` (DeepViT): a learnable H x H mixing of the post-softmax maps (a 1x1 conv
  over heads), BatchNorm over heads, times ``scale``.
* :class:`TalkingHeads` (CaiT): a linear H x H head mixing, before (logits) or after the softmax.
* :class:`RefinerMap` (Refined-ViT): expand H maps to r*H (1x1 conv), a depthwise k x k conv on
  every expanded map (distributed local attention), reduce back to H (1x1 conv), residual, then
  BatchNorm over heads and ``scale``; with frozen norms, folded and a band of map rows at a time.

Leading dimensions (batch, windows) are folded, so the transforms work inside windows too.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import torch_compat
from ..errors import ConfigError
from .attention import POST_SOFTMAX, PRE_SOFTMAX, MapTransform, fold_leading
from .checkpoint import recomputing


def _mix_heads(attn: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``out_g = sum_h W[g, h] attn_h + b_g`` over the head axis of (..., H, N, M) maps: a 1x1
    convolution over heads (G x H ``weight``) as a batched matmul, (..., G, N, M) out."""
    maps = fold_leading(attn)  # (prod(...), H, N, M); rows of a map may be a slice of it
    batch, groups = maps.shape[0], weight.shape[0]
    flat = maps.flatten(2)
    out = torch.baddbmm(bias.to(flat.dtype).view(1, groups, 1).expand(batch, groups, flat.shape[2]),
                        weight.to(flat.dtype).expand(batch, *weight.shape), flat)
    return out.view(*attn.shape[:-3], groups, *attn.shape[-2:])


def _bn_affine(norm: nn.BatchNorm2d) -> Tuple[torch.Tensor, torch.Tensor]:
    """An inference BatchNorm (running statistics) as ``x * gain + shift`` per channel."""
    gain = torch.rsqrt(norm.running_var + norm.eps)
    if norm.weight is not None:
        gain = gain * norm.weight
    shift = -norm.running_mean * gain
    return gain, shift if norm.bias is None else shift + norm.bias


class ReAttention(MapTransform):
    """DeepViT re-attention: ``BN(Theta^T attn) * scale`` (Zhou et al., 2021, Eq. 3).

    Args:
        num_heads: H.
        scale: output gain; the official ``transform_scale`` models use head_dim ** -0.5.
    """

    stage = POST_SOFTMAX

    def __init__(self, num_heads: int, scale: float = 1.0) -> None:
        super().__init__()
        self.mix = nn.Conv2d(num_heads, num_heads, kernel_size=1)
        self.norm = nn.BatchNorm2d(num_heads)
        self.scale = scale

    def forward(self, attn: torch.Tensor) -> torch.Tensor:
        maps = fold_leading(attn)  # (prod(...), H, N, M) for 2-D conv / BN
        heads = maps.shape[1]
        weight = self.mix.weight.view(heads, heads)  # the 1x1 conv as a batched matmul
        if self.norm.training or self.norm.running_mean is None:
            out = _mix_heads(maps, weight, self.mix.bias)
            out = _uncounted(self.norm, out) if recomputing() else self.norm(out)
            return (out * self.scale).reshape(attn.shape)
        # inference: BatchNorm and the output scale folded into the mixing weights and bias
        gain, shift = _bn_affine(self.norm)
        weight = weight * (gain * self.scale)[:, None]
        bias = (self.mix.bias * gain + shift) * self.scale
        return _mix_heads(attn, weight, bias)


class TalkingHeads(MapTransform):
    """CaiT talking heads: a linear map over the head axis, ``out_g = sum_h W[g, h] a_h + b_g``."""

    def __init__(self, num_heads: int, stage: str = PRE_SOFTMAX) -> None:
        super().__init__()
        if stage not in (PRE_SOFTMAX, POST_SOFTMAX):
            raise ValueError(f'TalkingHeads: stage must be {PRE_SOFTMAX!r} or {POST_SOFTMAX!r}, '
                             f'got {stage!r}')
        self.stage = stage
        self.proj = nn.Linear(num_heads, num_heads)

    def forward(self, attn: torch.Tensor) -> torch.Tensor:
        # heads-first batched matmul: no copy to a heads-last layout, no K=H matmul
        return _mix_heads(attn, self.proj.weight, self.proj.bias)


class RefinerMap(MapTransform):
    """Refiner: expansion, distributed local attention, reduction, residual; BN and ``scale``.

    Args:
        num_heads: H.
        expand_ratio: r; the expanded map count is ``round(r * H)`` (r = 1 skips the expansion).
        kernel_size: k of the depthwise convolution over every N x M map ("same" padding).
        scale: output gain (the official shared-map blocks use head_dim ** -0.5).
        recompute: in training with gradients, keep only the H input maps for backward and
            recompute the r*H expanded ones there, H at a time (``torch.utils.checkpoint``,
            non-reentrant, one group of expanded channels per checkpoint; also inside a
            ``torch.compile`` graph): the expanded maps are what made Refined-ViT's training
            memory several times DeepViT's. Every expanded channel has its own BatchNorm
            statistics, so the groups are exact. The checkpointed groups are pure functions
            that also return their batch statistics; the running statistics are updated from
            those once per forward, outside the recomputed region. This path calls the inner
            layers' weights functionally: hooks on them fire only with ``recompute=False``
            and training norms. Its statistics are this process's batch only, so a Refiner
            whose norms were made SyncBatchNorm (mmengine's ``sync_bn``,
            ``convert_sync_batchnorm``), or any norm other than plain BatchNorm, is refused in
            training with one line: build with ``recompute=False`` (RefinedViT
            ``recompute_maps=False``), whose modules synchronise as configured.

    With frozen norms (inference, or ``norm_eval`` outside the recompute) the Refiner runs
    folded: each BatchNorm is an affine map folded into its convolution (and ``scale`` into the
    last), and the map's rows are refined a band at a time (:func:`refiner_band_rows`, each
    band with the k // 2 rows around it that the local convolution reads), the expanded band
    channels-last. Equal to the modules up to rounding
    (tests/test_refiner_inference.py); the r*H expanded maps never exist whole. Its inner
    modules' hooks do not fire there.
    """

    stage = POST_SOFTMAX

    def __init__(self, num_heads: int, expand_ratio: float = 3, kernel_size: int = 3,
                 scale: float = 1.0, recompute: bool = True) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f'RefinerMap: kernel_size must be a positive odd int, got {kernel_size}')
        hidden = round(num_heads * expand_ratio)
        self.expand = expand_ratio != 1
        if self.expand:
            self.conv_exp = nn.Conv2d(num_heads, hidden, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(hidden)
        self.depth_sep_conv = nn.Conv2d(hidden, hidden, kernel_size, padding=kernel_size // 2,
                                        groups=hidden, bias=False)
        self.bn2 = nn.BatchNorm2d(hidden)
        self.conv_pro = nn.Conv2d(hidden, num_heads, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(num_heads)
        self.adapt_bn = nn.BatchNorm2d(num_heads)
        self.scale = scale
        self.recompute = recompute

    def forward(self, attn: torch.Tensor) -> torch.Tensor:
        maps = fold_leading(attn)  # (prod(...), H, N, M) for 2-D conv / BN
        if self.recompute and self.training and torch.is_grad_enabled():
            self._check_plain_norms()
            out = self._refine_recomputed(maps)
        elif self._norms_frozen():
            out = self._refine_folded(maps)
        else:
            out = self._refine(maps, count=not recomputing())
        return out.reshape(attn.shape)

    def _norms_frozen(self) -> bool:
        """Every norm normalises with its running statistics (inference, or ``norm_eval``)."""
        return all(not norm.training and getattr(norm, 'running_mean', None) is not None
                   for norm in (getattr(self, 'bn1', None), self.bn2, self.bn3, self.adapt_bn)
                   if norm is not None)

    def _check_plain_norms(self) -> None:
        """The recompute reproduces BatchNorm's own forward per channel group; refuse others."""
        for name in ('bn1', 'bn2', 'bn3', 'adapt_bn'):
            norm = getattr(self, name, None)
            if norm is not None and norm.training and type(norm).forward is not _BN_FORWARD:
                raise ConfigError(
                    f'RefinerMap.{name} is {type(norm).__name__}: the Refiner recompute '
                    f'(recompute_maps=True) normalises with this process\'s batch only and '
                    f'cannot synchronise it; set recompute_maps=False (RefinerMap recompute=False)')

    def _refine(self, maps: torch.Tensor, count: bool = True) -> torch.Tensor:
        """The Refiner through its modules, on folded maps (B, H, N, M); ``count``: the norms
        update their running statistics."""
        def norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return module(x) if count else _uncounted(module, x)

        x = maps
        # ReLU6 in place: BatchNorm's backward needs its input, not its output
        if self.expand:
            x = F.relu6(norm(self.bn1, self.conv_exp(x)), inplace=True)
        x = F.relu6(norm(self.bn2, self.depth_sep_conv(x)), inplace=True)
        x = norm(self.bn3, self.conv_pro(x)) + maps
        return norm(self.adapt_bn, x) * self.scale

    def _refine_folded(self, maps: torch.Tensor) -> torch.Tensor:
        """:meth:`_refine` with frozen norms, on folded maps (B, H, N, M): the norms and
        ``scale`` folded into the convolutions, the map's rows taken a band at a time (each
        band with the ``k // 2`` rows around it that its local convolution reads), so that the
        r*H expanded maps exist for one band only (:func:`refiner_band_rows`)."""
        folded = self._folded_weights(maps.dtype)
        pad = self.depth_sep_conv.padding[0]
        n = maps.shape[-2]
        rows = refiner_band_rows(maps, self.depth_sep_conv.out_channels, pad)
        if rows is None or rows >= n:
            return self._refine_band(maps, maps, (pad, pad), folded)  # one band: any size
        out = torch.empty_like(maps)
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            low, high = max(start - pad, 0), min(stop + pad, n)
            out[:, :, start:stop] = self._refine_band(
                maps[:, :, low:high], maps[:, :, start:stop],
                (pad - (start - low), pad - (high - stop)), folded)
        return out

    def _folded_weights(self, dtype: torch.dtype) -> Tuple[Optional[torch.Tensor], ...]:
        """Inference weights: expansion (H x r*H) and its bias, the local convolution
        (r*H, 1, k, k) and bias, reduction (H x r*H) and bias, the residual's gain (H, 1):
        ``out = reduce(local(expand(maps))) + gain * maps``, BatchNorms and ``scale`` in them."""
        expand = expand_bias = None
        if self.expand:
            gain1, expand_bias = _bn_affine(self.bn1)
            expand = (self.conv_exp.weight.flatten(1) * gain1[:, None]).t().to(dtype)
            expand_bias = expand_bias.to(dtype)
        gain2, local_bias = _bn_affine(self.bn2)
        local = self.depth_sep_conv.weight * gain2[:, None, None, None]
        gain3, shift3 = _bn_affine(self.bn3)
        gain_out, shift_out = _bn_affine(self.adapt_bn)
        residual = gain_out * self.scale  # adapt_bn(bn3(reduced) + maps) * scale
        reduce = self.conv_pro.weight.flatten(1) * (gain3 * residual)[:, None]
        reduce_bias = (shift3 * gain_out + shift_out) * self.scale
        return (expand, expand_bias, local.to(dtype), local_bias.to(dtype), reduce.to(dtype),
                reduce_bias[:, None].to(dtype), residual[:, None].to(dtype))

    def _refine_band(self, band: torch.Tensor, rows: torch.Tensor, pads: Tuple[int, int],
                     folded: Tuple[Optional[torch.Tensor], ...]) -> torch.Tensor:
        """The folded Refiner's output for input ``rows`` (B, H, R, M), from ``band``: those rows
        with the neighbours the local convolution reads, short of ``pads`` (top, bottom) rows of
        k // 2 each at the map's edges, where the convolution reads zeros. The expanded band is
        made channels-last ((B, rows, M, r*H) in memory), the layout in which the depthwise
        convolution vectorises over channels; the expansion and reduction read it transposed."""
        expand, expand_bias, local, local_bias, reduce, reduce_bias, residual = folded
        batch, width = band.shape[0], band.shape[-1]
        flat = band.flatten(2).transpose(1, 2)  # (B, pixels, H), a view
        if expand is not None:
            x = torch.baddbmm(expand_bias, flat, expand.expand(batch, *expand.shape))
            x = F.relu6(x, inplace=True)  # (B, pixels, r*H)
        else:
            x = flat.contiguous()
        x = x.view(batch, -1, width, x.shape[-1])  # (B, rows, M, r*H)
        if pads != (0, 0):
            x = F.pad(x, (0, 0, 0, 0, pads[0], pads[1]))  # the map's zero rows at its edges
        pad = local.shape[-1] // 2
        x = F.conv2d(x.permute(0, 3, 1, 2), local, local_bias, padding=(0, pad),
                     groups=local.shape[0])  # (B, r*H, R, M), channels-last
        x = F.relu6(x, inplace=True).permute(0, 2, 3, 1).flatten(1, 2)  # (B, R*M, r*H)
        out = torch.baddbmm(reduce_bias, reduce.expand(batch, *reduce.shape), x.transpose(1, 2))
        return out.addcmul_(rows.flatten(2), residual).view(rows.shape)

    def _refine_recomputed(self, maps: torch.Tensor) -> torch.Tensor:
        """:meth:`_refine` with the expanded maps made H channels at a time, each group
        checkpointed on its own, so backward holds one group's maps, not all r*H. The groups
        and the tail return their batch statistics, counted here once (not when ``with_cp``
        recomputes the whole block)."""
        hidden, step = self.depth_sep_conv.out_channels, self.conv_pro.out_channels
        reduced, group_stats = None, []
        for start in range(0, hidden, step):
            part, *stats = checkpoint(self._expanded_group, maps, start,
                                      min(start + step, hidden), use_reentrant=False)
            reduced = part if reduced is None else reduced + part
            group_stats.append(stats)
        out, *tail_stats = checkpoint(self._residual_tail, maps, reduced, use_reentrant=False)
        if not recomputing():
            mean1, var1, mean2, var2 = (torch.cat(s) for s in zip(*group_stats))
            if self.expand:
                _count_batch(self.bn1, mean1, var1)
            _count_batch(self.bn2, mean2, var2)
            _count_batch(self.bn3, *tail_stats[:2])
            _count_batch(self.adapt_bn, *tail_stats[2:])
        return out

    def _expanded_group(self, maps: torch.Tensor, start: int, stop: int
                        ) -> Tuple[torch.Tensor, ...]:
        """Expanded channels [start, stop): expansion, local conv, their share of the
        reduction; and the batch statistics (mean, var) of the group's bn1 and bn2 inputs."""
        group = slice(start, stop)
        if self.expand:
            x = F.conv2d(maps, self.conv_exp.weight[group])
            x, mean1, var1 = _batch_norm(self.bn1, x, group)
            x = F.relu6(x, inplace=True)
        else:
            x, mean1, var1 = maps[:, group], maps.new_empty(0), maps.new_empty(0)
        x = F.conv2d(x, self.depth_sep_conv.weight[group], padding=self.depth_sep_conv.padding,
                     groups=stop - start)
        x, mean2, var2 = _batch_norm(self.bn2, x, group)
        x = F.relu6(x, inplace=True)
        return F.conv2d(x, self.conv_pro.weight[:, group]), mean1, var1, mean2, var2

    def _residual_tail(self, maps: torch.Tensor, reduced: torch.Tensor
                       ) -> Tuple[torch.Tensor, ...]:
        """``adapt_bn(bn3(reduced) + maps) * scale``, and the batch statistics of both norms."""
        x, mean3, var3 = _batch_norm(self.bn3, reduced)
        out, mean4, var4 = _batch_norm(self.adapt_bn, x + maps)
        return out * self.scale, mean3, var3, mean4, var4


_BN_FORWARD = nn.BatchNorm2d.forward  # the forward the recompute reproduces functionally

# bytes of expanded maps (r*H channels, halo rows included) one band of the frozen-norm Refiner
# holds on CPU: within a last-level cache, and under glibc's largest mmap threshold (32 MiB),
# so that the bands' buffers come back from the heap instead of faulting fresh pages in
REFINER_BAND_BYTES = 8 * 2 ** 20


def refiner_band_rows(maps: torch.Tensor, hidden: int, pad: int) -> Optional[int]:
    """Map rows per band of the frozen-norm Refiner on folded ``maps`` (B, H, N, M) expanded to
    ``hidden`` channels; ``None`` (or ``N`` or more) means one band.

    * traced, compiled or exported: one band, so that a graph holds no size-dependent loop and
      serves every input size;
    * CPU tensors: bands of :data:`REFINER_BAND_BYTES` of expanded maps, which stay in cache;
    * every other device (CUDA): bands whose expanded maps hold half as many elements as the
      input map, about 2r (r = hidden / H) bands of large kernels: the r*H expanded maps never
      exist whole, and the Refiner adds about half a map to the memory of attention.
    """
    if torch.jit.is_tracing() or torch_compat.is_compiling() or torch_compat.is_exporting():
        return None
    if maps.device.type != 'cpu':
        return max(1, math.ceil(maps.shape[-2] * maps.shape[1] / (2 * hidden)))
    row_bytes = maps.shape[0] * hidden * maps.shape[-1] * maps.element_size()
    return max(1, REFINER_BAND_BYTES // row_bytes - 2 * pad)


def _uncounted(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` with its running statistics left as they were (a recomputation: the module
    runs, synchronising if it does, and its buffers are restored)."""
    buffers = [b for b in (getattr(norm, 'running_mean', None), getattr(norm, 'running_var', None),
                           getattr(norm, 'num_batches_tracked', None)) if b is not None]
    if not (norm.training and buffers):
        return norm(x)
    saved = [b.clone() for b in buffers]
    try:
        return norm(x)
    finally:  # also when the recomputation stops early, raising inside ``norm``
        with torch.no_grad():
            for buffer, value in zip(buffers, saved):
                buffer.copy_(value)


def _batch_norm(bn: nn.BatchNorm2d, x: torch.Tensor, group: slice = slice(None)
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``bn`` on channels ``group`` of its features (``x`` holds just those), as a pure
    function: the output, and the batch mean and unbiased variance that the module would count
    in its running statistics (empty when it counts none; :func:`_count_batch` counts them)."""
    weight = bn.weight[group] if bn.weight is not None else None
    bias = bn.bias[group] if bn.bias is not None else None
    none = x.new_empty(0)
    if bn.running_mean is None:  # track_running_stats=False: batch statistics always
        return F.batch_norm(x, None, None, weight, bias, True, 0.0, bn.eps), none, none
    if not bn.training:
        return F.batch_norm(x, bn.running_mean[group], bn.running_var[group], weight, bias,
                            False, 0.0, bn.eps), none, none
    # momentum 1: the "running" statistics become exactly this batch's
    mean = torch.zeros_like(bn.running_mean[group])
    var = torch.ones_like(bn.running_var[group])
    return F.batch_norm(x, mean, var, weight, bias, True, 1.0, bn.eps), mean, var


def _count_batch(bn: nn.BatchNorm2d, mean: torch.Tensor, var: torch.Tensor) -> None:
    """Count a batch of statistics ``mean``, ``var`` (from :func:`_batch_norm`) in ``bn``'s
    running statistics, as its forward in training does (``momentum=None``: cumulative)."""
    if not (bn.training and bn.track_running_stats and bn.running_mean is not None):
        return
    with torch.no_grad():
        bn.num_batches_tracked.add_(1)
        momentum = bn.momentum if bn.momentum is not None else \
            bn.num_batches_tracked.double().reciprocal()  # a tensor: no sync, no graph break
        bn.running_mean.mul_(1 - momentum).add_(mean * momentum)
        bn.running_var.mul_(1 - momentum).add_(var * momentum)
