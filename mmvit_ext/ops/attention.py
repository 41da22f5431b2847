"""Attention's CPU kernel for an additive bias that needs a gradient: the explicit product.

``F.scaled_dot_product_attention`` on CPU has a fused kernel for a bias without a gradient;
for one with a gradient (Swin's relative-position table in training) it runs its math
composite, which adds a pass over the map for fully masked rows (``isneginf`` / ``all`` /
``where``) and scales q and k separately: ~3 % of a Swin-T training step on 2 cores, what
timm's and mmdet's Swin (explicit maps) do not pay. There the layer runs its explicit product
(:func:`mmvit_ext.layers.attention.explicit_attention`: q scaled once, the bias terms added,
softmax, ``@ v``), plain differentiable torch ops (double backward, ``torch.func``, hooks as
usual). The biases our models pass are finite (Swin's shift mask is -100), so no row is fully
masked and the two agree up to rounding. Everywhere else (other devices, a bias without a
gradient, export, ``torch.compile``) SDPA runs.
"""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from .ms_deform_attn import PORTABLE_ENV, call_blocker, kernels_enabled


@dataclass(frozen=True)
class BiasGradAttention:
    """Where the explicit product replaces SDPA: ``devices``, for a bias with a gradient."""

    devices: Tuple[str, ...] = ('cpu',)

    def describe(self) -> str:
        """What an attention's repr shows: ``'explicit (cpu, bias with grad); sdpa elsewhere'``."""
        return f'explicit ({", ".join(self.devices)}, bias with grad); sdpa elsewhere'


def find_attention_kernel() -> Tuple[Optional[BiasGradAttention], str]:
    """The kernel, or ``(None, why not)`` (``MMVIT_EXT_KERNELS=portable``); read at build."""
    if not kernels_enabled():
        return None, f'{PORTABLE_ENV}=portable'
    return BiasGradAttention(), ''


def attention_kernel_blocker(kernel: Optional[BiasGradAttention], q: torch.Tensor,
                             bias_terms: Sequence[torch.Tensor]) -> Optional[str]:
    """Why this call runs SDPA instead of ``kernel``'s explicit product, or ``None``."""
    if kernel is None:
        return 'no kernel'
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in bias_terms)):
        return 'no bias gradient'  # SDPA's fused CPU kernel takes it
    if any(t.dtype == torch.bool for t in bias_terms):
        return 'boolean mask'
    return call_blocker(kernel.devices, q)


__all__ = ['BiasGradAttention', 'find_attention_kernel', 'attention_kernel_blocker']
