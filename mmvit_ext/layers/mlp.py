"""Token MLPs: the transformer MLP and PVTv2's convolutional FFN."""
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .checkpoint import CheckpointedCall
from .shapes import map_to_tokens, tokens_to_map


class Mlp(CheckpointedCall, nn.Module):
    """fc1 -> act -> drop -> fc2 -> drop on (..., C) tokens."""

    token_wise = True  # each token's output depends on that token only

    def __init__(self, in_features: int, hidden_features: Optional[int] = None,
                 out_features: Optional[int] = None, act_layer: Callable[[], nn.Module] = nn.GELU,
                 drop: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.act(self.fc1(x)))
        return self.drop(self.fc2(x))


class ConvMlp(CheckpointedCall, nn.Module):
    """PVTv2 FFN on (B, H*W, C) tokens: fc1 -> [ReLU] -> 3x3 depthwise conv on the (H, W) grid
    -> act -> fc2.

    The depthwise conv gives the positional information that PVTv2 uses instead of a position
    embedding; ``linear`` (PVTv2-li) adds the ReLU after fc1.
    """

    token_wise = False  # the depthwise conv mixes neighbouring tokens

    def __init__(self, in_features: int, hidden_features: int,
                 act_layer: Callable[[], nn.Module] = nn.GELU, drop: float = 0.0,
                 linear: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.linear = linear
        self.dwconv = nn.Conv2d(hidden_features, hidden_features, 3, 1, 1, groups=hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        x = self.fc1(x)
        if self.linear:
            x = F.relu(x, inplace=True)  # fc1 keeps its input, not its output, for backward
        x = self.act(map_to_tokens(self.dwconv(tokens_to_map(x, hw))))
        return self.drop(self.fc2(self.drop(x)))
