"""Peer implementations (mmdet, timm ...) holding exactly our weights, for side-by-side runs.

Each family builds its own (``BaseBackbone.benchmark_peers``, in the family's converter file,
with :func:`~mmvit_ext.converters.peers.load_peer`): our state dict is exported to the official
layout and read by each peer's own converter, so the comparison also cross-checks the
implementations' semantics. Imports go benchmark -> backbones -> converters, never back.
"""
from typing import Dict, List, Tuple

from torch import nn

from ..converters.peers import load_peer


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
