"""Float32 CPU GEMMs through oneDNN.

``F.linear`` on CPU calls MKL's sgemm, which picks its code path by CPU vendor: on AMD EPYC it
runs AVX2 kernels even where the core has AVX-512. A 1x1 convolution over a channels-last view
of the same tokens runs oneDNN's JIT kernels for the ISA the CPU reports, forward and backward
(autograd differentiates the convolution; measured on a 2-core EPYC with AVX-512: fwd+bwd
1.5-2.9x faster for 2k-32k tokens). Same product up to float32 summation order.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

# Below this many rows the convolution's set-up costs more than MKL's AVX2 loses (measured).
ONEDNN_MIN_ROWS = 256


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Large float32 CPU inputs outside autocast."""
    return (x.dtype == torch.float32 and weight.dtype == torch.float32 and x.dim() >= 2
            and x.device.type == 'cpu' and x.numel() >= ONEDNN_MIN_ROWS * x.shape[-1]
            and not torch.is_autocast_enabled('cpu') and torch.backends.mkldnn.is_available())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor = None):
    """``F.linear`` as a 1x1 convolution, or ``NotImplemented`` where :func:`applies` says no."""
    if not applies(x, weight):
        return NotImplemented
    out_features, in_features = weight.shape
    rows = x.numel() // in_features
    # (rows, K) row-major is a channels-last (1, K, rows, 1) image: no copy on the way in or out.
    image = x.reshape(1, rows, 1, in_features).permute(0, 3, 1, 2)
    out = F.conv2d(image, weight.view(out_features, in_features, 1, 1), bias)
    return out.permute(0, 2, 3, 1).reshape(*x.shape[:-1], out_features)


def linear_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                    has_bias: bool, needs: Tuple[bool, bool, bool]
                    ) -> Tuple[Optional[torch.Tensor], ...]:
    """Gradients (input, weight, bias) of ``F.linear(x, weight, bias)``, each only where
    ``needs`` says, for the fused kernels' hand-written backwards: oneDNN where :func:`applies`,
    else matrix products."""
    out_features, in_features = weight.shape
    need_x, need_w, need_b = needs[0], needs[1], needs[2] and has_bias
    if applies(x, weight):
        rows = x.numel() // in_features
        grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
            grad_out.reshape(1, rows, 1, out_features).permute(0, 3, 1, 2),
            x.reshape(1, rows, 1, in_features).permute(0, 3, 1, 2),
            weight.view(out_features, in_features, 1, 1), [out_features] if has_bias else None,
            [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [need_x, need_w, need_b])
        if need_x:
            grad_x = grad_x.permute(0, 2, 3, 1).reshape(x.shape)
        if need_w:
            grad_w = grad_w.view(out_features, in_features)
        return grad_x, grad_w, grad_b
    grad_2d = grad_out.reshape(-1, out_features)
    grad_x = grad_out.matmul(weight) if need_x else None
    grad_w = grad_2d.t().mm(x.reshape(-1, in_features)) if need_w else None
    grad_b = grad_2d.sum(0) if need_b else None
    return grad_x, grad_w, grad_b


def any_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None
               ) -> torch.Tensor:
    """:func:`linear` where it applies, else ``F.linear`` (for kernels that run outside the
    torch-function mode)."""
    out = linear(x, weight, bias)
    return F.linear(x, weight, bias) if out is NotImplemented else out
