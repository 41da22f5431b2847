"""The mechanism that maps a peer's constructor vocabulary (mmdet / mmseg / mmpretrain) onto ours.

A config written for a peer's ``SwinTransformer``, ``PyramidVisionTransformerV2`` or
``VisionTransformer`` builds our backbone after changing only ``type``. Each family states its
peer names as data, a :class:`Vocabulary` class attribute in its own file; its constructor hands
the keyword arguments that are not its own to :func:`translate`, which maps them and returns our
arguments. Nothing is silently ignored: a value we cannot honour raises one :class:`ConfigError`
naming the argument, the value and what we support; a name no peer uses raises ``TypeError`` as
Python would.

Where the peers give one name different meanings (Swin's ``frozen_stages`` count, default
``out_indices``...), the meaning follows :func:`resolve_peer` (docs/peer_semantics.md): the
``peer`` argument, else the default scope the config runs in; never which names appear.
"""
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Mapping, Optional, Sequence,
                    Tuple)

from ..errors import ConfigError

if TYPE_CHECKING:
    from .base import BaseBackbone

# a check returns None when the value is one we honour, else a phrase saying what we support
Check = Callable[[Any, Dict[str, Any]], Optional[str]]
# explicit peer arch values (our arch keys) and the resolved preset -> the values to use
ArchHook = Callable[[Dict[str, Any], Dict[str, Any]], Dict[str, Any]]

PEERS = ('mmdet', 'mmseg', 'mmpretrain')  # default scopes whose semantics a family may follow
OURS = 'mmvit_ext'


def cfg_check(types: Sequence[str], defaults: Optional[Dict[str, Any]] = None,
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


def equals(expected: Any, what: str) -> Check:
    """The one value we implement; ``what`` says it in the error."""
    def check(value: Any, args: Dict[str, Any]) -> Optional[str]:
        return None if value == expected else what
    return check


def is_bool(value: Any, args: Dict[str, Any]) -> Optional[str]:
    """``convert_weights``: official / peer layouts are detected and converted on every load."""
    return None if isinstance(value, bool) else 'True or False (layouts are auto-detected)'


def seq_equals(build: Callable[[Dict[str, Any]], Tuple[int, ...]], what: str) -> Check:
    """A sequence equal to ``build(args)`` (a shorter prefix is refused too)."""
    def check(value: Any, args: Dict[str, Any]) -> Optional[str]:
        expected = build(args)
        got = tuple(value) if isinstance(value, Sequence) else (value,)
        return None if got == expected[:len(got)] and len(got) == len(expected) else \
            f'{expected} ({what})'
    return check


def pair_check(value: Any, args: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """An image size: an int or an (H, W) pair."""
    if isinstance(value, int) or (isinstance(value, Sequence) and len(value) in (1, 2)
                                  and all(isinstance(v, int) for v in value)):
        return None
    return 'an int or an (H, W) pair'


GELU = cfg_check(['GELU'])
LN_EPS = dict(eps=1e-5)  # nn.LayerNorm's default, as the peers build LN


@dataclass(frozen=True)
class Vocabulary:
    """One family's peer names.

    Args:
        renames: peer name -> our constructor argument of the same meaning.
        arch_args: peer name -> key of our ``arch`` dict (``embed_dims``, ``depths`` ...).
        checks: peer names we implement one way only -> check of the value; accepted values
            change nothing (they restate what we do) unless the check sets an argument.
        adapt_arch: peer arch values whose meaning differs from our arch keys, rewritten
            (e.g. mmdet PVT's ``embed_dims`` is a base width, times ``num_heads`` per stage).
    """

    renames: Mapping[str, str] = field(default_factory=dict)
    arch_args: Mapping[str, str] = field(default_factory=dict)
    checks: Mapping[str, Check] = field(default_factory=dict)
    adapt_arch: Optional[ArchHook] = None

    @property
    def names(self) -> FrozenSet[str]:
        return frozenset(self.renames) | frozenset(self.arch_args) | frozenset(self.checks) \
            | frozenset({'pretrained'})


def to_pair(name: str, owner: str, value: Any) -> Tuple[int, int]:
    """``224``, ``(224,)`` or ``(224, 224)`` -> (H, W); a value of another type is a
    ``TypeError`` (as the peers raise), a sequence of another length a :class:`ConfigError`."""
    if not isinstance(value, (int, Sequence)) or isinstance(value, (bool, str)):
        raise TypeError(f'{owner}: {name} must be an int or an (H, W) pair, got {value!r}')
    if pair_check(value) is not None:
        raise ConfigError(f'{owner}: {name}={value!r} is not supported; use an int or an (H, W) '
                          f'pair')
    if isinstance(value, int):
        return value, value
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


def resolve_peer(owner: str, peer: Optional[str]) -> str:
    """Whose semantics apply where the peers disagree: ``peer`` when given, else the name of
    the mmengine default scope active at build time (the config's ``default_scope``, or the
    ``_scope_`` of a peer's base config) when it is one of :data:`PEERS`, else ours."""
    if peer is None:
        from mmengine.registry import DefaultScope
        scope = DefaultScope.get_current_instance()
        name = scope.scope_name if scope is not None else None
        return name if name in PEERS else OURS
    if peer not in PEERS + (OURS,):
        raise ConfigError(f'{owner}: peer={peer!r} is not supported; use one of '
                          f'{PEERS + (OURS,)} or None (the default scope decides)')
    return peer


def pretrained_to_init_cfg(owner: str, pretrained: Any, init_cfg: Any) -> Any:
    """The peers' ``pretrained=PATH`` as ``init_cfg=dict(type='Pretrained', checkpoint=PATH)``."""
    if pretrained is None:
        return init_cfg
    if init_cfg is not None:  # checked first, as the peers assert it first
        raise ConfigError(f'{owner}: pretrained={pretrained!r} and init_cfg={init_cfg!r} both '
                          f'given; use only init_cfg=dict(type=\'Pretrained\', checkpoint=...)')
    if not isinstance(pretrained, str):
        raise TypeError(f'{owner}: pretrained must be a checkpoint path/URL (str) or None, got '
                        f'{pretrained!r}')
    return dict(type='Pretrained', checkpoint=pretrained)


def normalise_init_cfg(init_cfg: Any) -> Any:
    """``dict(checkpoint=PATH)`` without ``type`` (mmdet's PVT configs) means ``Pretrained``."""
    if isinstance(init_cfg, (list, tuple)):
        return [normalise_init_cfg(cfg) for cfg in init_cfg]
    if isinstance(init_cfg, Mapping) and 'type' not in init_cfg and 'checkpoint' in init_cfg:
        return dict(init_cfg, type='Pretrained')
    return init_cfg


def _as_tuples(values: Dict[str, Any]) -> Dict[str, Any]:
    return {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in values.items()}


def translate(cls: 'type[BaseBackbone]', args: Dict[str, Any], peer_args: Mapping[str, Any]
              ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Map ``peer_args`` onto our constructor ``args`` (edited copy) of family ``cls`` and
    resolve ``arch`` and ``peer``.

    ``args['arch'] is None`` means ``cls.default_arch``; explicit dims (``embed_dims``,
    ``depths`` ...) then override it, as the peers' defaults do. With an explicit ``arch`` they
    must agree. Returns ``(args, arch_settings)``; ``args['peer']`` is resolved.
    """
    owner, vocab = cls.__name__, cls.vocabulary
    unknown = sorted(set(peer_args) - vocab.names)
    if unknown:
        raise TypeError(f'{owner}.__init__() got an unexpected keyword argument {unknown[0]!r}; '
                        f'peer (mmdet / mmseg / mmpretrain) names we accept: '
                        f'{sorted(vocab.names)}')
    args = dict(args)
    args['peer'] = resolve_peer(owner, args.get('peer'))
    args['init_cfg'] = normalise_init_cfg(
        pretrained_to_init_cfg(owner, peer_args.get('pretrained'), args.get('init_cfg')))
    for peer, ours in vocab.renames.items():
        if peer in peer_args:
            args[ours] = peer_args[peer]
    explicit = {vocab.arch_args[k]: v for k, v in peer_args.items() if k in vocab.arch_args}
    settings = cls.resolve_arch(cls.default_arch if args['arch'] is None else args['arch'])
    if vocab.adapt_arch is not None:
        explicit = vocab.adapt_arch(explicit, settings)
    explicit = _as_tuples(explicit)
    if args['arch'] is not None:
        preset = _as_tuples(settings)
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
    return args, settings


__all__ = ['Vocabulary', 'ConfigError', 'Check', 'PEERS', 'OURS', 'translate', 'resolve_peer',
           'to_pair', 'pair_check', 'cfg_check', 'equals', 'is_bool', 'seq_equals', 'GELU',
           'LN_EPS', 'pretrained_to_init_cfg', 'normalise_init_cfg']
