"""The peers' constructor vocabularies (mmdet / mmseg / mmpretrain) mapped onto ours, in one place.

A config written for a peer's ``SwinTransformer``, ``PyramidVisionTransformerV2`` or
``VisionTransformer`` builds our backbone after changing only ``type``. Each backbone hands the
keyword arguments that are not its own to :func:`translate`, which reads the family's
:class:`Vocabulary` (data: peer name -> our argument, peer name -> arch key, the values we
implement one way only) and returns our arguments. Nothing is silently ignored: a value we cannot
honour raises one :class:`ConfigError` naming the argument, the value and what we support; a name
no peer uses raises ``TypeError`` as Python would.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional, Sequence, Tuple

# a check returns None when the value is one we honour, else a phrase saying what we support
Check = Callable[[Any, Dict[str, Any]], Optional[str]]


class ConfigError(ValueError, AssertionError):
    """A constructor argument we cannot honour. Also an ``AssertionError``: the peers assert on
    the same mistakes, so code written against them keeps catching it."""


def _cfg_check(types: Sequence[str], defaults: Optional[Dict[str, Any]] = None,
               **fixed: Any) -> Check:
    """``act_cfg`` / ``norm_cfg``: a dict whose ``type`` is one of ``types`` (case-insensitive)
    and whose other keys, missing ones taking the layer's ``defaults``, equal ``fixed``."""
    wanted = f'dict(type={types[0]!r}' + ''.join(f', {k}={v!r}' for k, v in fixed.items()) + ')'

    def check(value: Any, args: Dict[str, Any]) -> Optional[str]:
        if not isinstance(value, Mapping) or str(value.get('type', '')).lower() not in \
                {t.lower() for t in types}:
            return f'only {wanted}'
        got = {**(defaults or {}), **{k: v for k, v in value.items()
                                      if k not in ('type', 'requires_grad')}}
        return None if got == fixed and value.get('requires_grad', True) is True \
            else f'only {wanted}'
    return check


def _equals(expected: Any, what: str) -> Check:
    def check(value: Any, args: Dict[str, Any]) -> Optional[str]:
        return None if value == expected else what
    return check


def _is_bool(value: Any, args: Dict[str, Any]) -> Optional[str]:
    # convert_weights: official / peer layouts are detected and converted on every load
    return None if isinstance(value, bool) else 'True or False (layouts are auto-detected)'


def _seq_equals(build: Callable[[Dict[str, Any]], Tuple[int, ...]], what: str) -> Check:
    def check(value: Any, args: Dict[str, Any]) -> Optional[str]:
        expected = build(args)
        got = tuple(value) if isinstance(value, Sequence) else (value,)
        return None if got == expected[:len(got)] and len(got) == len(expected) else \
            f'{expected} ({what})'
    return check


def _swin_stage_cfgs(value: Any, args: Dict[str, Any]) -> Optional[str]:
    """mmpretrain ``stage_cfgs``: only ``block_cfgs=dict(window_size=...)``, the same for all
    stages (it becomes ``window_size``)."""
    stages = value if isinstance(value, Sequence) else [value]
    windows = set()
    for stage in stages:
        blocks = dict(stage or {}).pop('block_cfgs', {}) or {}
        if set(dict(stage or {})) - {'block_cfgs'} or set(blocks) - {'window_size'}:
            return 'only stage_cfgs=dict(block_cfgs=dict(window_size=N)), the same for every stage'
        windows.add(blocks.get('window_size', args['window_size']))
    if len(windows) > 1:
        return 'one window_size for every stage'
    args['window_size'] = windows.pop()
    return None


def _swin_patch_cfg(value: Any, args: Dict[str, Any]) -> Optional[str]:
    """mmpretrain ``patch_cfg``: accepted when it restates our non-overlapping patch embedding."""
    allowed = dict(kernel_size=args['patch_size'], stride=args['patch_size'], padding=0,
                   conv_type='Conv2d', norm_cfg=dict(type='LN'), input_size=args['pretrain_img_size'],
                   in_channels=args.get('in_channels', 3))
    bad = {k: v for k, v in dict(value or {}).items() if allowed.get(k, object()) != v}
    return f'only keys restating the patch embedding {allowed}' if bad else None


def _swin_strides(args: Dict[str, Any]) -> Tuple[int, ...]:
    return (args['patch_size'],) + (2,) * (len(args['_arch']['depths']) - 1)


@dataclass(frozen=True)
class Vocabulary:
    """One family's peer names.

    Args:
        renames: peer name -> our constructor argument of the same meaning.
        arch_args: peer name -> key of our ``arch`` dict (``embed_dims``, ``depths`` ...).
        checks: peer names we implement one way only -> check of the value; accepted values
            change nothing (they restate what we do) unless the check sets an argument.
        dialects: dialect -> names only that peer uses (mmpretrain's Swin counts
            ``frozen_stages`` differently and returns only the last stage by default).
    """

    renames: Mapping[str, str] = field(default_factory=dict)
    arch_args: Mapping[str, str] = field(default_factory=dict)
    checks: Mapping[str, Check] = field(default_factory=dict)
    dialects: Mapping[str, FrozenSet[str]] = field(default_factory=dict)

    @property
    def names(self) -> FrozenSet[str]:
        return frozenset(self.renames) | frozenset(self.arch_args) | frozenset(self.checks) \
            | frozenset({'pretrained'})


GELU = _cfg_check(['GELU'])
LN_EPS = dict(eps=1e-5)  # nn.LayerNorm's default, as the peers build LN
VOCABULARIES: Dict[str, Vocabulary] = {
    # mmdet / mmseg SwinTransformer, mmpretrain SwinTransformer
    'swin': Vocabulary(
        renames={'img_size': 'pretrain_img_size'},
        arch_args={'embed_dims': 'embed_dims', 'depths': 'depths', 'num_heads': 'num_heads'},
        checks={
            'strides': _seq_equals(_swin_strides, 'patch embedding stride = patch_size, then '
                                                  '2x2 merging'),
            'act_cfg': GELU,
            'norm_cfg': _cfg_check(['LN'], LN_EPS, eps=1e-5),
            'convert_weights': _is_bool,
            'interpolate_mode': _equals('bicubic', "'bicubic'"),
            'out_after_downsample': _equals(False, 'False (maps are taken before merging)'),
            'stage_cfgs': _swin_stage_cfgs,
            'patch_cfg': _swin_patch_cfg,
        },
        # mmpretrain first: its names win where a config mixes them
        dialects={'mmpretrain': frozenset({'img_size', 'stage_cfgs', 'patch_cfg', 'out_after_downsample',
                                           'interpolate_mode'}),
                  'mmdet': frozenset({'embed_dims', 'depths', 'num_heads', 'strides',
                                      'convert_weights', 'act_cfg', 'pretrained'})}),
    # mmdet PyramidVisionTransformerV2 (its PVT v1 options only with their v2 values)
    'pvtv2': Vocabulary(
        arch_args={'embed_dims': 'embed_dims', 'num_layers': 'depths', 'num_heads': 'num_heads',
                   'mlp_ratios': 'mlp_ratios', 'sr_ratios': 'sr_ratios'},
        checks={
            'pretrain_img_size': lambda v, a: _pair_check(v),  # only sizes a pos-embed (none)
            'num_stages': lambda v, a: None if v == len(a['_arch']['depths']) else
            f"len(num_layers) = {len(a['_arch']['depths'])}",
            'patch_sizes': _seq_equals(lambda a: (7, 3, 3, 3), 'PVTv2 overlapping embedding'),
            'strides': _seq_equals(lambda a: (4, 2, 2, 2), 'PVTv2 overlapping embedding'),
            'paddings': _seq_equals(lambda a: (3, 1, 1, 1), 'PVTv2 overlapping embedding'),
            'use_abs_pos_embed': _equals(False, 'False (PVTv2 has no absolute position '
                                                'embedding)'),
            'norm_after_stage': _equals(True, 'True (PVTv2 normalises after every stage)'),
            'use_conv_ffn': _equals(True, 'True (PVTv2 conv FFN)'),
            'act_cfg': GELU,
            'norm_cfg': _cfg_check(['LN'], LN_EPS, eps=1e-6),
            'convert_weights': _is_bool,
        }),
}

# mmseg VisionTransformer names for the plain-ViT families (DeepViT, CaiT, Refined-ViT)
_MMSEG_VIT_ARCH = {'embed_dims': 'embed_dims', 'num_layers': 'depth', 'num_heads': 'num_heads',
                   'mlp_ratio': 'mlp_ratio'}
_MMSEG_VIT_CHECKS: Dict[str, Check] = {
    'patch_size': _equals(16, '16 (the pretrained patch size)'),
    'qkv_bias': _equals(True, 'True'),
    'with_cls_token': lambda v, a: None if isinstance(v, bool) else 'True or False',
    'output_cls_token': _equals(False, "False (out_type='cls_token' returns the class token)"),
    'final_norm': lambda v, a: None if isinstance(v, bool) else 'True or False',
    'act_cfg': GELU,
    'norm_cfg': _cfg_check(['LN'], LN_EPS, eps=1e-6),
    'patch_norm': _equals(False, 'False'),
    'patch_bias': _equals(True, 'True (the official patch embedding has a bias)'),
    'patch_pad': _equals('corner', "'corner' (bottom / right zero padding)"),
    'pre_norm': _equals(False, 'False'),
    'num_fcs': _equals(2, '2'),
    'out_origin': _equals(False, 'False'),
    'interpolate_mode': _equals('bicubic', "'bicubic'"),
    'frozen_exclude': _equals(['all'], "['all'] (freeze with frozen_stages)"),
}
# with any of these names, mmseg's defaults apply (see PlainViTBase)
_MMSEG_VIT = Vocabulary(arch_args=_MMSEG_VIT_ARCH, checks=_MMSEG_VIT_CHECKS,
                        dialects={'mmseg': frozenset(_MMSEG_VIT_ARCH) | frozenset(_MMSEG_VIT_CHECKS)})
VOCABULARIES.update(deepvit=_MMSEG_VIT, cait=_MMSEG_VIT, refiner=_MMSEG_VIT)


def _pair_check(value: Any) -> Optional[str]:
    if isinstance(value, int) or (isinstance(value, Sequence) and len(value) in (1, 2)
                                  and all(isinstance(v, int) for v in value)):
        return None
    return 'an int or an (H, W) pair'


def to_pair(name: str, owner: str, value: Any) -> Tuple[int, int]:
    """``224``, ``(224,)`` or ``(224, 224)`` -> (H, W); anything else is a :class:`ConfigError`."""
    if _pair_check(value) is not None:
        raise ConfigError(f'{owner}: {name}={value!r} is not supported; use an int or an (H, W) '
                          f'pair')
    if isinstance(value, int):
        return value, value
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


def pretrained_to_init_cfg(owner: str, pretrained: Any, init_cfg: Any) -> Any:
    """The peers' ``pretrained=PATH`` as ``init_cfg=dict(type='Pretrained', checkpoint=PATH)``."""
    if pretrained is None:
        return init_cfg
    if not isinstance(pretrained, str):
        raise TypeError(f'{owner}: pretrained must be a checkpoint path/URL (str) or None, got '
                        f'{pretrained!r}')
    if init_cfg is not None:
        raise ConfigError(f'{owner}: pretrained={pretrained!r} and init_cfg={init_cfg!r} both '
                          f'given; use only init_cfg=dict(type=\'Pretrained\', checkpoint=...)')
    return dict(type='Pretrained', checkpoint=pretrained)


def normalise_init_cfg(init_cfg: Any) -> Any:
    """``dict(checkpoint=PATH)`` without ``type`` (mmdet's PVT configs) means ``Pretrained``."""
    if isinstance(init_cfg, (list, tuple)):
        return [normalise_init_cfg(cfg) for cfg in init_cfg]
    if isinstance(init_cfg, Mapping) and 'type' not in init_cfg and 'checkpoint' in init_cfg:
        return dict(init_cfg, type='Pretrained')
    return init_cfg


def detect_dialect(vocab: Vocabulary, owner: str, peer_args: Mapping[str, Any]) -> Optional[str]:
    """The peer whose own names appear in ``peer_args`` (``None``: ours / mmdet / mmseg)."""
    found = [d for d, names in vocab.dialects.items() if names & set(peer_args)]
    return found[0] if found else None


def translate(owner: str, family: str, args: Dict[str, Any], peer_args: Mapping[str, Any],
              arch_zoo_default: str, resolve_arch: Callable[[Any], Dict[str, Any]]
              ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Map ``peer_args`` onto our constructor ``args`` (edited copy) and resolve ``arch``.

    ``args['arch'] is None`` means the family default; explicit dims (``embed_dims``, ``depths``
    ...) then override it, as the peers' defaults do. With an explicit ``arch`` they must agree.
    Returns ``(args, arch_settings)``.
    """
    vocab = VOCABULARIES.get(family, Vocabulary())
    unknown = sorted(set(peer_args) - vocab.names)
    if unknown:
        raise TypeError(f'{owner}.__init__() got an unexpected keyword argument {unknown[0]!r}; '
                        f'peer (mmdet / mmseg / mmpretrain) names we accept: '
                        f'{sorted(vocab.names)}')
    args = dict(args)
    args['init_cfg'] = normalise_init_cfg(
        pretrained_to_init_cfg(owner, peer_args.get('pretrained'), args.get('init_cfg')))
    for peer, ours in vocab.renames.items():
        if peer in peer_args:
            args[ours] = peer_args[peer]
    explicit = {vocab.arch_args[k]: v for k, v in peer_args.items() if k in vocab.arch_args}
    settings = resolve_arch(arch_zoo_default if args['arch'] is None else args['arch'])
    if family == 'pvtv2' and 'embed_dims' in explicit and isinstance(explicit['embed_dims'], int):
        heads = explicit.get('num_heads', settings['num_heads'])  # mmdet: dims = base x heads
        explicit['embed_dims'] = tuple(explicit['embed_dims'] * h for h in heads)
    explicit = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in explicit.items()}
    if args['arch'] is not None:
        preset = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in settings.items()}
        clash = {k: v for k, v in explicit.items() if preset.get(k) != v}
        if clash:
            k = sorted(clash)[0]
            raise ConfigError(f'{owner}: arch={args["arch"]!r} has {k}={preset.get(k)!r} but '
                              f'{k}={clash[k]!r} was also given; drop one of them or make them '
                              f'agree')
    settings.update(explicit)
    args['_arch'] = settings
    for name, check in vocab.checks.items():
        if name in peer_args:
            problem = check(peer_args[name], args)
            if problem is not None:
                raise ConfigError(f'{owner}: {name}={peer_args[name]!r} is not supported; we '
                                  f'support {problem}')
    args['_dialect'] = detect_dialect(vocab, owner, peer_args)
    return args, settings
