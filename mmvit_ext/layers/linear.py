"""Token projections whose float32 CPU GEMMs run on oneDNN.

``F.linear`` on CPU calls MKL's sgemm, which picks its code path by CPU vendor: on AMD EPYC it
runs AVX2 kernels even where the core has AVX-512. A 1x1 convolution over a channels-last view of
the same tokens runs oneDNN's JIT kernels for the ISA the CPU reports, forward and backward
(measured on a 2-core EPYC with AVX-512: fwd+bwd 1.5-2.9x faster for 2k-32k tokens). The result
is the same product up to float32 summation order. Only float32 tensors with enough rows take
this path; autocast (bf16 / fp16), CUDA, ``torch.compile`` and small inputs use ``F.linear``.

``MMVIT_EXT_CPU_GEMM=native`` (or :func:`set_cpu_gemm`) turns the oneDNN path off.
"""
import os

import torch
import torch.nn.functional as F
from torch import nn

CPU_GEMM_CHOICES = ('onednn', 'native')
# Below this many rows the convolution's set-up costs more than MKL's AVX2 loses (measured).
ONEDNN_MIN_ROWS = 256


def _initial_cpu_gemm() -> str:
    value = os.environ.get('MMVIT_EXT_CPU_GEMM', 'onednn')
    if value not in CPU_GEMM_CHOICES:
        raise ValueError(f'MMVIT_EXT_CPU_GEMM must be one of {CPU_GEMM_CHOICES}, got {value!r}')
    return value


_cpu_gemm = _initial_cpu_gemm()


def set_cpu_gemm(backend: str) -> str:
    """Choose the float32 CPU GEMM of :class:`Linear` (``'onednn'`` or ``'native'``); returns
    the previous choice."""
    global _cpu_gemm
    if backend not in CPU_GEMM_CHOICES:
        raise ValueError(f'cpu gemm backend must be one of {CPU_GEMM_CHOICES}, got {backend!r}')
    previous, _cpu_gemm = _cpu_gemm, backend
    return previous


def get_cpu_gemm() -> str:
    return _cpu_gemm


def _use_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (_cpu_gemm == 'onednn' and x.device.type == 'cpu' and x.dtype == torch.float32
            and weight.dtype == torch.float32 and x.dim() >= 2
            and x.numel() >= ONEDNN_MIN_ROWS * x.shape[-1]
            and not torch.is_autocast_enabled('cpu') and not torch.compiler.is_compiling()
            and not torch.jit.is_tracing()
            and torch.backends.mkldnn.is_available())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor = None) -> torch.Tensor:
    """``F.linear`` with the oneDNN route for large float32 CPU inputs (see module docs)."""
    if not _use_onednn(x, weight):
        return F.linear(x, weight, bias)
    out_features, in_features = weight.shape
    rows = x.numel() // in_features
    # (rows, K) row-major is a channels-last (1, K, rows, 1) image: no copy on the way in or out.
    image = x.reshape(1, rows, 1, in_features).permute(0, 3, 1, 2)
    out = F.conv2d(image, weight.view(out_features, in_features, 1, 1), bias)
    return out.permute(0, 2, 3, 1).reshape(*x.shape[:-1], out_features)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def linear_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                    has_bias: bool, needs: 'tuple[bool, bool, bool]'):
    """Gradients (input, weight, bias) of ``linear(x, weight, bias)``, each only if ``needs``
    says so, through the same GEMM route as the forward (oneDNN for large float32 CPU)."""
    out_features, in_features = weight.shape
    need_x, need_w, need_b = needs[0], needs[1], needs[2] and has_bias
    if _use_onednn(x, weight):
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
