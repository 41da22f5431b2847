"""glibc heap control: keep freed CPU memory in the process, or hand it back.

glibc serves blocks above its mmap threshold (at most 32 MB) with a fresh ``mmap`` and unmaps
them on free, so every large CPU tensor of a training step faults all of its pages in again.
On virtual machines, where touching freshly mapped memory is expensive, those faults can
dominate a step once tensors grow, and a step's time grows faster than its pixels; retaining
the heap serves those blocks from memory already faulted in (docs/speed.md, "Page faults and
``--retain-heap``"). The price is a higher resident peak, since freed memory is kept for reuse.

Process-wide, so retaining is opt-in: tools call it behind a flag (``--retain-heap``), never on
import. Whether it took effect is checked, not assumed (:func:`retain_freed_memory` returns a
:class:`HeapSetting` that says so), and what the kernel then does with the retained pages is
the host's business: on some hosts it reclaims them anyway and the setting gains nothing.
"""
import ctypes
import ctypes.util
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, Optional

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_MMAP_THRESHOLD_MAX = 32 * 2 ** 20  # glibc's largest dynamic mmap threshold (64-bit)
_INT_MAX = 2 ** 31 - 1
_PROBE_BYTES = 64 * 2 ** 20  # above glibc's largest mmap threshold (32 MB)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks',
        'fordblks', 'keepcost')]


@dataclass(frozen=True)
class HeapSetting:
    """The outcome of :func:`retain_freed_memory`: ``applied`` is true only when a large
    allocation was seen to come from the heap instead of a fresh ``mmap``."""
    applied: bool
    reason: str

    def __bool__(self) -> bool:
        return self.applied


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


def mmapped_blocks() -> Optional[int]:
    """Blocks glibc currently serves with their own ``mmap`` (``mallinfo2().hblks``), or
    ``None`` where that cannot be read (not glibc, or glibc < 2.33)."""
    libc = _glibc()
    if libc is None or not hasattr(libc, 'mallinfo2'):
        return None
    libc.mallinfo2.restype = _Mallinfo2
    return int(libc.mallinfo2().hblks)


def large_block_is_mmapped() -> Optional[bool]:
    """Whether glibc serves a 64 MB allocation with its own ``mmap`` right now (``None``: can't
    tell)."""
    libc = _glibc()
    before = mmapped_blocks()
    if before is None:
        return None
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(_PROBE_BYTES)
    during = mmapped_blocks()
    libc.free(block)
    return during > before


def retain_freed_memory() -> HeapSetting:
    """Serve every allocation from the heap (no per-block ``mmap``) and never trim it back.

    Returns whether that took effect, checked with a probe allocation, and why not if not (not
    glibc, ``mallopt`` refused, or the probe still got its own mapping).
    """
    libc = _glibc()
    if libc is None:
        return HeapSetting(False, 'the C library is not glibc')
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, _INT_MAX)):
        return HeapSetting(False, 'glibc mallopt refused the settings')
    mmapped = large_block_is_mmapped()
    if mmapped is None:
        return HeapSetting(True, 'settings accepted (glibc < 2.33: not verified)')
    if mmapped:
        return HeapSetting(False, 'a 64 MB allocation still got its own mmap')
    return HeapSetting(True, 'large blocks now come from the retained heap')


@contextmanager
def unmap_freed_blocks(threshold: int = 64 * 2 ** 10) -> Iterator[bool]:
    """Inside, every block of ``threshold`` bytes or more gets its own ``mmap`` and leaves the
    resident set when freed, so RSS follows the live tensors (a CPU stand-in for CUDA's
    ``max_memory_allocated``, without the heap's freed-but-kept pages; allocation is slower).
    Yields whether glibc took the setting. On exit the threshold is 32 MB, glibc's largest
    dynamic one, which a training loop's frees of large tensors drive it to anyway."""
    libc = _glibc()
    applied = libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    if applied:
        trim_freed_memory()  # glibc maps a block only when the heap's top cannot serve it
    try:
        yield applied
    finally:
        if applied:
            libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)


def trim_freed_memory() -> bool:
    """Give freed heap pages back to the OS now (``malloc_trim``); ``False`` if not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
