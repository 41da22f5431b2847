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
``layers.explicit_attention``                   query chunks at inference (:mod:`.cpu_attention`);
                                                a map carried on, in row chunks
                                                (:mod:`.cpu_refiner`)
``layers.map_attention``                        a Refiner map in row chunks at inference, each
                                                applied to the values (:mod:`.cpu_refiner`)
==============================================  =============================================

Module kernels (:data:`MODULE_KERNELS`) stand in for the ``forward`` of a layer type while a
forward runs inside :func:`call`; they run the module's own forward (:func:`.cpu_mlp.mlp_kernel`
for ``Mlp`` / ``ConvMlp``: GELU outputs into a reused buffer in training, row chunks at
inference; :func:`.cpu_refiner.refiner_kernel` for ``RefinerMap``: BatchNorms folded,
channels-last, row chunks at inference).

``mmvit_ext.flags.kernels('portable')`` (or ``MMVIT_EXT_KERNELS=portable`` in the environment)
turns every kernel off: CPU then runs exactly the code a GPU runs.
"""
import functools
import threading
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Callable, Dict, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .. import flags, torch_compat
from ..layers.attention import (explicit_attention, map_attention,
                                scaled_dot_product_attention)
from ..layers.map_transforms import RefinerMap
from ..layers.mlp import ConvMlp, Mlp
from . import cpu_attention, cpu_gemm, cpu_mlp, cpu_refiner

_active = threading.local()
_KERNELS_SUPPORTED = torch_compat.supports('CPU kernels')


def _linear(*args: Any, **kwargs: Any) -> Any:
    """The recomputing Linear after a tagged producer, else the oneDNN GEMM."""
    out = cpu_mlp.linear(*args, **kwargs)
    return cpu_gemm.linear(*args, **kwargs) if out is NotImplemented else out


def _explicit_attention(*args: Any, **kwargs: Any) -> Any:
    """A map carried on (Refined-ViT) in row chunks, else query chunks where they apply."""
    out = cpu_refiner.carried_explicit_attention(*args, **kwargs)
    return cpu_attention.chunked_explicit_attention(*args, **kwargs) \
        if out is NotImplemented else out


CPU_KERNELS: Dict[Callable, Callable] = {
    F.linear: _linear,
    F.layer_norm: cpu_mlp.layer_norm,
    F.gelu: cpu_mlp.gelu,
    scaled_dot_product_attention: cpu_attention.scaled_dot_product_attention,
    explicit_attention: _explicit_attention,
    map_attention: cpu_refiner.map_attention,
}
MODULE_KERNELS: Dict[type, Callable[..., Any]] = {
    Mlp: cpu_mlp.mlp_kernel,
    ConvMlp: cpu_mlp.mlp_kernel,
    RefinerMap: cpu_refiner.refiner_kernel,
}


def _module_kernel(module: nn.Module) -> Optional[Callable[..., Any]]:
    """``module``'s :data:`MODULE_KERNELS` entry bound to it, or ``None``."""
    kernel = MODULE_KERNELS.get(type(module))
    return None if kernel is None else functools.partial(kernel, module)


@contextmanager
def module_kernels(root: Any) -> Iterator[None]:
    """Within the block, the modules of ``root`` (a module, or a bound method of one) whose type
    has a :data:`MODULE_KERNELS` entry run it as their ``forward``."""
    owner = root if isinstance(root, nn.Module) else getattr(root, '__self__', None)
    patched = []
    if isinstance(owner, nn.Module):
        for module in owner.modules():
            kernel = _module_kernel(module)
            if kernel is not None and 'forward' not in vars(module):
                module.forward = kernel  # shadows the class's
                patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward


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
    if flags.kernels.get() != 'auto' or x.device.type != 'cpu':
        return False
    if not _KERNELS_SUPPORTED:
        torch_compat.warn_once('CPU kernels')
        return False
    if torch_compat.is_compiling() or torch_compat.is_exporting() or torch.jit.is_tracing():
        return False
    return not getattr(_active, 'on', False) and not torch.onnx.is_in_onnx_export()


@contextmanager
def _kernels_on(root: Any) -> Iterator[None]:
    """:class:`CpuKernels` and the module kernels of ``root`` for the block."""
    _active.on = True
    try:
        with CpuKernels(), module_kernels(root):
            yield
    finally:
        _active.on = False


def call(fn: Callable[..., Any], x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``fn(x, *args, **kwargs)``, inside :class:`CpuKernels` when :func:`cpu_kernels_apply`."""
    if not cpu_kernels_apply(x):
        return fn(x, *args, **kwargs)
    with _kernels_on(fn):
        return fn(x, *args, **kwargs)


def kernels_as_now(root: nn.Module) -> AbstractContextManager:
    """A context that runs ``root`` with the kernels in effect now (inside a forward through
    :func:`call` or not): for a recomputation in backward (activation checkpointing of a
    submodule), which runs outside the forward's mode."""
    return _kernels_on(root) if getattr(_active, 'on', False) else nullcontext()


def with_kernels(fn: Callable[..., Any], lean: bool = False) -> Callable[..., Any]:
    """``fn`` wrapped to run through :func:`call` (e.g. for activation checkpointing, whose
    recomputation in backward happens outside the forward's mode); ``lean``: with the kernels
    that save the least (:func:`.cpu_attention.lean`), for blocks checkpointed to save memory."""
    def wrapped(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        with cpu_attention.lean() if lean else nullcontext():
            return call(fn, x, *args, **kwargs)
    return wrapped


def module_forward(module: nn.Module) -> Callable[..., Any]:
    """The forward ``module`` runs now: its :data:`MODULE_KERNELS` entry inside a forward with
    the kernels on, else its class's (for code that shadows a module's ``forward``)."""
    kernel = _module_kernel(module) if getattr(_active, 'on', False) else None
    return kernel or functools.partial(type(module).forward, module)


__all__ = ['CPU_KERNELS', 'MODULE_KERNELS', 'module_kernels', 'CpuKernels', 'cpu_kernels_apply',
           'call', 'with_kernels', 'module_forward', 'kernels_as_now']
