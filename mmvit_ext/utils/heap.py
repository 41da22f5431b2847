"""glibc heap control: keep freed CPU memory in the process, or hand it back.

glibc serves blocks above its mmap threshold (at most 32 MB) with a fresh ``mmap`` and unmaps
them on free, so every large CPU tensor of a training step faults all of its pages in again.
On this project's CPU machines (virtual machines) those faults dominate the step once tensors
grow: PVTv2-b2-li fwd+bwd at batch 2, 512x512 took 1.76 s by default and 1.23 s with the heap
retained; doubling the pixels cost 2.4-3.0x by default and 1.9-2.0x retained. The price is a
higher resident peak (+10-15 % there), since freed memory is kept for reuse.

Process-wide, so retaining is opt-in: tools call it behind a flag (``--retain-heap``), never on
import.
"""
import ctypes
import ctypes.util
from functools import lru_cache
from typing import Optional

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = 2 ** 31 - 1


@lru_cache(maxsize=1)
def _glibc() -> Optional[ctypes.CDLL]:
    """The process's C library if it is glibc, else ``None``."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        libc.gnu_get_libc_version  # glibc only
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc


def retain_freed_memory() -> bool:
    """Serve every allocation from the heap (no per-block ``mmap``) and never trim it back.

    Returns ``False`` (and changes nothing) where the C library is not glibc.
    """
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _INT_MAX))


def trim_freed_memory() -> bool:
    """Give freed heap pages back to the OS now (``malloc_trim``); ``False`` if not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
