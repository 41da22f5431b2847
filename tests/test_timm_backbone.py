"""TimmBackbone: timm's own feature maps from the same weights (a timm checkpoint file loaded
through init_cfg / checkpoint_path), mmpretrain's TIMMBackbone swapped by ``type=``, freezing,
layer decay, and errors that name the argument. The contract suite covers it through
tests/backbone_cases.py. Tiny models; budget ~15 s."""
import sys

import pytest
import timm  # noqa: F401  (test-only dependency, pinned in requirements/dev.txt)
import torch

from mmvit_ext.backbones import TimmBackbone
from mmvit_ext.converters import save_state_dict
from mmvit_ext.converters.timm_models import TIMM
from mmvit_ext.errors import ConfigError
from layout_peers import build_in_scope, randomise

VIT = dict(embed_dim=32, depth=4, num_heads=2, img_size=64, dynamic_img_size=True,
           dynamic_img_pad=True)


def _timm_file(tmp_path, name, suffix='.pth', **kwargs):
    """A whole timm classifier with random weights (BatchNorm statistics too), saved as a user
    holds it; returns (path, state dict)."""
    model = randomise(timm.create_model(name, pretrained=False, **kwargs))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    path = tmp_path / f'{name}{suffix}'
    save_state_dict(model.state_dict(), path)
    return path, model.state_dict()


def _features_only(name, path, **kwargs):
    """timm's own features_only model with the file loaded by timm (into the whole model, before
    its feature wrapper is made; from the local file, no download)."""
    return timm.create_model(name, pretrained=True, features_only=True,
                             pretrained_cfg_overlay=dict(file=str(path), custom_load=False),
                             **kwargs).eval()


def _same_maps(ours, theirs, x):
    with torch.no_grad():
        got, want = ours.eval()(x), theirs(x)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.equal(a, b)
    return got


def test_resnet18_equals_timm_features_only(tmp_path):
    path, state = _timm_file(tmp_path, 'resnet18')
    reference = _features_only('resnet18', path, out_indices=(1, 2))
    model = TimmBackbone(model_name='resnet18', out_indices=(1, 2),
                         init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    report = model.load_report
    assert report.layout == TIMM and report.missing == [] and report.unexpected == []
    assert 'timm_model.fc.weight' in report.dropped  # the classifier, and layers 3-4 not built
    assert 'timm_model.layer4.1.bn2.running_var' in report.dropped
    outs = _same_maps(model, reference, torch.randn(2, 3, 97, 131))
    assert [tuple(o.shape[1:]) for o in outs] == model.output_shapes(97, 131) == \
        [(64, 25, 33), (128, 13, 17)]
    assert model.strides == (4, 8) and model.out_channels == (64, 128)


def test_vit_equals_timm_forward_intermediates(tmp_path):
    """A file through mmpretrain's ``checkpoint_path``; negative out_indices; odd sizes."""
    path, state = _timm_file(tmp_path, 'vit_tiny_patch16_224', '.safetensors', **VIT)
    reference = _features_only('vit_tiny_patch16_224', path, out_indices=(1, 3), **VIT)
    model = TimmBackbone(model_name='vit_tiny_patch16_224', checkpoint_path=str(path),
                         out_indices=(1, -1), **VIT)
    model.init_weights()
    assert model.load_report.missing == [] and model.load_report.unexpected == []
    assert {'timm_model.norm.weight', 'timm_model.head.weight'} <= set(model.load_report.dropped)
    for size in ((64, 64), (75, 113)):
        outs = _same_maps(model, reference, torch.randn(1, 3, *size))
        assert [tuple(o.shape[1:]) for o in outs] == model.output_shapes(*size)
    blocks = timm.create_model('vit_tiny_patch16_224', **VIT).eval()
    blocks.load_state_dict(state)
    with torch.no_grad():
        timm_maps = blocks.forward_intermediates(torch.ones(1, 3, 48, 80), indices=[1, 3],
                                                 intermediates_only=True)
        assert all(torch.equal(a, b) for a, b in zip(model(torch.ones(1, 3, 48, 80)), timm_maps))


def test_model_without_forward_intermediates_uses_features_only(tmp_path, monkeypatch):
    from timm.models.ghostnet import GhostNet
    if hasattr(GhostNet, 'forward_intermediates'):  # newer timm (1.0.31) gives every model one
        monkeypatch.delattr(GhostNet, 'forward_intermediates')
    path, state = _timm_file(tmp_path, 'ghostnet_050')
    reference = _features_only('ghostnet_050', path, out_indices=(2, 4))
    model = TimmBackbone(model_name='ghostnet_050', out_indices=(2, 4),
                         init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert model.load_report.missing == [] and model.load_report.unexpected == []
    assert model.strides == (8, 32)
    _same_maps(model, reference, torch.randn(1, 3, 71, 90))
    with pytest.raises(ConfigError, match='frozen_stages / with_cp need'):
        TimmBackbone(model_name='ghostnet_050', frozen_stages=1)


def test_mmpretrain_config_swaps_by_type():
    """A config written for mmpretrain's TIMMBackbone builds ours after changing only ``type``;
    its weights (``timm_model.*``) load into ours; ours returns maps where mmpretrain returns a
    ViT's token sequence."""
    cfg = dict(model_name='resnet18', features_only=True, pretrained=False,
               checkpoint_path='', in_channels=3, out_indices=(1, 2, 3))
    theirs = build_in_scope('mmpretrain', dict(type='mmpretrain.TIMMBackbone', **cfg))
    randomise(theirs)
    ours = build_in_scope('mmdet', dict(type='mmvit_ext.TimmBackbone', **cfg))
    ours.load_state_dict(theirs.state_dict())
    _same_maps(ours, theirs, torch.randn(1, 3, 64, 96))
    vit = dict(model_name='vit_tiny_patch16_224', features_only=False, **VIT)
    tokens = build_in_scope('mmpretrain', dict(type='mmpretrain.TIMMBackbone', **vit))(
        torch.randn(1, 3, 64, 96))
    maps = build_in_scope('mmdet', dict(type='mmvit_ext.TimmBackbone', **vit))(
        torch.randn(1, 3, 64, 96))
    assert tokens[0].dim() == 3 and [tuple(m.shape) for m in maps] == [(1, 32, 4, 6)]


def test_frozen_stages_and_norm_eval():
    model = TimmBackbone(model_name='resnet18', features_only=True, frozen_stages=2,
                         norm_eval=True).train()
    sum(o.mean() for o in model(torch.randn(2, 3, 64, 64))).backward()
    frozen = ('conv1.', 'bn1.', 'layer1.', 'layer2.')
    for name, param in model.timm_model.named_parameters():
        assert param.requires_grad == (not name.startswith(frozen)), name
        assert (param.grad is None) == name.startswith(frozen), name
    assert not model.timm_model.layer2.training and model.timm_model.layer3.training
    assert not model.timm_model.layer3[0].bn1.training  # norm_eval


def test_layer_decay_groups_follow_group_matcher():
    model = TimmBackbone(model_name='resnet18', features_only=True)
    depth = model.get_layer_depth
    assert depth('timm_model.conv1.weight') == (0, 10)
    assert depth('timm_model.layer1.0.conv1.weight') == (1, 10)
    assert depth('timm_model.layer4.1.bn2.bias') == (8, 10)
    assert depth('backbone.neck.x', prefix='backbone.') == (9, 10)


def test_bad_arguments_name_the_argument(monkeypatch):
    with pytest.raises(ConfigError, match="unknown model_name 'resnet_nope'"):
        TimmBackbone(model_name='resnet_nope')
    with pytest.raises(ConfigError, match='pretrained=True needs a local file'):
        TimmBackbone(model_name='resnet18', pretrained=True)
    with pytest.raises(TypeError, match='pretrained must be True or False'):
        TimmBackbone(model_name='resnet18', pretrained='resnet18.pth')
    with pytest.raises(ConfigError, match='checkpoint_path=.* and init_cfg'):
        TimmBackbone(model_name='resnet18', checkpoint_path='a.pth',
                     init_cfg=dict(type='Pretrained', checkpoint='b.pth'))
    with pytest.raises(ConfigError, match='in_chans is set by TimmBackbone'):
        TimmBackbone(model_name='resnet18', in_chans=4)
    with pytest.raises(ValueError, match='out_indices entry 5'):
        TimmBackbone(model_name='resnet18', out_indices=(1, 5))
    with pytest.raises(ConfigError, match='frozen_stages=5 is out of range'):
        TimmBackbone(model_name='resnet18', frozen_stages=5)
    with pytest.raises(TypeError, match='unexpected keyword argument'):
        TimmBackbone(model_name='resnet18', not_a_timm_argument=1)
    monkeypatch.setitem(sys.modules, 'timm', None)
    with pytest.raises(ImportError, match='TimmBackbone needs timm'):
        TimmBackbone(model_name='resnet18')


@pytest.mark.parametrize('part', ['block', 'attn'])
def test_checkpointed_timm_backbone_survives_save_load_and_deepcopy(tmp_path, part):
    """``torch.save`` of the whole module, ``torch.load(weights_only=False)`` and
    ``copy.deepcopy`` give back the checkpointed classes, the same outputs and gradients."""
    import copy
    from mmvit_ext.layers import CheckpointedCall
    torch.manual_seed(0)
    model = TimmBackbone(model_name='vit_tiny_patch16_224', **VIT, out_indices=(1, 3),
                         with_cp=dict(part=part)).train()
    x = torch.randn(2, 3, 64, 64)
    model(x)  # with_cp is applied at the first call
    kinds = {type(m).__name__ for m in model.modules() if isinstance(m, CheckpointedCall)}
    assert kinds == ({'CheckpointedBlock'} if part == 'block' else {'CheckpointedAttention'})
    path = tmp_path / 'whole.pt'
    torch.save(model, path)
    copies = {'torch.load': torch.load(path, weights_only=False), 'deepcopy': copy.deepcopy(model)}
    want = model(x)
    sum(m.square().mean() for m in want).backward()
    for how, other in copies.items():
        assert {type(m).__name__ for m in other.modules()
                if isinstance(m, CheckpointedCall)} == kinds, how
        assert str(other) == str(model), how
        got = other(x)
        sum(m.square().mean() for m in got).backward()
        for a, b in zip(got, want):
            assert torch.equal(a, b), how
        for (name, p), q in zip(model.named_parameters(), other.parameters()):
            assert torch.equal(p.grad, q.grad), (how, name)


def test_groups_come_from_timms_public_api():
    """No private timm module; every parameter a matcher names is in a group, in timm's order,
    and names it does not match (the top) are in none."""
    import inspect
    from mmvit_ext.backbones import timm_backbone
    assert 'timm.models._' not in inspect.getsource(timm_backbone)
    model = TimmBackbone(model_name='vit_tiny_patch16_224', **VIT, out_indices=(3,),
                         out_norm=True)
    stages = model.stage_groups
    assert len(stages) == 5 and len(model.block_groups) == 5  # stem + 4 blocks
    assert 'timm_model.cls_token' in stages[0] and 'timm_model.norm.weight' in stages[4]
    assert {n for names in stages.values() for n in names} == \
        {f'timm_model.{n}' for n, _ in model.timm_model.named_parameters()}
    matcher = dict(stem=r'^cls_token|pos_embed', blocks=[(r'^blocks\.(\d+)', None),
                                                          (r'^norm', (99999,))], head=None)
    assert [timm_backbone._matches(matcher, n) for n in
            ('pos_embed', 'blocks.3.attn.qkv.weight', 'norm.bias', 'head.weight')] == \
        [True, True, True, False]
    assert timm_backbone._matches(lambda name: (0,), 'head.weight')  # a callable places all
