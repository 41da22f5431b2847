"""Small helpers shared by the layers."""
from typing import Tuple, Union


def to_2tuple(value: Union[int, Tuple[int, int]]) -> Tuple[int, int]:
    """``7 -> (7, 7)``; a pair is returned as a tuple."""
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    if len(value) != 2:
        raise ValueError(f'expected an int or a pair, got {value}')
    return value  # type: ignore[return-value]
