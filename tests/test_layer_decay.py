"""Layer-wise lr decay: ``get_layer_depth`` of every family, and the optimizer groups built by
``mmvit_ext.LayerDecayOptimWrapperConstructor`` (and mmpretrain's own constructor) through the
config path the runners use, under the mmdet, mmseg and mmpretrain default scopes."""
import re
from typing import Dict, List

import pytest
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from torch import nn

import mmvit_ext
from backbone_cases import SMALL
from mmvit_ext.utils import build_model
from layout_peers import mask_rcnn_cfg, upernet_cfg

RATE, LR, WD = 0.75, 1e-4, 0.05
NO_DECAY = ('pos_embed', 'cls_token', 'relative_position_bias_table')
# a 24-block CaiT, small enough to build a detector in a second
CAIT24 = dict(type='mmvit_ext.CaiT', arch=dict(embed_dims=64, depth=24, num_heads=2),
              window_size=4, drop_path_rate=0.0)
PYRAMID_CHANNELS = [16, 32, 64, 64]


def optim_cfg(constructor: str = 'mmvit_ext.LayerDecayOptimWrapperConstructor',
              **paramwise) -> dict:
    paramwise = paramwise or dict(
        layer_decay_rate=RATE, norm_decay_mult=0.0,
        custom_keys={key: dict(decay_mult=0.0) for key in NO_DECAY})
    return dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=LR, weight_decay=WD),
                constructor=constructor, paramwise_cfg=paramwise)


def build_optimizer_in_scope(scope: str, model_cfg: dict, optim_wrapper: dict):
    """A config as a user writes it, built as mmengine's Runner does: the model with the scope's
    registry, then ``build_optim_wrapper`` under the config's ``default_scope``."""
    cfg = Config(dict(default_scope=scope, custom_imports=dict(imports=['mmvit_ext']),
                      model=model_cfg, optim_wrapper=optim_wrapper))
    model = build_model(cfg)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        return model, build_optim_wrapper(model, cfg.optim_wrapper)


def lr_by_param(model: nn.Module, groups: List[dict]) -> Dict[str, tuple]:
    """name -> (lr, weight decay) from the optimizer's groups; each parameter in one group."""
    owner = {id(p): name for name, p in model.named_parameters()}
    out: Dict[str, tuple] = {}
    for group in groups:
        for param in group['params']:
            name = owner[id(param)]
            assert name not in out, f'{name} is in two groups'
            out[name] = (group['lr'], group['weight_decay'])
    return out


def check_groups(model: nn.Module, groups: List[dict], depth_of) -> None:
    """lr = LR * RATE ** (L - 1 - id) exactly, decay 0 on norms / no-decay keys, every trainable
    parameter exactly once, ~2 groups per distinct layer id."""
    settings = lr_by_param(model, groups)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert set(settings) == trainable
    norms = {f'{name}.{short}' if name else short for name, module in model.named_modules()
             if isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm))
             for short, _ in module.named_parameters(recurse=False)}
    ids = set()
    for name, (lr, wd) in settings.items():
        layer_id, num_layers = depth_of(name)
        ids.add(layer_id)
        assert lr == pytest.approx(LR * RATE ** (num_layers - 1 - layer_id), rel=1e-12), name
        no_decay = name in norms or any(key in name for key in NO_DECAY)
        assert wd == (0.0 if no_decay else WD), name
    assert len(groups) <= 2 * len(ids)
    print(f'{len(groups)} groups for {len(settings)} parameters, {len(ids)} layer ids')


# ---- get_layer_depth -----------------------------------------------------------------------
@pytest.mark.parametrize('family', sorted(SMALL))
def test_layer_depth_contract(family):
    """Ids rise with the forward order from 0 (stem) to num_layers - 1, every built layer has
    weights, every block its own id; outside ``prefix`` (neck, heads) is the top."""
    model = mmvit_ext.MODELS.build(dict(SMALL[family], type=family))
    names = [name for name, _ in model.named_parameters()]
    ids = [model.get_layer_depth(name) for name in names]
    num_layers = ids[0][1]
    assert all(n == num_layers for _, n in ids) and ids[0][0] == 0
    assert [i for i, _ in ids] == sorted(i for i, _ in ids)
    assert {i for i, _ in ids} >= set(range(num_layers - 1))  # every built layer has weights
    blocks = [(re.match(r'(.*blocks\.\d+)\.', n), i) for n, (i, _) in zip(names, ids)]
    block_ids = {m.group(1): i for m, i in blocks if m}
    assert len(set(block_ids.values())) == len(block_ids)  # each block its own id
    top = {n for n, (i, _) in zip(names, ids) if i == num_layers - 1}
    assert not any(re.search(r'blocks\.|embed|cls_token', n) for n in top), top
    assert model.get_layer_depth('neck.lateral_convs.0.conv.weight', 'backbone.') == \
        (num_layers - 1, num_layers)
    assert model.get_layer_depth(f'backbone.{names[-1]}', 'backbone.') == ids[-1]


def test_layer_depth_per_family():
    """Where downsampling, embeddings and class-attention blocks go."""
    swin = mmvit_ext.MODELS.build(dict(type='SwinTransformer', arch=dict(
        embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)), use_abs_pos_embed=True))
    assert swin.get_layer_depth('absolute_pos_embed') == (0, 10)
    assert swin.get_layer_depth('layers.1.blocks.0.attn.relative_position_bias_table') == (3, 10)
    assert swin.get_layer_depth('layers.1.downsample.reduction.weight') == (4, 10)  # mmpretrain
    assert swin.get_layer_depth('norm3.weight') == (9, 10)
    pvt = mmvit_ext.MODELS.build(dict(type='PyramidVisionTransformerV2', arch='b0'))
    assert pvt.get_layer_depth('layers.0.patch_embed.proj.weight') == (0, 10)
    assert pvt.get_layer_depth('layers.0.norm.weight') == (2, 10)
    assert pvt.get_layer_depth('layers.1.patch_embed.proj.weight') == (2, 10)
    assert pvt.get_layer_depth('layers.3.blocks.1.mlp.fc1.weight') == (8, 10)
    cait = mmvit_ext.MODELS.build(dict(type='CaiT', arch='xxs24', out_type='cls_token'))
    assert cait.get_layer_depth('cls_token') == (0, 28)
    assert cait.get_layer_depth('blocks.23.attn.qkv.weight') == (24, 28)
    assert cait.get_layer_depth('cls_blocks.1.attn.q.weight') == (26, 28)
    assert cait.get_layer_depth('norm.weight') == (27, 28)
    partial = mmvit_ext.MODELS.build(dict(type='DeepViT', arch='s', out_indices=(7,)))
    assert partial.get_layer_depth('blocks.7.mlp.fc1.weight') == (8, 10)  # built blocks only


# ---- the constructor -------------------------------------------------------------------------
def test_constructor_in_mmdet_scope_24_blocks():
    """A Mask R-CNN around a 24-block ViT: 26 layer ids, groups merged to at most 2 per id."""
    model_cfg = mask_rcnn_cfg(dict(CAIT24, frozen_stages=2))
    model_cfg.neck.in_channels = PYRAMID_CHANNELS
    model, wrapper = build_optimizer_in_scope('mmdet', model_cfg, optim_cfg())
    groups = wrapper.optimizer.param_groups
    check_groups(model, groups, lambda n: model.backbone.get_layer_depth(n, 'backbone.'))
    assert not model.backbone.blocks[1].mlp.fc1.weight.requires_grad  # frozen: in no group
    # 26 ids (stem, 24 blocks, top); frozen_stages=2 leaves ids 3..25: scales RATE**22 .. 1
    assert {round(g['lr_scale'], 12) for g in groups} == {round(RATE ** k, 12) for k in range(23)}
    assert len(groups) <= 2 * 23


def test_constructor_in_mmseg_scope():
    model_cfg = upernet_cfg(CAIT24)
    model_cfg.decode_head.in_channels = PYRAMID_CHANNELS
    model_cfg.auxiliary_head.in_channels = PYRAMID_CHANNELS[2]
    model, wrapper = build_optimizer_in_scope('mmseg', model_cfg, optim_cfg())
    check_groups(model, wrapper.optimizer.param_groups,
                 lambda n: model.backbone.get_layer_depth(n, 'backbone.'))


def classifier_cfg() -> dict:
    return dict(type='ImageClassifier',
                backbone=dict(CAIT24, out_type='cls_token'),
                head=dict(type='LinearClsHead', num_classes=10, in_channels=64))


def test_ours_and_mmpretrains_constructor_agree_in_mmpretrain_scope():
    """mmpretrain's LearningRateDecayOptimWrapperConstructor works on our backbone in its
    ImageClassifier, and gives every parameter the lr and decay that ours gives."""
    model, ours = build_optimizer_in_scope('mmpretrain', classifier_cfg(), optim_cfg())
    check_groups(model, ours.optimizer.param_groups, model.get_layer_depth)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        theirs = build_optim_wrapper(
            model, optim_cfg('LearningRateDecayOptimWrapperConstructor'))
    peer = lr_by_param(model, theirs.optimizer.param_groups)
    mine = lr_by_param(model, ours.optimizer.param_groups)
    assert peer.keys() == mine.keys()
    for name in peer:
        assert mine[name] == pytest.approx(peer[name], rel=1e-12), name
    # theirs: one group per parameter; ours: merged
    assert len(theirs.optimizer.param_groups) == len(peer) > 5 * len(ours.optimizer.param_groups)


def test_custom_keys_lr_mult_and_bias_decay_on_a_bare_swin():
    """A bare backbone: lr_mult multiplies the layer scale, the longest custom key wins over
    the other rules, bias_decay_mult reaches the biases outside norms."""
    swin = mmvit_ext.MODELS.build(dict(type='SwinTransformer', arch=dict(
        embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))))
    wrapper = build_optim_wrapper(swin, optim_cfg(
        layer_decay_rate=RATE, bias_decay_mult=0.0,
        custom_keys={'patch_embed': dict(lr_mult=2.0),
                     'patch_embed.proj.bias': dict(lr_mult=3.0, decay_mult=0.5),
                     'relative_position_bias_table': dict(decay_mult=0.0)}))
    settings = lr_by_param(swin, wrapper.optimizer.param_groups)
    top = RATE ** 9  # 10 ids: patch_embed is layer 0
    assert settings['patch_embed.proj.weight'] == pytest.approx((LR * 2 * top, WD), rel=1e-12)
    assert settings['patch_embed.proj.bias'] == pytest.approx((LR * 3 * top, WD / 2), rel=1e-12)
    assert settings['patch_embed.norm.bias'] == pytest.approx((LR * 2 * top, WD), rel=1e-12)
    assert settings['layers.3.blocks.1.mlp.fc1.bias'][1] == 0.0
    assert settings['layers.3.blocks.1.mlp.fc1.weight'] == pytest.approx((LR * RATE, WD))
    assert settings['layers.0.blocks.0.attn.rel_pos.relative_position_bias_table'][1] == 0.0
    assert settings['norm3.weight'] == (LR, WD)  # no norm_decay_mult given: decayed


def test_bad_settings_raise():
    with pytest.raises(ValueError, match='layer_decay_rate'):
        mmvit_ext.LayerDecayOptimWrapperConstructor(
            dict(optimizer=dict(type='AdamW', lr=LR)), dict(layer_decay_rate=1.5))
    with pytest.raises(ValueError, match='lr_decay'):
        mmvit_ext.LayerDecayOptimWrapperConstructor(
            dict(optimizer=dict(type='AdamW', lr=LR)), dict(lr_decay=0.7))
    with pytest.raises(TypeError, match='get_layer_depth'):
        build_optim_wrapper(nn.Linear(2, 2), optim_cfg(layer_decay_rate=RATE))


def test_readme_groups_of_a_plain_vit_mask_rcnn():
    """The README's figures for its snippet on configs/mask_rcnn_deepvit_s_fpn_1x_coco.py."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    section = (root / 'README.md').read_text().split('### Layer-wise lr decay')[1]
    snippet = re.search(r'```python\n(.*?)```', section, re.S).group(1)
    quoted = re.search(r'has (\d+)\s+layer ids .*? its (\d+) parameters fall into (\d+) groups',
                       ' '.join(section.split()))
    namespace: dict = {}
    exec(snippet, namespace)  # the README's optim_wrapper, as a config holds it
    model_cfg = Config.fromfile(str(root / 'configs/mask_rcnn_deepvit_s_fpn_1x_coco.py')).model
    model_cfg.backbone.init_cfg = None
    model, wrapper = build_optimizer_in_scope('mmdet', model_cfg, namespace['optim_wrapper'])
    groups = wrapper.optimizer.param_groups
    scales = {round(g['lr_scale'], 12) for g in groups}
    assert (len(scales), sum(len(g['params']) for g in groups), len(groups)) == \
        tuple(int(v) for v in quoted.groups())
    assert scales == {round(0.75 ** k, 12) for k in range(len(scales))}
