"""Small helpers shared by the layers."""
from typing import Tuple, Union

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true


def to_2tuple(value: Union[int, Tuple[int, int]]) -> Tuple[int, int]:
    """``7 -> (7, 7)``; a pair is returned as a tuple."""
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    if len(value) != 2:
        raise ValueError(f'expected an int or a pair, got {value}')
    return value  # type: ignore[return-value]


def known_zero(value: Union[int, torch.SymInt]) -> bool:
    """Whether a size or offset is 0 for every input: a Python 0, or a symbolic size (under
    ``torch.export``) that is provably 0. Optional padding / shifts are skipped only then, so
    an export never bakes a branch taken at the example input's size into the graph."""
    return statically_known_true(value == 0)


def known_equal(a: Union[int, torch.SymInt], b: Union[int, torch.SymInt]) -> bool:
    """``a == b`` for every input (see :func:`known_zero`)."""
    return statically_known_true(a == b)
