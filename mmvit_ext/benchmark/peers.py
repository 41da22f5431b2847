"""Peer implementations (the same model in other libraries) holding exactly our weights, for
side-by-side runs.

A family with peers answers ``benchmark_peers(img_size)`` (a hook of ``BaseBackbone``), defined
in its own ``backbones/<family file>_peers.py``; this module only asks the registry which
families have them and the model for its peers. Peers belong to the family whose class defines
them: a family subclassing another's class has none unless it defines its own. Imports go
benchmark -> backbones -> converters, never back.
"""
from typing import Dict, List, Tuple

from torch import nn

from ..backbones import BaseBackbone, family_classes
from ..backbones.base import load_peer


def peers_owner(cls: type) -> type:
    """The class whose own body defines the ``benchmark_peers`` that ``cls`` uses."""
    return next(c for c in cls.__mro__ if 'benchmark_peers' in vars(c))


def has_peers(cls: type) -> bool:
    """Whether ``cls``'s family defines peers (not the default, not another family's)."""
    owner = peers_owner(cls)
    return owner is not BaseBackbone and getattr(owner, 'family', None) == \
        getattr(cls, 'family', None)


def peer_families() -> List[str]:
    """Families with peers for ``benchmark --compare``, from the registry."""
    return sorted(family for family, cls in family_classes().items() if has_peers(cls))


def build_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """The peer implementations of our backbone's family, with our weights."""
    if not isinstance(ours, BaseBackbone):
        raise ValueError(f'no peers for {type(ours).__name__}: not an mmvit_ext backbone')
    if not has_peers(type(ours)):
        raise ValueError(f'no peer implementations for {type(ours).__name__} (families with '
                         f'peers: {", ".join(peer_families())})')
    return ours.benchmark_peers(img_size)


__all__ = ['build_peers', 'has_peers', 'load_peer', 'peer_families', 'peers_owner']
