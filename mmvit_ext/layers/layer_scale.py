"""LayerScale (CaiT): a learnable per-channel residual-branch gain."""
import torch
from torch import nn


class LayerScale(nn.Module):
    """Multiplies (..., C) by a per-channel vector initialised to ``init_values``."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma
