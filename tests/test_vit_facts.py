"""A named ViT preset's facts hold in every scope, and a checkpoint tensor the model has no place
for is an error (docs/vit.md): the order explicit argument > preset > scope default > ours."""
import ast
from pathlib import Path

import pytest
import torch
from mmengine.logging import MMLogger

import dinov3_reference as ref
from layout_peers import build_in_scope, randomise
from mmvit_ext.backbones import VisionTransformer
from mmvit_ext.converters import CheckpointError
from vit_peers import timm_to_official_dinov2

ROOT = Path(__file__).resolve().parents[1]
SCOPES = ('mmvit_ext', 'mmdet', 'mmseg', 'mmpretrain')
# every DINOv2 / DINOv3 preset, by its official (underscored) name
DINO_PRESETS = sorted(n for n in VisionTransformer.arch_zoo
                      if n.startswith(('dinov2_', 'dinov3_vit')))


def _dense(arch, **extra) -> dict:
    return dict(type='mmvit_ext.VisionTransformer', arch=arch, out_type='featmap',
                simple_pyramid=False, drop_path_rate=0.0, **extra)


@pytest.mark.parametrize('arch', DINO_PRESETS)
def test_a_named_preset_builds_the_same_trunk_in_every_scope(arch):
    """Built on the meta device (the 7B too): the same tensors, shapes, eps and class token
    under mmdet's, mmseg's and mmpretrain's defaults as in ours."""
    shapes, facts = {}, {}
    for scope in SCOPES:
        with torch.device('meta'):
            model = build_in_scope(scope, _dense(arch, out_indices=(0,)))
        shapes[scope] = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        facts[scope] = (model.patch_bias, model.norm_eps, model.with_cls_token,
                        model.norm is not None, model.facts.source('patch_bias'))
        assert 'patch_embed.proj.bias' in shapes[scope], (scope, arch)
    assert all(s == shapes['mmvit_ext'] for s in shapes.values()), arch
    assert len(set(facts.values())) == 1 and facts['mmseg'][-1] == 'preset', facts


def _empty(scope: str, cfg: dict) -> VisionTransformer:
    """Built on the meta device, then given storage: every tensor comes from the checkpoint
    (a strict load), so no random initialisation is paid for."""
    with torch.device('meta'):
        model = build_in_scope(scope, cfg)
    return model.to_empty(device='cpu').eval()


def _layouts_dinov3():
    cfg = dict(ref.TINY, embed_dim=384, depth=12, num_heads=6)  # dinov3_vits16
    official = ref.official_state_dict(cfg, seed=3)
    return cfg, official, {'official': official, 'timm': ref.official_to_timm(official),
                           'HF': ref.official_to_hf(official)}


def test_dinov3_vits16_weights_give_the_official_maps_in_every_scope_and_layout():
    """The issue's config (mmseg's default scope, ``out_norm=True``) with the patch bias the
    official weights hold: every layout, every scope, the reference's maps."""
    cfg, official, layouts = _layouts_dinov3()
    x = torch.randn(1, 3, 32, 48)
    want = [m for m, _ in ref.get_intermediate_layers(official, cfg, x, (2, 5, 8, 11))]
    for scope in SCOPES:
        model = _empty(scope, _dense('dinov3_vits16', out_indices=(2, 5, 8, 11), out_norm=True))
        for name, state in layouts.items():
            model.load_state_dict(state)
            with torch.no_grad():
                got = model(x)
            err = max((g - w).abs().max().item() for g, w in zip(got, want))
            assert err < 1e-4, (scope, name, err)


def test_dinov2_s_weights_give_the_timm_maps_in_every_scope_and_layout():
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    timm = randomise(TimmViT(img_size=56, patch_size=14, embed_dim=384, depth=12, num_heads=6,
                             init_values=1e-5, num_classes=0), seed=5)
    layouts = {'timm': timm.state_dict(), 'official': timm_to_official_dinov2(timm.state_dict())}
    x = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        want = timm.forward_features(x)[:, 1:].transpose(1, 2).reshape(1, 384, 4, 4)
    for scope in SCOPES:
        model = _empty(scope, _dense('dinov2_s', out_indices=(11,), img_size=56))
        for name, state in layouts.items():
            model.load_state_dict(state)
            with torch.no_grad():
                got = model(x)[-1]
            assert (got - want).abs().max().item() < 1e-4, (scope, name)


def _small(**extra) -> VisionTransformer:
    return VisionTransformer(arch=dict(embed_dims=32, depth=2, num_heads=2), img_size=32,
                             simple_pyramid=False, with_cls_token=True, window_size=None,
                             **extra)


def test_a_trunk_tensor_without_a_place_is_an_error_naming_the_argument():
    state = _small().state_dict()
    model = _small(patch_bias=False)
    with pytest.raises(CheckpointError, match=r'patch_embed\.proj\.bias: build with '
                                              r'patch_bias=True'):
        model.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r'blocks\.0\.ls1\.gamma: build with layer_scale'):
        _small().load_state_dict({**state, 'blocks.0.ls1.gamma': torch.ones(32)})
    # a classifier head's tensors are not the backbone's: loaded without them, no error
    _small().load_state_dict({**state, 'head.weight': torch.zeros(10, 32),
                              'head.bias': torch.zeros(10)})
    from mmvit_ext import flags
    with flags.strict_loading(False):  # partial loading asked for: the rest loads
        model.load_state_dict(state)
    assert torch.equal(model.patch_embed.proj.weight, state['patch_embed.proj.weight'])


def test_mmseg_configs_drop_the_patch_bias_as_mmseg_does_and_say_so():
    """mmseg's VisionTransformer builds no patch bias by default and drops it from timm / DeiT
    weights; a type-swapped mmseg config does the same, with one log line; a named preset
    keeps it."""
    state = _small().state_dict()
    mmseg_cfg = dict(type='mmvit_ext.VisionTransformer', embed_dims=32, num_layers=2,
                     num_heads=2, img_size=32)
    model = build_in_scope('mmseg', mmseg_cfg)
    assert not model.patch_bias and model.facts.source('patch_bias') == 'scope'
    logger = MMLogger.get_current_instance()
    records = []
    handler = type('H', (__import__('logging').Handler,), {
        'emit': lambda self, record: records.append(record.getMessage())})()
    logger.addHandler(handler)
    try:
        model.load_state_dict(state)
    finally:
        logger.removeHandler(handler)
    assert any("mmseg's VisionTransformer drops them by default" in r and
               'patch_embed.proj.bias' in r for r in records), records
    assert 'drops the bias of timm / DeiT weights as mmseg does' in \
        (ROOT / 'docs' / 'vit.md').read_text()
    explicit = build_in_scope('mmseg', dict(mmseg_cfg, patch_bias=False))
    with pytest.raises(CheckpointError, match='patch_bias=True'):
        explicit.load_state_dict(state)  # the user asked for no bias: not the peer's drop


def test_the_order_of_facts_is_written_once():
    """vit_peers (the peers' facts and the order) imports nothing back from vit."""
    tree = ast.parse((ROOT / 'mmvit_ext' / 'backbones' / 'vit_peers.py').read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert 'vit' not in imported and '.vit' not in imported, imported
    from mmvit_ext.backbones.vit_peers import FACT_LEVELS
    assert FACT_LEVELS == ('argument', 'preset', 'scope', 'ours')


def test_dinov2_s_hf_weights_give_transformers_maps_in_every_scope():
    import transformers
    from layout_peers import hf_checkpoint
    config = transformers.Dinov2Config(hidden_size=384, num_hidden_layers=12,
                                       num_attention_heads=6, mlp_ratio=4, image_size=56,
                                       patch_size=14, layerscale_value=1e-5)
    hf = randomise(transformers.Dinov2Model(config), seed=6)
    state = hf_checkpoint(hf)
    x = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        tokens = hf(x).last_hidden_state[:, 1:]
    want = tokens.transpose(1, 2).reshape(1, 384, 4, 4)
    for scope in SCOPES:
        model = _empty(scope, _dense('dinov2_s', out_indices=(11,), img_size=56))
        model.load_state_dict(state)
        with torch.no_grad():
            got = model(x)[-1]
        assert (got - want).abs().max().item() < 1e-4, scope
