"""Size conditions that hold for every input (symbolic sizes included); shapes and pads are
in :mod:`.shapes`."""
from typing import Sequence, Union

import torch

from ..torch_compat import statically_known_true


def known_true(condition: Union[bool, torch.SymBool, torch.Tensor]) -> bool:
    """Whether a condition on sizes holds for every input. A symbolic condition (sizes under
    ``torch.export`` / dynamic ``torch.compile``) counts only if provable, so an optional pad or
    shift is skipped only where it is never needed and an export never bakes the example's
    branch into the graph; a Python bool, or a traced size (``torch.jit.trace``), is its value."""
    if isinstance(condition, torch.SymBool):
        return statically_known_true(condition)
    return bool(condition)


def known_zero(value: Union[int, torch.SymInt, Sequence]) -> bool:
    """``value == 0`` (every entry of a sequence) for every input (see :func:`known_true`)."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    return all(known_true(v == 0) for v in values)


def known_equal(a: Union[int, torch.SymInt, Sequence], b: Union[int, torch.SymInt, Sequence]
                ) -> bool:
    """``a == b`` (sizes, or equal-length sequences of them) for every input (see
    :func:`known_true`)."""
    pairs = zip(a, b) if isinstance(a, (tuple, list)) else ((a, b),)
    return all(known_true(x == y) for x, y in pairs)
