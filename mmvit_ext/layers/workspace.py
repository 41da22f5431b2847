"""A per-thread scratch buffer for CPU temporaries that are recomputed rather than saved.

A fresh multi-megabyte CPU tensor costs page faults on first touch (glibc maps and unmaps large
blocks on every allocation; ~13 ms per 50 MB measured here, several times the GELU writing it).
Temporaries that never outlive the op that consumes them (the GELU output feeding fc2, and its
recomputation in backward) reuse one buffer instead. :func:`release_workspace` frees it.
"""
import threading
from typing import Sequence

import torch

_local = threading.local()


def workspace(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` backed by this thread's buffer for (dtype, device).

    The contents are valid until the next call for the same dtype and device: use it only for a
    value consumed before then. CUDA tensors are allocated fresh (the caching allocator already
    reuses memory, and a shared buffer would race across streams).
    """
    device = torch.device(device)
    if device.type != 'cpu':
        return torch.empty(shape, dtype=dtype, device=device)
    numel = 1
    for s in shape:
        numel *= int(s)
    buffers = getattr(_local, 'buffers', None)
    if buffers is None:
        buffers = _local.buffers = {}
    buffer = buffers.get((dtype, device))
    if buffer is None or buffer.numel() < numel:
        buffer = buffers[(dtype, device)] = torch.empty(numel, dtype=dtype, device=device)
    return buffer[:numel].view(tuple(shape))


def release_workspace() -> None:
    """Free this thread's buffers."""
    _local.buffers = {}
