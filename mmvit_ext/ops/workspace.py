"""A per-thread CPU scratch buffer for temporaries that are recomputed rather than saved.

A fresh multi-megabyte CPU tensor costs page faults on first touch (glibc maps and unmaps large
blocks on every allocation; ~13 ms per 50 MB measured on the 2-core VM, several times the GELU
that writes it). Temporaries that never outlive the kernel consuming them (the GELU output
feeding fc2, and its recomputation in backward) reuse one buffer per thread and dtype.
"""
import threading
from typing import Sequence

import torch

_local = threading.local()


def workspace(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor of ``shape`` backed by this thread's buffer for ``dtype``:
    valid until the next call for the same dtype."""
    numel = 1
    for s in shape:
        numel *= int(s)
    buffers = getattr(_local, 'buffers', None)
    if buffers is None:
        buffers = _local.buffers = {}
    buffer = buffers.get(dtype)
    if buffer is None or buffer.numel() < numel:
        buffer = buffers[dtype] = torch.empty(numel, dtype=dtype)
    return buffer[:numel].view(tuple(shape))


def release_workspace() -> None:
    """Free this thread's buffers."""
    _local.buffers = {}
