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


def shifted_window_mask(height: int, width: int, window_size: Size2, shift_size: Size2,
                        device: torch.device = None, masked_value: float = -100.0) -> torch.Tensor:
    """Additive mask (num_windows, N, N) that keeps tokens of different regions of the cyclically
    shifted (padded) map from attending to each other; ``masked_value`` follows the official -100.
    """
    region = torch.zeros(1, height, width, 1, device=device)
    count = 0
    h_slices = (slice(0, -window_size[0]), slice(-window_size[0], -shift_size[0]),
                slice(-shift_size[0], None)) if shift_size[0] else (slice(None),)
    w_slices = (slice(0, -window_size[1]), slice(-window_size[1], -shift_size[1]),
                slice(-shift_size[1], None)) if shift_size[1] else (slice(None),)
    for hs in h_slices:
        for ws in w_slices:
            region[:, hs, ws, :] = count
            count += 1
    region = window_partition(region, window_size)[0, :, :, 0]  # (num_windows, N)
    diff = region.unsqueeze(1) - region.unsqueeze(2)
    return torch.zeros_like(diff).masked_fill_(diff != 0, masked_value)
