"""Activation checkpointing, and whether a forward is a checkpoint's recomputation.

:func:`checkpoint` is ``torch.utils.checkpoint`` (non-reentrant) whose recomputation in backward
runs inside :func:`recomputing`: a module that updates state in its forward (a BatchNorm's
running statistics) asks it, so that a recomputed forward does not count its batch twice.
Under ``torch.compile`` the recomputation happens inside the compiled graph, which repeats no
buffer update, so nothing needs to be asked there.

``with_cp`` (:mod:`mmvit_ext.backbones.checkpointing`) sets :attr:`CheckpointedCall.
checkpoint_chunks` on the parts it selects; the part's own call then runs through
:func:`checkpoint`. The module's code, parameter names and state dict stay as they are.
"""
import threading
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Iterator, Tuple

import torch
import torch.utils.checkpoint as cp

from .. import torch_compat

_recomputation = threading.local()


@contextmanager
def _recomputing_context() -> Iterator[None]:
    _recomputation.depth = getattr(_recomputation, 'depth', 0) + 1
    try:
        yield
    finally:
        _recomputation.depth -= 1


def _contexts() -> Tuple[ContextManager, ContextManager]:
    """``context_fn`` of :func:`checkpoint`: nothing around the forward, the flag around the
    recomputation (entered on the thread that runs it, per recomputation)."""
    return nullcontext(), _recomputing_context()


def recomputing() -> bool:
    """Whether this forward is the backward recomputation of a :func:`checkpoint` (this thread).
    Always ``False`` while ``torch.compile`` traces: the compiled graph recomputes by itself."""
    if torch_compat.is_compiling():
        return False
    return getattr(_recomputation, 'depth', 0) > 0


def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, its activations recomputed in backward (non-reentrant
    ``torch.utils.checkpoint``), the recomputation inside :func:`recomputing`."""
    if torch_compat.is_compiling():  # traced as one region that the graph recomputes
        return cp.checkpoint(function, *args, use_reentrant=False, **kwargs)
    return cp.checkpoint(function, *args, use_reentrant=False, context_fn=_contexts, **kwargs)


class CheckpointedCall:
    """Mixin (before ``nn.Module``) of the modules ``with_cp`` may select as a part of a block.

    ``checkpoint_chunks``: 0 runs the call plainly; 1 recomputes the whole call in backward;
    N > 1 cuts the first argument's token axis (-2) in N chunks, each a call of its own (hooks
    fire per chunk) recomputed on its own (token-wise modules only). Only in training with
    gradients enabled; under ``torch.compile`` inside the graph, as whole blocks are.
    """

    checkpoint_chunks: int = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        chunks = self.checkpoint_chunks
        call = super().__call__
        if not chunks or not (self.training and torch.is_grad_enabled()):
            return call(*args, **kwargs)
        if chunks == 1:
            return checkpoint(call, *args, **kwargs)
        x, *rest = args
        return torch.cat([checkpoint(call, part, *rest, **kwargs)
                          for part in x.chunk(chunks, dim=-2)], dim=-2)


__all__ = ['CheckpointedCall', 'checkpoint', 'recomputing']
