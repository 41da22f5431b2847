"""Multi-head attention: the fused kernel, or an explicit map that map transforms can act on.

Three functions hold the arithmetic, each a plain PyTorch definition:

* :func:`scaled_dot_product_attention` -- ``F.scaled_dot_product_attention`` over (..., H, N, d)
  with any leading dimensions (windows, batch), folded into one batch axis as the fused CUDA
  kernels need (never into the head axis, whose grid dimension is capped at 65,535).
* :func:`explicit_attention` -- the same product with the map materialised, so that *map
  transforms* act on it (re-attention, talking heads, Refiner). A transform declares whether it
  acts on the logits (``stage = 'pre_softmax'``) or the probabilities (``'post_softmax'``).
  Its two halves: :func:`attention_probs` (logits, pre-softmax transforms, softmax) and
  :func:`map_attention` on a given map (:func:`final_map`: post-softmax transforms and
  ``attn_map``; dropout, ``attn @ v``), for families that reuse or carry maps (Refined-ViT).

The final map always passes through ``attn_map`` (an Identity) for analysis hooks. A layer calls
SDPA only where one of its fused kernels takes the call (:mod:`.sdpa_kernels`, PyTorch's own
gates as data: dtype, mask and its gradient, dropout, head dims); elsewhere SDPA would run its
math fallback (float32 on the CPU, whatever the autocast dtype), and the layer computes the
explicit product instead. The repr names the path per mode; :mod:`mmvit_ext.flags`
``fused_attention(False)`` turns the fused path off.

An additive bias (``attn_bias``) is one tensor or a tuple of terms that broadcast to the map
(Swin's per-head position bias and per-window shift mask): kept apart, no (windows x heads x
N x N) sum is built unless a kernel needs one tensor.
"""
import math
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .. import flags
from .checkpoint import CheckpointedCall
from .sdpa_kernels import FIXED, LEARNED, OperandForm, describe_paths, kernel_for_call

PRE_SOFTMAX = 'pre_softmax'
POST_SOFTMAX = 'post_softmax'
AttnBias = Union[None, torch.Tensor, Tuple[torch.Tensor, ...]]


def bias_terms(attn_bias: AttnBias) -> Tuple[torch.Tensor, ...]:
    """The additive terms of ``attn_bias``: ``()``, ``(tensor,)`` or the tuple itself."""
    if attn_bias is None:
        return ()
    return tuple(attn_bias) if isinstance(attn_bias, tuple) else (attn_bias,)


def sum_bias(attn_bias: AttnBias) -> Optional[torch.Tensor]:
    """``attn_bias`` as one tensor (its terms summed, broadcast), or ``None``."""
    terms = bias_terms(attn_bias)
    if not terms:
        return None
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


class MapTransform(nn.Module):
    """Base of attention-map transforms: (..., H, N, M) -> (..., H, N, M), acting on the logits
    (``stage = 'pre_softmax'``) or on the probabilities (``'post_softmax'``)."""

    stage: str = POST_SOFTMAX


def fold_leading(t: torch.Tensor) -> torch.Tensor:
    """(..., H, N, d) -> (prod(...), H, N, d). The folded size is given, not inferred (``-1``):
    with symbolic sizes (export) inferring it means a costly symbolic division."""
    return t.reshape(math.prod(t.shape[:-3]), *t.shape[-3:])


def sdpa_mask(attn_bias: AttnBias, q: torch.Tensor) -> Optional[torch.Tensor]:
    """``attn_bias`` as one SDPA mask for q (..., H, N, d): summed, in q's dtype, 4-D
    (batch or 1, H or 1, N, M) once q's leading dims are folded, last stride 1 -- the form
    every fused kernel that takes a mask accepts. A per-window bias (4+ dims) is expanded over
    the batch for that; a bias of at most (H, N, M) broadcasts over it as it is (no batch x
    windows copy)."""
    mask = sum_bias(attn_bias)
    if mask is None:
        return None
    if mask.dtype not in (q.dtype, torch.bool):
        mask = mask.to(q.dtype)  # autocast: the fused kernels take one dtype
    lead = q.shape[:-3]
    if mask.dim() > 3 and len(lead) != 1:  # per window: one copy per image
        mask = fold_leading(mask.expand(*lead, *mask.shape[-3:]))
    elif mask.dim() < 4:  # (H, N, M) -> (1, H, N, M): torch's CPU gate refuses 3-D masks
        mask = mask.view(*(1,) * (4 - mask.dim()), *mask.shape)
    return mask if mask.stride(-1) == 1 else mask.contiguous()


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 attn_bias: AttnBias = None, dropout_p: float = 0.0,
                                 scale: Optional[float] = None) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v for q (..., H, N, d), k / v (..., H, M, d) through
    ``F.scaled_dot_product_attention``, leading dimensions folded into its batch axis and the
    bias as :func:`sdpa_mask`. Callers ask :func:`~.sdpa_kernels.kernel_for_call` first."""
    lead = q.shape[:-3]
    attn_mask = sdpa_mask(attn_bias, q)
    if len(lead) != 1:
        q, k, v = fold_leading(q), fold_leading(k), fold_leading(v)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                         scale=scale)
    return out.view(*lead, *out.shape[-3:])


def attention_probs(q: torch.Tensor, k: torch.Tensor, scale: float, attn_bias: AttnBias = None,
                    transforms: Sequence[MapTransform] = ()) -> torch.Tensor:
    """softmax(q k^T * scale + bias) (..., H, N, M) in ``q``'s dtype (softmax in float32 or
    wider), the pre-softmax transforms applied to the logits."""
    logits = (q * scale) @ k.transpose(-2, -1)
    for term in bias_terms(attn_bias):
        logits = logits + term
    for transform in transforms:
        if transform.stage == PRE_SOFTMAX:
            logits = transform(logits)
    # reduced precision: the softmax in float32 (float64 stays float64)
    wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return logits.softmax(dim=-1, dtype=wide).to(q.dtype)


def final_map(attn: torch.Tensor, transforms: Sequence[MapTransform] = (),
              attn_map: Optional[nn.Module] = None) -> torch.Tensor:
    """Probabilities (..., H, N, M) through the post-softmax transforms and ``attn_map``."""
    for transform in transforms:
        if transform.stage == POST_SOFTMAX:
            attn = transform(attn)
    return attn if attn_map is None else attn_map(attn)


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                       attn_bias: AttnBias = None, dropout_p: float = 0.0,
                       transforms: Sequence[MapTransform] = (),
                       attn_map: Optional[nn.Module] = None) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v with the map materialised (softmax in float32 or wider)
    and the map transforms applied before / after the softmax as each declares."""
    return map_attention(attention_probs(q, k, scale, attn_bias, transforms), v, dropout_p,
                         transforms, attn_map)


def map_attention(attn: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                  transforms: Sequence[MapTransform] = (), attn_map: Optional[nn.Module] = None
                  ) -> torch.Tensor:
    """``attn @ v`` for probabilities ``attn`` (..., H, N, M): the post-softmax transforms,
    ``attn_map``, dropout."""
    attn = final_map(attn, transforms, attn_map)
    return (F.dropout(attn, p=dropout_p) if dropout_p > 0 else attn) @ v


class AttentionBase(CheckpointedCall, nn.Module):
    """Heads, scale, output projection and the fused / explicit choice shared by every attention.

    Subclasses produce q, k, v of shape (..., H, N, d) and call :meth:`attend`. ``fused=False``
    (or :mod:`mmvit_ext.flags` ``fused_attention(False)`` around a run) materialises every map;
    ``attn_map`` is where analysis hooks see it.
    """

    def __init__(self, dim: int, num_heads: int, qk_scale: Optional[float] = None,
                 attn_drop: float = 0.0, proj_drop: float = 0.0,
                 map_transforms: Sequence[MapTransform] = (), fused: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = qk_scale or self.head_dim ** -0.5
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else nn.Identity()
        self.map_transforms = nn.ModuleList(map_transforms)
        self.attn_map = nn.Identity()
        self.fused = fused

    def extra_repr(self) -> str:
        if self.map_transforms:
            return 'explicit (map transforms)'
        if not self.fused:
            return 'explicit (fused=False)'
        device = self.proj.weight.device.type
        forms = (self.operand_forms(training=False), self.operand_forms(training=True))
        return 'fused: ' + describe_paths(device, self.head_dim, forms, (False, self.attn_drop > 0))

    def operand_forms(self, training: bool) -> Tuple[OperandForm, ...]:
        """What :meth:`attend` hands SDPA in training or inference, in the order it tries
        them (for the repr; :meth:`attend` decides from the tensors of each call)."""
        return (OperandForm(),)

    @staticmethod
    def bias_form(learned: bool, training: bool) -> OperandForm:
        """An additive bias as a mask: :data:`LEARNED` in training when it holds parameters."""
        return OperandForm(mask=LEARNED if learned and training else FIXED)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               attn_bias: AttnBias = None) -> torch.Tensor:
        """(..., H, N, d) queries over (..., H, M, d) keys/values -> (..., N, H*d) projected:
        SDPA where a fused kernel takes the call, else the explicit product."""
        if self.fused_kernel() and kernel_for_call(q, v, bias_terms(attn_bias),
                                                   self.dropout_p) is not None:
            x = scaled_dot_product_attention(q, k, v, attn_bias, self.dropout_p, self.scale)
        else:
            x = explicit_attention(q, k, v, self.scale, attn_bias, self.dropout_p,
                                   self.map_transforms, self.attn_map)
        return self.project(x)

    @property
    def dropout_p(self) -> float:
        """The map's dropout probability now (0 in eval mode)."""
        return self.attn_drop if self.training else 0.0

    def fused_kernel(self) -> bool:
        """Whether :meth:`attend` may take the fused path (SDPA) now: no map transforms, the
        layer's ``fused`` and the :mod:`mmvit_ext.flags` switch on (a fused kernel must still
        take the call)."""
        return self.fused and len(self.map_transforms) == 0 and flags.fused_attention.get()

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Heads (..., H, N, d) -> (..., N, H*d) through the output projection."""
        return self.proj_drop(self.proj(x.transpose(-3, -2).flatten(-2)))


class Attention(AttentionBase):
    """Multi-head self-attention over tokens (*batch, N, C) -> (*batch, N, C).

    Args:
        dim: token channels C.
        num_heads: H; C must be divisible by H.
        qkv_bias: bias on the joint qkv projection.
        qk_scale: overrides the 1/sqrt(d) scale.
        attn_drop / proj_drop: dropout on the map and on the output.
        map_transforms: transforms of the explicit map; empty means the fused kernel may run.
        fused: allow the fused kernel when there are no transforms.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 qk_scale: Optional[float] = None, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 map_transforms: Sequence[MapTransform] = (), fused: bool = True) -> None:
        super().__init__(dim, num_heads, qk_scale, attn_drop, proj_drop, map_transforms, fused)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)

    def forward(self, x: torch.Tensor, attn_bias: AttnBias = None) -> torch.Tensor:
        return self.attend(*self.qkv_heads(x), attn_bias)

    def qkv_heads(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tokens (*batch, N, C) -> q, k, v, each (*batch, H, N, d)."""
        return self.split_qkv(self.qkv(x))

    def split_qkv(self, qkv: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The qkv projection's output (*batch, N, 3C) -> q, k, v, each (*batch, H, N, d)."""
        *batch, n, _ = qkv.shape
        qkv = qkv.reshape(*batch, n, 3, self.num_heads, self.head_dim)
        return qkv.movedim(-3, 0).transpose(-3, -2).unbind(0)
