"""Which fused kernel of ``F.scaled_dot_product_attention`` takes which operands, written once as
data from PyTorch's own gates (torch 2.11: ``aten/src/ATen/native/transformers/sdp_utils_cpp.h``
and ``sdp_utils_cpp.cpp`` for the CPU, ``cuda/sdp_utils.cpp`` for CUDA).

Where no fused kernel takes a call, SDPA runs its math fallback: an unfused product that, on the
CPU, upcasts bfloat16 / float16 operands to float32. An attention layer asks
:func:`fused_sdpa_kernel` before it calls SDPA and takes its explicit path instead (matmuls in
the dtype autocast gives them, softmax in float32), so that ``fused`` in a repr means a fused
kernel, in the dtype asked for. Nothing here depends on the CPU kind or on timings.

What the table leaves out, because our layers always meet it: q, k, v are 4-D (leading dims
folded into the batch) with the last stride 1 and non-empty sequences; a mask is handed over as
one 2-D or 4-D tensor with the last stride 1 (:func:`mmvit_ext.layers.attention.sdpa_mask`).
What it cannot see: the GPU generation (the CUDA rows are those of sm80 and newer) and kernels
turned off with ``torch.backends.cuda.enable_*_sdp(False)``. On a device without rows
(``meta``, which stands for CUDA in the shape tests, ``mps``, ``xpu``) SDPA is called as it is.
"""
from typing import FrozenSet, NamedTuple, Optional, Sequence, Tuple

import torch

# what a kernel takes as ``attn_mask``
MASK_NONE = 'no mask'
MASK_DENSE = 'a 2-D / 4-D mask without grad'  # torch's check_attn_mask_shape
MASK_ANY = 'any mask, with grad too'
# what an attention call hands over as ``attn_mask``
FIXED = 'fixed'      # a mask that does not require grad (shift mask, a bias in inference)
LEARNED = 'learned'  # a mask that requires grad (a position bias being trained)

_HALF = frozenset({torch.float16, torch.bfloat16})


class SdpaKernel(NamedTuple):
    """One fused kernel behind ``F.scaled_dot_product_attention`` and the operands it takes."""
    name: str
    device: str
    dtypes: FrozenSet[torch.dtype]
    mask: str                   # MASK_NONE / MASK_DENSE / MASK_ANY
    dropout: bool               # takes dropout_p > 0
    same_value_dim: bool        # q, k and v head dims equal (else q, k equal, v free)
    half_alignment: int = 1     # head dims a multiple of this in float16 / bfloat16 ...
    full_alignment: int = 1     # ... and in float32
    max_head_dim: Optional[int] = None

    def takes(self, dtype: torch.dtype, qk_dim: int, v_dim: int, mask: Optional[str],
              dropout: bool) -> bool:
        """Whether this kernel runs a call with these operands."""
        if dtype not in self.dtypes or (dropout and not self.dropout):
            return False
        if mask is not None and (self.mask == MASK_NONE
                                 or (mask == LEARNED and self.mask != MASK_ANY)):
            return False
        if self.same_value_dim and qk_dim != v_dim:
            return False
        align = self.half_alignment if dtype in _HALF else self.full_alignment
        if qk_dim % align or v_dim % align:
            return False
        return self.max_head_dim is None or max(qk_dim, v_dim) <= self.max_head_dim


# in torch's order of preference per device (CUDA may put cuDNN first on sm90 / sm100)
SDPA_KERNELS: Tuple[SdpaKernel, ...] = (
    # use_flash_attention_cpp: no dropout, mask shape / no grad, equal head dims
    SdpaKernel('cpu flash', 'cpu', frozenset({torch.float32, torch.float64, *_HALF}),
               MASK_DENSE, dropout=False, same_value_dim=True),
    # can_use_flash_attention: no mask, equal head dims <= 256, half precision
    SdpaKernel('cuda flash', 'cuda', _HALF, MASK_NONE, dropout=True, same_value_dim=True,
               max_head_dim=256),
    # can_use_mem_efficient_attention: any mask (its gradient too), q / k dims equal,
    # minimum_gemm_alignment on sm80+: 128 bits of the dtype
    SdpaKernel('cuda mem-efficient', 'cuda', frozenset({torch.float32, *_HALF}), MASK_ANY,
               dropout=True, same_value_dim=False, half_alignment=8, full_alignment=4),
    # can_use_cudnn_attention: check_attn_mask_shape as the CPU, half precision
    SdpaKernel('cuda cudnn', 'cuda', _HALF, MASK_DENSE, dropout=True, same_value_dim=True,
               half_alignment=8, max_head_dim=256),
)


def ungated(device: str) -> SdpaKernel:
    """SDPA on a device whose gates are not in the table (``meta``, ``mps``, ``xpu`` ...):
    called as it is, PyTorch picking its kernel."""
    return SdpaKernel(f'{device} sdpa', device, frozenset(), MASK_ANY, dropout=True,
                      same_value_dim=False)


def fused_sdpa_kernel(device: str, dtype: torch.dtype, qk_dim: int, v_dim: int,
                      mask: Optional[str] = None, dropout: bool = False,
                      kernels: Sequence[SdpaKernel] = SDPA_KERNELS) -> Optional[SdpaKernel]:
    """The first fused kernel on ``device`` (``'cpu'``, ``'cuda'``) that takes the call, or
    ``None`` where SDPA would run its math fallback (:func:`ungated` on other devices).
    ``mask`` is ``None``, :data:`FIXED` or :data:`LEARNED`."""
    rows = [kernel for kernel in kernels if kernel.device == device]
    if not rows:
        return ungated(device)
    for kernel in rows:
        if kernel.takes(dtype, qk_dim, v_dim, mask, dropout):
            return kernel
    return None


def mask_kind(terms: Sequence[torch.Tensor]) -> Optional[str]:
    """What the sum of bias ``terms`` is as an SDPA mask: ``None``, :data:`FIXED` or
    :data:`LEARNED` (requires grad, as torch's gate reads it)."""
    if not terms:
        return None
    learned = torch.is_grad_enabled() and any(term.requires_grad for term in terms)
    return LEARNED if learned else FIXED


def kernel_for_call(q: torch.Tensor, v: torch.Tensor, terms: Sequence[torch.Tensor],
                    dropout_p: float, qk_dim: Optional[int] = None) -> Optional[SdpaKernel]:
    """:func:`fused_sdpa_kernel` for queries ``q`` (..., H, N, d), values ``v``, the bias
    ``terms`` summed into the mask and ``dropout_p``; ``qk_dim`` overrides q's head dim (q and
    k widened by a fold)."""
    return fused_sdpa_kernel(q.device.type, q.dtype, qk_dim or q.shape[-1], v.shape[-1],
                             mask_kind(terms), dropout_p > 0)


class OperandForm(NamedTuple):
    """What a layer hands SDPA in one mode, for its repr: ``same_value_dim`` (no widened q / k)
    and the mask's kind."""
    same_value_dim: bool = True
    mask: Optional[str] = None


def describe_paths(device: str, head_dim: int, forms: Sequence[Tuple[OperandForm, ...]],
                   dropout: Sequence[bool],
                   dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16)) -> str:
    """``'cpu flash'``, or the path per mode (``forms[i]``: inference, training; each a tuple of
    forms tried in order) and dtype where they differ, ``'explicit'`` where no kernel takes
    any form."""
    per_mode = []
    for mode, (mode_forms, mode_dropout) in enumerate(zip(forms, dropout)):
        names = []
        for dtype in dtypes:
            kernel = None
            for form in mode_forms:
                qk_dim = head_dim if form.same_value_dim else head_dim + 8
                kernel = fused_sdpa_kernel(device, dtype, qk_dim, head_dim, form.mask,
                                           mode_dropout)
                if kernel is not None:
                    break
            names.append(kernel.name if kernel is not None else 'explicit')
        if len(set(names)) == 1:
            per_mode.append(names[0])
        else:
            per_mode.append(', '.join(f'{name} ({str(dtype)[6:]})'
                                      for name, dtype in zip(names, dtypes)))
    if len(set(per_mode)) == 1:
        return per_mode[0]
    return '; '.join(f'{path} in {mode}' for path, mode in zip(per_mode, ('inference',
                                                                         'training')))
