"""The peers' argument names (mmvit_ext/backbones/vocabulary.py): mapped, honoured, or one clear
error naming the argument, the value and what we support. Builds on the meta device (no compute)."""
import pytest
import torch

from mmvit_ext.backbones import PyramidVisionTransformerV2 as PVT
from mmvit_ext.backbones import SwinTransformer as Swin
from mmvit_ext.backbones.vocabulary import ConfigError, normalise_init_cfg


def meta(cls, *args, **kwargs):
    with torch.device('meta'):
        return cls(*args, **kwargs)


def test_swin_mmdet_dims_select_the_arch():
    base = meta(Swin, embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
    assert base.out_channels == (128, 256, 512, 1024)
    assert sum(len(s.blocks) for s in base.layers) == 24
    assert base.arch_settings == meta(Swin, 'base').arch_settings
    # consistent with an explicit arch: fine; inconsistent: one error naming both
    assert meta(Swin, 'tiny', embed_dims=96).out_channels == (96, 192, 384, 768)
    with pytest.raises(ConfigError, match=r"arch='tiny' has embed_dims=96 but embed_dims=128"):
        meta(Swin, 'tiny', embed_dims=128)


@pytest.mark.parametrize('kwargs,pattern', [
    (dict(act_cfg=dict(type='ReLU')), r"act_cfg=\{'type': 'ReLU'\} is not supported; we support "
                                      r"only dict\(type='GELU'\)"),
    (dict(norm_cfg=dict(type='BN')), r"norm_cfg=.*only dict\(type='LN', eps=1e-05\)"),
    (dict(strides=(4, 2, 2, 1)), r'strides=\(4, 2, 2, 1\) is not supported; we support \(4, 2, 2, 2\)'),
    (dict(strides=(2, 2, 2, 2), patch_size=4), r'strides=\(2, 2, 2, 2\)'),
    (dict(pretrain_img_size=(224, 224, 224)), r'pretrain_img_size=\(224, 224, 224\)'),
    (dict(pad_small_map='yes'), r"pad_small_map='yes' is not supported; we support True or False"),
    (dict(out_after_downsample=True), 'out_after_downsample=True'),
    (dict(stage_cfgs=dict(block_cfgs=dict(norm_cfg=dict(type='BN')))), 'stage_cfgs='),
    (dict(interpolate_mode='bilinear'), "interpolate_mode='bilinear'"),
])
def test_swin_unsupported_values_raise_one_error(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        meta(Swin, **kwargs)
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, AssertionError)


def test_swin_accepted_peer_values():
    model = meta(Swin, strides=(4, 2, 2, 2), act_cfg=dict(type='GELU'), norm_cfg=dict(type='LN'),
                 convert_weights=True, qk_scale=None, patch_norm=False)
    assert isinstance(model.patch_embed.norm, torch.nn.Identity)
    assert meta(Swin, pretrain_img_size=(224,)).pretrain_img_size == (224, 224)
    with pytest.raises(TypeError, match="unexpected keyword argument 'embed_dim'"):
        meta(Swin, embed_dim=96)


TINY_SWIN = dict(embed_dims=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1))


def frozen_stages_of(model) -> list:
    return [all(not p.requires_grad for p in s.parameters()) for s in model.train().layers]


def test_swin_mmpretrain_names():
    # img_size -> pretrain_img_size; stage_cfgs window -> window_size; peer mmpretrain's
    # default out_indices (3,)
    model = meta(Swin, arch='base', img_size=384, stage_cfgs=dict(block_cfgs=dict(window_size=12)),
                 peer='mmpretrain')
    assert model.pretrain_img_size == (384, 384) and model.window_size == 12
    assert model.out_indices == (3,) and model.out_channels == (1024,)
    # mmpretrain counts frozen stages from 0: frozen_stages=1 freezes stages 0 and 1
    model = Swin(TINY_SWIN, img_size=64, frozen_stages=1, out_indices=(0, 1, 2, 3),
                 peer='mmpretrain')
    assert frozen_stages_of(model) == [True, True, False, False]
    assert frozen_stages_of(Swin(TINY_SWIN, frozen_stages=1, peer='mmdet')) == \
        [True, False, False, False]


@pytest.mark.parametrize('extra', [{}, dict(img_size=64), dict(embed_dims=8),
                                   dict(stage_cfgs=dict(block_cfgs=dict(window_size=7)))])
def test_names_never_choose_the_semantics(extra):
    """Without ``peer`` and outside a peer's scope, our semantics hold whatever names appear."""
    model = Swin(TINY_SWIN, frozen_stages=1, **extra)
    assert model.peer == 'mmvit_ext' and model.out_indices == (0, 1, 2, 3)
    assert not model.pad_small_map and not model.refuse_small_maps
    assert frozen_stages_of(model) == [True, False, False, False]


@pytest.mark.parametrize('scope,frozen,out_indices,pad', [
    ('mmpretrain', [True, True, False, False], (3,), False),
    ('mmdet', [True, False, False, False], (0, 1, 2, 3), True),
    ('mmseg', [True, False, False, False], (0, 1, 2, 3), True),
    ('mmengine', [True, False, False, False], (0, 1, 2, 3), False),
])
def test_the_default_scope_chooses_the_semantics(scope, frozen, out_indices, pad):
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope(scope):
        for extra in ({}, dict(img_size=64)):
            model = Swin(TINY_SWIN, frozen_stages=1, **extra)
            assert model.out_indices == out_indices and model.pad_small_map == pad
            if out_indices == (3,):
                model = Swin(TINY_SWIN, frozen_stages=1, out_indices=(0, 1, 2, 3), **extra)
            assert frozen_stages_of(model) == frozen
        # the explicit argument wins over the scope
        assert Swin(TINY_SWIN, frozen_stages=1, peer='mmdet').out_indices == (0, 1, 2, 3)


def test_unknown_peer_is_refused():
    with pytest.raises(ConfigError, match="peer='timm' is not supported"):
        meta(Swin, peer='timm')


def test_pvtv2_mmdet_names():
    b0 = meta(PVT, embed_dims=32, num_layers=[2, 2, 2, 2])
    assert b0.out_channels == (32, 64, 160, 256)
    assert b0.arch_settings['depths'] == (2, 2, 2, 2)
    b5 = meta(PVT, embed_dims=64, num_layers=[3, 6, 40, 3], mlp_ratios=(4, 4, 4, 4))
    assert b5.arch_settings == {**meta(PVT, 'b5').arch_settings, 'embed_dims': (64, 128, 320, 512)}
    assert len(b5.layers[2].blocks) == 40
    meta(PVT, num_stages=4, patch_sizes=[7, 3, 3, 3], strides=[4, 2, 2, 2], paddings=[3, 1, 1, 1],
         use_abs_pos_embed=False, norm_after_stage=True, use_conv_ffn=True,
         norm_cfg=dict(type='LN', eps=1e-6), act_cfg=dict(type='GELU'), pretrain_img_size=224)


@pytest.mark.parametrize('kwargs,pattern', [
    (dict(use_abs_pos_embed=True), r'use_abs_pos_embed=True is not supported; we support False'),
    (dict(use_conv_ffn=False), 'use_conv_ffn=False'),
    (dict(norm_after_stage=False), 'norm_after_stage=False'),
    (dict(patch_sizes=[4, 2, 2, 2]), r'patch_sizes=\[4, 2, 2, 2\].*\(7, 3, 3, 3\)'),
    (dict(norm_cfg=dict(type='LN')), r"only dict\(type='LN', eps=1e-06\)"),
    (dict(num_stages=3), r'num_stages=3 is not supported; we support len\(num_layers\) = 4'),
    (dict(act_cfg=dict(type='ReLU')), r"act_cfg=.*only dict\(type='GELU'\)"),
    (dict(arch='b0', embed_dims=64), r"arch='b0' has embed_dims=\(32, 64, 160, 256\)"),
])
def test_pvtv2_unsupported_values_raise_one_error(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        meta(PVT, **kwargs)


def test_init_cfg_forms():
    url = 'https://example.invalid/pvt_v2_b0.pth'
    assert normalise_init_cfg(dict(checkpoint=url)) == dict(type='Pretrained', checkpoint=url)
    assert normalise_init_cfg([dict(checkpoint=url)]) == [dict(type='Pretrained', checkpoint=url)]
    assert meta(PVT, init_cfg=dict(checkpoint=url)).init_cfg == \
        dict(type='Pretrained', checkpoint=url)
    assert meta(Swin, pretrained=url).init_cfg == dict(type='Pretrained', checkpoint=url)
    with pytest.raises(ConfigError, match='both given'):
        meta(Swin, pretrained=url, init_cfg=dict(type='Pretrained', checkpoint=url))
    with pytest.raises(TypeError, match='pretrained must be'):
        meta(PVT, pretrained=123)


def test_init_cfg_without_type_loads(tmp_path):
    """mmdet's PVTv2 configs write init_cfg=dict(checkpoint=...): it loads (was KeyError)."""
    cfg = dict(embed_dims=(8, 16, 16, 16), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1))
    src = PVT(cfg)
    path = tmp_path / 'ours.pth'
    torch.save(src.state_dict(), path)
    dst = PVT(cfg, init_cfg=dict(checkpoint=str(path)))
    dst.init_weights()
    for key, value in src.state_dict().items():
        assert torch.equal(value, dst.state_dict()[key]), key


# ---- plain ViTs: mmseg VisionTransformer names ---------------------------------------------------
from mmvit_ext.backbones import CaiT, DeepViT  # noqa: E402
from mmvit_ext.layers import resize_pos_embed  # noqa: E402

TINY_MMSEG = dict(embed_dims=32, num_layers=4, num_heads=2, mlp_ratio=3)


def test_plain_vit_peer_mmseg_takes_mmseg_defaults():
    model = meta(DeepViT, arch=dict(embed_dims=32, depth=4, num_heads=2, reattention_blocks=2),
                 img_size=(64, 96), out_indices=(1, 3), num_heads=2, peer='mmseg')
    # mmseg's defaults: class token in the trunk, global attention, stride-16 maps one per
    # index, no final norm
    assert model.cls_token is not None and model.window_size is None
    assert model.simple_pyramid is False and model.norm is None
    assert model.grid_size == (4, 6)
    assert model.out_channels == (32, 32) and model.strides == (16, 16)
    # mmseg's names alone choose nothing: our defaults
    native = meta(DeepViT, dict(embed_dims=32, depth=4, num_heads=2, reattention_blocks=2),
                  num_heads=2, final_norm=True)
    assert native.cls_token is None and native.window_size == 14 and native.simple_pyramid


@pytest.mark.parametrize('cls,kwargs,pattern', [
    (DeepViT, dict(with_cls_token=True, window_size=7), 'use window_size=None'),
    (CaiT, dict(with_cls_token=True), 'only enters its class-attention blocks'),
    (DeepViT, dict(output_cls_token=True), 'output_cls_token=True is not supported'),
    (DeepViT, dict(act_cfg=dict(type='ReLU')), r"only dict\(type='GELU'\)"),
    (DeepViT, dict(qkv_bias=False), 'qkv_bias=False is not supported; we support True'),
    (DeepViT, dict(patch_size=8), 'patch_size=8 is not supported; we support 16'),
    (DeepViT, dict(img_size=(64, 64, 64)), r'img_size=\(64, 64, 64\)'),
    (DeepViT, dict(arch='16b', embed_dims=768), "arch='16b' has embed_dims=384"),
])
def test_plain_vit_unsupported_values_raise_one_error(cls, kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        meta(cls, **kwargs)


def test_with_cls_token_runs_the_official_trunk():
    """with_cls_token=True: patch tokens are those of the official classifier trunk (class token
    through every block, global attention), given the same weights."""
    arch = dict(embed_dims=32, depth=3, num_heads=2, reattention_blocks=1)
    official = DeepViT(arch, img_size=64, out_type='cls_token', drop_path_rate=0.0).eval()
    dense = DeepViT(arch, img_size=64, with_cls_token=True, final_norm=True, out_indices=(-1,),
                    drop_path_rate=0.0, peer='mmseg').eval()
    dense.load_state_dict(official.state_dict())
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        tokens, hw = official.patch_embed(x)
        pos = resize_pos_embed(official.pos_embed, official.grid_size, hw, 1)
        tokens = torch.cat([official.cls_token.expand(2, -1, -1) + pos[:, :1],
                            tokens + pos[:, 1:]], dim=1)
        for block in official.blocks:
            tokens = block(tokens, hw)
        tokens = official.norm(tokens)
        expected = tokens[:, 1:].transpose(1, 2).reshape(2, 32, *hw)
        assert torch.allclose(official(x)[0], tokens[:, 0], atol=1e-5)
        assert torch.allclose(dense(x)[0], expected, atol=1e-5)
