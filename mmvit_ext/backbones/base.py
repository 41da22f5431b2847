"""The backbone contract shared by every family.

Every backbone resolves an ``arch`` from its ``arch_zoo`` (names and aliases, or a validated
custom dict), validates ``out_indices`` / ``frozen_stages``, honours ``norm_eval`` and ``with_cp``,
loads checkpoints of every known layout on every load path (a load-state-dict pre-hook converts
and checks the keys under its prefix, see :mod:`mmvit_ext.converters.loading`), and
publishes its output contract as data: ``out_channels`` and ``strides`` per output, derived from
the channels and strides of every selectable level and ``out_indices``. Parts after the last
selected level are not built (they would get no gradient, which breaks DDP).
"""
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from mmengine.logging import print_log
from mmengine.model import BaseModule
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..converters import load_pretrained, unwrap_state_dict
from ..converters.layouts import StateDict
from ..converters.loading import LoadReport, current_source, prepare_state_dict
from ..layers import AttentionBase, resize_rel_pos_table
from ..errors import ConfigError
from .checkpointing import (CheckpointPlan, checkpoint_block, select_parts,
                            parse_with_cp, part_module)
from .vocabulary import Vocabulary, normalise_init_cfg

# (params in millions, GFLOPs) of a preset in classifier form at 224x224; None: not published
PaperFigures = Tuple[Optional[float], Optional[float]]


@dataclass(frozen=True)
class ExportLimits:
    """What a dynamic ONNX graph of a backbone needs to know about input sizes.

    Args:
        min_size: the smallest image side the graph serves (torch specialises size-1 dims, so
            the deepest map must be at least 2 pixels).
        fixed_window_size: from this side on, every map whose windows shrink to fit small maps
            is longer than one window, so the window layout does not depend on the size (the
            export is faster there); 0 when no window shrinks.
    """

    min_size: int
    fixed_window_size: int = 0


def load_peer(peer: nn.Module, state: StateDict, name: str) -> nn.Module:
    """Load ``state`` into a peer implementation (``benchmark_peers``); anything missing (but
    saved buffers) or left over raises, naming the peer as ``name``."""
    result = peer.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith('relative_position_index')]
    if missing or result.unexpected_keys:
        raise RuntimeError(f'{name} did not take our weights: missing {missing}, '
                           f'unexpected {result.unexpected_keys}')
    return peer


class AttentionBlock(NamedTuple):
    """A trunk block for attention analysis: the block (its output: the tokens, or
    ``(tokens, ...)``), its attention module (maps at ``attention.attn_map``) and the token stride
    of its input map."""
    block: nn.Module
    attention: AttentionBase
    stride: int


# checkpoint keys of classifier and pretraining heads: never a backbone's, dropped quietly
HEAD_KEYS = re.compile(r'(head|heads|head_dist|fc|classifier|pre_logits|pooler|decoder\w*|'
                       r'mask_token|fc_norm)(\.|$)')


class BaseBackbone(BaseModule):
    """Contract base, and the one place a family answers every question about itself.

    Subclasses set the class attributes below, call :meth:`_set_contract`, build their layers
    and implement :meth:`forward_features`, :meth:`frozen_modules` and :meth:`unbuilt_prefixes`.
    Shared code and tools ask the class (or instance), never test for a family:

    * ``family``: the short name of the tools' ``FAMILY:ARCH`` presets and of the family's
      checkpoint layouts (:func:`mmvit_ext.converters.register_layout`);
    * ``arch_zoo`` (presets and aliases, one table), ``default_arch``, ``essential_keys`` /
      ``optional_keys`` of a custom arch: :meth:`resolve_arch`;
    * ``vocabulary``: the peers' names for its arguments (:mod:`.vocabulary`);
    * ``paper_figures``: the presets ``model_stats --all`` counts, with the paper's numbers;
    * ``official_code``: where ``official_parity.py`` finds the official model;
    * :meth:`infer_arch`: constructor settings read off a state dict of our layout;
    * :meth:`classifier_settings`: the settings that make the classifier form;
    * :meth:`export_limits`: input sizes a dynamic ONNX graph serves;
    * :meth:`benchmark_peers` / :meth:`peer_agreement_size`: peer implementations holding our
      weights, for ``benchmark --compare``;
    * :meth:`layer_depth_groups`: layer-wise lr decay;
    * :meth:`checkpoint_stages`: the blocks ``with_cp`` counts (and FSDP wraps).
    """

    family: str = ''
    arch_zoo: Dict[str, Dict[str, Any]] = {}
    default_arch: str = ''
    essential_keys: FrozenSet[str] = frozenset()
    optional_keys: FrozenSet[str] = frozenset()
    vocabulary: Vocabulary = Vocabulary()
    # a peer config whose backbone ``type`` is this class's name builds it after changing only
    # the type (tests/test_peer_configs.py builds every such shipped config)
    peer_drop_in: bool = True
    paper_figures: Dict[str, PaperFigures] = {}
    # the official repository's model module and our arch -> its constructor, for
    # tools/analysis/official_parity.py (None: no official code to check against)
    official_code: Optional[Tuple[str, Dict[str, str]]] = None
    in_channels: int = 3
    min_input_size: int = 1

    def __init__(self, init_cfg: Optional[Union[dict, List[dict]]] = None) -> None:
        super().__init__(init_cfg=normalise_init_cfg(init_cfg))  # dict(checkpoint=...) too
        self.out_indices: Tuple[int, ...] = ()
        self.level_channels: Tuple[int, ...] = ()
        self.level_strides: Tuple[int, ...] = ()
        self.frozen_stages = -1
        self.norm_eval = False
        self._cp_key: Optional[Tuple] = None
        self._cp_blocks: FrozenSet[int] = frozenset()  # every block, and those run whole
        self._cp_whole: FrozenSet[int] = frozenset()
        self.with_cp = False
        self.load_report: Optional[LoadReport] = None
        self._register_load_state_dict_pre_hook(self._convert_on_load)

    # ---- family facts ----------------------------------------------------------------------
    @classmethod
    def infer_arch(cls, state_dict: StateDict) -> Optional[Dict[str, Any]]:
        """Constructor settings (``arch=dict(...)`` and others) read off weights of our layout,
        so that ``tools/convert_checkpoint.py`` can load-check them; ``None``: the weights do
        not determine the architecture (pass ``--arch``)."""
        return None

    @classmethod
    def classifier_settings(cls) -> Dict[str, Any]:
        """Settings that make the classifier trunk: one output, the deepest."""
        return dict(out_indices=(-1,))

    def export_limits(self) -> ExportLimits:
        """Sizes a dynamic ONNX graph of this instance serves (:class:`ExportLimits`); families
        whose windows shrink to fit small maps add ``fixed_window_size``."""
        strides = [s for s in (*self.level_strides, *self.strides) if s is not None]
        return ExportLimits(min_size=2 * max(strides))

    def benchmark_peers(self, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
        """Peer implementations (mmdet, timm ...) of this model holding exactly our weights,
        returning our outputs, for ``benchmark --compare``; none by default. A family with peers
        defines them in its own ``<family file>_peers.py`` (:func:`load_peer` loads them)."""
        raise ValueError(f'no peer implementations for {type(self).__name__} (families with '
                         f'peers define benchmark_peers())')

    def peer_agreement_size(self, peer: str, size: Tuple[int, int]) -> Tuple[int, int]:
        """An input size near ``size`` where ``peer`` computes what we compute (their small-map
        or padding semantics may differ elsewhere)."""
        return size

    # ---- arguments -------------------------------------------------------------------------
    @classmethod
    def resolve_arch(cls, arch: Union[str, Dict[str, Any]]) -> Dict[str, Any]:
        """Preset name / alias -> settings; a custom dict must hold exactly the known keys."""
        name = cls.__name__
        if isinstance(arch, str):
            key = arch.lower()
            if key not in cls.arch_zoo:
                raise ConfigError(f'{name}: unknown arch {arch!r}; choose one of '
                                  f'{sorted(cls.arch_zoo)} (it is not in default archs) or pass '
                                  f'a dict with keys {sorted(cls.essential_keys)}')
            return dict(cls.arch_zoo[key])
        if not isinstance(arch, dict):
            raise TypeError(f'{name}: arch must be a preset name or a dict, got {type(arch).__name__}')
        missing = cls.essential_keys - set(arch)
        if missing:
            raise ConfigError(f'{name}: custom arch is missing keys {sorted(missing)} '
                              f'(Custom arch needs a dict with keys '
                              f'{sorted(cls.essential_keys)})')
        unknown = set(arch) - cls.essential_keys - cls.optional_keys
        if unknown:
            raise ConfigError(f'{name}: custom arch has unknown keys {sorted(unknown)} (allowed: '
                             f'{sorted(cls.essential_keys | cls.optional_keys)})')
        return dict(arch)

    def _set_contract(self, out_indices: Union[int, Sequence[int]], channels: Sequence[int],
                      strides: Sequence[int], frozen_stages: int, num_stages: int,
                      norm_eval: bool, with_cp: Any) -> None:
        """Validate and store the common arguments; ``channels`` / ``strides`` list every
        selectable level (stage or block); ``with_cp`` as in :mod:`.checkpointing`."""
        name = type(self).__name__
        num_outputs = len(channels)
        if isinstance(out_indices, int):
            out_indices = (out_indices,)
        if not isinstance(out_indices, Sequence) or not out_indices:
            raise TypeError(f'{name}: out_indices must be an int or a non-empty sequence of ints, '
                            f'got {out_indices!r}')
        resolved = []
        for index in out_indices:
            if not isinstance(index, int) or isinstance(index, bool):
                raise TypeError(f'{name}: out_indices entries must be ints, got {index!r}')
            if not -num_outputs <= index < num_outputs:
                raise ValueError(f'{name}: out_indices entry {index!r} is out of range; valid '
                                 f'indices are 0..{num_outputs - 1} (or negative from the end)')
            resolved.append(index % num_outputs)
        if len(set(resolved)) != len(resolved):
            raise ValueError(f'{name}: out_indices {tuple(out_indices)} has duplicates')
        if not isinstance(frozen_stages, int) or not -1 <= frozen_stages <= num_stages:
            raise ValueError(f'{name}: frozen_stages={frozen_stages!r} is out of range; use -1 '
                             f'(nothing frozen) up to {num_stages} (all stages)')
        self.level_channels = tuple(channels)
        self.level_strides = tuple(strides)
        self.out_indices = tuple(sorted(resolved))  # outputs always come shallow to deep
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp

    @property
    def num_outputs(self) -> int:
        """Selectable levels (stages or blocks) of the full architecture."""
        return len(self.level_channels)

    def output_spec(self) -> List[Tuple[int, int]]:
        """(channels, stride) of every output; families with resampled outputs override."""
        return [(self.level_channels[i], self.level_strides[i]) for i in self.out_indices]

    @property
    def out_channels(self) -> Tuple[int, ...]:
        return tuple(c for c, _ in self.output_spec())

    @property
    def strides(self) -> Tuple[int, ...]:
        return tuple(s for _, s in self.output_spec())

    def output_shapes(self, height: int, width: int) -> List[Tuple[int, int, int]]:
        """(C, H', W') of every output for an input of ``height`` x ``width``."""
        return [(c, math.ceil(height / s), math.ceil(width / s))
                for c, s in zip(self.out_channels, self.strides)]

    def check_input(self, x: torch.Tensor) -> None:
        """Raise a clear error for a wrong rank, channel count or too small an image."""
        name = type(self).__name__
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f'{name} expects a (B, {self.in_channels}, H, W) tensor, got {shape}')
        if x.shape[1] != self.in_channels:
            raise ValueError(f'{name} was built with in_channels={self.in_channels} but the input '
                             f'has {x.shape[1]} channels (shape {tuple(x.shape)})')
        if min(x.shape[2:]) < self.min_input_size:
            raise ValueError(f'{name} needs inputs of at least {self.min_input_size}x'
                             f'{self.min_input_size} pixels (one patch), got {tuple(x.shape[2:])}')

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """(B, C_in, H, W) -> the maps of ``out_indices``."""
        self.check_input(x)
        self.prepare_checkpointing()
        return self.forward_features(x)

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The family's forward, plain PyTorch."""
        raise NotImplementedError

    # ---- activation checkpointing ------------------------------------------------------------
    @property
    def with_cp(self) -> Any:
        """The checkpointing setting as given (:mod:`.checkpointing`); setting it validates it."""
        return self._with_cp

    @with_cp.setter
    def with_cp(self, value: Any) -> None:
        self._cp_plan: CheckpointPlan = parse_with_cp(value, type(self).__name__)
        self._with_cp = value

    def checkpoint_stages(self) -> List[List[nn.Module]]:
        """The blocks :meth:`run_block` runs, grouped by stage, in run order (what ``with_cp``
        counts). Default: every ``nn.ModuleList`` named ``blocks``, in registration order."""
        return [list(module) for name, module in self.named_modules()
                if name.rpartition('.')[2] == 'blocks' and isinstance(module, nn.ModuleList)]

    def prepare_checkpointing(self) -> None:
        """Select what ``with_cp`` names: whole blocks for :meth:`run_block`, ``attn`` /
        ``mlp`` parts hooked. Again only when the setting or the blocks changed (e.g. wrapped
        as FSDP units); ``train()`` and every forward call this."""
        stages = self.checkpoint_stages()
        key = (self._cp_plan, tuple(id(b) for stage in stages for b in stage))
        if key == self._cp_key:
            return
        name = type(self).__name__
        blocks = [b for stage in stages for b in stage]
        parts = self._cp_plan.parts(stages, name)
        self._cp_blocks = frozenset(id(b) for b in blocks)
        self._cp_whole = frozenset(id(b) for b, p in zip(blocks, parts) if p == 'block')
        chunks = self._cp_plan.mlp_chunks
        if chunks > 1:  # whole blocks, their MLPs in token chunks
            selected = [part_module(b, 'mlp', name) for b, p in zip(blocks, parts) if p == 'block']
            for module in selected:
                if not getattr(module, 'token_wise', False):
                    raise ConfigError(f'{name}: with_cp mlp_chunks needs a token-wise MLP '
                                      f'(token_wise = True); {type(module).__name__} mixes tokens')
        else:
            selected = [part_module(b, p, name) for b, p in zip(blocks, parts)
                        if p not in (None, 'block')]
        select_parts(list(self.modules()), selected, chunks)
        self._cp_key = key

    def run_block(self, block: nn.Module, *args: Any) -> Any:
        """Run a block, through activation checkpointing where ``with_cp`` selects the whole
        block."""
        if self._cp_plan.active and id(block) not in self._cp_blocks:
            raise RuntimeError(f'{type(self).__name__}: run_block got a {type(block).__name__} '
                               f'that checkpoint_stages() does not list, so with_cp cannot '
                               f'select it; override checkpoint_stages()')
        if id(block) in self._cp_whole and self.training and torch.is_grad_enabled():
            return checkpoint_block(block, *args)
        return block(*args)

    # ---- training behaviour ------------------------------------------------------------------
    def frozen_modules(self) -> List[nn.Module]:
        """Modules (and parameters wrapped in modules) frozen by ``frozen_stages``."""
        raise NotImplementedError

    def frozen_parameters(self) -> List[nn.Parameter]:
        """Loose parameters (e.g. position embeddings) frozen with stage 0."""
        return []

    def _freeze_stages(self) -> None:
        for module in self.frozen_modules():
            module.eval()
            for param in module.parameters():
                param.requires_grad = False
        if self.frozen_stages >= 0:
            for param in self.frozen_parameters():
                param.requires_grad = False

    def train(self, mode: bool = True) -> 'BaseBackbone':
        super().train(mode)
        self.prepare_checkpointing()
        self._freeze_stages()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, _BatchNorm):
                    module.eval()
        return self

    # ---- weights -----------------------------------------------------------------------------
    def init_weights(self) -> None:
        """``init_cfg=dict(type='Pretrained', checkpoint=PATH or URL[, prefix=...][,
        strict=False])`` loads a checkpoint of any known layout (auto-detected and converted);
        ``strict=False`` allows one that leaves tensors unloaded. Other init types go to
        mmengine."""
        cfgs = self.init_cfg if isinstance(self.init_cfg, list) else [self.init_cfg]
        if self.init_cfg is not None and not all(isinstance(c, dict) for c in cfgs):
            raise TypeError(f'{type(self).__name__}: init_cfg must be a dict or a list of dicts, '
                            f'got {self.init_cfg!r}')
        pretrained = [c for c in cfgs if isinstance(c, dict) and c.get('type') == 'Pretrained']
        others = [c for c in cfgs if c is not None and c not in pretrained]
        if others:
            saved, self.init_cfg = self.init_cfg, others
            super().init_weights()
            self.init_cfg = saved
        for cfg in pretrained:
            if 'checkpoint' not in cfg:
                raise ValueError(f'{type(self).__name__}: init_cfg of type Pretrained needs '
                                 f'checkpoint=PATH, got {cfg}')
            load_pretrained(self, cfg['checkpoint'], prefix=cfg.get('prefix'),
                            map_location=cfg.get('map_location', 'cpu'),
                            strict=cfg.get('strict', True))
        self._is_init = True

    def instance_layout(self, state_dict: StateDict) -> Optional[Tuple[StateDict, str]]:
        """A checkpoint in a layout only this instance can place (a wrapped library's model,
        whose keys depend on how it was built), in our keys with the layout's name; ``None``:
        detect among the registered layouts."""
        return None

    def _convert_on_load(self, state_dict: StateDict, prefix: str, local_metadata: dict,
                         strict: bool, missing_keys: List[str], unexpected_keys: List[str],
                         error_msgs: List[str]) -> None:
        """Load-state-dict pre-hook: the keys under ``prefix`` (ours, or of any known layout,
        e.g. ``backbone.*`` of a whole mmdet detector) are converted, adapted and checked in
        place, so every load path gets the same conversion and the same errors."""
        keys = [k for k in state_dict if k.startswith(prefix)]
        if not keys:
            return
        given = {k[len(prefix):]: state_dict.pop(k) for k in keys}
        if not prefix:  # loaded straight into the backbone: a whole detector's backbone.* keys
            given = unwrap_state_dict(given, source=current_source())
        converted, self.load_report = prepare_state_dict(self, given)
        state_dict.update((prefix + k, v) for k, v in converted.items())
        print_log(f'{type(self).__name__} ({prefix or "model"}): {current_source()}\n'
                  f'{self.load_report.summary()}', logger='current')

    # ---- analysis ------------------------------------------------------------------------------
    analysis_settings: Dict[str, Any] = {}
    # (key pattern, the argument that builds its place): named by the unexpected-key error
    build_hints: Tuple[Tuple[str, str], ...] = ()
    """Constructor arguments under which attention analysis tools build the family (e.g. global
    attention for the plain ViTs, as pretrained)."""

    def attention_blocks(self) -> List[AttentionBlock]:
        """Every built trunk block in depth order, for attention analysis."""
        raise NotImplementedError(f'{type(self).__name__} defines no attention_blocks(), which '
                                  f'the attention analysis tools need')

    # ---- layer-wise lr decay -----------------------------------------------------------------
    def layer_depth_groups(self) -> List[Tuple[str, ...]]:
        """Parameter-name prefixes (module or parameter names, no trailing dot) of every layer
        id from 0 (the embeddings) upwards; names in no group (output norms, the pyramid) take
        the top id. Families return this as data; :meth:`get_layer_depth` resolves it."""
        raise NotImplementedError(f'{type(self).__name__} defines no layer_depth_groups(), which '
                                  f'get_layer_depth (layer-wise lr decay) needs')

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """``(layer_id, num_layers)`` of a parameter, mmpretrain's convention: 0 the embeddings,
        then the built blocks bottom-up, ``num_layers - 1`` everything else (output norms, the
        pyramid, and any name outside ``prefix``: the neck and heads of a whole model).
        ``num_layers`` counts the blocks this instance builds (+2)."""
        groups = self.layer_depth_groups()
        num_layers = len(groups) + 1
        if not param_name.startswith(prefix):
            return num_layers - 1, num_layers
        name = param_name[len(prefix):]
        for layer_id, names in enumerate(groups):
            if any(name == p or name.startswith(p + '.') for p in names):
                return layer_id, num_layers
        return num_layers - 1, num_layers

    def unbuilt_prefixes(self) -> Tuple[str, ...]:
        """Key prefixes of the full architecture's parts that this instance does not build
        (levels after the last of ``out_indices``, output norms it does not use...)."""
        return ()

    def unused_checkpoint_keys(self, keys: Sequence[str]) -> List[str]:
        """Checkpoint keys this instance drops by design (see :meth:`unbuilt_prefixes`):
        reported as expected, never as an error."""
        prefixes = self.unbuilt_prefixes()
        return [k for k in keys if prefixes and k.startswith(prefixes)]

    def unexpected_key_problem(self, key: str) -> Optional[str]:
        """Why a checkpoint tensor this instance has no place for matters: ``None`` for a
        classifier or pretraining head's (:data:`HEAD_KEYS`); otherwise the tensor with the
        argument that would build its place (the family's ``build_hints``: pattern -> argument),
        or with no argument where the family names none."""
        if HEAD_KEYS.match(key):
            return None
        hint = next((arg for pattern, arg in self.build_hints if re.search(pattern, key)), None)
        return f'{key}: build with {hint}' if hint else f'{key}: no part of this arch holds it (deeper or other parts?)'

    def peer_drop(self, key: str) -> Optional[str]:
        """Where the peer scope's own default leaves ``key``'s part out (the peer drops it from
        its own weights too): which default; else ``None``."""
        return None

    def adapt_state_dict(self, state_dict: StateDict) -> Tuple[StateDict, List[str]]:
        """Resize relative-position tables whose window differs from ours (square windows).
        Subclasses extend this for position embeddings. Returns the dict and the resized keys."""
        own = self.state_dict()
        resized = []
        state_dict = dict(state_dict)
        for key, value in state_dict.items():
            if key.endswith('relative_position_bias_table') and key in own \
                    and value.shape != own[key].shape and value.shape[1] == own[key].shape[1]:
                src = (int(math.isqrt(value.shape[0])) + 1) // 2
                dst = (int(math.isqrt(own[key].shape[0])) + 1) // 2
                state_dict[key] = resize_rel_pos_table(value, (src, src), (dst, dst))
                resized.append(key)
        return state_dict, resized
