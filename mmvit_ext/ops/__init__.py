"""Device kernels, kept apart from the model code.

The model code (:mod:`mmvit_ext.layers`, the backbones) is plain PyTorch: it is what runs on
CUDA, under ``torch.compile`` and in exports. On CPU, a backbone's forward runs inside
:class:`CpuKernels`, a ``TorchFunctionMode`` that routes a few calls to faster kernels with the
same semantics -- the one place where kernels are chosen by device and dtype:

==============================================  =============================================
call in the model code                          CPU kernel (where it applies, else the call)
==============================================  =============================================
``F.linear`` (every ``nn.Linear``)              oneDNN GEMM, float32 (:mod:`.cpu_gemm`); after
                                                a LayerNorm / GELU in training, one that saves
                                                the producer's input instead (:mod:`.cpu_mlp`)
``F.layer_norm``, ``F.gelu``                    the same op, output tagged for ``F.linear``
``layers.scaled_dot_product_attention``         small-map kernel (:mod:`.cpu_attention`)
``layers.explicit_attention``                   query chunks at inference (:mod:`.cpu_attention`)
==============================================  =============================================

``mmvit_ext.flags.kernels('portable')`` (or ``MMVIT_EXT_KERNELS=portable`` in the environment)
turns every kernel off: CPU then runs exactly the code a GPU runs.
"""
import threading
from typing import Any, Callable, Dict

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import flags
from ..layers.attention import explicit_attention, scaled_dot_product_attention
from . import cpu_attention, cpu_gemm, cpu_mlp

_active = threading.local()


def _linear(*args: Any, **kwargs: Any) -> Any:
    """The recomputing Linear after a tagged producer, else the oneDNN GEMM."""
    out = cpu_mlp.linear(*args, **kwargs)
    return cpu_gemm.linear(*args, **kwargs) if out is NotImplemented else out


CPU_KERNELS: Dict[Callable, Callable] = {
    F.linear: _linear,
    F.layer_norm: cpu_mlp.layer_norm,
    F.gelu: cpu_mlp.gelu,
    scaled_dot_product_attention: cpu_attention.scaled_dot_product_attention,
    explicit_attention: cpu_attention.chunked_explicit_attention,
}


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
    return (flags.kernels.get() == 'auto' and x.device.type == 'cpu'
            and not getattr(_active, 'on', False) and not torch.onnx.is_in_onnx_export())


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


__all__ = ['CPU_KERNELS', 'CpuKernels', 'cpu_kernels_apply', 'call', 'with_kernels']
