"""CPU kernels around the MLPs.

Training: a Linear fed by a LayerNorm or an exact GELU (a pre-norm block's ``norm -> fc1`` and
an MLP's ``act -> fc2``, wherever they occur) saves its input's *producer's* input instead of its
own input, and recomputes the input in backward.

The model code stays as written (``mlp(norm(x))``): under :class:`~mmvit_ext.ops.CpuKernels`,
``F.layer_norm`` and ``F.gelu`` return their usual output, tagged with what produced it, and
``F.linear`` on a tagged input runs :class:`RecomputedInputLinear`. The producer already keeps
its own input for its backward, so the Linear's input (the normalised tokens; the GELU output,
the widest tensor of an MLP) is never saved: fewer freshly mapped pages on the 2-core VM, which
is where CPU training time goes at these sizes. The GELU recomputation in backward writes to the
per-thread workspace. Applies to float32 CPU tensors, and under CPU autocast to its GEMMs (in the
autocast dtype) and GELUs; values are those of the unfused ops.

Inside an MLP (:func:`mlp_kernel`, the module kernel of ``Mlp`` / ``ConvMlp``, whose GELU
output feeds nothing but fc2) the GELU output itself goes to the workspace too, and its backward
runs in place on the incoming gradient: no fresh 4C-wide tensor either way. At inference an
``Mlp`` runs on row chunks (each through the module's own forward) whose hidden activations stay
under ``MLP_CHUNK_ELEMENTS``: buffers glibc recycles instead of freshly mapped pages.
"""
import threading
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_gemm import any_linear, linear_backward
from .workspace import workspace

_TAG = '_mmvit_ext_producer'  # (kind, inputs) of the op that produced a tensor
# Hidden activations per token chunk of an inference-time MLP (16 MB in float32).
MLP_CHUNK_ELEMENTS = 2 ** 22
_scope = threading.local()  # inside an MLP's forward: GELU outputs feed only fc2


def _applies(x: torch.Tensor) -> bool:
    """float32 CPU tensors (or, under CPU autocast, its reduced-precision ones) with autograd."""
    dtypes = (torch.float32, torch.get_autocast_dtype('cpu')) \
        if torch.is_autocast_enabled('cpu') else (torch.float32,)
    return x.device.type == 'cpu' and x.dtype in dtypes and torch.is_grad_enabled()


class _WorkspaceGelu(torch.autograd.Function):
    """Exact GELU written to the workspace (its one consumer, fc2, reads it at once and saves
    ``h`` instead); backward in place on the incoming gradient (fc2's, used by nothing else)."""

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return torch._C._nn.gelu(h, out=workspace(h.shape, h.dtype))

    @staticmethod
    def backward(ctx, grad):
        (h,) = ctx.saved_tensors
        if not grad.is_contiguous() or grad.dtype != h.dtype:
            return torch.ops.aten.gelu_backward(grad, h)
        return torch.ops.aten.gelu_backward.grad_input(grad, h, grad_input=grad)


def layer_norm(x: torch.Tensor, normalized_shape, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5):
    """``F.layer_norm``, its output tagged for :func:`linear` (affine, last-dim norms)."""
    if not _applies(x) or x.dtype != torch.float32 or weight is None or bias is None \
            or len(normalized_shape) != 1:
        return NotImplemented
    out = F.layer_norm(x, normalized_shape, weight, bias, eps)
    setattr(out, _TAG, ('layer_norm', (x, weight, bias), eps))
    return out


def gelu(h: torch.Tensor, approximate: str = 'none'):
    """Exact ``F.gelu``, its output tagged for :func:`linear`; inside an MLP in the workspace
    (at inference too)."""
    in_mlp = getattr(_scope, 'mlp', False)
    if not torch.is_grad_enabled() and in_mlp and approximate == 'none' \
            and h.device.type == 'cpu' and h.dtype == torch.float32:
        return torch._C._nn.gelu(h, out=workspace(h.shape, h.dtype))
    if not _applies(h) or approximate != 'none':
        return NotImplemented
    out = _WorkspaceGelu.apply(h) if in_mlp else F.gelu(h)
    setattr(out, _TAG, ('gelu', (h,), None))
    return out


def _recompute(kind: str, inputs: Tuple[torch.Tensor, ...], eps: Optional[float]
               ) -> torch.Tensor:
    """The producer's output again (a GELU output into the workspace: used once, at once)."""
    if kind == 'layer_norm':
        x, weight, bias = inputs
        return torch.native_layer_norm(x, (x.shape[-1],), weight, bias, eps)[0]
    (h,) = inputs
    return torch._C._nn.gelu(h, out=workspace(h.shape, h.dtype))


class RecomputedInputLinear(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` saving the inputs of the op that produced ``x`` (not ``x``);
    backward recomputes ``x`` from them for the weight gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, kind, eps, *producer_inputs):
        compute_dtype = (torch.get_autocast_dtype('cpu') if torch.is_autocast_enabled('cpu')
                         else x.dtype)
        with torch.autocast('cpu', enabled=False):
            b = bias.to(compute_dtype) if bias is not None else None
            out = any_linear(x.to(compute_dtype), weight.to(compute_dtype), b)
        if out._base is not None:  # oneDNN's channels-last result is a view: in-place ops after
            # a custom Function need its own tensor, here one on the same memory (no copy)
            out = out.new_empty(0).set_(out.untyped_storage(), out.storage_offset(), out.shape,
                                        out.stride())
        ctx.save_for_backward(weight, *producer_inputs)
        ctx.kind, ctx.eps, ctx.compute_dtype = kind, eps, compute_dtype
        ctx.has_bias, ctx.x_dtype = bias is not None, x.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        weight, *producer_inputs = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        with torch.autocast('cpu', enabled=False):
            x = _recompute(ctx.kind, tuple(producer_inputs), ctx.eps)
            grad_x, grad_w, grad_b = linear_backward(
                grad_out.contiguous(), x.to(ctx.compute_dtype), weight.to(ctx.compute_dtype),
                ctx.has_bias, (need_x, need_w, need_b))
        grad_x = grad_x.to(ctx.x_dtype) if grad_x is not None else None
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(weight.dtype) if grad_b is not None else None
        return (grad_x, grad_w, grad_b, None, None) + (None,) * len(producer_inputs)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
    """:class:`RecomputedInputLinear` for an input tagged by :func:`layer_norm` / :func:`gelu`,
    else ``NotImplemented``."""
    producer = getattr(x, _TAG, None)
    if producer is None or not torch.is_grad_enabled() or x.dim() < 2:
        return NotImplemented
    kind, inputs, eps = producer
    return RecomputedInputLinear.apply(x, weight, bias, kind, eps, *inputs)


def mlp_kernel(mlp: nn.Module, x: torch.Tensor, *args) -> torch.Tensor:
    """The module's own forward for an MLP whose activation feeds only fc2 (``Mlp``,
    ``ConvMlp``): in training with GELU outputs in the workspace; at inference a token-wise
    one (no ``args``) in row chunks."""
    forward = type(mlp).forward
    rows = x.numel() // x.shape[-1]
    chunk = max(256, MLP_CHUNK_ELEMENTS // mlp.fc1.out_features)
    _scope.mlp = True
    try:
        if torch.is_grad_enabled() or args or x.dim() < 2 or rows <= chunk:
            return forward(mlp, x, *args)
        flat = x.reshape(rows, x.shape[-1])
        out = torch.cat([forward(mlp, flat[i:i + chunk]) for i in range(0, rows, chunk)])
        return out.view(*x.shape[:-1], out.shape[-1])
    finally:
        _scope.mlp = False


__all__ = ['layer_norm', 'gelu', 'linear', 'RecomputedInputLinear', 'mlp_kernel',
           'MLP_CHUNK_ELEMENTS']
