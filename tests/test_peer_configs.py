"""Every Swin / PVTv2 config shipped with mmdet, mmseg and mmpretrain builds our backbone after
changing only the backbone ``type`` to ``mmvit_ext.<Class>``, with the peer's output contract.

Both backbones are built from the same dict through the peer's own registry (ours is reached by
its scope) on the meta device and run on a meta 384x384 image: output channels and strides must
agree; features given the same weights are compared in
:func:`test_features_equal_given_peer_weights`.
"""
import copy
import importlib
import re
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple
from unittest import mock

import pytest
import torch

import mmdet  # noqa: F401  (the peers are dependencies: a missing one fails, not skips)
import mmpretrain  # noqa: F401
import mmseg  # noqa: F401
from mmengine.config import Config

import mmvit_ext  # noqa: E402,F401  (registers the mmvit_ext scope)
from mmvit_ext.backbones import family_classes  # noqa: E402
from mmvit_ext.errors import ConfigError  # noqa: E402
from layout_peers import build_in_scope  # noqa: E402

PEERS = ('mmdet', 'mmseg', 'mmpretrain')
# our registered backbones: a peer config whose backbone type has the same class name is built
# with ours after changing only the type
OURS = {cls.__name__: f'mmvit_ext.{cls.__name__}' for cls in family_classes().values()
        if cls.peer_drop_in}
SIZE = 384  # every stage map >= the largest window (12) in the shipped configs


def _peer_registry(peer: str) -> SimpleNamespace:
    """The peer's MODELS, building in the peer's default scope."""
    return SimpleNamespace(build=partial(build_in_scope, peer))


def _shipped_configs() -> Tuple[List[Tuple[str, str, dict]], Dict[str, str]]:
    """(peer, config path relative to its configs folder, backbone dict) for every shipped
    config whose backbone type is the class name of one of ours (configs are read only where
    their path names one of our families, e.g. ``swin`` or ``pvtv2``, or their text names one
    of our classes as a type, e.g. mmpretrain's ``deit/*``), and the candidates mmengine could
    not load, with the error."""
    found, unloadable = [], {}
    families = [re.sub(r'[^a-z0-9]', '', family.lower())
                for family, cls in family_classes().items() if cls.peer_drop_in]
    typed = re.compile(r"type=['\"](\w+\.)?(%s)['\"]" % '|'.join(OURS))
    for peer in PEERS:
        root = Path(importlib.import_module(peer).__file__).parent / '.mim' / 'configs'
        for path in sorted(root.rglob('*.py')):
            name = re.sub(r'[^a-z0-9]', '', str(path.relative_to(root)).lower())
            if not any(family in name for family in families) and \
                    not typed.search(path.read_text(errors='ignore')):
                continue
            try:
                model = Config.fromfile(str(path)).get('model')
            except Exception as error:  # noqa: BLE001  (reported by test_every_candidate_loads)
                unloadable[f'{peer}:{path.relative_to(root)}'] = \
                    f'{type(error).__name__}: {str(error).splitlines()[0][:160]}'
                continue
            backbone = model.get('backbone') if isinstance(model, dict) else None
            if isinstance(backbone, dict) and \
                    str(backbone.get('type', '')).split('.')[-1] in OURS:
                found.append((peer, str(path.relative_to(root)), backbone.to_dict()))
    return found, unloadable


CONFIGS, UNLOADABLE = _shipped_configs()
# candidate configs that mmengine cannot load here, with the reason; each one is printed by
# test_every_candidate_config_loads, and any other config that fails to load fails it
KNOWN_UNLOADABLE: Dict[str, str] = {
    # mmpretrain 1.2.0's own config error (its base defines no test_pipeline); a Swin V2
    # backbone (SwinTransformerV2), not a class of ours: read only because its path names Swin
    f'mmpretrain:swin_transformer_v2/swinv2-{size}-w12_8xb128_in21k-192px.py':
        "KeyError: 'test_pipeline'" for size in ('base', 'large')}
# the shipped configs of mmdet 3.3.0, mmseg 1.2.2 and mmpretrain 1.2.0 (requirements/dev.txt)
# whose backbone is one of ours
EXPECTED_CONFIGS = 223
# configs asking for what we do not implement: one ConfigError naming the argument
# shipped configs we refuse, with the error they get (none since pad_small_map is honoured)
UNSUPPORTED: Dict[str, str] = {}


_LINSPACE = torch.linspace


def _cpu_linspace(*args, **kwargs):
    # the peers read drop-path rates with .item(), which meta tensors cannot answer
    return _LINSPACE(*args, **{**kwargs, 'device': 'cpu'})


def _shape(out) -> Tuple[int, ...]:
    """An output's shape; of the map where it comes as ``[map, class token]`` (mmseg)."""
    return tuple((out[0] if isinstance(out, (list, tuple)) else out).shape)


def _contract(model: torch.nn.Module, in_channels: int) -> List[Tuple[int, Optional[int]]]:
    """(channels, stride) of every output on a meta SIZE x SIZE image; vectors (B, C) and
    tokens (B, L, C) have no stride."""
    with torch.no_grad():
        outs = model(torch.empty(1, in_channels, SIZE, SIZE, device='meta'))
    return [(shape[1], SIZE // shape[-1]) if len(shape) == 4 else (shape[-1], None)
            for shape in map(_shape, outs)]


@pytest.fixture(scope='module')
def built():
    """One build per distinct (peer, backbone dict): many configs share a backbone."""
    return {}


def test_every_candidate_config_loads(capsys):
    """A candidate config that fails to load is a failure, not a skipped case."""
    with capsys.disabled():
        print(f'\n{len(KNOWN_UNLOADABLE)} shipped configs known not to load here (not checked)')
        for name, reason in sorted(KNOWN_UNLOADABLE.items()):
            print(f'  {name}: {reason}')
    unexpected = {k: v for k, v in UNLOADABLE.items() if k not in KNOWN_UNLOADABLE}
    assert not unexpected, unexpected
    assert all(UNLOADABLE.get(k) == v for k, v in KNOWN_UNLOADABLE.items()), \
        'a known-unloadable config loads now, or fails differently'


def test_found_every_family():
    peers = {(peer, b['type'].split('.')[-1]) for peer, _, b in CONFIGS}
    assert {('mmdet', 'SwinTransformer'), ('mmseg', 'SwinTransformer'),
            ('mmpretrain', 'SwinTransformer'), ('mmdet', 'PyramidVisionTransformerV2'),
            ('mmseg', 'VisionTransformer'), ('mmpretrain', 'VisionTransformer')} <= peers
    vit = [path for _, path, b in CONFIGS if b['type'].split('.')[-1] == 'VisionTransformer']
    assert len(vit) == 78 and sum(path.startswith('deit/') for path in vit) == 4, len(vit)
    assert len(CONFIGS) == EXPECTED_CONFIGS, len(CONFIGS)


def _contracts(peer: str, backbone: dict, built: dict):
    """(peer's contract, our contract, our model) for a shipped backbone dict, built once per
    distinct (peer, dict)."""
    key = (peer, repr(sorted(backbone.items())))
    if key not in built:
        ours_cfg = dict(copy.deepcopy(backbone), type=OURS[backbone['type'].split('.')[-1]])
        registry = _peer_registry(peer)
        with torch.device('meta'), mock.patch('torch.linspace', _cpu_linspace):
            peer_model = registry.build(copy.deepcopy(backbone))
            ours = registry.build(ours_cfg)
        peer_model.eval()  # some peers' train() returns None
        channels = backbone.get('in_channels', 3)
        built[key] = (_contract(peer_model, channels), _contract(ours.eval(), channels), ours)
    return built[key]


def _row(peer: str, path: str, backbone: dict, built: dict) -> Tuple[str, str, str]:
    """(result, channels, strides) of one shipped config, as the table prints it."""
    name = f'{peer}:{path}'
    if name in UNSUPPORTED:
        ours_cfg = dict(copy.deepcopy(backbone), type=OURS[backbone['type'].split('.')[-1]])
        with pytest.raises(ConfigError, match=UNSUPPORTED[name]):
            _peer_registry(peer).build(ours_cfg)
        return 'error', UNSUPPORTED[name].split('=')[0], '-'
    peer_contract, our_contract, ours = _contracts(peer, backbone, built)
    same = our_contract == peer_contract and \
        list(zip(ours.out_channels, ours.strides)) == our_contract
    return ('ok' if same else 'DIFF', str([c for c, _ in our_contract]),
            str([s for _, s in our_contract]))


@pytest.mark.parametrize('peer,path,backbone', CONFIGS, ids=[f'{p}:{c}' for p, c, _ in CONFIGS])
def test_shipped_config_builds_with_peer_contract(peer, path, backbone, built):
    if f'{peer}:{path}' in UNSUPPORTED:
        _row(peer, path, backbone, built)  # raises the ConfigError it names
        return
    peer_contract, our_contract, ours = _contracts(peer, backbone, built)
    assert our_contract == peer_contract
    assert [(c, s) for c, s in zip(ours.out_channels, ours.strides)] == our_contract


def test_print_table(capsys, built):
    """The table of every shipped config (builds the ones no test above has built yet, so it
    holds in any order and alone)."""
    rows = {f'{peer}:{path}': _row(peer, path, backbone, built)
            for peer, path, backbone in CONFIGS}
    with capsys.disabled():
        width = max((len(k) for k in rows), default=10)
        print(f'\n{"config":<{width}}  build  channels / strides')
        for name, (ok, channels, strides) in sorted(rows.items()):
            print(f'{name:<{width}}  {ok:<5}  {channels} / {strides}')
        refused = sum(ok == 'error' for ok, _, _ in rows.values())
        print(f'{len(rows)} configs: {len(rows) - refused} built, {refused} refused; '
              f'{len(KNOWN_UNLOADABLE)} known unloadable, not built')
    assert len(rows) == len(CONFIGS) == EXPECTED_CONFIGS
    assert all(ok in ('ok', 'error') for ok, _, _ in rows.values())


# ---- features given the same weights ----------------------------------------------------------
SMALL = {
    'mmdet-swin': ('mmdet', dict(type='SwinTransformer', embed_dims=32, depths=(2, 2, 2, 2),
                                 num_heads=(1, 2, 4, 8), drop_path_rate=0.0)),
    'mmseg-swin': ('mmseg', dict(type='SwinTransformer', embed_dims=32, depths=(2, 2, 2, 2),
                                 num_heads=(1, 2, 4, 8), drop_path_rate=0.0)),
    'mmpretrain-swin': ('mmpretrain', dict(type='SwinTransformer', arch=dict(
        embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)), img_size=224,
        out_indices=(0, 1, 2, 3), drop_path_rate=0.0)),
    'mmdet-pvtv2': ('mmdet', dict(type='PyramidVisionTransformerV2', embed_dims=16,
                                  num_layers=(1, 1, 1, 1), drop_path_rate=0.0)),
}


_VIT = dict(img_size=64, embed_dims=32, num_layers=3, num_heads=2)
_VIT_ARCH = dict(embed_dims=32, num_layers=3, num_heads=2, feedforward_channels=96)
# the peers' ViT settings of the shipped configs, tiny: mmseg's DPT / SETR / UperNet and
# mmpretrain's classifiers, MAE / CLIP fine-tuning and DINOv2
VIT_SMALL = {
    'mmseg-vit-dpt': ('mmseg', dict(type='VisionTransformer', out_indices=(0, 2),
                                    with_cls_token=True, output_cls_token=True, **_VIT)),
    'mmseg-vit-setr': ('mmseg', dict(type='VisionTransformer', out_indices=(0, 1, 2),
                                     with_cls_token=False, interpolate_mode='bilinear',
                                     norm_cfg=dict(type='LN', eps=1e-6, requires_grad=True),
                                     **_VIT)),
    'mmseg-vit-upernet': ('mmseg', dict(type='VisionTransformer', out_indices=(1, 2),
                                        final_norm=True, pre_norm=True, patch_norm=True,
                                        **_VIT)),
    'mmpretrain-vit': ('mmpretrain', dict(type='VisionTransformer', arch=_VIT_ARCH, img_size=64,
                                          out_indices=(1, 2))),
    'mmpretrain-vit-mae-clip': ('mmpretrain', dict(
        type='VisionTransformer', arch=_VIT_ARCH, img_size=64, pre_norm=True,
        out_type='avg_featmap', final_norm=False)),
    'mmpretrain-vit-dinov2': ('mmpretrain', dict(
        type='VisionTransformer', arch=_VIT_ARCH, img_size=56, patch_size=14,
        layer_scale_init_value=1e-5, layer_cfgs=dict(ffn_type='swiglu_fused'),
        out_type='featmap', out_indices=(0, 1, 2))),
    'mmpretrain-vit-raw-no-cls': ('mmpretrain', dict(
        type='VisionTransformer', arch=_VIT_ARCH, img_size=64, with_cls_token=False,
        out_type='raw')),
}


def _flat(outs) -> List[torch.Tensor]:
    """Outputs as tensors (mmseg's ``[map, class token]`` pairs flattened)."""
    return [t for out in outs for t in (out if isinstance(out, (list, tuple)) else [out])]


@pytest.mark.parametrize('name', sorted(SMALL) + sorted(VIT_SMALL))
def test_features_equal_given_peer_weights(name):
    """Peer weights (random) loaded into ours (converted on load): the same features (<= 1e-4)
    at a size other than the pretraining one (position embeddings resized as the peer does)."""
    from layout_peers import randomise
    peer, cfg = {**SMALL, **VIT_SMALL}[name]
    registry = _peer_registry(peer)
    peer_model = registry.build(copy.deepcopy(cfg))
    randomise(peer_model)  # and eval(); some peers' train() returns None
    ours = registry.build(dict(copy.deepcopy(cfg), type=OURS[cfg['type']])).eval()
    ours.load_state_dict(peer_model.state_dict())
    x = torch.randn(1, 3, 256, 288)  # every Swin stage map longer than the window
    with torch.no_grad():
        feats, peer_feats = _flat(ours(x)), _flat(peer_model(x))
    assert len(feats) == len(peer_feats)
    for a, b in zip(feats, peer_feats):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= 1e-4


def _to_peer_layout(name: str, ours: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Our weights in the peer's layout: exported to the official layout, then read by mmdet's
    own converter (mmseg and mmpretrain Swin share mmdet's keys)."""
    from mmdet.models.backbones.pvt import pvt_convert
    from mmdet.models.backbones.swin import swin_converter

    from mmvit_ext.converters import export_official_pvtv2, export_official_swin
    if name.endswith('pvtv2'):
        return pvt_convert(export_official_pvtv2(ours.state_dict()))
    state = {k[len('backbone.'):]: v for k, v in
             swin_converter(export_official_swin(ours.state_dict())).items()
             if not k.startswith('backbone.norm.')}
    state.update({k: v for k, v in ours.state_dict().items() if k.startswith('norm')})
    return state


@pytest.mark.parametrize('name', sorted(SMALL))
def test_features_equal_given_our_weights_in_the_peer(name):
    """The same dict builds the same function: our weights, exported and read by the peer's own
    converter, give the peer the same features (<= 1e-4)."""
    peer, cfg = SMALL[name]
    registry = _peer_registry(peer)
    peer_model = registry.build(copy.deepcopy(cfg))
    peer_model.eval()
    ours = registry.build(dict(copy.deepcopy(cfg), type=OURS[cfg['type']])).eval()
    result = peer_model.load_state_dict(_to_peer_layout(name, ours), strict=False)
    assert not result.unexpected_keys
    assert all(k.endswith(('relative_position_index', 'attn_mask')) for k in result.missing_keys)
    x = torch.randn(1, 3, 256, 288)  # every Swin stage map longer than the window
    with torch.no_grad():
        feats, peer_feats = ours(x), peer_model(x)
    assert len(feats) == len(peer_feats) == 4
    for a, b in zip(feats, peer_feats):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= 1e-4


@pytest.mark.parametrize('name', ['mmdet-swin', 'mmseg-swin', 'mmpretrain-swin'])
def test_swin_maps_shorter_than_the_window_as_the_peer(name):
    """On maps shorter than the window (stages 3-4 of a 96 x 128 input) mmdet / mmseg pad the
    map and keep the shift, as mmpretrain with pad_small_map=True; built in their default scope
    ours does the same (<= 1e-4), while outside it ours keeps the official shrink-to-the-map."""
    peer, cfg = SMALL[name]
    cfg = dict(cfg, pad_small_map=True) if peer == 'mmpretrain' else cfg
    registry = _peer_registry(peer)
    peer_model = registry.build(copy.deepcopy(cfg))
    peer_model.eval()  # the peers' train() returns None
    ours = registry.build(dict(copy.deepcopy(cfg), type=OURS[cfg['type']])).eval()
    assert ours.pad_small_map
    peer_model.load_state_dict(_to_peer_layout('swin', ours), strict=False)
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        for a, b in zip(ours(x), peer_model(x)):
            assert a.shape == b.shape
            assert (a - b).abs().max().item() <= 1e-4
    from mmvit_ext.backbones import SwinTransformer
    native = SwinTransformer(arch=dict(embed_dims=32, depths=(2, 2, 2, 2),
                                       num_heads=(1, 2, 4, 8)), drop_path_rate=0.0)
    assert not native.pad_small_map


# ---- semantics by rule: the default scope, never the names ------------------------------------
def _frozen(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {n: p for n, p in model.backbone.named_parameters() if not p.requires_grad}


@pytest.mark.parametrize('frozen_stages', [0, 1])
@pytest.mark.parametrize('extra', [{}, dict(img_size=224)], ids=['no-img_size', 'img_size'])
def test_type_swapped_mmpretrain_config_freezes_what_mmpretrain_freezes(frozen_stages, extra):
    """mmpretrain's Swin-T recipe, built as its runner builds it (mmengine's MODELS under the
    config's default_scope='mmpretrain'), with and without ``img_size``: our backbone freezes
    exactly the parameters mmpretrain's freezes (names through our converter)."""
    from mmengine.registry import MODELS as ROOT_MODELS
    from mmengine.registry import init_default_scope

    from mmvit_ext.converters.swin import convert_openmmlab_swin
    import mmpretrain
    recipe = 'swin_transformer/swin-tiny_16xb64_in1k.py'
    cfg = Config.fromfile(str(Path(mmpretrain.__file__).parent / '.mim' / 'configs' / recipe))
    init_default_scope(cfg.default_scope)  # what the runner does
    backbone = {k: v for k, v in cfg.model.backbone.to_dict().items() if k != 'img_size'}
    backbone.update(frozen_stages=frozen_stages, **extra)
    models = {}
    for kind in ('SwinTransformer', 'mmvit_ext.SwinTransformer'):
        model_cfg = copy.deepcopy(cfg.model)
        model_cfg.backbone = dict(backbone, type=kind, drop_path_rate=0.0)
        models[kind] = ROOT_MODELS.build(model_cfg).train()
    theirs, ours = _frozen(models['SwinTransformer']), _frozen(models['mmvit_ext.SwinTransformer'])
    assert models['mmvit_ext.SwinTransformer'].backbone.peer == 'mmpretrain'
    assert sum(p.numel() for p in ours.values()) == sum(p.numel() for p in theirs.values()) == \
        {0: 304_086, 1: 1_492_290}[frozen_stages]
    assert set(convert_openmmlab_swin(theirs)) == set(ours)


@pytest.mark.parametrize('peer', ['mmdet', 'mmseg'])
@pytest.mark.parametrize('frozen_stages', [0, 2])
def test_mmdet_and_mmseg_configs_keep_their_count(peer, frozen_stages):
    """mmdet / mmseg: ``frozen_stages=k`` freezes the patch embedding, stages 0..k-1 and their
    output norms, with or without mmpretrain's ``img_size``."""
    for extra in ({}, dict(img_size=224)):
        cfg = dict(type='mmvit_ext.SwinTransformer', embed_dims=32, depths=(2, 2, 2, 2),
                   num_heads=(1, 2, 4, 8), frozen_stages=frozen_stages, **extra)
        model = build_in_scope(peer, cfg).train()
        prefixes = ('patch_embed.', *(f'{part}{i}.' for i in range(frozen_stages)
                                      for part in ('layers.', 'norm')))
        assert {n for n, p in model.named_parameters() if not p.requires_grad} == \
            {n for n, _ in model.named_parameters() if n.startswith(prefixes)}
    assert model.peer == peer and model.pad_small_map and model.out_indices == (0, 1, 2, 3)
