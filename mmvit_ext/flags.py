"""The switches of mmvit_ext, each set for a block of code by a context manager.

==========================================  ===================================================
``with flags.fused_attention(False):``       every attention materialises its whole map (the
                                            explicit path, no fused or chunked kernel):
                                            ``attn_map`` forward hooks see every map once,
                                            FLOP counters see the matmuls. ``True`` (default):
                                            attention without map transforms runs
                                            ``F.scaled_dot_product_attention`` where one of
                                            its fused kernels takes the call
                                            (:mod:`mmvit_ext.layers.sdpa_kernels`), else the
                                            explicit product; a module built with
                                            ``fused=False`` never does.
``with flags.strict_loading(False):``        backbones accept checkpoints that leave tensors
                                            unloaded (a warning instead of an error), on every
                                            load path (``init_cfg``, ``load_state_dict`` ...).
==========================================  ===================================================

Like ``torch.backends.cudnn.flags``, a switch holds for the whole process while its block runs
and is restored on exit; ``flags.fused_attention.get()`` (etc.) reads the current value. Model code reads
the switches at run time, so they apply to models built before the block as well.

One more switch is an environment variable, read when a layer is built (not by a block):
``MMVIT_EXT_KERNELS=portable`` (:data:`KERNELS_ENV`) builds every layer without its device
kernel of :mod:`mmvit_ext.ops` (today mmcv's deformable attention on CUDA, in ViT-Adapter),
so that it runs its portable PyTorch definition on every device; its repr says so
(``kernel=pytorch (MMVIT_EXT_KERNELS=portable)``). ``portable`` is the only
value the variable takes: any other is ignored, with one warning when mmvit_ext is imported
(:func:`warn_removed_kernels_env`). ``flags.kernels`` and ``flags.KERNEL_CHOICES`` do not exist;
reading either raises ``AttributeError`` naming what to use instead (:data:`KERNELS_REMOVED`).
"""
import os
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

KERNELS_ENV = 'MMVIT_EXT_KERNELS'
# the line behind flags.kernels' AttributeError and the warning for any other MMVIT_EXT_KERNELS
KERNELS_REMOVED = ('the CPU kernels that intercepted torch calls were removed in 0.2.0, and '
                   'flags.kernels with them: every device runs the portable model code, with '
                   'device kernels chosen when a layer is built and shown in its repr; the '
                   'explicit attention path is flags.fused_attention(False)')


class Flag:
    """A process-wide switch: ``with flag(value): ...`` sets it for a block, ``flag.get()``
    reads it."""

    def __init__(self, name: str, default: Any,
                 check: Optional[Callable[[Any], Optional[str]]] = None) -> None:
        self.name = name
        self._check = check
        self._value = self.validate(default)

    def validate(self, value: Any) -> Any:
        problem = self._check(value) if self._check is not None else None
        if problem:
            raise ValueError(f'mmvit_ext.flags.{self.name}: {problem}, got {value!r}')
        return value

    def get(self) -> Any:
        return self._value

    @contextmanager
    def __call__(self, value: Any) -> Iterator[None]:
        value = self.validate(value)
        previous, self._value = self._value, value
        try:
            yield
        finally:
            self._value = previous

    def __repr__(self) -> str:
        return f'mmvit_ext.flags.{self.name}({self._value!r})'


def _bool(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else 'expects True or False'


fused_attention = Flag('fused_attention', True, _bool)
strict_loading = Flag('strict_loading', True, _bool)


def __getattr__(name: str) -> Any:
    """``flags.kernels`` / ``flags.KERNEL_CHOICES``: gone, said in one line."""
    if name in ('kernels', 'KERNEL_CHOICES'):
        raise AttributeError(f'mmvit_ext.flags.{name} is gone: {KERNELS_REMOVED}')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def warn_removed_kernels_env() -> Optional[str]:
    """Warn (and return the line) when ``MMVIT_EXT_KERNELS`` holds a value nothing reads: any
    value but ``portable``, which turns the device kernels of :mod:`mmvit_ext.ops` off."""
    value = os.environ.get(KERNELS_ENV)
    if value is None or value.strip().lower() == 'portable':
        return None
    message = (f'mmvit_ext: {KERNELS_ENV}={value!r} is ignored: {KERNELS_REMOVED} '
               f'({KERNELS_ENV}=portable still turns the device kernels of mmvit_ext.ops off)')
    warnings.warn(message, UserWarning, stacklevel=2)
    return message


warn_removed_kernels_env()  # once, when mmvit_ext is imported

__all__ = ['Flag', 'fused_attention', 'strict_loading', 'KERNELS_ENV', 'warn_removed_kernels_env']
