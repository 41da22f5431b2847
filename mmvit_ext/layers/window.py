"""Window attention (Swin, windowed plain ViTs): padding, cyclic shift, partition, shift mask.

Everything is computed from the input's shape on the input's device, inside ``forward``: no
caches keyed by sizes, no host-to-device copies. Sizes may be symbolic (``torch.export`` with
dynamic shapes): window fitting, padding, shifts and masks are then arithmetic on the input's
sizes, never a branch on them, so an exported graph serves every input size.
"""
from typing import NamedTuple, Optional, Sequence, Tuple

import torch

from .attention import Attention, AttnBias, MapTransform
from .sdpa_kernels import OperandForm
from .rel_pos import RelativePositionBias
from .shapes import Size2, pad_to_multiple, to_2tuple
from .utils import known_equal, known_true, known_zero


# where maps are zero-padded to whole windows: before the qkv projection (ViTDet, Swin) or after
# it (the official ViT-Adapter); see WindowAttention
WINDOW_PADDINGS = ('tokens', 'qkv')


class WindowGeometry(NamedTuple):
    """How :meth:`WindowAttention.to_windows` cut a map: ``window is None`` for global
    attention."""
    hw: Size2
    tokens: Tuple[int, int, int]  # (B, H*W, C) of the input
    window: Optional[Size2] = None
    shift: Optional[Size2] = None
    padded: Optional[Size2] = None


def fit_window(hw: Size2, window_size: Size2, shift_size: Size2) -> Tuple[Size2, Size2]:
    """A map side that fits in one window gets a window of its own length and no shift (as the
    official Swin at its last stage); longer sides keep the window, padded to a multiple.
    A symbolic side that may be either gets the same rule as arithmetic (no branch)."""
    window, shift = [], []
    for side, size, offset in zip(hw, window_size, shift_size):
        if known_true(side > size):  # ints, or a symbolic range above the window
            window.append(size)
            shift.append(offset)
        elif known_true(side <= size):
            window.append(side)
            shift.append(0)
        else:  # symbolic either way: shift = min(shift, shift * max(0, side - window))
            window.append(torch.sym_min(side, size))
            shift.append(torch.sym_min(offset, offset * torch.sym_max(0, side - size))
                         if offset else 0)
    return tuple(window), tuple(shift)


def window_partition(x: torch.Tensor, window_size: Size2) -> torch.Tensor:
    """(B, H, W, C) with H, W multiples of the window -> (B, num_windows, wh*ww, C)."""
    b, h, w, c = x.shape
    wh, ww = window_size
    x = x.view(b, h // wh, wh, w // ww, ww, c).transpose(2, 3)
    # copy, then view: ``reshape`` would branch on one window per row / column (a view then)
    return x.clone(memory_format=torch.contiguous_format).view(b, (h // wh) * (w // ww), wh * ww, c)


def window_reverse(windows: torch.Tensor, window_size: Size2, height: int, width: int
                   ) -> torch.Tensor:
    """Inverse of :func:`window_partition`: (B, num_windows, wh*ww, C) -> (B, H, W, C)."""
    b, _, _, c = windows.shape
    wh, ww = window_size
    x = windows.view(b, height // wh, width // ww, wh, ww, c).transpose(2, 3)
    return x.clone(memory_format=torch.contiguous_format).view(b, height, width, c)


def _shift_regions(length: int, window: int, shift: int, device: torch.device) -> torch.Tensor:
    """Region (0, 1, 2) of each position along one axis of the shifted map: before the last
    window, inside it before the wrapped-around part, the wrapped-around part."""
    positions = torch.arange(length, device=device)
    if known_zero(shift):
        return torch.zeros_like(positions)
    # a symbolic shift that is 0 at run time comes with window == length: one region
    return (positions >= length - window).long() + (positions >= length - shift).long()


def shifted_window_mask(height: int, width: int, window_size: Size2, shift_size: Size2,
                        device: Optional[torch.device] = None, masked_value: float = -100.0
                        ) -> torch.Tensor:
    """Additive mask (num_windows, N, N) that keeps tokens of different regions of the cyclically
    shifted (padded) map from attending to each other; ``masked_value`` follows the official -100.

    Regions come from comparisons with the region bounds rather than slice assignments, so the
    same code compiles under ``torch.compile`` (inductor's CPU code generator fails on the
    chained masked stores the assignments become, torch 2.11).
    """
    rows = _shift_regions(height, window_size[0], shift_size[0], device)
    cols = _shift_regions(width, window_size[1], shift_size[1], device)
    region = (rows[:, None] * 3 + cols[None, :]).float().view(1, height, width, 1)
    region = window_partition(region, window_size)[0, :, :, 0]  # (num_windows, N)
    diff = region.unsqueeze(1) - region.unsqueeze(2)
    return torch.zeros_like(diff).masked_fill_(diff != 0, masked_value)


def roll(x: torch.Tensor, shifts: Sequence, dims: Sequence[int]) -> torch.Tensor:
    """``torch.roll``; a shift computed from a symbolic size (export) becomes two slices and a
    concat, since ONNX has no roll op for a shift that is not a constant."""
    if all(isinstance(s, int) for s in shifts):
        return torch.roll(x, shifts=tuple(shifts), dims=tuple(dims))
    for shift, dim in zip(shifts, dims):
        length = x.shape[dim]
        start = (-shift) % length  # output starts at input index -shift (mod length)
        x = torch.cat([x.narrow(dim, start, length - start), x.narrow(dim, 0, start)], dim)
    return x


def split_windows(grid: torch.Tensor, window_size: Size2, shift_size: Size2
                  ) -> Tuple[torch.Tensor, Size2]:
    """(B, H, W, C) -> zero-padded, cyclically shifted windows (B, num_windows, N, C) and the
    padded size."""
    grid = pad_to_multiple(grid, window_size, channels_last=True)
    if not known_zero(shift_size):
        grid = roll(grid, (-shift_size[0], -shift_size[1]), (1, 2))
    return window_partition(grid, window_size), (grid.shape[1], grid.shape[2])


def join_windows(windows: torch.Tensor, window_size: Size2, shift_size: Size2, padded: Size2,
                 hw: Size2) -> torch.Tensor:
    """Inverse of :func:`split_windows` on the valid tokens: -> (B, H, W, C)."""
    grid = window_reverse(windows, window_size, *padded)
    if not known_zero(shift_size):
        grid = roll(grid, shift_size, (1, 2))
    if known_equal(padded, hw):
        return grid
    # a fresh copy: reshaping the crop as a view would branch on whether it is contiguous
    return grid[:, :hw[0], :hw[1]].clone(memory_format=torch.contiguous_format)


class WindowAttention(Attention):
    """Self-attention of (B, H*W, C) tokens of an H x W map: inside (shifted) windows, or over
    the whole map when ``window_size`` is ``None``.

    Windows are folded into the batch axis. A window longer than the map shrinks to the map
    (:func:`fit_window`); maps are zero-padded to whole windows on the bottom / right.
    :meth:`position_bias` adds the learned relative-position bias (Swin) to every window;
    subclasses can override it (e.g. decomposed relative positions) without touching the trunk.

    Args:
        dim, num_heads, qkv_bias, qk_scale, attn_drop, proj_drop, map_transforms, fused: as
            :class:`Attention`.
        window_size: window side in tokens, or ``None`` for global attention.
        shift: shift the windows by half a window (SW-MSA), masking wrapped-around regions.
        rel_pos: a learned relative-position bias table per head (``rel_pos``).
        pad_small_map: keep the window (and shift) on maps shorter than it, zero-padding them
            (mmdet / mmseg Swin, mmpretrain ``pad_small_map=True``) instead of shrinking it.
        padding: where a map that is no multiple of the window is zero-padded (see
            :data:`WINDOW_PADDINGS`): ``'tokens'`` before the qkv projection (detectron2's ViTDet,
            Swin; padded keys and values are then the projection's bias), windows shrunk to
            small maps unless ``pad_small_map``; ``'qkv'`` after it (the official ViT-Adapter's
            ``WindowedAttention``): q, k and v are zero there, so every padded key scores 0 and,
            unmasked, still takes its share of the softmax, with a zero value; windows are never
            shrunk (a 10 x 12 map is one padded 14 x 14 window). ``'qkv'`` has no shift.
    """

    def __init__(self, dim: int, num_heads: int, window_size: Optional[int] = 7,
                 shift: bool = False, rel_pos: bool = False, qkv_bias: bool = True,
                 qk_scale: Optional[float] = None, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 map_transforms: Sequence[MapTransform] = (), fused: bool = True,
                 pad_small_map: bool = False, padding: str = 'tokens') -> None:
        super().__init__(dim, num_heads, qkv_bias, qk_scale, attn_drop, proj_drop,
                         map_transforms, fused)
        self.pad_small_map = pad_small_map
        if window_size is None and (shift or rel_pos):
            raise ValueError('WindowAttention: shift and rel_pos need a window_size')
        self.window_size = to_2tuple(window_size) if window_size is not None else None
        half = (self.window_size[0] // 2, self.window_size[1] // 2) if shift else (0, 0)
        self.shift_size = half
        self.rel_pos = RelativePositionBias(self.window_size, num_heads) if rel_pos else None
        self.padding = 'tokens'
        self.set_padding(padding)

    def set_padding(self, padding: str) -> None:
        """Choose where maps are padded to whole windows (``padding`` above); the trunk calls
        this once, when it builds its blocks."""
        if padding not in WINDOW_PADDINGS:
            raise ValueError(f'WindowAttention: padding must be one of {WINDOW_PADDINGS}, got '
                             f'{padding!r}')
        if padding == 'qkv' and any(self.shift_size):
            raise ValueError("WindowAttention: padding='qkv' (the official ViT-Adapter's) has "
                             "no shifted windows; use padding='tokens' with shift=True")
        self.padding = padding

    def extra_repr(self) -> str:
        where = ('global' if self.window_size is None
                 else f'window_size={self.window_size}, padding={self.padding!r}')
        return f'{where}, {super().extra_repr()}'

    def operand_forms(self, training: bool) -> Tuple[OperandForm, ...]:
        if self.rel_pos is None and not any(self.shift_size):
            return (OperandForm(),)
        learned = self.rel_pos is not None \
            and self.rel_pos.relative_position_bias_table.requires_grad
        return (self.bias_form(learned, training),)

    def fitted_window(self, hw: Size2) -> Tuple[Size2, Size2]:
        """The window and shift that attend over an ``hw`` map (:func:`fit_window`, or the
        window as built under ``pad_small_map``)."""
        if self.pad_small_map:
            return self.window_size, self.shift_size
        return fit_window(hw, self.window_size, self.shift_size)

    def position_bias(self, window: Size2) -> Optional[torch.Tensor]:
        """Bias (H, N, N) added to every window's logits, or ``None``."""
        return self.rel_pos(window) if self.rel_pos is not None else None

    def to_windows(self, x: torch.Tensor, hw: Size2
                   ) -> Tuple[torch.Tensor, AttnBias, WindowGeometry]:
        """Tokens (B, H*W, C) -> windows (B, num_windows, N, C) (the tokens themselves for
        global attention), their bias (position bias and / or shift mask: a tensor, the two as
        a tuple of terms, or ``None``) and the geometry :meth:`from_windows` needs."""
        if self.window_size is None:
            return x, None, WindowGeometry(hw, x.shape)
        b, n, c = x.shape
        window, shift = self.fitted_window(hw)
        windows, padded = split_windows(x.view(b, hw[0], hw[1], c), window, shift)
        bias = self.position_bias(window)
        if not known_zero(shift):
            mask = shifted_window_mask(*padded, window, shift, x.device).unsqueeze(1)
            bias = mask if bias is None else (bias, mask)  # terms, not a (windows, H, N, N) sum
        return windows, bias, WindowGeometry(hw, (b, n, c), window, shift, padded)

    def from_windows(self, out: torch.Tensor, geometry: WindowGeometry) -> torch.Tensor:
        """Inverse of :meth:`to_windows` on the output tokens: -> (B, H*W, C)."""
        if geometry.window is None:
            return out
        merged = join_windows(out, geometry.window, geometry.shift, geometry.padded, geometry.hw)
        return merged.reshape(geometry.tokens)

    def forward(self, x: torch.Tensor, hw: Size2) -> torch.Tensor:
        if self.padding == 'qkv' and self.window_size is not None:
            return self.forward_padded_qkv(x, hw)
        windows, bias, geometry = self.to_windows(x, hw)
        return self.from_windows(super().forward(windows, attn_bias=bias), geometry)

    def forward_padded_qkv(self, x: torch.Tensor, hw: Size2) -> torch.Tensor:
        """``padding='qkv'``: project the tokens, then zero-pad q, k, v to whole windows of
        ``window_size`` (never shrunk) and attend inside each window, padded keys unmasked."""
        b, n, c = x.shape
        qkv = self.qkv(x)
        windows, padded = split_windows(qkv.view(b, hw[0], hw[1], qkv.shape[-1]),
                                        self.window_size, (0, 0))
        out = self.attend(*self.split_qkv(windows), self.position_bias(self.window_size))
        geometry = WindowGeometry(hw, (b, n, c), self.window_size, (0, 0), padded)
        return self.from_windows(out, geometry)
