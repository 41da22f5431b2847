"""Training-loop pieces: exact resume (random state in checkpoints), crash-safe saving, training
state under weights-only loading, FSDP, the backbone compiled, whole-model mixed precision around mmcv ops,
determinism on CUDA."""
from .compile import COMPILE_TARGETS, apply_compile_choice, compile_backbone
from .fsdp import backbone_block_policy, prepare_strategy, strip_wrapper_prefixes
from .determinism import (DeterminismCheckHook, check_cuda_determinism,
                          nondeterministic_cuda_modules, prepare_cuda_determinism)
from .eomt_hooks import EoMTMaskAnnealingHook, TwoStageWarmupPolyLR, mask_probability
from .hooks import (ModelLayoutHook, RandomStateHook, TrustedCheckpointHook,
                    add_run_hooks)
from .precision import CpuAmpOptimWrapper, Fp32OpsHook, amp_on_cpu, keep_ops_float32
from .runner import (AtomicSaveRunner, atomic_save_checkpoint, find_resumable_checkpoint,
                     init_cpu_distributed)

__all__ = ['ModelLayoutHook', 'RandomStateHook', 'TrustedCheckpointHook', 'add_run_hooks',
           'Fp32OpsHook',
           'keep_ops_float32', 'CpuAmpOptimWrapper', 'amp_on_cpu',
           'DeterminismCheckHook', 'check_cuda_determinism', 'nondeterministic_cuda_modules',
           'prepare_cuda_determinism', 'AtomicSaveRunner', 'atomic_save_checkpoint',
           'find_resumable_checkpoint', 'init_cpu_distributed', 'backbone_block_policy',
           'prepare_strategy', 'strip_wrapper_prefixes', 'COMPILE_TARGETS',
           'apply_compile_choice', 'compile_backbone', 'EoMTMaskAnnealingHook',
           'TwoStageWarmupPolyLR', 'mask_probability']
