"""Training-loop pieces: exact resume (random state in checkpoints) and crash-safe saving."""
from .hooks import RandomStateHook
from .runner import (AtomicSaveRunner, atomic_save_checkpoint, find_resumable_checkpoint,
                     init_cpu_distributed)

__all__ = ['RandomStateHook', 'AtomicSaveRunner', 'atomic_save_checkpoint',
           'find_resumable_checkpoint', 'init_cpu_distributed']
