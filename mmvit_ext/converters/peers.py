"""Loading our weights into a peer implementation (mmdet, timm ...): the families' converter
files build their benchmark peers with it (:mod:`mmvit_ext.benchmark` uses them)."""
from typing import Dict

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


__all__ = ['load_peer']
