"""``tools/train.py --compile``: the backbone compiled in place, or mmengine's compile of the
whole ``train_step``.

Every registered backbone's forward traces as one graph (tests/test_compile.py), so compiling the
backbone alone gives inductor whole blocks (attention, windows, norms, MLPs fused) while the
detector's heads, with their data-dependent shapes, stay eager. ``nn.Module.compile`` compiles in
place: parameter names, checkpoints, hooks and the optimizer see the same module as without it.
"""
from typing import Optional

import torch
from mmengine.config import Config
from mmengine.model import is_model_wrapper
from torch import nn

COMPILE_TARGETS = ('backbone', 'model')


def apply_compile_choice(cfg: Config, target: Optional[str]) -> dict:
    """Turn ``--compile TARGET`` into the config: ``model`` sets mmengine's ``compile`` (the whole
    ``train_step``); ``backbone`` takes the config's ``compile`` options (a dict, e.g.
    ``--cfg-options compile.backend=eager``) off the config, so mmengine compiles nothing, and
    returns them for :func:`compile_backbone`."""
    if target is None:
        return {}
    if target not in COMPILE_TARGETS:
        raise ValueError(f'--compile must be one of {COMPILE_TARGETS}, got {target!r}')
    options = cfg.get('compile', None)
    options = dict(options) if isinstance(options, dict) else {}
    if target == 'model':
        cfg.compile = options or True
        return {}
    cfg.pop('compile', None)
    return options


def compile_backbone(model: nn.Module, **options) -> nn.Module:
    """Compile ``model.backbone`` in place with ``torch.compile`` options; returns the backbone.

    The first iterations include the compile time (inductor: tens of seconds on a GPU, minutes
    for a large backbone on CPU); a new input shape compiles again (``dynamic=True`` avoids that).
    """
    inner = model.module if is_model_wrapper(model) else model
    backbone = getattr(inner, 'backbone', None)
    if not isinstance(backbone, nn.Module):
        raise ValueError(f'--compile backbone: {type(inner).__name__} has no backbone; '
                         '--compile model compiles the whole train_step')
    if not hasattr(nn.Module, 'compile'):
        raise RuntimeError('--compile backbone needs torch >= 2.2 (nn.Module.compile), '
                           f'this is torch {torch.__version__}')
    backbone.compile(**options)
    return backbone
