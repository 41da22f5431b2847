"""The switches of mmvit_ext, each set for a block of code by a context manager.

==========================================  ===================================================
``with flags.fused_attention(False):``       every attention materialises its whole map (the
                                            explicit path, no fused or chunked kernel):
                                            ``attn_map`` forward hooks see every map once,
                                            FLOP counters see the matmuls. ``True`` (default):
                                            attention without map transforms may run
                                            ``F.scaled_dot_product_attention``; a module built
                                            with ``fused=False`` never does.
``with flags.strict_loading(False):``        backbones accept checkpoints that leave tensors
                                            unloaded (a warning instead of an error), on every
                                            load path (``init_cfg``, ``load_state_dict`` ...).
==========================================  ===================================================

Like ``torch.backends.cudnn.flags``, a switch holds for the whole process while its block runs
and is restored on exit; ``flags.fused_attention.get()`` (etc.) reads the current value. Model code reads
the switches at run time, so they apply to models built before the block as well.
"""
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

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

__all__ = ['Flag', 'fused_attention', 'strict_loading']
