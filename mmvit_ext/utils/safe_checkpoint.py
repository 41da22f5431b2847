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
"""
import argparse
import collections
import pickle
from typing import Any, List

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


def allow_mmengine_checkpoints() -> None:
    """Register the allowlist (mmengine and timm training checkpoints) with torch once."""
    global _done
    if _done or not hasattr(torch.serialization, 'add_safe_globals'):
        return
    from mmengine.logging.history_buffer import HistoryBuffer
    torch.serialization.add_safe_globals([
        HistoryBuffer, collections.Counter, argparse.Namespace, *_numpy_globals(),
        (history_buffer_getattr, 'builtins.getattr'),
    ])
    _done = True

