"""Axial rotary position embedding (RoPE) of DINOv3: computed from the token grid at run time.

Each head's channels are split in four quarters of ``head_dim / 4`` frequencies: the angles of
the row coordinate fill the first half of the rotation angles, those of the column coordinate
the second, and the whole is tiled twice for the rotate-half convention
(``x * cos + rotate_half(x) * sin``). Coordinates are patch centres normalised to [-1, 1]
(``'separate'``: per axis; ``'min'`` / ``'max'``: by the shorter / longer side). The periods
are a persistent float32 buffer (``periods``), as the official checkpoints hold it.

Training-time coordinate augmentation, as the official ``RopePositionEmbedding``
(``shift_coords``, ``jitter_coords``, ``rescale_coords``; the hub models were pretrained with
``rescale_coords=2``): in training mode only, every call draws, in this order, a shift per axis
uniform in [-shift, shift] (added), a factor per axis log-uniform in [1/jitter, jitter] and one
factor log-uniform in [1/rescale, rescale] (both multiplied), with the official RNG calls (float32
on the periods' device). The official trunk calls its RoPE once per block, so each block draws
its own; so do ours (a block recomputed by activation checkpointing replays its draws: torch
restores the RNG state). Within :meth:`RopeEmbedding.one_draw` every call returns the first
call's draw (the official EoMT: one RoPE per forward, shared by all blocks).
"""
import contextlib
import math
from typing import Dict, Iterator, Optional, Tuple

import torch
from torch import nn

from .shapes import Size2

NORMALIZE_COORDS = ('separate', 'min', 'max')


def rope_periods(head_dim: int, base: Optional[float] = 100.0, min_period: Optional[float] = None,
                 max_period: Optional[float] = None) -> torch.Tensor:
    """(head_dim / 4,) float32 periods: ``base ** (4 i / head_dim)``, or geometrically spaced
    from ``min_period`` to ``max_period`` when both are given (then ``base`` must be ``None``)."""
    if head_dim % 4:
        raise ValueError(f'RoPE needs a head dim divisible by 4, got {head_dim}')
    both = min_period is not None and max_period is not None
    if (base is None) == (not both):
        raise ValueError('RoPE: give either base or both min_period and max_period')
    count = head_dim // 4
    if base is not None:
        return base ** (2 * torch.arange(count, dtype=torch.float32) / (head_dim // 2))
    ratio = max_period / min_period
    return ratio ** torch.linspace(0, 1, count, dtype=torch.float32) / ratio * max_period


def rope_coords(hw: Size2, normalize: str = 'separate', device: Optional[torch.device] = None
                ) -> torch.Tensor:
    """(h*w, 2) float32 (row, column) patch-centre coordinates in [-1, 1], row-major."""
    height, width = hw
    rows = torch.arange(height, device=device, dtype=torch.float32) + 0.5
    cols = torch.arange(width, device=device, dtype=torch.float32) + 0.5
    if normalize == 'separate':
        rows, cols = rows / height, cols / width
    else:
        side = min(height, width) if normalize == 'min' else max(height, width)
        rows, cols = rows / side, cols / side
    grid = torch.stack(torch.meshgrid(rows, cols, indexing='ij'), dim=-1).flatten(0, 1)
    return 2.0 * grid - 1.0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[a, b] -> [-b, a]`` over the last dim's halves."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rope(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """Rotate the last ``sin.shape[-2]`` tokens of x (..., N, d) (the patch tokens; the prefix
    tokens before them are left as they are), in float32, returned in x's dtype."""
    num_prefix = x.shape[-2] - sin.shape[-2]
    prefix, patches = x.split((num_prefix, sin.shape[-2]), dim=-2)
    wide = patches.float()
    rotated = (wide * cos + rotate_half(wide) * sin).to(x.dtype)
    return torch.cat([prefix, rotated], dim=-2)


def augment_coords(coords: torch.Tensor, shift: Optional[float], jitter: Optional[float],
                   rescale: Optional[float]) -> torch.Tensor:
    """(N, 2) coordinates shifted, jittered and rescaled by fresh draws, in the official order
    and with its RNG calls (see the module)."""
    dd = dict(device=coords.device, dtype=coords.dtype)
    if shift is not None:
        coords = coords + torch.empty(2, **dd).uniform_(-shift, shift)[None, :]
    if jitter is not None:
        bound = math.log(jitter)
        coords = coords * torch.empty(2, **dd).uniform_(-bound, bound).exp()[None, :]
    if rescale is not None:
        bound = math.log(rescale)
        coords = coords * torch.empty(1, **dd).uniform_(-bound, bound).exp()
    return coords


def _check_augmentation(name: str, value: Optional[float], least: float) -> Optional[float]:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or value < least):
        raise ValueError(f'RoPE {name} must be None or a number >= {least}, got {value!r}')
    return None if value is None else float(value)


class RopeEmbedding(nn.Module):
    """(sin, cos), each (h*w, head_dim) float32, of an h x w token grid.

    Args:
        head_dim: channels per head (a multiple of 4).
        base / min_period / max_period: the periods (:func:`rope_periods`).
        normalize: coordinate normalisation, one of :data:`NORMALIZE_COORDS`.
        shift_coords / jitter_coords / rescale_coords: training-time coordinate augmentation
            (see the module); ``None``: none. Off in eval mode.
    """

    def __init__(self, head_dim: int, base: Optional[float] = 100.0,
                 min_period: Optional[float] = None, max_period: Optional[float] = None,
                 normalize: str = 'separate', shift_coords: Optional[float] = None,
                 jitter_coords: Optional[float] = None,
                 rescale_coords: Optional[float] = None) -> None:
        super().__init__()
        if normalize not in NORMALIZE_COORDS:
            raise ValueError(f'RoPE normalize must be one of {NORMALIZE_COORDS}, got {normalize!r}')
        self.normalize = normalize
        self.shift_coords = _check_augmentation('shift_coords', shift_coords, 0.0)
        self.jitter_coords = _check_augmentation('jitter_coords', jitter_coords, 1.0)
        self.rescale_coords = _check_augmentation('rescale_coords', rescale_coords, 1.0)
        self.register_buffer('periods', rope_periods(head_dim, base, min_period, max_period))
        self._held: Optional[Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor]]] = None

    @property
    def augments(self) -> bool:
        """Whether a call draws coordinate augmentations (training mode, any set)."""
        return self.training and any(v is not None for v in (
            self.shift_coords, self.jitter_coords, self.rescale_coords))

    def extra_repr(self) -> str:
        augment = ''.join(f', {k}={v}' for k, v in (
            ('shift_coords', self.shift_coords), ('jitter_coords', self.jitter_coords),
            ('rescale_coords', self.rescale_coords)) if v is not None)
        return f'frequencies={self.periods.shape[0]}, normalize={self.normalize!r}{augment}'

    @contextlib.contextmanager
    def one_draw(self) -> Iterator[None]:
        """Within: one augmentation draw per grid, returned by every call (module doc)."""
        self._held = {}
        try:
            yield
        finally:
            self._held = None

    def forward(self, hw: Size2) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._held is not None and tuple(hw) in self._held:
            return self._held[tuple(hw)]
        sin_cos = self._sin_cos(hw)
        if self._held is not None:
            self._held[tuple(hw)] = sin_cos
        return sin_cos

    def _sin_cos(self, hw: Size2) -> Tuple[torch.Tensor, torch.Tensor]:
        coords = rope_coords(hw, self.normalize, self.periods.device)
        if self.augments:
            coords = augment_coords(coords, self.shift_coords, self.jitter_coords,
                                    self.rescale_coords)
        angles = 2 * math.pi * coords[:, :, None] / self.periods.float()[None, None, :]
        angles = angles.flatten(1, 2).tile(2)  # (h*w, head_dim): rows, columns, twice
        return torch.sin(angles), torch.cos(angles)
