"""CPU kernel for :func:`mmvit_ext.layers.norm_mlp`: the pre-norm MLP branch with LayerNorm ->
fc1 and GELU -> fc2 fused, so that backward keeps neither the normalised tokens nor the GELU
output (the widest tensor of an MLP); both are recomputed, one cheap pass each.

On the 2-core VM fewer saved activations mean fewer freshly mapped pages, which is where CPU
training time goes at these sizes. Applies to :class:`~mmvit_ext.layers.Mlp` and
:class:`~mmvit_ext.layers.ConvMlp` behind an affine ``nn.LayerNorm``, exact GELU and no active
dropout, on CPU tensors (float32, or under CPU autocast with the GEMMs in the autocast dtype).
At inference, :class:`Mlp` runs in row chunks whose hidden activations stay under
``MLP_CHUNK_ELEMENTS`` (buffers glibc recycles instead of mapping fresh pages).
"""
from typing import Any, Tuple

import torch
from torch import nn

from ..layers.mlp import ConvMlp, Mlp
from .cpu_gemm import any_linear, linear_backward
from .workspace import workspace

# Hidden activations per token chunk of an inference-time Mlp (16 MB in float32).
MLP_CHUNK_ELEMENTS = 2 ** 22


class _LayerNormLinear(torch.autograd.Function):
    """``linear(layer_norm(x))`` (then a ReLU in place if ``relu``), saving ``x`` and the row
    statistics instead of the normalised tokens."""

    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, eps, weight, bias, compute_dtype, relu):
        shape = (x.shape[-1],)
        with torch.autocast('cpu', enabled=False):
            normed, mean, rstd = torch.native_layer_norm(x, shape, norm_weight, norm_bias, eps)
            b = bias.to(compute_dtype) if bias is not None else None
            out = any_linear(normed.to(compute_dtype), weight.to(compute_dtype), b)
            if relu:
                out = out.relu_()
        ctx.save_for_backward(x, norm_weight, norm_bias, mean, rstd, weight,
                              out if relu else None)
        ctx.eps, ctx.compute_dtype, ctx.has_bias = eps, compute_dtype, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, norm_weight, norm_bias, mean, rstd, weight, relu_out = ctx.saved_tensors
        need_x, need_nw, need_nb, _, need_w, need_b = ctx.needs_input_grad[:6]
        shape = (x.shape[-1],)
        with torch.autocast('cpu', enabled=False):
            if relu_out is not None:
                grad_out = torch.ops.aten.threshold_backward(grad_out, relu_out, 0)
            normed = torch.native_layer_norm(x, shape, norm_weight, norm_bias, ctx.eps)[0]
            grad_normed, grad_w, grad_b = linear_backward(
                grad_out.contiguous(), normed.to(ctx.compute_dtype),
                weight.to(ctx.compute_dtype), ctx.has_bias, (True, need_w, need_b))
            grad_x, grad_nw, grad_nb = torch.ops.aten.native_layer_norm_backward(
                grad_normed.to(x.dtype), x, shape, mean, rstd, norm_weight, norm_bias,
                [need_x, need_nw, need_nb])
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(weight.dtype) if grad_b is not None else None
        return grad_x, grad_nw, grad_nb, None, grad_w, grad_b, None, None


class _GeluLinear(torch.autograd.Function):
    """``linear(gelu(h))`` saving only ``h``: the GELU output is written to the workspace and
    recomputed there in backward."""

    @staticmethod
    def forward(ctx, h, weight, bias, compute_dtype):
        with torch.autocast('cpu', enabled=False):
            act = torch._C._nn.gelu(h, out=workspace(h.shape, h.dtype))
            b = bias.to(compute_dtype) if bias is not None else None
            out = any_linear(act.to(compute_dtype), weight.to(compute_dtype), b)
        ctx.save_for_backward(h, weight)
        ctx.compute_dtype, ctx.has_bias = compute_dtype, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, weight = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        with torch.autocast('cpu', enabled=False):
            act = torch._C._nn.gelu(h, out=workspace(h.shape, h.dtype))
            grad_act, grad_w, grad_b = linear_backward(
                grad_out.contiguous(), act.to(ctx.compute_dtype),
                weight.to(ctx.compute_dtype), ctx.has_bias, (need_h, need_w, need_b))
            grad_h = None
            if need_h:
                grad_act = grad_act.to(h.dtype)
                grad_h = torch.ops.aten.gelu_backward.grad_input(grad_act, h, grad_input=grad_act)
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(weight.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.get_autocast_dtype('cpu') if torch.is_autocast_enabled('cpu') else x.dtype


def _applies(x: torch.Tensor, norm: nn.Module, mlp: nn.Module) -> bool:
    return (x.device.type == 'cpu' and x.dtype == torch.float32 and x.is_contiguous()
            and type(norm) is nn.LayerNorm and norm.elementwise_affine
            and len(norm.normalized_shape) == 1 and type(mlp) in (Mlp, ConvMlp)
            and type(mlp.act) is nn.GELU and mlp.act.approximate == 'none'
            and not (mlp.training and isinstance(mlp.drop, nn.Dropout)))


def _norm_fc1(x: torch.Tensor, norm: nn.LayerNorm, fc1: nn.Linear, relu: bool) -> torch.Tensor:
    return _LayerNormLinear.apply(x, norm.weight, norm.bias, norm.eps, fc1.weight, fc1.bias,
                                  _compute_dtype(x), relu)


def _gelu_fc2(h: torch.Tensor, fc2: nn.Linear) -> torch.Tensor:
    return _GeluLinear.apply(h, fc2.weight, fc2.bias, _compute_dtype(h))


def _mlp(x: torch.Tensor, norm: nn.LayerNorm, mlp: Mlp) -> torch.Tensor:
    return _gelu_fc2(_norm_fc1(x, norm, mlp.fc1, False), mlp.fc2)


def _conv_mlp(x: torch.Tensor, norm: nn.LayerNorm, mlp: ConvMlp, hw: Tuple[int, int]
              ) -> torch.Tensor:
    h = _norm_fc1(x, norm, mlp.fc1, mlp.linear)
    b, _, c = h.shape
    grid = h.transpose(1, 2).reshape(b, c, hw[0], hw[1])
    return _gelu_fc2(mlp.dwconv(grid).flatten(2).transpose(1, 2), mlp.fc2)


def norm_mlp(x: torch.Tensor, norm: nn.Module, mlp: nn.Module, *args: Any) -> Any:
    """:func:`mmvit_ext.layers.norm_mlp` fused, or ``NotImplemented`` where it does not apply."""
    if not _applies(x, norm, mlp):
        return NotImplemented
    if type(mlp) is ConvMlp:
        return _conv_mlp(x, norm, mlp, *args)
    rows = x.numel() // x.shape[-1]
    chunk = max(256, MLP_CHUNK_ELEMENTS // mlp.fc1.out_features)
    if torch.is_grad_enabled() or rows <= chunk:
        return _mlp(x, norm, mlp)
    flat = x.reshape(rows, x.shape[-1])
    out = torch.cat([_mlp(flat[i:i + chunk], norm, mlp) for i in range(0, rows, chunk)])
    return out.view(*x.shape[:-1], out.shape[-1])


__all__ = ['norm_mlp', 'MLP_CHUNK_ELEMENTS']

