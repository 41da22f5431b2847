"""Any timm model as a pyramid backbone: NCHW maps of the levels timm's ``feature_info`` lists.

The model runs through timm's own feature API: ``forward_intermediates`` (ViTs, ConvNeXt, Swin,
EVA, Hiera, ResNet... every model that has it; levels after the last of ``out_indices`` are
pruned by timm's ``prune_intermediate_layers``) or, for models that predate it, timm's
``features_only`` wrapper. Stages (``frozen_stages``), blocks (``with_cp``) and layer-decay
groups come from the model's ``group_matcher``. Weights load only from a file (timm, Hugging Face
hub, mmpretrain ``TIMMBackbone`` or our keys, :mod:`mmvit_ext.converters.timm_models`): nothing is
downloaded. timm is imported when a model is built (a test / optional dependency).
"""
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..converters.layouts import StateDict
from ..converters.timm_models import PREFIX, timm_keys_to_ours
from ..errors import ConfigError
from ..registry import MODELS
from .base import BaseBackbone
from ..layers import CheckpointedCall
from .checkpointing import select_parts

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
_CHECKPOINTED: Dict[type, type] = {}


def _reduce_checkpointed(module: nn.Module, protocol: int) -> tuple:
    """Pickle / deepcopy a ``Checkpointed<Name>`` as its timm class (found by its own module
    and name) plus the state: the generated class itself has no importable name."""
    state = module.__getstate__() if hasattr(module, '__getstate__') else module.__dict__
    return _new_checkpointed, (type(module).timm_class,), state


def checkpointed_class(cls: type) -> type:
    """``Checkpointed<Name>``: ``cls`` (a timm block / attention / MLP class) with
    :class:`~mmvit_ext.layers.CheckpointedCall` before it, made once per class."""
    if cls not in _CHECKPOINTED:
        _CHECKPOINTED[cls] = type(f'Checkpointed{cls.__name__}', (CheckpointedCall, cls), {
            '__module__': __name__, 'timm_class': cls, '__reduce_ex__': _reduce_checkpointed})
    return _CHECKPOINTED[cls]


def _new_checkpointed(cls: type) -> nn.Module:
    """An empty ``Checkpointed<cls>`` for unpickling (its state is set after)."""
    checkpointed = checkpointed_class(cls)
    return checkpointed.__new__(checkpointed)


def checkpointable(module: nn.Module) -> CheckpointedCall:
    """``module`` as a :class:`~mmvit_ext.layers.CheckpointedCall`: timm's block / attention /
    MLP classes get a subclass ``Checkpointed<Name>`` (same code, parameters and state dict,
    shown by ``print(model)``) when ``with_cp`` selects the module. The subclass lives in this
    module and pickles as its timm class, so ``torch.save(model)`` / ``copy.deepcopy`` work."""
    if not isinstance(module, CheckpointedCall):
        module.__class__ = checkpointed_class(type(module))
    return module


def import_timm() -> Any:
    try:
        import timm
    except ImportError as err:
        raise ImportError('TimmBackbone needs timm (pip install timm; it is not a dependency '
                          'of mmvit_ext)') from err
    return timm


def _common_module(names: Sequence[str]) -> str:
    """The deepest module holding every parameter in ``names`` ('' for the root)."""
    paths = [n.split('.')[:-1] for n in names]
    common = []
    for parts in zip(*paths):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return '.'.join(common)


def _matches(matcher: Any, name: str) -> bool:
    """Whether a timm ``group_matcher`` spec places ``name`` in a group of its own: a dict of
    regexes (or lists of ``(regex, suffix)``) matches from the start of the name, as timm's
    grouping does; a callable places every name."""
    if not isinstance(matcher, dict):
        return True
    specs = [spec for spec in matcher.values() if spec is not None]
    patterns = [p for spec in specs for p in
                ([s[0] for s in spec] if isinstance(spec, (list, tuple)) else [spec])]
    return any(re.match(pattern, name) for pattern in patterns)


@MODELS.register_module()
class TimmBackbone(BaseBackbone):
    """A timm model by name, returning the NCHW maps of ``out_indices``.

    Args:
        model_name: a timm model name (``timm.list_models()``); ``arch`` is the same argument
            under our backbones' common name (a name, or ``dict(model_name=..., **kwargs)``).
        features_only: mmpretrain's switch: ``False`` (its default) returns the deepest map,
            ``True`` every level; ``out_indices`` overrides both.
        pretrained: ``True`` needs a file (``checkpoint_path`` or ``init_cfg``): timm's
            download is never used.
        checkpoint_path: a timm / Hugging Face / mmpretrain checkpoint file, loaded by
            :meth:`init_weights` with the load report of every backbone.
        in_channels: input channels (timm's ``in_chans``).
        out_indices: levels of timm's ``feature_info`` (negative from the end).
        out_norm: pass the maps through the model's final norm (timm's ``norm=True`` of
            ``forward_intermediates``); ``False`` prunes that norm.
        frozen_stages: freeze the stem (0) and the first N stages of ``group_matcher(coarse=
            True)`` (ResNet layers, ConvNeXt / Swin stages, ViT blocks); -1 nothing.
        norm_eval: BatchNorm layers stay in eval mode while training.
        with_cp: activation checkpointing of the blocks of ``group_matcher()``
            (:mod:`.checkpointing`, whole blocks or their ``attn`` / ``mlp``).
        **kwargs: the timm model's own arguments (``drop_path_rate``, ``img_size``,
            ``dynamic_img_size``...).
    """

    family = 'timm'
    peer_drop_in = False  # mmpretrain's class is ``TIMMBackbone``: swapping the type is the edit

    def __init__(self, model_name: Optional[str] = None, features_only: bool = False,
                 pretrained: bool = False, checkpoint_path: str = '', in_channels: int = 3,
                 out_indices: Optional[Union[int, Sequence[int]]] = None, out_norm: bool = False,
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: Any = False,
                 init_cfg: Optional[Union[dict, List[dict]]] = None,
                 arch: Optional[Union[str, Dict[str, Any]]] = None, **kwargs: Any) -> None:
        timm = import_timm()
        model_name, kwargs = self._resolve_name(timm, model_name, arch, kwargs)
        init_cfg = self._resolve_weights(pretrained, checkpoint_path, init_cfg)
        super().__init__(init_cfg=init_cfg)
        self.model_name = model_name
        self.in_channels = in_channels
        model = self._create(timm, model_name, in_chans=in_channels, **kwargs)
        info = getattr(model, 'feature_info', None)
        if not info:
            raise ConfigError(f'TimmBackbone: timm model {model_name!r} publishes no '
                              f'feature_info, so it has no maps to return')
        levels = list(info)
        if out_indices is None:
            out_indices = tuple(range(len(levels))) if features_only else (-1,)
        self.stage_groups: Optional[Dict[int, List[str]]] = None
        self._set_contract(out_indices, [lv['num_chs'] for lv in levels],
                           [lv['reduction'] for lv in levels], frozen_stages=-1,
                           num_stages=0, norm_eval=norm_eval, with_cp=False)
        self.intermediates = hasattr(model, 'forward_intermediates') and \
            hasattr(model, 'prune_intermediate_layers')
        if self.intermediates:
            self.take_indices = model.prune_intermediate_layers(
                list(self.out_indices), prune_norm=not out_norm, prune_head=True)
            self.out_norm = out_norm
        else:
            if out_norm:
                raise ConfigError(f'TimmBackbone: out_norm=True needs forward_intermediates, '
                                  f'which timm model {model_name!r} does not have')
            model = self._create(timm, model_name, in_chans=in_channels, features_only=True,
                                 out_indices=self.out_indices, **kwargs)
        self.timm_model = model
        self.min_input_size = max(self.strides)
        self._set_training_groups(frozen_stages, with_cp)
        self._freeze_stages()

    # ---- construction ----------------------------------------------------------------------
    @staticmethod
    def _resolve_name(timm: Any, model_name: Optional[str], arch: Any, kwargs: Dict[str, Any]
                      ) -> Tuple[str, Dict[str, Any]]:
        """``model_name`` or ``arch`` (a name or ``dict(model_name=..., **timm kwargs)``),
        checked against timm's registry."""
        if isinstance(arch, dict):
            if 'model_name' not in arch:
                raise ConfigError(f"TimmBackbone: custom arch is missing keys ['model_name'] "
                                  f'(a dict with model_name and timm arguments), got {arch}')
            arch = dict(arch)
            kwargs = {**arch, **kwargs}
            arch = kwargs.pop('model_name')
        for argument, name in (('arch', arch), ('model_name', model_name)):
            if name is not None and not (isinstance(name, str) and timm.is_model(name)):
                raise ConfigError(f'TimmBackbone: unknown {argument} {name!r}: not a timm model '
                                  f'name (timm.list_models() lists them)')
        if model_name is not None and arch is not None and model_name != arch:
            raise ConfigError(f'TimmBackbone: model_name={model_name!r} and arch={arch!r} name '
                              f'different models; give one')
        name = model_name or arch
        if name is None:
            raise ConfigError('TimmBackbone: model_name is required (a timm model name)')
        for argument in ('features_only', 'out_indices', 'pretrained_cfg_overlay', 'in_chans'):
            if argument in kwargs:
                raise ConfigError(f'TimmBackbone: {argument} is set by TimmBackbone itself, not '
                                  f'passed to timm (use in_channels / out_indices / a file)')
        return name, kwargs

    @staticmethod
    def _resolve_weights(pretrained: Any, checkpoint_path: str, init_cfg: Any) -> Any:
        """mmpretrain's ``pretrained`` / ``checkpoint_path`` -> our ``init_cfg`` (a file only)."""
        if not isinstance(pretrained, bool):
            raise TypeError(f'TimmBackbone: pretrained must be True or False, got '
                            f'{pretrained!r} (a file goes in checkpoint_path)')
        if checkpoint_path:
            if init_cfg is not None:
                raise ConfigError(f'TimmBackbone: checkpoint_path={checkpoint_path!r} and '
                                  f'init_cfg both load weights; give one')
            return dict(type='Pretrained', checkpoint=str(checkpoint_path))
        cfgs = init_cfg if isinstance(init_cfg, list) else [init_cfg]
        has_file = any(isinstance(c, dict) and 'checkpoint' in c for c in cfgs)
        if pretrained and not has_file:
            raise ConfigError("TimmBackbone: pretrained=True needs a local file "
                              "(checkpoint_path=... or init_cfg=dict(type='Pretrained', "
                              "checkpoint=...)); timm's download is never used")
        return init_cfg

    @staticmethod
    def _create(timm: Any, model_name: str, **kwargs: Any) -> nn.Module:
        """``timm.create_model`` without weights; on the meta device the model is built on the
        CPU and moved (timm's initialisers read values)."""
        if torch.empty(0).device.type != 'meta':  # the device context a caller built under
            return timm.create_model(model_name, pretrained=False, **kwargs)
        with torch.device('cpu'):
            model = timm.create_model(model_name, pretrained=False, **kwargs)
        return model.to('meta')

    def _matcher_groups(self, coarse: bool) -> List[List[str]]:
        """Parameter names (ours) of every ``group_matcher`` group from the stem up; names the
        matcher does not match (the top) are left out. timm's public ``group_parameters``
        (``timm.models`` in 1.0.15 and 1.0.31) orders the groups."""
        from timm.models import group_parameters
        model = self.timm_model
        matcher = model.group_matcher(coarse=coarse)
        groups = group_parameters(model, matcher)
        matched = [[n for n in names if _matches(matcher, n)]
                   for _, names in sorted(groups.items())]
        return [[PREFIX + n for n in names] for names in matched if names]

    def _set_training_groups(self, frozen_stages: int, with_cp: Any) -> None:
        needs_groups = frozen_stages != -1 or with_cp
        if not self.intermediates or not hasattr(self.timm_model, 'group_matcher'):
            if needs_groups:
                raise ConfigError(f'TimmBackbone: frozen_stages / with_cp need timm\'s '
                                  f'forward_intermediates and group_matcher, which '
                                  f'{self.model_name!r} does not have')
            self.frozen_stages, self.with_cp = -1, False
            return
        stages = self._matcher_groups(coarse=True)
        if not isinstance(frozen_stages, int) or not -1 <= frozen_stages < len(stages):
            raise ConfigError(f'TimmBackbone: frozen_stages={frozen_stages!r} is out of range; '
                              f'use -1 (nothing frozen) up to {len(stages) - 1} (the stem and '
                              f'{len(stages) - 1} stages of {self.model_name})')
        self.stage_groups = dict(enumerate(stages))
        stage_of = {n: gid for gid, names in self.stage_groups.items() for n in names}
        self.block_groups = self._matcher_groups(coarse=False)
        self.block_names = [(stage_of[names[0]], _common_module(names))
                            for names in self.block_groups[1:]]  # the stem is no block
        self.frozen_stages = frozen_stages
        self.with_cp = with_cp

    @property
    def nondeterministic_cuda_backward(self) -> Optional[str]:
        """Read by :mod:`mmvit_ext.engine.determinism`: timm's ``dynamic_img_size`` resizes the
        position embedding to the input's grid, bicubically, inside the model's forward."""
        if getattr(self.timm_model, 'dynamic_img_size', False):
            return ("timm's dynamic_img_size: bicubic position-embedding resize, whose CUDA "
                    'backward torch refuses under use_deterministic_algorithms')
        return None

    # ---- forward ---------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if self.intermediates:
            maps = self.timm_model.forward_intermediates(
                x, indices=self.take_indices, norm=self.out_norm, output_fmt='NCHW',
                intermediates_only=True)
        else:
            maps = self.timm_model(x)
            if str(getattr(self.timm_model, 'output_fmt', 'NCHW')).endswith('NHWC'):
                maps = [m.permute(0, 3, 1, 2) for m in maps]
        return tuple(maps)

    # ---- training behaviour ----------------------------------------------------------------
    def _frozen_names(self) -> set:
        groups = self.stage_groups or {}
        return {n for gid in range(self.frozen_stages + 1) for n in groups.get(gid, [])}

    def frozen_modules(self) -> List[nn.Module]:
        """The largest modules whose every parameter is in a frozen group."""
        frozen = self._frozen_names()
        if not frozen:
            return []
        modules, taken = [], []
        for name, module in self.named_modules():
            params = [n for n, _ in module.named_parameters(prefix=name)]
            if not params or any(name.startswith(t + '.') for t in taken) or \
                    not all(p in frozen for p in params):
                continue
            modules.append(module)
            taken.append(name)
        return modules

    def frozen_parameters(self) -> List[nn.Parameter]:
        """Frozen parameters held loose (ViT's ``cls_token`` / ``pos_embed``)."""
        inside = {id(p) for m in self.frozen_modules() for p in m.parameters()}
        frozen = self._frozen_names()
        return [p for n, p in self.named_parameters() if n in frozen and id(p) not in inside]

    def checkpoint_stages(self) -> List[List[nn.Module]]:
        """The blocks of ``group_matcher()`` (each fine group's module), per coarse stage."""
        stages: Dict[int, List[nn.Module]] = {}
        for stage, name in getattr(self, 'block_names', ()):
            module = self.get_submodule(name)
            if module is not self and not isinstance(module, CONTAINERS):
                stages.setdefault(stage, []).append(module)
        return [blocks for _, blocks in sorted(stages.items())]

    def prepare_checkpointing(self) -> None:
        """``with_cp`` on timm's blocks (whole, or their ``attn`` / ``mlp``): timm runs its blocks
        itself, so :meth:`run_block` never sees them; the selected modules checkpoint their own
        call (:func:`checkpointable`)."""
        stages = self.checkpoint_stages()
        key = (self._cp_plan, tuple(id(b) for stage in stages for b in stage))
        if key == self._cp_key:
            return
        name = type(self).__name__
        if self._cp_plan.mlp_chunks > 1:
            raise ConfigError(f'{name}: with_cp mlp_chunks needs a token-wise MLP (token_wise '
                              f'= True); timm MLPs do not say so, use whole blocks')
        blocks = [b for stage in stages for b in stage]
        parts = self._cp_plan.parts(stages, name) if self._cp_plan.active else []
        selected = []
        for block, part in zip(blocks, parts):
            if part is None:
                continue
            module = block if part == 'block' else getattr(block, part, None)
            if not isinstance(module, nn.Module):
                raise ConfigError(f'{name}: with_cp part {part!r}: {type(block).__name__} has no '
                                  f'{part!r} child (use part=\'block\')')
            selected.append(checkpointable(module))
        select_parts(list(self.modules()), selected, 1)
        self._cp_key = key

    # ---- weights -----------------------------------------------------------------------------
    def instance_layout(self, state_dict: StateDict) -> Optional[Tuple[StateDict, str]]:
        return timm_keys_to_ours(state_dict, self.state_dict().keys())

    def unused_checkpoint_keys(self, keys: Sequence[str]) -> List[str]:
        """Keys of parts this instance does not build: missing right under a container (the
        feature wrapper, a block list cut after the last output) or under a module timm emptied
        (a pruned head or norm, now ``Identity``)."""
        own = set(self.state_dict())
        unused = []
        for key in keys:
            if key in own or not key.startswith(PREFIX):
                continue
            parent: nn.Module = self.timm_model
            missing = False
            for part in key[len(PREFIX):].split('.')[:-1]:
                child = parent._modules.get(part)
                if child is None:
                    missing = True
                    break
                parent = child
            emptied = not any(True for _ in parent.parameters()) and \
                not any(True for _ in parent.buffers())
            if emptied or (missing and (parent is self.timm_model or
                                        isinstance(parent, CONTAINERS))):
                unused.append(key)
        return unused

    def layer_depth_groups(self) -> List[Tuple[str, ...]]:
        """``group_matcher()``'s groups: the stem, then every block (and downsample) in order."""
        if self.stage_groups is None:
            raise NotImplementedError(f'TimmBackbone: layer-wise lr decay needs timm\'s '
                                      f'group_matcher and forward_intermediates, which '
                                      f'{self.model_name!r} does not have')
        return [tuple(names) for names in self.block_groups]
