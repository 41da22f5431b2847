"""Peer implementations (mmdet, timm ...) holding exactly our weights, for side-by-side runs.

Each family builds its own (``BaseBackbone.benchmark_peers``, in the family's converter file):
our state dict is exported to the official layout and read by each peer's own converter, so the
comparison also cross-checks the implementations' semantics. This module holds what they share.
"""
from typing import Dict, List, Tuple

import torch
from torch import nn


def load_peer(peer: nn.Module, state: Dict[str, torch.Tensor], name: str) -> nn.Module:
    """Load ``state`` into ``peer``; anything missing (but saved buffers) or left over raises."""
    result = peer.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith('relative_position_index')]
    if missing or result.unexpected_keys:
        raise RuntimeError(f'{name} did not take our weights: missing {missing}, '
                           f'unexpected {result.unexpected_keys}')
    return peer


def peer_families() -> List[str]:
    """Families whose backbone defines peers for ``benchmark --compare``."""
    from ..backbones import BaseBackbone, family_classes
    return sorted(family for family, cls in family_classes().items()
                  if cls.benchmark_peers is not BaseBackbone.benchmark_peers)


def build_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """The peer implementations of our backbone's family, with our weights (the family's
    ``benchmark_peers``)."""
    if not hasattr(ours, 'benchmark_peers'):
        raise ValueError(f'no peers for {type(ours).__name__}: not an mmvit_ext backbone')
    return ours.benchmark_peers(img_size)
