"""Attention's CPU kernel: the explicit product where SDPA's CPU kernels are the slower way.

``F.scaled_dot_product_attention`` on CPU has a fused (flash) kernel, but three kinds of call
run faster as the layer's explicit product
(:func:`mmvit_ext.layers.attention.explicit_attention`: q scaled once, the bias terms added,
softmax in float32, ``@ v``; plain differentiable torch ops, double backward, ``torch.func``
and hooks as usual); the measured speeds are in docs/speed.md ("Attention on CPU"):

* an additive bias that needs a gradient (Swin's relative-position table in training): SDPA
  runs its math composite there, which adds a pass over the map for fully masked rows
  (``isneginf`` / ``all`` / ``where``) and scales q and k separately, work that timm's and
  mmdet's explicit maps do not do;
* bfloat16 maps of at most ``bf16_max_map`` query-key pairs per image and head (Swin's and
  ViTDet's windows, DeiT's 197 tokens, PVTv2's later stages): one oneDNN bf16 matmul over a
  small map outruns the flash kernel's blocks, forward and backward. Larger maps to train keep
  SDPA, which never materialises them: the explicit product keeps each map for backward
  (float32 probabilities and their bf16 copy), and on PVTv2's first stages that memory costs
  more than the time it saves;
* bfloat16 maps of any size that need no gradient (inference): nothing is kept for backward,
  and the bf16 matmuls outrun the flash kernel on large maps too (PVTv2's first stages,
  ViTDet's global blocks). They run in pieces of at most ``bf16_piece_map`` query-key pairs
  (whole maps of several images or windows, or query rows of one image's maps); a piece's
  float32 probabilities take 8 MB at 2**21 pairs, small enough that glibc's default heap
  faults few of their pages in anew, large enough to give ViTDet's matmuls rows to work on.

The bfloat16 rules hold only where oneDNN has bf16 matmuls (AVX-512 bf16, AMX): elsewhere
torch's bf16 GEMM is a slow fallback, so SDPA keeps those calls.

float16 always runs SDPA: without a float16 matmul in oneDNN (no AVX-512 FP16 / AMX) the
explicit product has no fast GEMM to run on. The biases our models pass are finite (Swin's
shift mask is -100), so no row is fully masked and the two paths agree up to rounding.
Everywhere else (other devices, float32 without a bias gradient, export, ``torch.compile``)
SDPA runs.
"""
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from .ms_deform_attn import PORTABLE_ENV, call_blocker, kernels_enabled


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd records a call on ``tensors`` (grad mode on, one of them requires it)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


@dataclass(frozen=True)
class ExplicitAttentionKernel:
    """Where the explicit product replaces SDPA: on ``devices``, for a bias with a gradient
    (any dtype of ``dtypes``), for bfloat16 maps of at most ``bf16_max_map`` query-key pairs per
    image and head, and for bfloat16 maps of any size that need no gradient, in pieces of at
    most ``bf16_piece_map`` pairs (:meth:`piece`). ``bf16_max_map=0``: no bfloat16 rule, where
    the CPU has no native bf16 matmul."""

    devices: Tuple[str, ...] = ('cpu',)
    dtypes: Tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.bfloat16)
    bf16_max_map: int = 2 ** 18
    bf16_piece_map: int = 2 ** 21

    def describe(self) -> str:
        """What an attention's repr shows, e.g. ``'explicit (cpu: bias with grad; bf16 maps
        <= 262144, any without grad); sdpa elsewhere'``."""
        bf16 = f'; bf16 maps <= {self.bf16_max_map}, any without grad' \
            if self.bf16_max_map else ''
        return f'explicit ({", ".join(self.devices)}: bias with grad{bf16}); sdpa elsewhere'

    def blocker(self, q: torch.Tensor, k: torch.Tensor, bias_terms: Sequence[torch.Tensor]
                ) -> Optional[str]:
        """Why this call runs SDPA instead of the explicit product, or ``None``."""
        if q.dtype not in self.dtypes:
            return f'{q.dtype} (SDPA faster)'
        if any(t.dtype == torch.bool for t in bias_terms):
            return 'boolean mask'
        blocked = call_blocker(self.devices, q)  # before any arithmetic on (symbolic) sizes
        if blocked is not None:
            return blocked
        if needs_grad(*bias_terms):
            return None
        if q.dtype == torch.bfloat16 and self.bf16_max_map and (
                not needs_grad(q, k, *bias_terms)
                or q.shape[-2] * k.shape[-2] <= self.bf16_max_map):
            return None
        return 'fused kernel'  # float32 without a bias gradient, or a large bf16 map to train

    def piece(self, q: torch.Tensor, k: torch.Tensor, bias_terms: Sequence[torch.Tensor]
              ) -> Tuple[int, int]:
        """``(items, rows)``: the explicit product of a call it runs, in pieces of that many
        items of q's first dimension (images, windows) and query rows. The whole call, or
        (bfloat16 without a gradient) pieces of at most ``bf16_piece_map`` query-key pairs:
        whole maps of several items, or rows of one item's maps where one is larger."""
        items, rows = q.shape[0], q.shape[-2]
        if q.dtype != torch.bfloat16 or needs_grad(q, k, *bias_terms):
            return items, rows
        pairs_per_row = math.prod(q.shape[1:-2]) * k.shape[-2]
        if pairs_per_row * rows <= self.bf16_piece_map:
            return min(items, self.bf16_piece_map // (pairs_per_row * rows)), rows
        return 1, max(1, self.bf16_piece_map // pairs_per_row)


def cpu_has_bf16_matmul() -> bool:
    """Whether oneDNN multiplies bfloat16 natively on this CPU (AVX-512 bf16 or AMX); elsewhere
    a bf16 matmul is emulated (AVX-512) or torch's fallback GEMM (AVX2), far slower than
    float32. False where this torch cannot say."""
    try:
        return bool(torch.backends.mkldnn.is_available()
                    and (torch.cpu._is_avx512_bf16_supported()
                         or torch.cpu._is_amx_tile_supported()))
    except (AttributeError, RuntimeError):
        return False


def find_attention_kernel() -> Tuple[Optional[ExplicitAttentionKernel], str]:
    """The kernel, or ``(None, why not)`` (``MMVIT_EXT_KERNELS=portable``); read at build.
    Its bf16 rule only where the CPU has a bf16 matmul (:func:`cpu_has_bf16_matmul`)."""
    if not kernels_enabled():
        return None, f'{PORTABLE_ENV}=portable'
    return (ExplicitAttentionKernel() if cpu_has_bf16_matmul()
            else ExplicitAttentionKernel(bf16_max_map=0)), ''


def attention_kernel_piece(kernel: Optional[ExplicitAttentionKernel], q: torch.Tensor,
                           k: torch.Tensor, bias_terms: Sequence[torch.Tensor]
                           ) -> Optional[Tuple[int, int]]:
    """The pieces ``(items, rows)`` where ``kernel``'s explicit product runs this call
    (:meth:`ExplicitAttentionKernel.piece`), ``None`` where SDPA does."""
    if kernel is None or kernel.blocker(q, k, bias_terms) is not None:
        return None
    return kernel.piece(q, k, bias_terms)


__all__ = ['ExplicitAttentionKernel', 'attention_kernel_piece', 'cpu_has_bf16_matmul',
           'find_attention_kernel']
