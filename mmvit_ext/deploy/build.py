"""A config's model for export: built in its own scope, with a checkpoint of any layout."""
import logging
from pathlib import Path
from typing import Any, Dict, Optional, Union

from torch import nn

def build_from_config(config: Union[str, Path], checkpoint: Optional[str] = None,
                      overrides: Optional[Dict[str, Any]] = None) -> nn.Module:
    """The config's model in its task's scope (mmdet / mmseg / mmpretrain), in eval mode, with
    ``checkpoint`` loaded (:func:`load_any_checkpoint`; ``None`` or ``'none'``: the random
    initialisation). The backbone's own ``init_cfg`` (a pretrained file) is not read."""
    from mmengine.config import Config
    from mmengine.logging import MMLogger

    from ..utils.build import build_model
    cfg = Config.fromfile(str(config))
    if overrides:
        cfg.merge_from_dict(overrides)
    model = build_model(cfg, pretrained=False)
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
    """A checkpoint of this model (``backbone.*`` beside its neck / heads, e.g. from
    ``tools/train.py`` or a peer's zoo) loads strictly into ``model``, the backbone part through
    the backbone's layout conversion. Anything else -- a backbone-only file in our layout or an
    official / peer one, or another model's checkpoint such as an ImageNet classifier's -- gives
    its backbone weights to the backbone (:func:`mmvit_ext.converters.load_pretrained`)."""
    from ..converters import load_pretrained, read_checkpoint
    from ..converters.io import WRAPPER_KEYS
    if not hasattr(model, 'backbone'):
        load_pretrained(model, checkpoint)
        return
    state = read_checkpoint(checkpoint)
    for key in WRAPPER_KEYS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    state = {k[len('module.'):] if str(k).startswith('module.') else k: v
             for k, v in state.items()} if isinstance(state, dict) else {}
    parts = {str(k).split('.')[0] for k in state}
    children = {name for name, _ in model.named_children()}
    if 'backbone' in parts and len(parts) > 1 and parts <= children:
        model.load_state_dict(state, strict=True)
    else:
        load_pretrained(model.backbone, checkpoint)


__all__ = ['build_from_config', 'load_any_checkpoint']
