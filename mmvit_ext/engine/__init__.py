"""Training-loop pieces: exact resume (random state in checkpoints), crash-safe saving, FSDP."""
from .fsdp import backbone_block_policy, prepare_strategy, strip_wrapper_prefixes
from .hooks import RandomStateHook
from .runner import (AtomicSaveRunner, atomic_save_checkpoint, find_resumable_checkpoint,
                     init_cpu_distributed)

__all__ = ['RandomStateHook', 'AtomicSaveRunner', 'atomic_save_checkpoint',
           'find_resumable_checkpoint', 'init_cpu_distributed', 'backbone_block_policy',
           'prepare_strategy', 'strip_wrapper_prefixes']
