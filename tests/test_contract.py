"""The backbone contract, run over every backbone in the mmvit_ext registry."""
import math

import pytest
import torch

from mmvit_ext.converters import CheckpointError
from mmvit_ext.registry import MODELS
from backbone_cases import CASES, LARGE_SIZE_OK, SMALL

SIZES = [(112, 137), (224, 224), (513, 769)]


def _registered():
    MODELS.import_from_location()
    return sorted(MODELS.module_dict)


def _build(name, **cfg):
    return MODELS.build(dict(type=f'mmvit_ext.{name}', **cfg))


def test_every_registered_backbone_has_cases():
    registered = _registered()
    assert registered, 'no backbone registered in the mmvit_ext scope'
    assert set(registered) <= set(CASES), f'no contract cases for {set(registered) - set(CASES)}'


SHAPE_CASES = [(name, i, size) for name, cases in CASES.items() for i in range(len(cases))
               for size in SIZES if size != (513, 769) or (name, i) in LARGE_SIZE_OK]


@pytest.mark.parametrize('name,case,size', SHAPE_CASES)
def test_output_shapes_match_contract(name, case, size):
    model = _build(name, **CASES[name][case]).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    assert isinstance(outs, tuple) and len(outs) == len(model.out_channels)
    assert len(model.out_channels) == len(model.strides) == len(outs)
    for out, channels, stride in zip(outs, model.out_channels, model.strides):
        assert out.shape == (1, channels, math.ceil(size[0] / stride), math.ceil(size[1] / stride))
        assert torch.isfinite(out).all()
    assert [tuple(o.shape[1:]) for o in outs] == model.output_shapes(*size)


@pytest.mark.parametrize('name', sorted(CASES))
def test_out_indices_subset_and_negative(name):
    model = _build(name, **SMALL[name], out_indices=(-1, 1)).eval()
    full = _build(name, **SMALL[name]).eval()
    full.load_state_dict(model.state_dict(), strict=False)
    assert model.out_indices == (1, full.num_outputs - 1)  # sorted, shallow to deep
    outs = model(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [full.level_channels[1], full.level_channels[-1]]


@pytest.mark.parametrize('name', sorted(CASES))
def test_frozen_stages_freeze_params_and_modes(name):
    model = _build(name, **SMALL[name], frozen_stages=1, drop_path_rate=0.0)
    model.train()
    frozen = model.frozen_modules()
    assert frozen, 'frozen_stages=1 froze nothing'
    frozen_params = {id(p) for m in frozen for p in m.parameters()}
    frozen_params |= {id(p) for p in model.frozen_parameters()}
    assert all(not sub.training for mod in frozen for sub in mod.modules())
    sum(o.sum() for o in model(torch.randn(2, 3, 64, 64))).backward()
    for pname, param in model.named_parameters():
        if id(param) in frozen_params:
            assert not param.requires_grad and param.grad is None, pname
        elif param.requires_grad:
            assert param.grad is not None, f'{pname} got no gradient'
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert 0 < len(trainable) < len(list(model.parameters()))


@pytest.mark.parametrize('name', sorted(CASES))
def test_with_cp_same_outputs_and_grads(name):
    plain = _build(name, **SMALL[name], drop_path_rate=0.0).train()
    ckpt = _build(name, **SMALL[name], drop_path_rate=0.0, with_cp=True).train()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 72, 56)
    outs_a, outs_b = plain(x), ckpt(x)
    for a, b in zip(outs_a, outs_b):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    sum((o ** 2).mean() for o in outs_a).backward()
    sum((o ** 2).mean() for o in outs_b).backward()
    grads_b = dict(ckpt.named_parameters())
    for pname, param in plain.named_parameters():
        torch.testing.assert_close(param.grad, grads_b[pname].grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
@pytest.mark.parametrize('name', sorted(CASES))
def test_builds_through_downstream_registries(scope, name):
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    model = registry.build(dict(type=f'mmvit_ext.{name}', **SMALL[name]))
    assert type(model) is MODELS.get(name)


@pytest.mark.parametrize('suffix', ['.pth', '.safetensors'])
@pytest.mark.parametrize('name', sorted(CASES))
def test_state_dict_roundtrip_through_init_cfg(name, suffix, tmp_path):
    from mmvit_ext.converters import save_state_dict
    source = _build(name, **SMALL[name]).eval()
    path = tmp_path / f'weights{suffix}'
    save_state_dict(source.state_dict(), path)
    target = _build(name, **SMALL[name], init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    target.init_weights()
    target.eval()
    for key, value in source.state_dict().items():
        assert torch.equal(value, target.state_dict()[key]), key
    x = torch.randn(1, 3, 48, 40)
    for a, b in zip(source(x), target(x)):
        assert torch.equal(a, b)


@pytest.mark.parametrize('name', sorted(CASES))
def test_bad_arguments_raise_clear_errors(name):
    cls = MODELS.get(name)
    with pytest.raises(ValueError, match="unknown arch 'nope'"):
        cls(arch='nope')
    with pytest.raises(ValueError, match='missing keys'):
        cls(arch={})
    with pytest.raises(ValueError, match='out_indices entry 99'):
        cls(**SMALL[name], out_indices=(0, 99))
    with pytest.raises(ValueError, match='duplicates'):
        cls(**SMALL[name], out_indices=(1, 1))
    with pytest.raises(ValueError, match='frozen_stages=99'):
        cls(**SMALL[name], frozen_stages=99)
    model = cls(**SMALL[name]).eval()
    with pytest.raises(ValueError, match='in_channels=3 but the input has 4 channels'):
        model(torch.randn(1, 4, 64, 64))
    with pytest.raises(ValueError, match='expects a'):
        model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match='at least'):
        model(torch.randn(1, 3, 2, 64))


@pytest.mark.parametrize('name', sorted(CASES))
def test_checkpoint_of_unknown_layout_is_refused(name, tmp_path):
    path = tmp_path / 'other.pth'
    torch.save({'state_dict': {'foo.weight': torch.zeros(2), 'bar.bias': torch.zeros(2)}}, path)
    model = _build(name, **SMALL[name], init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match='shares no key'):
        model.init_weights()
