"""PVTv2: official-checkpoint conversion, parity with timm, paper parameter counts."""
import pytest
import torch

from mmvit_ext.backbones import PyramidVisionTransformerV2
from mmvit_ext.converters import CheckpointError, convert_official_pvtv2
from official_layouts import official_pvtv2_state_dict, official_swin_state_dict

import timm  # test-only reference, installed by tools/setup_env.sh


@pytest.mark.parametrize('arch,linear', [('b2', False), ('b2_li', True)])
def test_official_checkpoint_matches_timm_reference(arch, linear, tmp_path):
    """Official layout -> our converter vs timm's converter: same stage outputs (<= 1e-4)."""
    from timm.models.pvt_v2 import checkpoint_filter_fn
    official = official_pvtv2_state_dict(linear=linear)
    path = tmp_path / f'pvt_v2_{arch}.pth'
    torch.save(official, path)
    ours = PyramidVisionTransformerV2(arch, drop_path_rate=0.0,
                                      init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    ours.init_weights()
    ours.eval()
    ref = timm.create_model(f'pvt_v2_{arch}', pretrained=False).eval()
    ref.load_state_dict(checkpoint_filter_fn(dict(official), ref))
    x = torch.randn(2, 3, 160, 224)
    with torch.no_grad():
        feats = ours(x)
        y = ref.patch_embed(x)
        diffs = []
        for feat, stage in zip(feats, ref.stages):
            y = stage(y)
            diffs.append((feat - y).abs().max().item())
    print(f'pvt_v2_{arch} parity max-abs-diff per level: {diffs}')
    assert max(diffs) <= 1e-4


def test_converter_maps_every_key_and_is_idempotent():
    official = official_pvtv2_state_dict(depths=(1, 1, 1, 1))
    converted = convert_official_pvtv2(official)
    model = PyramidVisionTransformerV2(dict(embed_dims=(64, 128, 320, 512), depths=(1, 1, 1, 1),
                                            num_heads=(1, 2, 5, 8)))
    assert set(converted) == set(model.state_dict())
    assert torch.equal(converted['layers.2.blocks.0.mlp.dwconv.weight'],
                       official['block3.0.mlp.dwconv.dwconv.weight'])
    again = convert_official_pvtv2(converted)
    assert again.keys() == converted.keys() and all(again[k] is converted[k] for k in again)


@pytest.mark.parametrize('arch,paper_m', [('b0', 3.7), ('b1', 14.0), ('b2', 25.4), ('b2_li', 22.6),
                                          ('b3', 45.2), ('b4', 62.6), ('b5', 82.0)])
def test_param_counts_match_paper(arch, paper_m):
    model = PyramidVisionTransformerV2(arch)
    count = sum(p.numel() for p in model.parameters()) + (model.out_channels[-1] + 1) * 1000
    print(f'pvt_v2_{arch}: {count / 1e6:.2f} M')
    assert abs(count / 1e6 - paper_m) < 0.05
    ref = timm.create_model(f'pvt_v2_{arch}', pretrained=False)
    assert count == sum(p.numel() for p in ref.parameters())


def test_linear_sra_pools_to_7x7_at_any_size():
    model = PyramidVisionTransformerV2(dict(embed_dims=(16, 32, 40, 64), depths=(1, 1, 1, 1),
                                            num_heads=(1, 2, 5, 8), linear=True)).eval()
    attn = model.layers[0].blocks[0].attn
    for size in ((64, 64), (200, 96)):
        tokens = torch.randn(1, (size[0] // 4) * (size[1] // 4), 16)
        assert attn.reduce(tokens, (size[0] // 4, size[1] // 4)).shape == (1, 49, 16)
    mlp = model.layers[0].blocks[0].mlp
    assert mlp.linear  # ReLU after fc1: negative pre-activations never reach the dwconv
    with torch.no_grad():
        mlp.fc1.bias.fill_(-100.0)
        mlp.dwconv.bias.zero_()
        out = mlp(torch.randn(1, 16, 16), (4, 4))
    torch.testing.assert_close(out, mlp.fc2.bias.expand_as(out))


def test_swin_checkpoint_is_refused_by_pvt(tmp_path):
    path = tmp_path / 'swin.pth'
    torch.save({'model': official_swin_state_dict(depths=(1, 1, 1, 1))}, path)
    model = PyramidVisionTransformerV2('b0', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match=r'official Swin.*loads \'pvtv2\''):
        model.init_weights()


def test_export_is_the_inverse_of_convert():
    from mmvit_ext.converters import export_official_pvtv2
    official = official_pvtv2_state_dict(depths=(1, 2, 1, 1), linear=True)
    kept = {k: v for k, v in official.items() if not k.startswith('head.')}
    exported = export_official_pvtv2(convert_official_pvtv2(official))
    assert exported.keys() == kept.keys() and all(exported[k] is kept[k] for k in kept)
