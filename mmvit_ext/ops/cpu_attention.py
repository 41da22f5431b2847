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
  (:data:`EXPLICIT_HALF_MAX_KEYS`). It saves its maps, as the peers' does.
* Explicit maps at inference: computed in chunks of query rows when every map transform is
  row-local (:data:`ROW_LOCAL`), so a global map never exists whole (bounded memory, buffers
  glibc recycles). Not under ``mmvit_ext.flags.fused_attention(False)``, which promises whole
  maps (``attn_map`` hooks), nor where the map is carried on to another block.
"""
from typing import Callable, Dict, Optional, Sequence

import torch
from torch import nn

from .. import flags
from ..layers.attention import explicit_attention
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


def _probabilities(q: torch.Tensor, k: torch.Tensor, bias: Optional[torch.Tensor],
                   scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + bias) in float32 (on CPU a float32 softmax of upcast bf16 logits
    is faster than a bf16 one, measured)."""
    logits = torch.matmul(q * scale, k.transpose(-2, -1))
    if logits.dtype != torch.float32:
        logits = logits.float()
    if bias is not None:
        if torch.broadcast_shapes(bias.shape, logits.shape) == logits.shape:
            logits.add_(bias)
        else:
            logits = logits + bias
    return torch.softmax(logits, dim=-1)


class _Chunks:
    """How :class:`SmallMapAttention` walks a map in cache-sized chunks.

    Windowed inputs (B, W, H, N, d) are viewed window-major, (W, B, H, N, d), and cut along
    windows, so that every chunk of the output and of each gradient is a contiguous slice. Other
    inputs run whole (cutting PVT's long query axis measured no faster).
    """

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 bias: Optional[torch.Tensor]) -> None:
        self.windowed = q.dim() == 5 and k.shape[:-2] == q.shape[:-2] == v.shape[:-2]
        self.length = self.step = 1
        if self.windowed:
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))
            if bias is not None:
                bias = bias.reshape((1,) * (5 - bias.dim()) + tuple(bias.shape)).transpose(0, 1)
            self.length = q.shape[0]
            elements = q.numel() // q.shape[-1] * k.shape[-2]
            count = max(1, min(self.length, -(-elements // SMALL_MAP_CHUNK_ELEMENTS)))
            self.step = -(-self.length // count)
        self.q, self.k, self.v, self.bias = q, k, v, bias

    def __iter__(self):
        for start in range(0, self.length, self.step):
            yield start, min(self.step, self.length - start)

    def take(self, t: Optional[torch.Tensor], start: int, size: int) -> Optional[torch.Tensor]:
        """Chunk of a window-major tensor (broadcast window dim: whole)."""
        if t is None or not self.windowed or t.shape[0] == 1:
            return t
        return t.narrow(0, start, size)

    def inputs(self, start: int, size: int):
        """q, k, v and bias of one chunk."""
        return tuple(self.take(t, start, size) for t in (self.q, self.k, self.v, self.bias))

    def restore(self, t: torch.Tensor) -> torch.Tensor:
        """A window-major result back in the caller's layout (a view)."""
        return t.transpose(0, 1) if self.windowed else t


class SmallMapAttention(torch.autograd.Function):
    """softmax(q k^T * scale + bias) v with a hand-written backward, windows in chunks.

    Saves only q, k, v (views of one qkv tensor) and the bias: backward recomputes each chunk's
    map (one small matmul and a softmax, the same ops so the same values). Softmax and its
    backward run in float32 whatever the input dtype; ``bias`` (any shape that broadcasts to the
    map) gets its gradient summed back to its own shape.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, scale):
        chunks = _Chunks(q, k, v, bias)
        out = chunks.q.new_empty(chunks.q.shape[:-1] + (v.shape[-1],))
        with torch.autocast('cpu', enabled=False):
            for start, size in chunks:
                qc, kc, vc, bc = chunks.inputs(start, size)
                probs = _probabilities(qc, kc, bc, scale).to(q.dtype)
                torch.matmul(probs, vc, out=chunks.take(out, start, size))
        ctx.save_for_backward(q, k, v, bias)
        ctx.scale = scale
        return chunks.restore(out)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias = ctx.saved_tensors
        chunks = _Chunks(q, k, v, bias)
        grad_out = chunks.restore(grad_out).contiguous()  # the transpose is its own inverse
        batch = torch.broadcast_shapes(chunks.q.shape[:-2], chunks.k.shape[:-2])
        grad_q = chunks.q.new_empty(chunks.q.shape)
        grad_k, grad_v = (t.new_empty(batch + t.shape[-2:])  # summed below
                          for t in (chunks.k, chunks.v))
        need_bias = bias is not None and ctx.needs_input_grad[3]
        grad_bias = chunks.bias.new_zeros(chunks.bias.shape, dtype=torch.float32) \
            if need_bias else None
        for start, size in chunks:
            qc, kc, vc, bc = chunks.inputs(start, size)
            go = chunks.take(grad_out, start, size)
            probs32 = _probabilities(qc, kc, bc, ctx.scale)
            probs = probs32.to(q.dtype)
            torch.matmul(probs.transpose(-2, -1), go, out=chunks.take(grad_v, start, size))
            grad_probs = torch.matmul(go, vc.transpose(-2, -1)).float()
            grad_logits = grad_probs.sub_((grad_probs * probs32).sum(-1, keepdim=True))
            grad_logits.mul_(probs32)
            if need_bias:
                part = chunks.take(grad_bias, start, size)
                part.add_(grad_logits.sum_to_size(part.shape))
            grad_logits = grad_logits.to(q.dtype)
            torch.matmul(grad_logits, kc, out=chunks.take(grad_q, start, size)).mul_(ctx.scale)
            torch.matmul(grad_logits.transpose(-2, -1), qc,
                         out=chunks.take(grad_k, start, size)).mul_(ctx.scale)
        grad_q, grad_k, grad_v = (chunks.restore(t) for t in (grad_q, grad_k, grad_v))
        if grad_k.shape != k.shape:  # keys / values broadcast over a batch dim
            grad_k, grad_v = grad_k.sum_to_size(k.shape), grad_v.sum_to_size(v.shape)
        if need_bias:
            grad_bias = chunks.restore(grad_bias).reshape(bias.shape).to(bias.dtype)
        return grad_q, grad_k, grad_v, grad_bias, None


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


def _trains_in_half(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    bias: Optional[torch.Tensor]) -> bool:
    """bf16 / fp16 inputs of maps up to ``EXPLICIT_HALF_MAX_KEYS`` keys with something to
    differentiate."""
    return (q.dtype != torch.float32 and k.shape[-2] <= EXPLICIT_HALF_MAX_KEYS
            and torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in (q, k, v, bias)))


def scaled_dot_product_attention(q, k, v, attn_bias=None, dropout_p=0.0, scale=None):
    """Where a small map applies: the explicit map in bf16 / fp16 training, else the small-map
    kernel; elsewhere ``NotImplemented``."""
    if not small_map_applies(q, k, dropout_p):
        return NotImplemented
    if attn_bias is not None and attn_bias.dtype == torch.bool:
        return NotImplemented
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if _trains_in_half(q, k, v, attn_bias):
        return explicit_attention(q, k, v, scale, attn_bias)
    return SmallMapAttention.apply(q, k, v, attn_bias, scale)


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
    outs = []
    for start in range(0, q.shape[-2], rows):
        bias, carried = (t[..., start:start + rows, :] if t is not None and t.shape[-2] != 1
                         else t for t in (attn_bias, carried_map))
        outs.append(explicit_attention(q[..., start:start + rows, :], k, v, scale, bias,
                                       dropout_p, transforms, attn_map, carried))
    return torch.cat(outs, dim=-2)


