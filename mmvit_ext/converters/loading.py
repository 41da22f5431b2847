"""Loading weights into our backbones on every path: ``init_cfg``, ``load_from``, ``--resume``,
tools/test.py and a plain ``model.load_state_dict``.

Every backbone registers :func:`prepare_state_dict` as a load-state-dict pre-hook (see
``BaseBackbone``): the keys under its prefix are converted from whichever layout they are in,
adapted (tables / embeddings resized) and checked. A checkpoint that leaves backbone tensors
unloaded or does not fit raises, unless partial loading is allowed (``init_cfg=dict(...,
strict=False)`` or ``mmvit_ext.flags.strict_loading(False)``); misses that are expected (output norms a classifier
never had) keep their initialisation. A checkpoint tensor the model has no place for is an error
that names the argument building its place, unless it is a classifier / pretraining head's, or
the peer scope's own default leaves that part out (the peer drops it too: logged).
"""
import contextvars
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Tuple

from mmengine.logging import print_log
from torch import nn

from .. import flags

from .io import CheckpointError, PathLike, read_checkpoint, unwrap_state_dict
from .layouts import INIT_ONLY, Layout, StateDict, detect_layout, detect_layouts

_SOURCE = contextvars.ContextVar('mmvit_ext_load_source', default='state dict')
_SHOWN = 8  # keys named in messages


@contextmanager
def loading_source(source: str) -> Iterator[None]:
    """Within the block, messages of the backbones' load pre-hooks name ``source``."""
    token = _SOURCE.set(source)
    try:
        yield
    finally:
        _SOURCE.reset(token)


def current_source() -> str:
    """The checkpoint being loaded, as named by :func:`load_pretrained` (or 'state dict')."""
    return _SOURCE.get()


@dataclass
class LoadReport:
    """What happened to every key: for logs, tests and the conversion tool."""
    layout: str
    loaded: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)           # kept at their initialisation
    expected_missing: List[str] = field(default_factory=list)  # the part of ``missing`` by design
    unexpected: List[str] = field(default_factory=list)        # ignored
    dropped: List[str] = field(default_factory=list)           # unbuilt parts, buffers
    resized: List[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f'layout: {self.layout}; loaded {len(self.loaded)} tensors']
        unplanned = [k for k in self.missing if k not in self.expected_missing]
        for name, keys in (('resized', self.resized), ('dropped (unbuilt parts, buffers)',
                                                       self.dropped),
                           ('kept initialised (expected: not in this layout)',
                            self.expected_missing),
                           ('missing, kept initialised', unplanned),
                           ('unexpected, ignored', self.unexpected)):
            if keys:
                lines.append(f'{name} ({len(keys)}): {", ".join(keys)}')
        return '\n'.join(lines)


def _model_layout(model: nn.Module, state_dict: StateDict) -> Optional[Layout]:
    """The first layout of the model's family that matches; a family built on another's trunk
    (ViT-Adapter: ``layout_families``) tries that family's layouts next."""
    families = getattr(model, 'layout_families', (getattr(model, 'family', None),))
    return next((lay for lay in (detect_layout(state_dict, f) for f in families) if lay), None)


def _init_only(model: nn.Module, state_dict: StateDict) -> Optional['re.Pattern']:
    """Keys the model may keep initialised: per (model family, layout family) where registered
    (:func:`register_init_only`), else per model family."""
    family = getattr(model, 'family', None)
    layout = _model_layout(model, state_dict)
    if layout is not None and f'{family}<-{layout.family}' in INIT_ONLY:
        return INIT_ONLY[f'{family}<-{layout.family}']
    return INIT_ONLY.get(family)


def convert_for_model(model: nn.Module, state_dict: StateDict, source: str = 'checkpoint'
                      ) -> Tuple[StateDict, str]:
    """Detect the layout, check it belongs to the model's family, convert to our key names.
    A model whose own layout depends on the instance (a wrapped library model) maps it first
    (``instance_layout``)."""
    instance_layout = getattr(model, 'instance_layout', None)
    mapped = instance_layout(state_dict) if instance_layout is not None else None
    if mapped is not None:
        return mapped
    family = getattr(model, 'family', None)
    families = getattr(model, 'layout_families', (family,))
    layout = _model_layout(model, state_dict)
    if layout is None:
        foreign = [lay for lay in detect_layouts(state_dict) if lay.family not in families]
        if foreign:
            raise CheckpointError(
                f'{source} looks like an {foreign[0].name} checkpoint, which belongs to the '
                f'{foreign[0].family!r} family; {type(model).__name__} loads {family!r} '
                f'checkpoints')
        return dict(state_dict), 'not recognised'
    if layout.convert is None:
        raise CheckpointError(f'{source} is in the {layout.name} layout, which '
                              f'{type(model).__name__} has no converter for')
    return layout.convert(state_dict), layout.name


def _first(keys: List[str]) -> str:
    more = f', ... ({len(keys) - _SHOWN} more)' if len(keys) > _SHOWN else ''
    return ', '.join(keys[:_SHOWN]) + more


def _drop_by_design(model: nn.Module, state_dict: StateDict, own: StateDict,
                    report: LoadReport) -> StateDict:
    """Remove keys of parts this instance does not build and of non-persistent buffers."""
    non_persistent = {key for key, _ in model.named_buffers()} - set(own)
    unused = getattr(model, 'unused_checkpoint_keys', None)
    unused = set(unused(list(state_dict))) if unused is not None else set()
    report.dropped = sorted(k for k in state_dict if k in non_persistent or k in unused)
    return {k: v for k, v in state_dict.items() if k not in non_persistent and k not in unused}


def _fit_problem(source: str, name: str, layout: str, own: StateDict, state_dict: StateDict,
                 mismatched: List[str], unplanned: List[str]) -> str:
    """One message with the counts and the first keys of what does not fit."""
    if mismatched:
        message = (f'{source} does not fit {name} ({len(mismatched)} shape mismatches; wrong '
                   f'arch?): ' + '; '.join(mismatched[:10]))
        if unplanned:
            message += f'; and {len(unplanned)} tensors are not in it: {_first(unplanned)}'
    else:
        message = (f'{source} leaves {len(unplanned)} of {len(own)} {name} tensors unloaded '
                   f'(another depth, width or layout?): {_first(unplanned)}')
    return message + (f' [layout: {layout}; {len(set(state_dict) & set(own))} tensors matched, '
                      f'{len(set(state_dict) - set(own))} unexpected]')


def _check_unexpected(model: nn.Module, source: str, name: str, unexpected: List[str],
                      strict: bool) -> None:
    """Checkpoint tensors the model has no place for: a head's are logged; where the peer
    scope's own default leaves the part out, the peer drops them too: logged, with that default;
    any other (a trunk tensor) raises when ``strict``, naming it and the argument that would
    hold it."""
    problem = getattr(model, 'unexpected_key_problem', lambda key: None)
    peer_drop = getattr(model, 'peer_drop', lambda key: None)
    drops = {k: peer_drop(k) for k in unexpected}
    trunk = [why for why in (problem(k) for k in unexpected if not drops[k]) if why]
    if trunk and strict:
        raise CheckpointError(
            f'{source} holds {len(trunk)} tensors {name} has no place for: '
            f'{"; ".join(trunk[:_SHOWN])}{" ..." if len(trunk) > _SHOWN else ""}. To drop them '
            "anyway, pass strict=False in the init_cfg (type='Pretrained') or load inside "
            'mmvit_ext.flags.strict_loading(False)')
    peer = sorted(k for k, why in drops.items() if why)
    if peer:
        print_log(f'{source}: {len(peer)} keys dropped, as {drops[peer[0]]}: {_first(peer)}',
                  logger='current', level=logging.WARNING)
    rest = sorted(set(unexpected) - set(peer))
    if rest:
        print_log(f'{source}: {len(rest)} keys unexpected by {name}, ignored: {_first(rest)}',
                  logger='current', level=logging.WARNING)


def prepare_state_dict(model: nn.Module, state_dict: StateDict, source: Optional[str] = None,
                       strict: Optional[bool] = None) -> Tuple[StateDict, LoadReport]:
    """Convert, adapt and check ``state_dict`` (keys relative to ``model``) for loading.

    Returns the dict to load (every key of the model present: expected misses filled with the
    model's current values, so ``load_state_dict(strict=True)`` passes) and the report. Raises
    :class:`CheckpointError` for a foreign or unknown layout, and, when ``strict`` (default: the
    ``mmvit_ext.flags.strict_loading`` setting), for shape mismatches or unexpectedly missing tensors.
    """
    source = source or _SOURCE.get()
    strict = flags.strict_loading.get() if strict is None else strict
    name = type(model).__name__
    init_only = _init_only(model, state_dict)
    state_dict, layout = convert_for_model(model, state_dict, source)
    report = LoadReport(layout=layout)
    adapt = getattr(model, 'adapt_state_dict', None)
    if adapt is not None:
        state_dict, report.resized = adapt(state_dict)
    own = model.state_dict()
    state_dict = _drop_by_design(model, state_dict, own, report)
    if not set(state_dict) & set(own):
        raise CheckpointError(
            f'{source} shares no key with {name} (layout not recognised); it has keys like '
            f'{sorted(state_dict)[:5]}, the model expects keys like {sorted(own)[:5]}')
    mismatched_keys = [k for k, v in state_dict.items() if k in own and v.shape != own[k].shape]
    report.missing = sorted(set(own) - set(state_dict))
    report.expected_missing = [k for k in report.missing if k.endswith('num_batches_tracked')
                               or (init_only is not None and init_only.search(k))]
    planned = set(report.expected_missing)
    unplanned = [k for k in own if k not in state_dict and k not in planned]  # model order
    if mismatched_keys or unplanned:
        mismatched = [f'{k}: checkpoint {tuple(state_dict[k].shape)} vs model '
                      f'{tuple(own[k].shape)}' for k in mismatched_keys]
        message = _fit_problem(source, name, layout, own, state_dict, mismatched, unplanned)
        if strict:
            raise CheckpointError(message + '. To load it anyway, pass strict=False in the '
                                  "init_cfg (type='Pretrained') or load inside "
                                  'mmvit_ext.flags.strict_loading(False)')
        print_log(f'{message}; loading the rest (partial loading allowed)', logger='current',
                  level=logging.WARNING)
    report.unexpected = sorted(set(state_dict) - set(own))
    _check_unexpected(model, source, name, report.unexpected, strict)
    loadable = {k: v for k, v in state_dict.items() if k in own and k not in mismatched_keys}
    report.loaded = sorted(loadable)
    for key in report.missing + mismatched_keys:
        loadable[key] = own[key]  # keep the initialisation; strict load_state_dict passes
    return loadable, report


def load_pretrained(model: nn.Module, path: PathLike, prefix: Optional[str] = None,
                    map_location: str = 'cpu', strict: bool = True,
                    logger: str = 'current') -> LoadReport:
    """Read, unwrap and load ``path`` into ``model`` through its load pre-hook (conversion,
    resizing, checks: see :func:`prepare_state_dict`); ``strict=False`` allows partial loads."""
    checkpoint = read_checkpoint(path, map_location)
    source = f'checkpoint {path}'
    state_dict = unwrap_state_dict(checkpoint, source=source, prefix=prefix)
    with flags.strict_loading(bool(strict)), loading_source(source):
        if hasattr(model, 'load_report'):
            model.load_state_dict(state_dict, strict=True)
            return model.load_report
        state_dict, report = prepare_state_dict(model, state_dict)  # no pre-hook of ours
        model.load_state_dict(state_dict, strict=True)
    print_log(f'{type(model).__name__}: loaded {path}\n{report.summary()}', logger=logger)
    return report
