"""Building a config's model: the one way tools and tests do it."""
import copy
import importlib
from pathlib import Path
from typing import Optional, Union

from mmengine.config import Config, ConfigDict
from torch import nn

ConfigLike = Union[str, Path, Config, ConfigDict, dict]


def task_scope(model_cfg: Union[Config, ConfigDict, dict]) -> str:
    """The downstream registry scope a model config (or a whole config) belongs to: mmpretrain
    (an ImageClassifier), mmseg (a decode head) or mmdet."""
    model_cfg = model_cfg.get('model', model_cfg)
    if model_cfg.get('type') == 'ImageClassifier':
        return 'mmpretrain'
    return 'mmseg' if 'decode_head' in model_cfg else 'mmdet'


def build_model(cfg: ConfigLike, scope: Optional[str] = None, pretrained: bool = True) -> nn.Module:
    """The model of ``cfg`` (a config file, a config, or a model dict), built with ``scope``'s
    MODELS while ``scope`` is the default scope, as that codebase's runner builds it.

    Args:
        scope: ``mmdet`` / ``mmseg`` / ``mmpretrain`` / ``mmvit_ext``; ``None``: the config's
            ``default_scope``, else :func:`task_scope` (our backbones follow the scope's
            semantics, docs/peer_semantics.md).
        pretrained: ``False`` leaves the backbone's ``init_cfg`` (a pretrained file) out.
    """
    if isinstance(cfg, (str, Path)):
        cfg = Config.fromfile(str(cfg))
    default_scope = cfg.get('default_scope') if 'model' in cfg else None
    model_cfg = copy.deepcopy(cfg['model'] if 'model' in cfg else cfg)
    scope = scope or default_scope or task_scope(model_cfg)
    if not pretrained and isinstance(model_cfg.get('backbone'), dict):
        model_cfg['backbone']['init_cfg'] = None
    importlib.import_module('mmvit_ext')
    if scope != 'mmvit_ext':
        importlib.import_module(f'{scope}.models')
    registry = importlib.import_module(f'{scope}.registry').MODELS
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope(scope):
        return registry.build(model_cfg)


__all__ = ['build_model', 'task_scope']
