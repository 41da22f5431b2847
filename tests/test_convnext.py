"""The DINOv3 ConvNeXt: presets and parameter counts, parity with the test-side reference
(tests/convnext_reference.py, the official semantics on the official keys) in both layouts and
through the conversion tool; the init_cfg and load_state_dict paths of both layouts run in
tests/test_layouts.py (layout_peers.convnext_cases)."""
import importlib.util
from pathlib import Path

import pytest
import torch

import mmvit_ext  # noqa: F401
import convnext_reference as ref
from mmvit_ext.backbones.convnext import CONVNEXT_ARCHS, README_PARAMS, ConvNeXt
from mmvit_ext.converters import convert_hf_convnext, convert_official_convnext, save_state_dict
from mmvit_ext.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4
HUB = {names[0]: preset for names, preset in CONVNEXT_ARCHS.items()}


def official_count(dims, depths) -> int:
    """Parameters of the official ConvNeXt from its structure: stem conv + norm, three norm +
    conv downsamplings, per block dwconv 7x7, norm, two linears (4x), gamma; the final norm."""
    count = 3 * 16 * dims[0] + dims[0] + 2 * dims[0]
    count += sum(2 * a + 4 * a * b + b for a, b in zip(dims, dims[1:]))
    count += sum(depth * (50 * d + 2 * d + 8 * d * d + 5 * d + d) for d, depth in zip(dims, depths))
    return count + 2 * dims[-1]


@pytest.mark.parametrize('name', sorted(README_PARAMS))
def test_hub_archs_have_the_official_widths_and_parameter_counts(name):
    with torch.device('meta'):
        model = ConvNeXt(arch=name, out_norm=True)
    dims, depths = HUB[name]['embed_dims'], HUB[name]['depths']
    assert model.out_channels == dims and model.strides == (4, 8, 16, 32)
    assert [len(stage.blocks) for stage in model.layers] == list(depths)
    count = sum(p.numel() for p in model.parameters())
    assert count == official_count(dims, depths)
    # the README's rounded figures are the ConvNeXt paper's, with its 1000-class head
    head = dims[-1] * 1000 + 1000
    assert abs((count + head) / 1e6 - README_PARAMS[name]) <= 0.5, count
    short = name.rsplit('_', 1)[1]
    assert ConvNeXt.resolve_arch(short) == ConvNeXt.resolve_arch(short[0]) == HUB[name]


@pytest.mark.parametrize('norm', [False, True])
def test_official_layout_equals_the_reference(norm):
    official = ref.official_state_dict(**ref.TINY, seed=1)
    model = ConvNeXt(arch=dict(ref.TINY), out_norm=norm).eval()
    model.load_state_dict(official)  # strict: every key placed (norms.3 is norm, saved twice)
    assert 'official DINOv3 ConvNeXt' in model.load_report.layout
    assert not any(k.startswith('norms.') for k in convert_official_convnext(official))
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        got, want = model(x), ref.intermediate_layers(official, x, norm=norm)
    assert [o.shape[1:] for o in got] == [(16, 16, 24), (24, 8, 12), (32, 4, 6), (48, 2, 3)]
    diff = max((a - b).abs().max().item() for a, b in zip(got, want))
    assert diff <= TOL, diff
    assert (got[-1] - ref.intermediate_layers(official, x, norm=not norm)[-1]).abs().max() > 0.1


def test_transformers_layout_equals_the_official_and_converters_are_idempotent():
    official = ref.official_state_dict(**ref.TINY, seed=2)
    hf = ref.official_to_hf(official)
    ours = convert_official_convnext(official)
    assert convert_hf_convnext(hf) == ours
    assert convert_hf_convnext({'dinov3_convnext.' + k: v for k, v in hf.items()}) == ours
    assert convert_official_convnext(ours) == ours and convert_hf_convnext(ours) == ours
    assert 'layers.3.downsample.proj.weight' in ours and 'layers.0.downsample.norm.bias' in ours
    assert ours['layers.2.blocks.1.ls.gamma'] is official['stages.2.1.gamma']


def test_out_norm_needs_the_last_stage_and_early_stages_drop_the_rest(tmp_path):
    with pytest.raises(ConfigError, match='out_norm'):
        ConvNeXt(arch=dict(ref.TINY), out_indices=(0, 1), out_norm=True)
    early = ConvNeXt(arch=dict(ref.TINY), out_indices=(1,))
    early.load_state_dict(ref.official_state_dict(**ref.TINY))
    assert len(early.layers) == 2 and early.norm is None
    assert any(k.startswith('layers.3.') for k in early.load_report.dropped)
    assert 'norm.weight' in early.load_report.dropped


def test_convert_tool_writes_ours_and_load_checks_it(tmp_path):
    spec = importlib.util.spec_from_file_location('convert_checkpoint',
                                                  ROOT / 'tools/convert_checkpoint.py')
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    official = ref.official_state_dict(**ref.TINY, seed=3)
    save_state_dict(official, tmp_path / 'hub.pth')
    summary = tool.convert(str(tmp_path / 'hub.pth'), str(tmp_path / 'ours.pth'))
    assert 'detected layout: official DINOv3 ConvNeXt' in summary
    assert 'load-checked' in summary and 'ConvNeXt' in summary, summary
    model = ConvNeXt(arch=dict(ref.TINY), out_norm=True,
                     init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'ours.pth')))
    model.init_weights()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        got, want = model.eval()(x), ref.intermediate_layers(official, x, norm=True)
    assert max((a - b).abs().max().item() for a, b in zip(got, want)) <= TOL
