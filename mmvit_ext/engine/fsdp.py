"""Training past one device's memory on mmengine's engine: ``FlexibleRunner`` with
``FSDPStrategy`` (sharded parameters, gradients and optimiser state).

A config names the strategy and our auto-wrap policy, which makes every backbone block (the
modules its :meth:`~mmvit_ext.backbones.BaseBackbone.checkpoint_stages` lists) one FSDP unit;
the rest of the model (embeddings, neck, heads) stays in the root unit::

    runner_type = 'FlexibleRunner'
    strategy = dict(type='FSDPStrategy', model_wrapper=dict(
        auto_wrap_policy=dict(type='mmvit_ext.backbone_block_policy'),
        mixed_precision=dict(param_dtype='bfloat16', reduce_dtype='float32',
                             buffer_dtype='float32')))

``use_orig_params=True`` (mmengine's default) keeps parameter names and per-parameter
``requires_grad``, so ``frozen_stages`` and layer-wise lr decay work as without FSDP.
"""
import weakref
from typing import Any

import torch
from mmengine.config import Config
from torch import nn

from ..backbones import BaseBackbone
from ..errors import ConfigError
from ..registry import FUNCTIONS

_BLOCKS: 'weakref.WeakSet[nn.Module]' = weakref.WeakSet()


@FUNCTIONS.register_module()
def backbone_block_policy(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
    """FSDP auto-wrap policy (torch's callable protocol): descend everywhere; wrap a module iff
    it is a block of one of our backbones. FSDP asks about a backbone (``recurse=True``) before
    any of its blocks, which is when the blocks are collected."""
    if recurse:
        if isinstance(module, BaseBackbone):
            _BLOCKS.update(block for stage in module.checkpoint_stages() for block in stage)
        return True
    return module in _BLOCKS


def strip_wrapper_prefixes(name: str) -> str:
    """A parameter name of an FSDP- / checkpoint-wrapped model as in the plain model."""
    for prefix in ('_fsdp_wrapped_module.', '_checkpoint_wrapped_module.', '_orig_mod.'):
        name = name.replace(prefix, '')
    return name


def prepare_strategy(cfg: Config) -> bool:
    """Adapt a config that names a ``strategy`` for :class:`mmengine.runner.FlexibleRunner`;
    returns whether it does. Without CUDA, FSDP runs on CPU (gloo): mmengine's default
    ``device_id`` (the local rank, a CUDA device) is replaced by ``'cpu'`` (with ``None`` torch
    looks for an accelerator and refuses to run)."""
    strategy: Any = cfg.get('strategy')
    if not strategy:
        return False
    if cfg.get('runner_type', 'FlexibleRunner') != 'FlexibleRunner':
        raise ConfigError(f"a config with strategy={strategy.get('type')!r} runs under "
                         f"runner_type='FlexibleRunner', got {cfg.runner_type!r}")
    if strategy.get('type') == 'FSDPStrategy' and not torch.cuda.is_available():
        wrapper = strategy.setdefault('model_wrapper', dict(type='MMFullyShardedDataParallel'))
        wrapper.setdefault('device_id', 'cpu')
    return True
