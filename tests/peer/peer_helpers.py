"""The peers' test helpers the transcribed tests use, written here against our layers."""
import math

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from mmvit_ext.layers import resize_pos_embed


def check_norm_state(modules, train_state: bool) -> bool:
    """Every ``_BatchNorm`` among ``modules`` is in ``train_state`` (the peers' helper)."""
    return all(m.training == train_state for m in modules if isinstance(m, _BatchNorm))


def timm_resize_pos_embed(pos_embed: torch.Tensor, target: torch.Tensor,
                          num_tokens: int = 1) -> torch.Tensor:
    """mmpretrain's test helper: ``pos_embed`` (1, T + side^2, C) resized bicubically to the
    square grid of ``target``, the ``num_tokens`` prefix slots kept."""
    side = int(math.isqrt(pos_embed.shape[1] - num_tokens))
    new = int(math.isqrt(target.shape[1] - num_tokens))
    return resize_pos_embed(pos_embed, (side, side), (new, new), num_tokens)


__all__ = ['check_norm_state', 'timm_resize_pos_embed']
