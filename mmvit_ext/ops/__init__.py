"""Device kernels, kept apart from the model code.

The model code (:mod:`mmvit_ext.layers`, the backbones) is plain PyTorch: it is what runs on
CUDA, under ``torch.compile`` and in exports. On CPU, a backbone's forward runs inside
:class:`CpuKernels`, a ``TorchFunctionMode`` that routes a few calls to faster kernels with the
same semantics -- the one place where kernels are chosen by device and dtype:

==============================================  =============================================
call in the model code                          CPU kernel (where it applies, else the call)
==============================================  =============================================
``F.linear`` (every ``nn.Linear``)              oneDNN GEMM, float32 (:mod:`.cpu_gemm`)
``layers.scaled_dot_product_attention``         small-map kernel (:mod:`.cpu_attention`)
``layers.explicit_attention``                   query chunks at inference (:mod:`.cpu_attention`)
``layers.norm_mlp`` (LayerNorm -> Mlp/ConvMlp)   LayerNorm->fc1, GELU->fc2 fused (:mod:`.cpu_mlp`)
==============================================  =============================================

``MMVIT_EXT_KERNELS=portable`` in the environment (or :func:`set_kernels`) turns every kernel
off: CPU then runs exactly the code a GPU runs.
"""
import os
import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..layers.attention import explicit_attention, scaled_dot_product_attention
from ..layers.mlp import norm_mlp
from . import cpu_attention, cpu_gemm, cpu_mlp

KERNEL_CHOICES = ('auto', 'portable')
CPU_KERNELS: Dict[Callable, Callable] = {
    F.linear: cpu_gemm.linear,
    scaled_dot_product_attention: cpu_attention.scaled_dot_product_attention,
    explicit_attention: cpu_attention.chunked_explicit_attention,
    norm_mlp: cpu_mlp.norm_mlp,
}


def _choice_from_env() -> str:
    value = os.environ.get('MMVIT_EXT_KERNELS', 'auto')
    if value not in KERNEL_CHOICES:
        raise ValueError(f'MMVIT_EXT_KERNELS must be one of {KERNEL_CHOICES}, got {value!r}')
    return value


_choice = _choice_from_env()
_active = threading.local()


def set_kernels(choice: str) -> str:
    """``'auto'`` (CPU kernels where they apply) or ``'portable'`` (none); returns the previous
    choice."""
    global _choice
    if choice not in KERNEL_CHOICES:
        raise ValueError(f'kernels must be one of {KERNEL_CHOICES}, got {choice!r}')
    previous, _choice = _choice, choice
    return previous


def get_kernels() -> str:
    return _choice


@contextmanager
def kernels(choice: str) -> Iterator[None]:
    """Run a block of code with ``choice`` (tests, benchmarks)."""
    previous = set_kernels(choice)
    try:
        yield
    finally:
        set_kernels(previous)


class CpuKernels(TorchFunctionMode):
    """Routes calls that have a CPU kernel to it; a kernel returns ``NotImplemented`` where it
    does not apply (dtype, size, device), and the call then runs as written."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kernel = CPU_KERNELS.get(func)
        if kernel is not None:
            out = kernel(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def cpu_kernels_apply(x: torch.Tensor) -> bool:
    """Whether a forward over ``x`` runs with the CPU kernels: CPU input, kernels on, not
    being compiled, traced or exported, and not already inside :class:`CpuKernels`."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing():
        return False
    return (_choice == 'auto' and x.device.type == 'cpu' and not getattr(_active, 'on', False)
            and not torch.onnx.is_in_onnx_export())


def call(fn: Callable[..., Any], x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``fn(x, *args, **kwargs)``, inside :class:`CpuKernels` when :func:`cpu_kernels_apply`."""
    if not cpu_kernels_apply(x):
        return fn(x, *args, **kwargs)
    _active.on = True
    try:
        with CpuKernels():
            return fn(x, *args, **kwargs)
    finally:
        _active.on = False


def with_kernels(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped to run through :func:`call` (e.g. for activation checkpointing, whose
    recomputation in backward happens outside the forward's mode)."""
    def wrapped(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return call(fn, x, *args, **kwargs)
    return wrapped


__all__ = ['KERNEL_CHOICES', 'CPU_KERNELS', 'CpuKernels', 'set_kernels', 'get_kernels',
           'kernels', 'cpu_kernels_apply', 'call', 'with_kernels']
