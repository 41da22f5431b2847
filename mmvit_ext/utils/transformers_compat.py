"""Two names onedl-mmpretrain (<= 1.3.6) imports from transformers where transformers 5 has none.

onedl-mmpretrain's multimodal models (imported by ``mmpretrain.models`` when transformers and
pycocotools are installed, and so by ``mmdet.models``) import ``find_pruneable_heads_and_indices``
from ``transformers.pytorch_utils`` (BLIP, RAM; transformers 5 removed it, and the failed import
leaves BLIP subclassing ``None``: ``TypeError: NoneType takes no arguments``) and
``PretrainedConfig`` from ``transformers.modeling_utils`` (OFA; transformers 5 renamed it
``PreTrainedConfig`` and keeps the old name only in ``configuration_utils``). ``import
mmvit_ext`` puts our ``find_pruneable_heads_and_indices``, written from transformers 4's
documented behaviour, and transformers' own ``configuration_utils.PretrainedConfig`` where
mmpretrain looks, only where that break is installed
(:data:`mmvit_ext.utils.env_check.KNOWN_BREAKS`) and each name is missing; nothing else in
transformers or mmpretrain is touched. An import of ``mmdet.models`` or ``mmpretrain.models``
before ``mmvit_ext`` still fails (configs import mmvit_ext first, through ``custom_imports``).
"""
from types import ModuleType
from typing import Iterable, Set, Tuple

import torch

HELPER = 'find_pruneable_heads_and_indices'
CONFIG = 'PretrainedConfig'


def find_pruneable_heads_and_indices(heads: Iterable[int], n_heads: int, head_size: int,
                                     already_pruned_heads: Set[int]
                                     ) -> Tuple[Set[int], torch.Tensor]:
    """The heads still to prune and the rows (of the query / key / value projections; columns of
    the output one) that stay, for a layer that now holds ``n_heads`` heads of ``head_size``.

    ``heads`` and ``already_pruned_heads`` are numbered as in the unpruned layer; the heads
    pruned before sit in no row any more, so a head's row block is its number less the pruned
    heads numbered below it. Returns ``(set(heads) - already_pruned_heads, kept)`` with ``kept``
    an int64 index of length ``(n_heads - len(new heads)) * head_size``, ascending.
    """
    to_prune = set(heads) - set(already_pruned_heads)
    blocks = {head - sum(p < head for p in already_pruned_heads) for head in to_prune}
    keep = torch.tensor([block not in blocks for block in range(n_heads)])
    kept = torch.arange(n_heads * head_size)[keep.repeat_interleave(head_size)]
    return to_prune, kept


def supply_missing(pytorch_utils: ModuleType, modeling_utils: ModuleType,
                   configuration_utils: ModuleType) -> bool:
    """Put :func:`find_pruneable_heads_and_indices` in ``pytorch_utils`` and
    ``configuration_utils.PretrainedConfig`` in ``modeling_utils`` (transformers' modules), each
    only where it lacks one; True when both then have theirs."""
    if not hasattr(pytorch_utils, HELPER):
        setattr(pytorch_utils, HELPER, find_pruneable_heads_and_indices)
    if not hasattr(modeling_utils, CONFIG) and hasattr(configuration_utils, CONFIG):
        setattr(modeling_utils, CONFIG, getattr(configuration_utils, CONFIG))
    return callable(getattr(pytorch_utils, HELPER)) and hasattr(modeling_utils, CONFIG)


def mend_onedl_mmpretrain() -> bool:
    """The known break's mend, run by ``import mmvit_ext`` only where the break is installed:
    supply both names to the installed transformers; False if it cannot be imported."""
    try:
        from transformers import configuration_utils, modeling_utils, pytorch_utils
    except Exception:  # a transformers that does not import: the break stays named, as before
        return False
    return supply_missing(pytorch_utils, modeling_utils, configuration_utils)


__all__ = ['CONFIG', 'HELPER', 'find_pruneable_heads_and_indices', 'mend_onedl_mmpretrain',
           'supply_missing']
