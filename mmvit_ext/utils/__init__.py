from .build import build_model, task_scope
from .heap import HeapSetting, retain_freed_memory
from .safe_checkpoint import allow_mmengine_checkpoints

__all__ = ['allow_mmengine_checkpoints', 'retain_freed_memory', 'HeapSetting', 'build_model',
           'task_scope']
