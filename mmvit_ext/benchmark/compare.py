"""Checking that peers compute what we compute, at a size where their semantics agree."""
from typing import Dict, Tuple

import torch
from torch import nn

from .peers import build_peers


def agreement_size(ours: nn.Module, peer: str, size: Tuple[int, int]) -> Tuple[int, int]:
    """The timed size when the peer's semantics coincide with ours there, else a probe size
    (the family's ``peer_agreement_size``)."""
    return ours.peer_agreement_size(peer, size)


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
