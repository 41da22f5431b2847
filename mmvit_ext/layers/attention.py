"""Multi-head attention with a fused path and an explicit-map path.

The fused path calls ``F.scaled_dot_product_attention`` with relative-position bias and masks
passed as an additive ``attn_mask``; on CPU, small maps (Swin windows, reduced PVT keys) run a
hand-written kernel instead (:class:`_ExplicitAttention`), which is faster there and keeps no
map for backward. The explicit path materialises the attention map so that
*map transforms* can act on it (re-attention, talking heads, Refiner); a transform declares
whether it acts on the logits (``stage = 'pre_softmax'``) or on the probabilities
(``stage = 'post_softmax'``). The final map always passes through ``attn_map`` (an Identity), so
analysis tools can capture it with a forward hook after setting ``fused = False``.
"""
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .linear import Linear

PRE_SOFTMAX = 'pre_softmax'
POST_SOFTMAX = 'post_softmax'


class MapTransform(nn.Module):
    """Base of attention-map transforms: (..., H, N, M) -> (..., H, N, M).

    ``row_local()`` says whether each query row of the output depends only on the same row of
    the input (head mixing does; a convolution over the map does not): then inference may run
    the explicit path in chunks of queries, with bounded memory.
    """

    stage: str = POST_SOFTMAX

    def row_local(self) -> bool:
        return False


# Upper bound on the elements of one explicit map chunk at inference (16 MB in float32: under
# glibc's 32 MB mmap threshold, so chunk buffers are recycled rather than freshly mapped).
# Windowed DeepViT-S / CaiT-S24 at 800x1216: 1.52-1.66 s / 2.27 s, 2x pixels 2.08-2.24x / 2.31x.
MAP_CHUNK_ELEMENTS = 2 ** 22


def _explicit(q, k, v, scale, attn_bias, dropout_p, transforms, attn_map):
    logits = (q * scale) @ k.transpose(-2, -1)
    if attn_bias is not None:
        logits = logits + attn_bias
    for transform in transforms:
        if transform.stage == PRE_SOFTMAX:
            logits = transform(logits)
    attn = logits.float().softmax(dim=-1).to(q.dtype)
    for transform in transforms:
        if transform.stage == POST_SOFTMAX:
            attn = transform(attn)
    if attn_map is not None:
        attn = attn_map(attn)
    if dropout_p > 0:
        attn = F.dropout(attn, p=dropout_p)
    return attn @ v


def _query_chunks(q: torch.Tensor, k: torch.Tensor, transforms, attn_map) -> int:
    """Rows per chunk for an inference-time explicit map, or 0 to run it whole."""
    if torch.is_grad_enabled() or (attn_map is not None and (
            attn_map._forward_hooks or attn_map._forward_pre_hooks)):
        return 0
    if not all(t.row_local() for t in transforms):
        return 0
    total = q.numel() // q.shape[-1] * k.shape[-2]  # elements of the whole map
    if total <= MAP_CHUNK_ELEMENTS:
        return 0
    return max(1, q.shape[-2] * MAP_CHUNK_ELEMENTS // total)


def _merge_window_dim(q: torch.Tensor, bias: Optional[torch.Tensor]):
    """(B, W, H, N, d) -> (B, W*H, N, d) so that a per-window bias (W, H, N, M) broadcasts over B
    in a 4-D call, which the fused CPU/CUDA kernels require."""
    b, w, h = q.shape[:3]
    q = q.flatten(1, 2)
    if bias is not None:
        bias = bias.reshape((1,) * (5 - bias.dim()) + tuple(bias.shape))
        bias = bias.expand(bias.shape[0], w, h, *bias.shape[-2:]).flatten(1, 2)
    return q, bias


# The explicit CPU kernel below beats F.scaled_dot_product_attention where the map is small:
# measured on 2 EPYC cores, fwd+bwd of Swin windows (49 tokens) 1.2-1.5x in float32 and
# 2.3-2.8x in bf16; PVTv2 stages with <= 4096 queries over 256 keys up to 2.3x in bf16. Long
# float32 maps (PVTv2 stage 1, 16384 x 256) stay on the fused kernel, which is faster there.
EXPLICIT_CPU_MAX_ELEMENTS = 2 ** 20   # queries x keys of one map
EXPLICIT_CPU_FP32_MAX_QUERIES = 256


# Map elements of one chunk of the CPU kernel (2 MB in float32): a chunk's logits, probabilities
# and their gradients stay in cache between the ops that make and use them. Swin-T stage 1 at
# 512x512 (2 x 361 windows x 3 heads of 49 x 49), against the whole map at once: bf16 forward
# 26 -> 9 ms, float32 fwd+bwd 108 -> 57 ms.
EXPLICIT_CPU_CHUNK_ELEMENTS = 2 ** 19


def _probabilities(q: torch.Tensor, k: torch.Tensor, bias: Optional[torch.Tensor],
                   scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + bias) in float32 (q, k in any float dtype; on CPU a float32
    softmax of upcast bf16 logits is faster than a bf16 one, measured)."""
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
    """How :class:`_ExplicitAttention` walks a map in cache-sized chunks.

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
            count = max(1, min(self.length, -(-elements // EXPLICIT_CPU_CHUNK_ELEMENTS)))
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


class _ExplicitAttention(torch.autograd.Function):
    """softmax(q k^T * scale + bias) v with a hand-written backward, windows in chunks.

    Saves only q, k, v (views of one qkv tensor) and the bias: backward recomputes each chunk's
    map (one small matmul and a softmax, the same ops so the same values) rather than keeping
    it. Softmax and its backward run in float32 whatever the input dtype; ``bias`` (any shape
    that broadcasts to the map) gets its gradient summed back to its own shape.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, scale):
        chunks = _Chunks(q, k, v, bias)
        out = chunks.q.new_empty(chunks.q.shape[:-1] + (v.shape[-1],))
        with torch.autocast(q.device.type, enabled=False):
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


def _use_explicit_cpu(q: torch.Tensor, k: torch.Tensor, dropout_p: float) -> bool:
    if (q.device.type != 'cpu' or dropout_p > 0 or torch.compiler.is_compiling()
            or torch.jit.is_tracing()):
        return False
    queries, keys = q.shape[-2], k.shape[-2]
    if queries * keys > EXPLICIT_CPU_MAX_ELEMENTS:
        return False
    if q.dtype != torch.float32:
        return True
    return torch.is_grad_enabled() and queries <= EXPLICIT_CPU_FP32_MAX_QUERIES


def multihead_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        attn_bias: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                        transforms: Sequence[nn.Module] = (), attn_map: Optional[nn.Module] = None,
                        fused: bool = True) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v over (..., H, N, d) tensors.

    ``attn_bias`` broadcasts to (..., H, N, M). With ``fused`` and no transforms the fused kernel
    runs; 5-D inputs (B, windows, H, N, d) are folded to 4-D so a per-window bias is not copied
    over the batch. Softmax runs in float32 on the explicit path, which at inference runs in
    chunks of queries when every transform is row-local and the map is large.
    """
    if fused and not transforms and attn_map is None:
        if _use_explicit_cpu(q, k, dropout_p):
            return _ExplicitAttention.apply(q, k, v, attn_bias, scale)
        if attn_bias is not None and attn_bias.dtype != q.dtype:
            attn_bias = attn_bias.to(q.dtype)  # autocast: the kernel wants one dtype
        shape = q.shape
        if q.dim() == 5:
            q, attn_bias = _merge_window_dim(q, attn_bias)
            k, v = k.flatten(1, 2), v.flatten(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, dropout_p=dropout_p,
                                             scale=scale)
        return out.reshape(*shape[:-1], out.shape[-1])
    rows = _query_chunks(q, k, transforms, attn_map)
    if not rows:
        return _explicit(q, k, v, scale, attn_bias, dropout_p, transforms, attn_map)
    # every chunk reads all keys and values: lay them out once, not once per chunk (the matmul
    # would copy strided views each time, a cost growing with size x number of chunks)
    k, v = k.contiguous(), v.contiguous()
    outs = []
    for start in range(0, q.shape[-2], rows):
        bias = attn_bias
        if bias is not None and bias.shape[-2] != 1:
            bias = bias[..., start:start + rows, :]
        outs.append(_explicit(q[..., start:start + rows, :], k, v, scale, bias, dropout_p,
                              transforms, attn_map))
    return torch.cat(outs, dim=-2)


class AttentionBase(nn.Module):
    """Heads, scale, output projection and the fused / explicit choice shared by every attention.

    Subclasses produce q, k, v of shape (..., H, N, d) and call :meth:`attend`.
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
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else nn.Identity()
        self.map_transforms = nn.ModuleList(map_transforms)
        self.attn_map = nn.Identity()
        self.fused = fused

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               attn_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(..., H, N, d) queries over (..., H, M, d) keys/values -> (..., N, H*d) projected."""
        use_fused = self.fused and len(self.map_transforms) == 0
        x = multihead_attention(q, k, v, self.scale, attn_bias,
                                self.attn_drop if self.training else 0.0,
                                transforms=self.map_transforms,
                                attn_map=None if use_fused else self.attn_map, fused=use_fused)
        x = x.transpose(-3, -2).flatten(-2)
        return self.proj_drop(self.proj(x))


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
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)

    def forward(self, x: torch.Tensor, attn_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        *batch, n, _ = x.shape
        qkv = self.qkv(x).reshape(*batch, n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.movedim(-3, 0).transpose(-3, -2).unbind(0)  # each (*batch, H, N, d)
        return self.attend(q, k, v, attn_bias)
