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
    if h.device.type != 'cpu' or torch.compiler.is_compiling():
        return fc(F.gelu(h))
    dtype = torch.get_autocast_dtype('cpu') if torch.is_autocast_enabled('cpu') else h.dtype
    return _GeluLinear.apply(h, fc.weight, fc.bias, dtype)


def _exact_gelu(act: nn.Module) -> bool:
    return type(act) is nn.GELU and act.approximate == 'none'


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
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
        self.relu = nn.ReLU() if linear else nn.Identity()
        self.dwconv = nn.Conv2d(hidden_features, hidden_features, 3, 1, 1, groups=hidden_features)
        self.act = act_layer()
        self.fc2 = Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: 'tuple[int, int]') -> torch.Tensor:
        x = self.relu(self.fc1(x))
        b, n, c = x.shape
        grid = x.transpose(1, 2).reshape(b, c, hw[0], hw[1])
        x = self.dwconv(grid).flatten(2).transpose(1, 2)
        if _exact_gelu(self.act) and not (self.training and isinstance(self.drop, nn.Dropout)):
            return gelu_linear(x, self.fc2)
        return self.drop(self.fc2(self.drop(self.act(x))))
