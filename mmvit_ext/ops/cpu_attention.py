"""CPU attention kernels with the semantics of :func:`mmvit_ext.layers.scaled_dot_product_attention`
and :func:`mmvit_ext.layers.explicit_attention`.

* Small maps (Swin windows, PVT's reduced keys): an explicit kernel with a hand-written backward
  that keeps no map (recomputes it) and walks windows in cache-sized chunks. Measured on 2 EPYC
  cores against ``F.scaled_dot_product_attention`` (which runs its math path on CPU when the
  bias needs a gradient): fwd+bwd of Swin windows 1.2-1.5x in float32.
* Window-sized maps in bf16 / fp16 training: :func:`explicit_attention`, the map materialised
  (softmax in float32) and differentiated by autograd, as the peers' (timm, mmdet) attention
  runs under autocast. Its few whole-map ops beat the chunked kernel (many small bf16 ops and
  strided chunk copies) and ``F.scaled_dot_product_attention`` (math path with a bias gradient):
  Swin-T / PVTv2-b2 maps fwd+bwd 1.4-1.8x faster than the chunked kernel alone (1 thread,
  thread CPU time); in the whole backbone only Swin's windows gained
  (:data:`EXPLICIT_HALF_MAX_KEYS`). It saves its maps, as the peers' does; not inside
  :func:`lean` (blocks checkpointed for memory), where the small-map kernel runs.
* Explicit maps at inference: computed in chunks of query rows when every map transform is
  row-local (:data:`ROW_LOCAL`), so a global map never exists whole (bounded memory, buffers
  glibc recycles). Not under ``mmvit_ext.flags.fused_attention(False)``, which promises whole
  maps (``attn_map`` hooks), nor where the map is carried on to another block.
"""
import threading
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Optional, Sequence

import torch
from torch import nn

from .. import flags
from ..layers.attention import bias_terms, explicit_attention
from ..layers.map_transforms import ReAttention, TalkingHeads

# queries x keys of one map above which the fused kernel is faster; float32 maps with more
# queries than this run the fused kernel too (PVTv2 stage 1, 16384 x 256).
SMALL_MAP_MAX_ELEMENTS = 2 ** 20
SMALL_MAP_FP32_MAX_QUERIES = 256
# Map elements of one chunk of the small-map kernel (2 MB in float32): a chunk's logits,
# probabilities and their gradients stay in cache. Swin-T stage 1 at 512x512: bf16 forward
# 26 -> 9 ms, float32 fwd+bwd 108 -> 57 ms against the whole map at once.
SMALL_MAP_CHUNK_ELEMENTS = 2 ** 19
# bf16 / fp16 training on maps with at most this many keys (Swin's 49-token windows) runs the
# explicit map: Swin-T fwd+bwd 0.99x -> 1.04x timm. PVTv2's 256 reduced keys measured level
# both ways (1.04x / 1.02x timm), so keep the kernel, which saves no map.
EXPLICIT_HALF_MAX_KEYS = 64
# Upper bound on the elements of one explicit map chunk at inference (16 MB in float32: under
# glibc's 32 MB mmap threshold, so chunk buffers are recycled rather than freshly mapped).
INFERENCE_CHUNK_ELEMENTS = 2 ** 22


def _probabilities(q: torch.Tensor, k: torch.Tensor, terms: Sequence[torch.Tensor],
                   scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + sum(terms)) in float32 (on CPU a float32 softmax of upcast bf16
    logits is faster than a bf16 one, measured)."""
    logits = torch.matmul(q * scale, k.transpose(-2, -1))
    if logits.dtype != torch.float32:
        logits = logits.float()
    for term in terms:
        if torch.broadcast_shapes(term.shape, logits.shape) == logits.shape:
            logits.add_(term)
        else:
            logits = logits + term
    return torch.softmax(logits, dim=-1)


class _Chunks:
    """How :class:`SmallMapAttention` walks a map in cache-sized chunks.

    Windowed inputs (B, W, H, N, d) are viewed window-major, (W, B, H, N, d), and cut along
    windows, so that every chunk of the output and of each gradient is a contiguous slice. Other
    inputs run whole (cutting PVT's long query axis measured no faster).
    """

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 terms: Sequence[torch.Tensor]) -> None:
        self.windowed = q.dim() == 5 and k.shape[:-2] == q.shape[:-2] == v.shape[:-2]
        self.length = self.step = 1
        if self.windowed:
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))
            terms = [t.reshape((1,) * (5 - t.dim()) + tuple(t.shape)).transpose(0, 1)
                     for t in terms]
            self.length = q.shape[0]
            elements = q.numel() // q.shape[-1] * k.shape[-2]
            count = max(1, min(self.length, -(-elements // SMALL_MAP_CHUNK_ELEMENTS)))
            self.step = -(-self.length // count)
        self.q, self.k, self.v, self.terms = q, k, v, tuple(terms)

    def __iter__(self):
        for start in range(0, self.length, self.step):
            yield start, min(self.step, self.length - start)

    def take(self, t: Optional[torch.Tensor], start: int, size: int) -> Optional[torch.Tensor]:
        """Chunk of a window-major tensor (broadcast window dim: whole)."""
        if t is None or not self.windowed or t.shape[0] == 1:
            return t
        return t.narrow(0, start, size)

    def inputs(self, start: int, size: int):
        """q, k, v and the bias terms of one chunk."""
        q, k, v = (self.take(t, start, size) for t in (self.q, self.k, self.v))
        return q, k, v, [self.take(t, start, size) for t in self.terms]

    def restore(self, t: torch.Tensor) -> torch.Tensor:
        """A window-major result back in the caller's layout (a view)."""
        return t.transpose(0, 1) if self.windowed else t


class SmallMapAttention(torch.autograd.Function):
    """softmax(q k^T * scale + sum(terms)) v with a hand-written backward, windows in chunks.

    Saves only q, k, v (views of one qkv tensor) and the bias terms: backward recomputes each
    chunk's map (one small matmul and a softmax, the same ops so the same values). Softmax and
    its backward run in float32 whatever the input dtype; each bias term (any shape that
    broadcasts to the map) gets its gradient summed back to its own shape, so a per-head bias
    and a per-window mask never become one (windows x heads) tensor.
    """

    @staticmethod
    def forward(ctx, q, k, v, scale, *terms):
        chunks = _Chunks(q, k, v, terms)
        out = chunks.q.new_empty(chunks.q.shape[:-1] + (v.shape[-1],))
        with torch.autocast('cpu', enabled=False):
            for start, size in chunks:
                qc, kc, vc, bc = chunks.inputs(start, size)
                probs = _probabilities(qc, kc, bc, scale).to(q.dtype)
                torch.matmul(probs, vc, out=chunks.take(out, start, size))
        ctx.save_for_backward(q, k, v, *terms)
        ctx.scale = scale
        return chunks.restore(out)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, *terms = ctx.saved_tensors
        chunks = _Chunks(q, k, v, terms)
        grad_out = chunks.restore(grad_out).contiguous()  # the transpose is its own inverse
        batch = torch.broadcast_shapes(chunks.q.shape[:-2], chunks.k.shape[:-2])
        grad_q = chunks.q.new_empty(chunks.q.shape)
        grad_k, grad_v = (t.new_empty(batch + t.shape[-2:])  # summed below
                          for t in (chunks.k, chunks.v))
        grad_terms = [t.new_zeros(t.shape, dtype=torch.float32) if needed else None
                      for t, needed in zip(chunks.terms, ctx.needs_input_grad[4:])]
        for start, size in chunks:
            qc, kc, vc, bc = chunks.inputs(start, size)
            go = chunks.take(grad_out, start, size)
            probs32 = _probabilities(qc, kc, bc, ctx.scale)
            probs = probs32.to(q.dtype)
            torch.matmul(probs.transpose(-2, -1), go, out=chunks.take(grad_v, start, size))
            grad_probs = torch.matmul(go, vc.transpose(-2, -1)).float()
            grad_logits = grad_probs.sub_((grad_probs * probs32).sum(-1, keepdim=True))
            grad_logits.mul_(probs32)
            for grad_term in grad_terms:
                if grad_term is not None:
                    part = chunks.take(grad_term, start, size)
                    part.add_(grad_logits.sum_to_size(part.shape))
            grad_logits = grad_logits.to(q.dtype)
            torch.matmul(grad_logits, kc, out=chunks.take(grad_q, start, size)).mul_(ctx.scale)
            torch.matmul(grad_logits.transpose(-2, -1), qc,
                         out=chunks.take(grad_k, start, size)).mul_(ctx.scale)
        grad_q, grad_k, grad_v = (chunks.restore(t) for t in (grad_q, grad_k, grad_v))
        if grad_k.shape != k.shape:  # keys / values broadcast over a batch dim
            grad_k, grad_v = grad_k.sum_to_size(k.shape), grad_v.sum_to_size(v.shape)
        grad_terms = [g if g is None else chunks.restore(g).reshape(t.shape).to(t.dtype)
                      for g, t in zip(grad_terms, terms)]
        return (grad_q, grad_k, grad_v, None, *grad_terms)


def small_map_applies(q: torch.Tensor, k: torch.Tensor, dropout_p: float) -> bool:
    """Where :class:`SmallMapAttention` measured faster than the fused kernel."""
    if q.device.type != 'cpu' or dropout_p > 0 or q.dtype not in (
            torch.float32, torch.bfloat16, torch.float16):
        return False
    queries, keys = q.shape[-2], k.shape[-2]
    if queries * keys > SMALL_MAP_MAX_ELEMENTS:
        return False
    if q.dtype != torch.float32:
        return True
    return torch.is_grad_enabled() and queries <= SMALL_MAP_FP32_MAX_QUERIES


_lean = threading.local()


@contextmanager
def lean() -> Iterator[None]:
    """Within the block, bf16 / fp16 training maps run the small-map kernel, which saves no map,
    instead of the faster explicit map (Swin-L Mask R-CNN, bf16, whole blocks checkpointed:
    the recomputed block's saved maps were the peak)."""
    previous, _lean.on = getattr(_lean, 'on', False), True
    try:
        yield
    finally:
        _lean.on = previous


def _trains_in_half(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    terms: Sequence[torch.Tensor]) -> bool:
    """bf16 / fp16 inputs of maps up to ``EXPLICIT_HALF_MAX_KEYS`` keys with something to
    differentiate, outside :func:`lean`."""
    return (q.dtype != torch.float32 and k.shape[-2] <= EXPLICIT_HALF_MAX_KEYS
            and torch.is_grad_enabled() and not getattr(_lean, 'on', False)
            and any(t.requires_grad for t in (q, k, v, *terms)))


def scaled_dot_product_attention(q, k, v, attn_bias=None, dropout_p=0.0, scale=None):
    """Where a small map applies: the explicit map in bf16 / fp16 training, else the small-map
    kernel; elsewhere ``NotImplemented``."""
    terms = bias_terms(attn_bias)
    if not small_map_applies(q, k, dropout_p) or any(t.dtype == torch.bool for t in terms):
        return NotImplemented
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if _trains_in_half(q, k, v, terms):
        return explicit_attention(q, k, v, scale, attn_bias)
    return SmallMapAttention.apply(q, k, v, scale, *terms)


# Map transforms whose every output query row depends only on the same input row (head mixing
# does; a convolution over the map or batch statistics do not), by type: the others run whole.
ROW_LOCAL: Dict[type, Callable[[nn.Module], bool]] = {
    TalkingHeads: lambda transform: True,
    ReAttention: lambda transform: not transform.norm.training,  # statistics folded at inference
}


def _row_local(transform: nn.Module) -> bool:
    rule = ROW_LOCAL.get(type(transform))
    return rule is not None and rule(transform)


def _inference_rows(q: torch.Tensor, k: torch.Tensor, transforms: Sequence[nn.Module]) -> int:
    """Query rows per chunk for an inference-time explicit map, or 0 to run it whole."""
    if torch.is_grad_enabled() or q.device.type != 'cpu' or not flags.fused_attention.get():
        return 0
    if not all(_row_local(t) for t in transforms):
        return 0
    total = q.numel() // q.shape[-1] * k.shape[-2]  # elements of the whole map
    if total <= INFERENCE_CHUNK_ELEMENTS:
        return 0
    return max(1, q.shape[-2] * INFERENCE_CHUNK_ELEMENTS // total)


def chunked_explicit_attention(q, k, v, scale, attn_bias=None, dropout_p=0.0, transforms=(),
                               attn_map=None, carried_map=None, return_map=False):
    """:func:`explicit_attention` in chunks of query rows at inference, else ``NotImplemented``."""
    rows = 0 if return_map else _inference_rows(q, k, transforms)
    if not rows:
        return NotImplemented
    # every chunk reads all keys and values: lay them out once, not once per chunk (the matmul
    # would copy strided views each time, a cost growing with size x number of chunks)
    k, v = k.contiguous(), v.contiguous()

    def rows_of(t: Optional[torch.Tensor], start: int) -> Optional[torch.Tensor]:
        return t if t is None or t.shape[-2] == 1 else t[..., start:start + rows, :]

    outs = []
    for start in range(0, q.shape[-2], rows):
        bias = tuple(rows_of(t, start) for t in bias_terms(attn_bias))
        outs.append(explicit_attention(q[..., start:start + rows, :], k, v, scale, bias or None,
                                       dropout_p, transforms, attn_map,
                                       rows_of(carried_map, start)))
    return torch.cat(outs, dim=-2)


