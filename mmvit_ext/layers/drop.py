"""Stochastic depth: mmcv's DropPath and the linear per-block rate rule."""
from typing import List

from mmcv.cnn.bricks.drop import DropPath

__all__ = ['DropPath', 'linear_drop_path_rates']


def linear_drop_path_rates(drop_path_rate: float, depth: int) -> List[float]:
    """Rates rising linearly from 0 at the first block to ``drop_path_rate`` at the last."""
    if not 0.0 <= drop_path_rate < 1.0:
        raise ValueError(f'drop_path_rate must be in [0, 1), got {drop_path_rate}')
    if depth <= 1:
        return [0.0] * depth if drop_path_rate == 0 else [drop_path_rate] * depth
    return [drop_path_rate * i / (depth - 1) for i in range(depth)]
