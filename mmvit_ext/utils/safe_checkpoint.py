"""mmengine 0.10.7 under torch >= 2.6: let ``weights_only`` loading accept training checkpoints.

torch >= 2.6 loads with ``weights_only=True`` by default; mmengine's checkpoints carry its
message-hub state (``HistoryBuffer`` objects, numpy arrays and scalars), which that unpickler
refuses. We allowlist exactly those plain-data classes; everything else — any callable such as
``os.system`` or ``builtins.exec`` — stays refused, so a malicious pickle still cannot run code.
"""
from typing import List

import numpy as np
import torch

_done = False


def _numpy_globals() -> List[object]:
    """numpy's array/scalar reconstruction entry points and concrete dtype classes."""
    try:  # numpy >= 1.25 / 2.x
        from numpy.core.multiarray import _reconstruct, scalar
    except ImportError:  # pragma: no cover
        from numpy._core.multiarray import _reconstruct, scalar
    dtypes = [type(np.dtype(t)) for t in (np.float16, np.float32, np.float64, np.int8, np.int16,
                                          np.int32, np.int64, np.uint8, np.bool_)]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtypes]


def allow_mmengine_checkpoints() -> None:
    """Register the allowlist once (idempotent)."""
    global _done
    if _done or not hasattr(torch.serialization, 'add_safe_globals'):
        return
    from mmengine.logging.history_buffer import HistoryBuffer
    torch.serialization.add_safe_globals([HistoryBuffer, *_numpy_globals()])
    _done = True
