"""Peak bytes of live tensors in one forward (+ backward), counted on the meta device.

Every tensor an op creates is counted from its creation until its storage is freed; no memory
is touched, so a detection-size backward that a machine could not hold is still counted. On
CUDA this tracks ``max_memory_allocated`` (the caching allocator's rounding and workspaces
aside): it is a model's activation and gradient memory, not a device's.
"""
import weakref
from typing import Any, Dict, Iterable, Tuple

import torch
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode


class LiveTensorPeak(TorchDispatchMode):
    """Counts the storages ops create while active: ``current`` and ``peak`` bytes."""

    def __init__(self, existing: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.current = self.peak = 0
        self._live: Dict[int, int] = {}
        # storages that existed before (parameters, inputs): their views are not new memory
        self._existing = {t.untyped_storage()._cdata for t in existing}

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple = (), kwargs: Any = None
                           ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()  # its Python object lives as long as the storage
                key = storage._cdata
                if key not in self._live and key not in self._existing:
                    self._live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._free, key)
        return out

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)


def live_peak_bytes(model: nn.Module, x: torch.Tensor, backward: bool = True) -> int:
    """Peak live-tensor bytes of ``model(x)`` (and the backward of the sum of its outputs)
    beyond the parameters and ``x``; run it with the model and ``x`` on the meta device."""
    existing = [x, *model.parameters(), *model.buffers()]
    with LiveTensorPeak(existing) as live:
        outs = model(x)
        if backward:
            sum(o.float().sum() for o in tree_flatten(outs)[0]
                if isinstance(o, torch.Tensor)).backward()
    return live.peak


__all__ = ['LiveTensorPeak', 'live_peak_bytes']
