"""Checking that peers compute what we compute, at a size where their semantics agree."""
from typing import Dict, Tuple

import torch
from torch import nn

from ..backbones import SwinTransformer
from .peers import build_peers


def agreement_size(ours: nn.Module, peer: str, size: Tuple[int, int]) -> Tuple[int, int]:
    """The timed size when the peer's semantics coincide with ours there, else a probe size.

    Swin: mmdet shifts windows even when a map fits in one window (the official classifier and
    we do not), so it agrees when the last map is larger than the window; timm rolls before it
    pads, so it agrees when no padding happens (every map a multiple of the window).
    """
    if not isinstance(ours, SwinTransformer):
        return size
    grid = [(size[0] // 2 ** (i + 2), size[1] // 2 ** (i + 2)) for i in range(4)]
    if peer == 'mmdet':
        ok = all(s % 32 == 0 for s in size) and min(grid[-1]) > ours.window_size
        return size if ok else (256, 256)
    ok = all(s % (32 * ours.window_size) == 0 for s in size)
    return size if ok else (224, 224)


@torch.no_grad()
def check_peers(ours: nn.Module, peers: Dict[str, nn.Module], size: Tuple[int, int],
                atol: float = 1e-4) -> Dict[str, Tuple[Tuple[int, int], float]]:
    """Max-abs-diff of every peer's outputs against ours (same weights), each at its agreement
    size; raises if any exceeds ``atol``. Returns ``{peer: (size, diff)}``."""
    was_training = ours.training
    ours.eval()
    report = {}
    for name in peers:
        check = agreement_size(ours, name, size)
        peer = peers[name] if check == size else build_peers(ours, check)[name]
        peer.eval()
        x = torch.randn(1, 3, *check, generator=torch.Generator().manual_seed(0))
        ref, out = ours(x), peer(x)
        if len(ref) != len(out):
            raise AssertionError(f'{name} returned {len(out)} maps, we return {len(ref)}')
        diff = max((a - b).abs().max().item() for a, b in zip(ref, out))
        if diff > atol:
            raise AssertionError(f'{name} outputs differ from ours by {diff:.2e} at {check}')
        report[name] = (check, diff)
    ours.train(was_training)
    return report
