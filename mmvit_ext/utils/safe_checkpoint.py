"""mmengine 0.10.7 under torch >= 2.6: let ``weights_only`` loading accept training checkpoints.

torch >= 2.6 loads with ``weights_only=True`` by default, and mmengine's checkpoints carry its
message-hub state: ``HistoryBuffer`` objects, numpy arrays and scalars, a ``Counter`` of scheduler
milestones, and each buffer's statistics functions, pickled as ``getattr(HistoryBuffer, 'min')``.
We allowlist exactly those plain-data classes and stand in for ``builtins.getattr`` with a
function that only returns HistoryBuffer's registered statistics. timm's training script saves
its command line as an ``argparse.Namespace`` (``args``) beside ``version`` and ``metric``: a
plain attribute bag, allowlisted too. Everything else — ``os.system``,
``builtins.exec``, ``getattr`` on any other object — stays refused, so a crafted pickle still
cannot run code.

Importing mmvit_ext changes nothing in torch: the allowlist applies where we load. Our reader
(:func:`mmvit_ext.converters.read_checkpoint`), ``tools/train.py`` and ``tools/test.py`` load
inside :func:`trusted_training_state`; a run of the peers' tools adds
:class:`~mmvit_ext.engine.TrustedCheckpointHook`; :func:`allow_mmengine_checkpoints` is the
process-wide opt-in. torch keeps one allowlist per process, so a block inside
:func:`trusted_training_state` widens it for every thread while it runs.
"""
import argparse
import collections
import pickle
from contextlib import contextmanager
from typing import Any, Iterator, List

import numpy as np
import torch

_done = False


def _numpy_globals() -> List[object]:
    """numpy's array / scalar reconstruction entry points and its concrete dtype classes."""
    try:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    except ImportError:  # pragma: no cover  (numpy 2.x)
        from numpy._core.multiarray import _reconstruct, scalar
    dtypes = [type(np.dtype(t)) for t in (np.float16, np.float32, np.float64, np.int8, np.int16,
                                          np.int32, np.int64, np.uint8, np.bool_)]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtypes]


def history_buffer_getattr(obj: Any, name: str) -> Any:
    """Replacement for ``builtins.getattr`` during ``weights_only`` unpickling: resolves only
    ``HistoryBuffer.<statistics method>``, the one use mmengine's checkpoints make of it."""
    from mmengine.logging.history_buffer import HistoryBuffer
    allowed = {'min', 'max', 'current', 'mean', *HistoryBuffer._statistics_methods}
    if obj is HistoryBuffer and isinstance(name, str) and name in allowed:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f'refused getattr({obj!r}, {name!r}) while unpickling: only HistoryBuffer statistics '
        f'methods {sorted(allowed)} may be referenced by a checkpoint')


def training_state_globals() -> List[object]:
    """The allowlist: the plain-data classes of mmengine and timm training checkpoints, and the
    restricted ``getattr`` stand-in (torch's ``(callable, 'module.name')`` form)."""
    from mmengine.logging.history_buffer import HistoryBuffer
    return [HistoryBuffer, collections.Counter, argparse.Namespace, *_numpy_globals(),
            (history_buffer_getattr, 'builtins.getattr')]


def _has_allowlist() -> bool:
    """torch >= 2.4 (``torch_compat.NEEDS['training-state checkpoints']``)."""
    return all(hasattr(torch.serialization, name)
               for name in ('add_safe_globals', 'get_safe_globals', 'clear_safe_globals'))


@contextmanager
def trusted_training_state() -> Iterator[None]:
    """Within the block, ``torch.load(weights_only=True)`` (torch's default from 2.6) also
    accepts the training state of mmengine / timm checkpoints (:func:`training_state_globals`);
    on exit, exceptions included, torch's allowlist is as it was. Nested blocks and
    :func:`allow_mmengine_checkpoints` compose: only what the block added is removed. On torch
    < 2.4 (no allowlist) the block changes nothing."""
    if not _has_allowlist():
        yield
        return
    serialization = torch.serialization
    present = set(serialization.get_safe_globals())
    added = [g for g in training_state_globals() if g not in present]
    serialization.add_safe_globals(added)
    try:
        yield
    finally:  # torch < 2.5 has no public remove: rebuild the list without what we added
        kept = [g for g in serialization.get_safe_globals() if g not in added]
        serialization.clear_safe_globals()
        serialization.add_safe_globals(kept)


def allow_mmengine_checkpoints() -> None:
    """Allowlist the training state of mmengine and timm checkpoints for the whole process (an
    opt-in for scripts that call mmengine's loaders themselves; see docs/checkpoints.md)."""
    global _done
    if _done or not _has_allowlist():
        return
    torch.serialization.add_safe_globals(training_state_globals())
    _done = True

