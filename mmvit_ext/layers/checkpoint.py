"""Activation checkpointing of a part of a block (its attention or its MLP), chosen from outside.

``with_cp`` (:mod:`mmvit_ext.backbones.checkpointing`) sets :attr:`CheckpointedCall.
checkpoint_chunks` on the parts it selects; the part's own call then runs through
``torch.utils.checkpoint`` (non-reentrant). The module's code, parameter names and state dict
stay as they are.
"""
import warnings
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from .. import torch_compat


class CheckpointedCall:
    """Mixin (before ``nn.Module``) of the modules ``with_cp`` may select as a part of a block.

    ``checkpoint_chunks``: 0 runs the call plainly; 1 recomputes the whole call in backward;
    N > 1 cuts the first argument's token axis (-2) in N chunks, each a call of its own (hooks
    fire per chunk) recomputed on its own (token-wise modules only). Only in training with gradients enabled; under
    ``torch.compile`` the call runs plainly (whole blocks are checkpointed inside the graph).
    """

    checkpoint_chunks: int = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        chunks = self.checkpoint_chunks
        call = super().__call__
        if not chunks or not (self.training and torch.is_grad_enabled()):
            return call(*args, **kwargs)
        if torch_compat.is_compiling():
            warnings.warn(f'{type(self).__name__}: with_cp parts and mlp_chunks are not '
                          f'checkpointed in a forward compiled by torch.compile; whole blocks '
                          f'are (with_cp=True, a number or one entry per stage)')
            return call(*args, **kwargs)
        if chunks == 1:
            return checkpoint(call, *args, use_reentrant=False, **kwargs)
        x, *rest = args
        return torch.cat([checkpoint(call, part, *rest, use_reentrant=False, **kwargs)
                          for part in x.chunk(chunks, dim=-2)], dim=-2)


__all__ = ['CheckpointedCall']
