"""Dialable activation checkpointing: which blocks recompute their activations in backward, and
which part of each (the whole block, only its attention or only its MLP).

``with_cp`` of every backbone takes:

==============================================  ================================================
``False`` / ``None`` / ``0``                    nothing (the default)
``True``                                        every block, whole (mmdet / mmseg / mmpretrain)
``N`` (int)                                     the first N blocks in run order (the shallow,
                                                high-resolution ones hold the most activations)
``[k0, k1, ...]`` (one entry per stage)         the first k_i blocks of stage i; ``True`` /
                                                ``False`` for all / none of a stage
``'attn'`` / ``'mlp'``                          every block, only its ``attn`` / ``mlp`` child
                                                (the norm before it, layer scale and drop path
                                                are not recomputed: the norm's output is saved)
``dict(blocks=..., part='attn')``               ``blocks`` any of the above selections, ``part``
                                                ``'block'`` (default), ``'attn'`` or ``'mlp'``
``dict(blocks=..., mlp_chunks=N)``              whole blocks, and in their recomputation the MLP
                                                runs in N token chunks, each recomputed again
                                                on its own in backward: its hidden activations
                                                exist for one chunk at a time (token-wise MLPs,
                                                ``token_wise = True``; not PVTv2's convolutional
                                                one)
==============================================  ================================================

A stage is a group of :meth:`~mmvit_ext.backbones.BaseBackbone.checkpoint_stages`: the four
stages of Swin / PVTv2, one stage (every trunk block) for the plain-ViT families, plus CaiT's
class-attention blocks as a second stage in its classifier. The part of a block is its child
module of that name (every family's blocks have ``attn`` and ``mlp``), a
:class:`~mmvit_ext.layers.CheckpointedCall` whose call checkpoints itself when selected (the
block's code, parameter names and state dict stay as they are); whole blocks are checkpointed by
:meth:`~mmvit_ext.backbones.BaseBackbone.run_block`. Checkpointing is non-reentrant (DDP, FSDP,
frozen parameters and autocast work as without it; under ``torch.compile`` whole blocks and
parts are checkpointed inside the graph), runs only in training with gradients
enabled, and recomputes with the forward's random state (dropout and drop path give the same
values; MLP dropout in chunks draws per chunk).
"""
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..errors import ConfigError
from ..layers.checkpoint import CheckpointedCall, checkpoint

PARTS = ('block', 'attn', 'mlp')
BlockSelection = Union[bool, int, Tuple[Union[bool, int], ...]]


@dataclass(frozen=True)
class CheckpointPlan:
    """A parsed ``with_cp``: ``blocks`` (``True`` all, an int the first N in run order, or one
    bool / int per stage), ``part`` (one of :data:`PARTS`) and ``mlp_chunks`` (token chunks of
    the MLP inside whole blocks; 1: one piece)."""

    blocks: BlockSelection
    part: str = 'block'
    mlp_chunks: int = 1

    @property
    def active(self) -> bool:
        if isinstance(self.blocks, tuple):
            return any(self.blocks)
        return bool(self.blocks)

    def parts(self, stages: Sequence[Sequence[nn.Module]], owner: str) -> List[Optional[str]]:
        """The part to checkpoint (or ``None``) of every block of ``stages``, in run order."""
        sizes = [len(s) for s in stages]
        if isinstance(self.blocks, tuple):
            if len(self.blocks) != len(stages):
                raise ConfigError(f'{owner}: with_cp={list(self.blocks)} needs one entry per stage '
                                  f'({len(stages)} stages of {sizes} blocks)')
            counts = [n if k is True else int(k) for k, n in zip(self.blocks, sizes)]
            if any(k > n for k, n in zip(counts, sizes)):
                raise ConfigError(f'{owner}: with_cp={list(self.blocks)} asks for more blocks '
                                  f'than stages have ({sizes})')
            return [self.part if j < k else None for k, n in zip(counts, sizes) for j in range(n)]
        total = sum(sizes)
        first = total if self.blocks is True else int(self.blocks)
        if first > total:
            raise ConfigError(f'{owner}: with_cp={first} asks for more blocks than the {total} '
                              f'this instance builds')
        return [self.part if i < first else None for i in range(total)]


def _selection(value: Any, owner: str) -> BlockSelection:
    if value is None or value is False:
        return False
    if value is True or (isinstance(value, int) and value >= 0):
        return value
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, bool) or (isinstance(v, int) and v >= 0) for v in value):
        return tuple(value)
    raise ConfigError(f'{owner}: with_cp blocks must be True / False, a number of blocks >= 0 or '
                      f'a list with one bool / number per stage, got {value!r}')


def parse_with_cp(value: Any, owner: str) -> CheckpointPlan:
    """``with_cp`` (see the module docstring) -> a :class:`CheckpointPlan`; bad values raise a
    :class:`~mmvit_ext.errors.ConfigError` naming ``with_cp``."""
    if isinstance(value, str):
        if value not in PARTS[1:]:
            raise ConfigError(f"{owner}: with_cp={value!r} is not supported; strings select a "
                              f"part of every block: 'attn' or 'mlp'")
        return CheckpointPlan(True, value)
    if isinstance(value, dict):
        unknown = set(value) - {'blocks', 'part', 'mlp_chunks'}
        if unknown:
            raise ConfigError(f'{owner}: with_cp dict has unknown keys {sorted(unknown)} '
                              f"(allowed: 'blocks', 'part', 'mlp_chunks')")
        part = value.get('part', 'block')
        if part not in PARTS:
            raise ConfigError(f'{owner}: with_cp part={part!r} is not supported; choose one of '
                              f'{PARTS}')
        chunks = value.get('mlp_chunks', 1)
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ConfigError(f'{owner}: with_cp mlp_chunks must be an int >= 1, got {chunks!r}')
        if chunks > 1 and part != 'block':
            raise ConfigError(f"{owner}: with_cp mlp_chunks={chunks} chunks the MLP of whole "
                              f"blocks; it needs part='block', got part={part!r}")
        return CheckpointPlan(_selection(value.get('blocks', True), owner), part, chunks)
    return CheckpointPlan(_selection(value, owner))


def checkpoint_block(block: nn.Module, *args: Any) -> Any:
    """``block(*args)``, recomputed in backward (non-reentrant; the recomputation counts no
    batch in running statistics again, :func:`~mmvit_ext.layers.checkpoint.recomputing`)."""
    return checkpoint(block, *args)


def part_module(block: nn.Module, part: str, owner: str) -> CheckpointedCall:
    """The submodule ``part`` of ``block``: its child of that name, a
    :class:`~mmvit_ext.layers.CheckpointedCall`."""
    module = getattr(block, part, None)
    if not isinstance(module, CheckpointedCall):
        raise ConfigError(f"{owner}: with_cp part {part!r} needs blocks whose {part!r} child is "
                          f"a mmvit_ext.layers.CheckpointedCall (the shared attention and MLPs); "
                          f"{type(block).__name__}.{part} is {type(module).__name__} "
                          f"(use part='block')")
    return module


def select_parts(modules: Sequence[nn.Module], selected: Sequence[CheckpointedCall],
                 chunks: int) -> None:
    """Checkpoint exactly ``selected`` among ``modules`` (in ``chunks`` token chunks, 1: whole);
    every other :class:`~mmvit_ext.layers.CheckpointedCall` of ``modules`` runs plainly."""
    for module in modules:
        if isinstance(module, CheckpointedCall):
            module.checkpoint_chunks = 0
    for module in selected:
        module.checkpoint_chunks = chunks


__all__ = ['PARTS', 'CheckpointPlan', 'parse_with_cp', 'checkpoint_block', 'part_module',
           'select_parts']
