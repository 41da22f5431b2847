"""Window partition / reverse with padding, and the shifted-window region mask (Swin)."""
from typing import Tuple

import torch
import torch.nn.functional as F

Size2 = Tuple[int, int]


def pad_to_windows(x: torch.Tensor, window_size: Size2) -> torch.Tensor:
    """Zero-pad (B, H, W, C) on the bottom/right to multiples of the window."""
    pad_h = -x.shape[1] % window_size[0]
    pad_w = -x.shape[2] % window_size[1]
    if pad_h or pad_w:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    return x


def window_partition(x: torch.Tensor, window_size: Size2) -> torch.Tensor:
    """(B, H, W, C) with H, W multiples of the window -> (B, num_windows, wh*ww, C)."""
    b, h, w, c = x.shape
    wh, ww = window_size
    x = x.view(b, h // wh, wh, w // ww, ww, c).transpose(2, 3)
    return x.reshape(b, (h // wh) * (w // ww), wh * ww, c)


def window_reverse(windows: torch.Tensor, window_size: Size2, height: int, width: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`: (B, num_windows, wh*ww, C) -> (B, H, W, C)."""
    b, _, _, c = windows.shape
    wh, ww = window_size
    x = windows.view(b, height // wh, width // ww, wh, ww, c).transpose(2, 3)
    return x.reshape(b, height, width, c)


def _shift_regions(length: int, window: int, shift: int, device: torch.device) -> torch.Tensor:
    """Region (0, 1, 2) of each position along one axis of the shifted map: before the last
    window, inside it before the wrapped-around part, the wrapped-around part."""
    positions = torch.arange(length, device=device)
    if not shift:
        return torch.zeros_like(positions)
    return (positions >= length - window).long() + (positions >= length - shift).long()


def shifted_window_mask(height: int, width: int, window_size: Size2, shift_size: Size2,
                        device: torch.device = None, masked_value: float = -100.0) -> torch.Tensor:
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


class _RowGather(torch.autograd.Function):
    """``out = x[index]`` on rows, rows ``zero_rows`` of ``out`` set to 0; the backward is the
    same kind of gather with the inverse index (``index`` is a bijection between the non-zero
    output rows and the input rows), so neither direction needs a scatter-add."""

    @staticmethod
    def forward(ctx, x, index, zero_rows, inverse, inverse_zero_rows):
        out = x.index_select(0, index)
        if zero_rows.numel():
            out.index_fill_(0, zero_rows, 0)
        ctx.save_for_backward(inverse, inverse_zero_rows, index, zero_rows)
        return out

    @staticmethod
    def backward(ctx, grad):
        inverse, inverse_zero_rows, index, zero_rows = ctx.saved_tensors
        return (_RowGather.apply(grad.contiguous(), inverse, inverse_zero_rows, index, zero_rows),
                None, None, None, None)


class WindowLayout:
    """Token order of a (B, H, W) map after zero-padding to whole windows, the cyclic shift and
    the window partition, as index tensors: one gather each way instead of pad + roll +
    partition (and their reverses), forward and backward.

    ``to_windows`` maps (B, H*W, C) tokens to (B, windows, wh*ww, C) with padded tokens zero;
    ``from_windows`` is its inverse on the valid tokens (padding dropped).
    """

    def __init__(self, batch: int, height: int, width: int, window_size: Size2,
                 shift_size: Size2, device: torch.device) -> None:
        wh, ww = window_size
        hp, wp = height + (-height % wh), width + (-width % ww)
        self.padded = (hp, wp)
        self.num_windows = (hp // wh) * (wp // ww)
        self.window_tokens = wh * ww
        rows = (torch.arange(height).view(-1, 1) - shift_size[0]) % hp
        cols = (torch.arange(width).view(1, -1) - shift_size[1]) % wp
        # windowed position of every valid token (rolled by -shift, then partitioned)
        pos = ((rows // wh) * (wp // ww) + cols // ww) * (wh * ww) + (rows % wh) * ww + cols % ww
        pos = pos.flatten()
        src = torch.zeros(hp * wp, dtype=torch.long)
        src[pos] = torch.arange(height * width)
        valid = torch.zeros(hp * wp, dtype=torch.bool)
        valid[pos] = True
        pad = (~valid).nonzero().flatten()
        offsets_tokens = torch.arange(batch).view(-1, 1) * (height * width)
        offsets_windows = torch.arange(batch).view(-1, 1) * (hp * wp)
        self.gather_windows = (src + offsets_tokens).flatten().to(device)
        self.pad_rows = (pad + offsets_windows).flatten().to(device)
        self.gather_tokens = (pos + offsets_windows).flatten().to(device)
        self.no_rows = torch.zeros(0, dtype=torch.long, device=device)

    def to_windows(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        out = _RowGather.apply(x.reshape(-1, c), self.gather_windows, self.pad_rows,
                               self.gather_tokens, self.no_rows)
        return out.view(b, self.num_windows, self.window_tokens, c)

    def from_windows(self, windows: torch.Tensor) -> torch.Tensor:
        b, c = windows.shape[0], windows.shape[-1]
        out = _RowGather.apply(windows.reshape(-1, c), self.gather_tokens, self.no_rows,
                               self.gather_windows, self.pad_rows)
        return out.view(b, -1, c)
