"""A config's model for export: built in its own scope, with a checkpoint of any layout."""
import importlib
import logging
from pathlib import Path
from typing import Any, Dict, Optional, Union

from torch import nn

HEAD_PREFIXES = ('neck.', 'decode_head.', 'auxiliary_head.', 'bbox_head.', 'rpn_head.',
                 'roi_head.', 'head.')


def build_from_config(config: Union[str, Path], checkpoint: Optional[str] = None,
                      overrides: Optional[Dict[str, Any]] = None) -> nn.Module:
    """The config's model in its scope (``default_scope``: mmdet / mmseg / mmpretrain), in eval
    mode, with ``checkpoint`` loaded (:func:`load_any_checkpoint`; ``None`` or ``'none'``: the
    random initialisation). The backbone's own ``init_cfg`` (a pretrained file) is not read."""
    from mmengine.config import Config
    from mmengine.logging import MMLogger
    from mmengine.registry import DefaultScope
    cfg = Config.fromfile(str(config))
    if overrides:
        cfg.merge_from_dict(overrides)
    scope = cfg.get('default_scope', 'mmdet')
    importlib.import_module('mmvit_ext')
    importlib.import_module(f'{scope}.models')
    registry = importlib.import_module(f'{scope}.registry').MODELS
    model_cfg = cfg.model
    if 'backbone' in model_cfg:
        model_cfg.backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.build(model_cfg)
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.ERROR)  # init_weights logs every parameter
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)
    if checkpoint and checkpoint != 'none':
        load_any_checkpoint(model, checkpoint)
    return model.eval()


def load_any_checkpoint(model: nn.Module, checkpoint: str) -> None:
    """A whole-model checkpoint (``backbone.*`` with a neck / head, e.g. from ``tools/train.py``
    or a peer's model zoo) loads strictly into ``model``, the backbone part through the
    backbone's layout conversion; a backbone-only one, in our layout or any official / peer
    layout, into the backbone through :func:`mmvit_ext.converters.load_pretrained`."""
    from ..converters import load_pretrained, read_checkpoint
    from ..converters.io import STRIP_PREFIXES, WRAPPER_KEYS
    if not hasattr(model, 'backbone'):
        load_pretrained(model, checkpoint)
        return
    state = read_checkpoint(checkpoint)
    for key in WRAPPER_KEYS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if isinstance(state, dict) and any(str(k).startswith(HEAD_PREFIXES) for k in state):
        for strip in STRIP_PREFIXES:
            if strip != 'backbone.' and all(k.startswith(strip) for k in state):
                state = {k[len(strip):]: v for k, v in state.items()}
        model.load_state_dict(state, strict=True)
    else:
        load_pretrained(model.backbone, checkpoint)


__all__ = ['build_from_config', 'load_any_checkpoint']
