"""The switches of mmvit_ext, each set for a block of code by a context manager.

==========================================  ===================================================
``with flags.fused_attention(False):``       every attention materialises its whole map (the
                                            explicit path, no fused or chunked kernel):
                                            ``attn_map`` forward hooks see every map once,
                                            FLOP counters see the matmuls. ``True`` (default):
                                            attention without map transforms may run
                                            ``F.scaled_dot_product_attention``; a module built
                                            with ``fused=False`` never does.
``with flags.kernels('portable'):``          no CPU kernel (:mod:`mmvit_ext.ops`): CPU runs
                                            exactly the code a GPU runs. ``'auto'`` (default,
                                            or ``MMVIT_EXT_KERNELS`` in the environment): CPU
                                            kernels where they apply.
``with flags.strict_loading(False):``        backbones accept checkpoints that leave tensors
                                            unloaded (a warning instead of an error), on every
                                            load path (``init_cfg``, ``load_state_dict`` ...).
==========================================  ===================================================

Like ``torch.backends.cudnn.flags``, a switch holds for the whole process while its block runs
and is restored on exit; ``flags.kernels.get()`` (etc.) reads the current value. Model code reads
the switches at run time, so they apply to models built before the block as well.
"""
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Tuple

KERNEL_CHOICES = ('auto', 'portable')


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


def _choice(choices: Tuple[str, ...]) -> Callable[[Any], Optional[str]]:
    return lambda value: None if value in choices else f'must be one of {choices}'


fused_attention = Flag('fused_attention', True, _bool)
kernels = Flag('kernels', os.environ.get('MMVIT_EXT_KERNELS', 'auto'), _choice(KERNEL_CHOICES))
strict_loading = Flag('strict_loading', True, _bool)

__all__ = ['Flag', 'KERNEL_CHOICES', 'fused_attention', 'kernels', 'strict_loading']
