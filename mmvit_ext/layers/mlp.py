"""Token MLPs, with GELU -> fc2 as one op that recomputes the GELU instead of saving it."""
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .linear import Linear, linear, linear_backward
from .workspace import workspace


class _GeluLinear(torch.autograd.Function):
    """``linear(gelu(h), weight, bias)`` saving only ``h``: the GELU output (the widest tensor of
    an MLP) is written to the workspace, and recomputed there in backward."""

    @staticmethod
    def forward(ctx, h, weight, bias, compute_dtype):
        with torch.autocast(h.device.type, enabled=False):
            act = torch._C._nn.gelu(h, out=workspace(h.shape, h.dtype, h.device))
            w = weight.to(compute_dtype)
            b = bias.to(compute_dtype) if bias is not None else None
            out = linear(act.to(compute_dtype), w, b)
        ctx.save_for_backward(h, weight)
        ctx.compute_dtype = compute_dtype
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, weight = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        with torch.autocast(h.device.type, enabled=False):
            act = torch._C._nn.gelu(h, out=workspace(h.shape, h.dtype, h.device))
            w = weight.to(ctx.compute_dtype)
            grad_act, grad_w, grad_b = linear_backward(
                grad_out.contiguous(), act.to(ctx.compute_dtype), w, ctx.has_bias,
                (need_h, need_w, need_b))
            grad_h = None
            if need_h:
                grad_act = grad_act.to(h.dtype)
                grad_h = torch.ops.aten.gelu_backward.grad_input(grad_act, h, grad_input=grad_act)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(weight.dtype)
        return grad_h, grad_w, grad_b, None


def gelu_linear(h: torch.Tensor, fc: nn.Linear) -> torch.Tensor:
    """``fc(gelu(h))`` (exact GELU) on CPU through :class:`_GeluLinear`; elsewhere, or under
    ``torch.compile``, the plain modules' ops."""
    if h.device.type != 'cpu' or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return fc(F.gelu(h))
    dtype = torch.get_autocast_dtype('cpu') if torch.is_autocast_enabled('cpu') else h.dtype
    return _GeluLinear.apply(h, fc.weight, fc.bias, dtype)


class _LayerNormLinear(torch.autograd.Function):
    """``linear(layer_norm(x), weight, bias)`` (then a ReLU in place if ``relu``) saving ``x``
    and the row statistics instead of the normalised tokens, which backward recomputes (one cheap
    pass over ``x``)."""

    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, eps, weight, bias, compute_dtype, relu=False):
        shape = (x.shape[-1],)
        with torch.autocast(x.device.type, enabled=False):
            normed, mean, rstd = torch.native_layer_norm(x, shape, norm_weight, norm_bias, eps)
            b = bias.to(compute_dtype) if bias is not None else None
            out = linear(normed.to(compute_dtype), weight.to(compute_dtype), b)
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
        with torch.autocast(x.device.type, enabled=False):
            if relu_out is not None:
                grad_out = torch.ops.aten.threshold_backward(grad_out, relu_out, 0)
            normed = torch.native_layer_norm(x, shape, norm_weight, norm_bias, ctx.eps)[0]
            grad_normed, grad_w, grad_b = linear_backward(
                grad_out.contiguous(), normed.to(ctx.compute_dtype),
                weight.to(ctx.compute_dtype), ctx.has_bias, (True, need_w, need_b))
            grad_x, grad_nw, grad_nb = torch.ops.aten.native_layer_norm_backward(
                grad_normed.to(x.dtype), x, shape, mean, rstd, norm_weight, norm_bias,
                [need_x, need_nw, need_nb])
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(weight.dtype)
        return grad_x, grad_nw, grad_nb, None, grad_w, grad_b, None, None


def _fusable_norm(norm: Optional[nn.Module], x: torch.Tensor) -> bool:
    return (type(norm) is nn.LayerNorm and norm.elementwise_affine and len(norm.normalized_shape) == 1
            and x.device.type == 'cpu' and x.dtype == torch.float32 and x.is_contiguous()
            and not torch.compiler.is_compiling() and not torch.jit.is_tracing())


def layer_norm_linear(x: torch.Tensor, norm: Optional[nn.Module], fc: nn.Linear,
                      relu: bool = False) -> torch.Tensor:
    """``fc(norm(x))`` (then ReLU if ``relu``); a float32 CPU LayerNorm is fused with ``fc``
    (:class:`_LayerNormLinear`) so that the normalised tokens are not kept for backward."""
    if norm is None or not _fusable_norm(norm, x):
        out = fc(x if norm is None else norm(x))
        return F.relu(out, inplace=True) if relu else out  # fc's output is not saved by fc
    dtype = torch.get_autocast_dtype('cpu') if torch.is_autocast_enabled('cpu') else x.dtype
    return _LayerNormLinear.apply(x, norm.weight, norm.bias, norm.eps, fc.weight, fc.bias, dtype,
                                  relu)


def _exact_gelu(act: nn.Module) -> bool:
    return type(act) is nn.GELU and act.approximate == 'none'


# Hidden activations per token chunk of an inference-time Mlp (16 MB in float32).
MLP_CHUNK_ELEMENTS = 2 ** 22


class Mlp(nn.Module):
    """fc1 -> act -> drop -> fc2 -> drop on (..., C) tokens."""

    def __init__(self, in_features: int, hidden_features: Optional[int] = None,
                 out_features: Optional[int] = None, act_layer: Callable[[], nn.Module] = nn.GELU,
                 drop: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.fc2 = Linear(hidden_features, out_features, bias=bias)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, norm: Optional[nn.Module] = None) -> torch.Tensor:
        """MLP of ``x``, or of ``norm(x)`` with the norm fused into fc1 where it can be.

        At inference on CPU, tokens run in chunks whose hidden activations stay under
        ``MLP_CHUNK_ELEMENTS``: buffers that glibc recycles instead of mapping fresh pages (the
        cost that made a 2x larger image more than 2x slower).
        """
        rows = x.numel() // x.shape[-1]
        chunk = max(256, MLP_CHUNK_ELEMENTS // self.fc1.out_features)
        if torch.is_grad_enabled() or x.device.type != 'cpu' or rows <= chunk \
                or torch.compiler.is_compiling() or torch.jit.is_tracing():
            return self._forward(x, norm)
        flat = x.reshape(rows, x.shape[-1])
        out = torch.cat([self._forward(flat[i:i + chunk], norm) for i in range(0, rows, chunk)])
        return out.view(*x.shape[:-1], out.shape[-1])

    def _forward(self, x: torch.Tensor, norm: Optional[nn.Module]) -> torch.Tensor:
        h = layer_norm_linear(x, norm, self.fc1)
        if _exact_gelu(self.act) and not (self.training and isinstance(self.drop, nn.Dropout)):
            return gelu_linear(h, self.fc2)
        return self.drop(self.fc2(self.drop(self.act(h))))


class ConvMlp(nn.Module):
    """PVTv2 FFN: fc1 -> [ReLU] -> 3x3 depthwise conv on the (H, W) grid -> act -> fc2.

    The depthwise conv gives the positional information that PVTv2 uses instead of a position
    embedding; ``linear`` (PVTv2-li) adds the ReLU after fc1.
    """

    def __init__(self, in_features: int, hidden_features: int,
                 act_layer: Callable[[], nn.Module] = nn.GELU, drop: float = 0.0,
                 linear: bool = False) -> None:
        super().__init__()
        self.fc1 = Linear(in_features, hidden_features)
        self.linear = linear
        self.dwconv = nn.Conv2d(hidden_features, hidden_features, 3, 1, 1, groups=hidden_features)
        self.act = act_layer()
        self.fc2 = Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: 'tuple[int, int]',
                norm: Optional[nn.Module] = None) -> torch.Tensor:
        """FFN of ``x`` (or of ``norm(x)``, fused into fc1 as in :class:`Mlp`) on an hw grid."""
        x = layer_norm_linear(x, norm, self.fc1, relu=self.linear)
        b, n, c = x.shape
        grid = x.transpose(1, 2).reshape(b, c, hw[0], hw[1])
        x = self.dwconv(grid).flatten(2).transpose(1, 2)
        if _exact_gelu(self.act) and not (self.training and isinstance(self.drop, nn.Dropout)):
            return gelu_linear(x, self.fc2)
        return self.drop(self.fc2(self.drop(self.act(x))))
