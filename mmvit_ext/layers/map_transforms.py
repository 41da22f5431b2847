"""Attention-map transforms of the deep-ViT papers, each acting on (..., H, N, M) maps.

* :class:`ReAttention` (DeepViT): a learnable H x H mixing of the post-softmax maps (a 1x1 conv
  over heads), BatchNorm over heads, times ``scale``.
* :class:`TalkingHeads` (CaiT): a linear H x H head mixing, before (logits) or after the softmax.
* :class:`RefinerMap` (Refined-ViT): expand H maps to r*H (1x1 conv), a depthwise k x k conv on
  every expanded map (distributed local attention), reduce back to H (1x1 conv), residual, then
  BatchNorm over heads and ``scale``.

Leading dimensions (batch, windows) are folded, so the transforms work inside windows too.
"""
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import torch_compat
from .attention import POST_SOFTMAX, PRE_SOFTMAX, MapTransform, fold_leading


def _mix_heads(attn: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``out_g = sum_h W[g, h] attn_h + b_g`` over the head axis of (..., H, N, M) maps."""
    maps = fold_leading(attn)  # (prod(...), H, N, M) for 2-D conv / BN
    batch, heads = maps.shape[:2]
    flat = maps.flatten(2)
    out = torch.baddbmm(bias.to(flat.dtype).view(1, heads, 1).expand(batch, heads, flat.shape[2]),
                        weight.to(flat.dtype).expand(batch, heads, heads), flat)
    return out.view(attn.shape)


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
            return (self.norm(out) * self.scale).reshape(attn.shape)
        # inference: BatchNorm and the output scale folded into the mixing weights and bias
        gain = self.norm.weight * torch.rsqrt(self.norm.running_var + self.norm.eps)
        weight = weight * (gain * self.scale)[:, None]
        bias = ((self.mix.bias - self.norm.running_mean) * gain + self.norm.bias) * self.scale
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
            recompute the r*H expanded ones there (``torch.utils.checkpoint``, non-reentrant):
            the expanded maps are what made Refined-ViT's training memory several times
            DeepViT's. The recomputation normalises with the batch statistics, as the forward
            did, without counting the batch in the running statistics a second time; hooks on
            the inner convolutions and BatchNorms fire again during backward.
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
        if (self.recompute and self.training and torch.is_grad_enabled()
                and not torch_compat.is_compiling()):
            out = checkpoint(self.refine, maps, [], use_reentrant=False)
        else:
            out = self.refine(maps)
        return out.reshape(attn.shape)

    def refine(self, maps: torch.Tensor, calls: Optional[List[None]] = None) -> torch.Tensor:
        """The Refiner on folded maps (B, H, N, M). ``calls`` counts the calls of one checkpointed
        forward: a second call is the recomputation for backward."""
        again = calls is not None and len(calls) > 0
        if calls is not None:
            calls.append(None)

        def norm(bn: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
            if again and bn.training and bn.track_running_stats:
                # the forward's op on copies of the running statistics: the same batch
                # statistics and saved tensors, the module's statistics left as they are
                return F.batch_norm(x, bn.running_mean.clone(), bn.running_var.clone(),
                                    bn.weight, bn.bias, True, 0.0, bn.eps)
            return bn(x)

        x = maps
        if self.expand:
            x = F.relu6(norm(self.bn1, self.conv_exp(x)))
        x = F.relu6(norm(self.bn2, self.depth_sep_conv(x)))
        x = norm(self.bn3, self.conv_pro(x)) + maps
        return norm(self.adapt_bn, x) * self.scale
