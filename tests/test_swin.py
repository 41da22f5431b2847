"""Swin: official-checkpoint conversion, parity with timm, paper parameter counts."""
import pytest
import torch

from mmvit_ext.backbones import SwinTransformer
from mmvit_ext.converters import CheckpointError, convert_official_swin
from official_layouts import official_swin_state_dict

import timm  # test-only reference, installed by tools/setup_env.sh

ARCHS = {'tiny': (96, (2, 2, 6, 2), (3, 6, 12, 24)), 'small': (96, (2, 2, 18, 2), (3, 6, 12, 24)),
         'base': (128, (2, 2, 18, 2), (4, 8, 16, 32))}


def _save_official(tmp_path, **kwargs):
    path = tmp_path / 'swin_official.pth'
    torch.save({'model': official_swin_state_dict(**kwargs)}, path)
    return path


def test_official_checkpoint_matches_timm_reference(tmp_path):
    """Official layout -> our converter vs timm's own converter: same features (<= 1e-4)."""
    from timm.models.swin_transformer import checkpoint_filter_fn
    official = official_swin_state_dict()
    path = tmp_path / 'swin_tiny_patch4_window7_224.pth'
    torch.save({'model': official}, path)
    ours = SwinTransformer('tiny', drop_path_rate=0.0,
                           init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    ours.init_weights()
    ours.eval()
    ref = timm.create_model('swin_tiny_patch4_window7_224', pretrained=False).eval()
    ref.load_state_dict(checkpoint_filter_fn(dict(official), ref))
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        feats = ours(x)
        ref_feats = ref.forward_intermediates(x, norm=False, intermediates_only=True)
        diffs = []
        for i, (a, b) in enumerate(zip(feats, ref_feats)):
            b = getattr(ours, f'norm{i}')(b.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            diffs.append((a - b).abs().max().item())
    print(f'swin-t parity max-abs-diff per level: {diffs}')
    assert max(diffs) <= 1e-4


def test_final_norm_and_buffers_are_mapped():
    official = official_swin_state_dict(depths=(2, 2, 2, 2))
    converted = convert_official_swin(official)
    assert torch.equal(converted['norm3.weight'], official['norm.weight'])
    assert not any(k.startswith('head.') or k.endswith(('attn_mask', 'relative_position_index'))
                   for k in converted)
    assert 'layers.0.blocks.0.attn.rel_pos.relative_position_bias_table' in converted
    model_keys = set(SwinTransformer(dict(embed_dims=96, depths=(2, 2, 2, 2),
                                          num_heads=(3, 6, 12, 24))).state_dict())
    assert set(converted) - model_keys == set()
    assert model_keys - set(converted) == {f'norm{i}.{p}' for i in range(3) for p in ('weight', 'bias')}


def test_converter_is_idempotent():
    once = convert_official_swin(official_swin_state_dict(depths=(1, 1, 1, 1)))
    twice = convert_official_swin(once)
    assert once.keys() == twice.keys()
    assert all(once[k] is twice[k] for k in once)


def test_window12_model_loads_window7_checkpoint_with_resized_tables(tmp_path):
    path = _save_official(tmp_path, depths=(1, 1, 2, 1))
    model = SwinTransformer(dict(embed_dims=96, depths=(1, 1, 2, 1), num_heads=(3, 6, 12, 24)),
                            window_size=12, pretrain_img_size=384,
                            init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    from mmvit_ext.converters import load_pretrained
    report = load_pretrained(model, path)
    assert len(report.resized) == 5 and all(k.endswith('bias_table') for k in report.resized)
    assert model.layers[0].blocks[0].attn.rel_pos.relative_position_bias_table.shape == (23 * 23, 3)
    assert report.missing == [f'norm{i}.{p}' for i in range(3) for p in ('bias', 'weight')]
    assert report.unexpected == []


def test_checkpoint_of_another_family_is_refused(tmp_path):
    path = tmp_path / 'pvt_v2_b2.pth'
    torch.save({'block1.0.attn.q.weight': torch.zeros(64, 64),
                'patch_embed1.proj.weight': torch.zeros(64, 3, 7, 7)}, path)
    model = SwinTransformer('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match=r'official PVTv2.*SwinTransformer loads \'swin\''):
        model.init_weights()


def test_mismatched_arch_checkpoint_names_the_keys(tmp_path):
    path = _save_official(tmp_path, embed_dims=128, depths=(2, 2, 6, 2), num_heads=(4, 8, 16, 32))
    model = SwinTransformer('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match=r'shape mismatches.*patch_embed.proj.weight'):
        model.init_weights()


@pytest.mark.parametrize('arch,paper_m,timm_name', [
    ('tiny', 28, 'swin_tiny_patch4_window7_224'), ('small', 50, 'swin_small_patch4_window7_224'),
    ('base', 88, 'swin_base_patch4_window7_224')])
def test_param_counts_match_paper_and_timm(arch, paper_m, timm_name):
    """Classification count = backbone with its final norm + a 1000-class linear head."""
    model = SwinTransformer(arch, out_indices=(3,))
    last = model.out_channels[0]
    count = sum(p.numel() for p in model.parameters()) + last * 1000 + 1000
    ref = timm.create_model(timm_name, pretrained=False)
    print(f'swin-{arch}: {count / 1e6:.2f} M')
    assert count == sum(p.numel() for p in ref.parameters())
    assert round(count / 1e6) == paper_m


@pytest.mark.parametrize('size', [(3, 3), (4, 4), (20, 9), (31, 200)])
def test_maps_smaller_than_window_and_odd_sizes(size):
    model = SwinTransformer(dict(embed_dims=16, depths=(1, 2, 1, 1), num_heads=(1, 2, 2, 4)),
                            window_size=7).eval()
    x = torch.randn(1, 3, *size)
    if min(size) < 4:
        with pytest.raises(ValueError, match='at least 4x4'):
            model(x)
        return
    outs = model(x)
    assert [tuple(o.shape[1:]) for o in outs] == model.output_shapes(*size)
    assert all(torch.isfinite(o).all() for o in outs)


def test_downstream_swin_registrations_untouched():
    import mmvit_ext  # noqa: F401
    from mmdet.registry import MODELS as DET
    from mmpretrain.registry import MODELS as PRE
    from mmseg.registry import MODELS as SEG
    import mmdet.models  # noqa: F401
    import mmpretrain.models  # noqa: F401
    import mmseg.models  # noqa: F401
    for registry, module in ((DET, 'mmdet'), (SEG, 'mmseg'), (PRE, 'mmpretrain')):
        assert registry.get('SwinTransformer').__module__.startswith(module)
        assert registry.get('mmvit_ext.SwinTransformer') is SwinTransformer


def test_export_is_the_inverse_of_convert():
    from mmvit_ext.converters import export_official_swin
    official = official_swin_state_dict(depths=(1, 1, 2, 1))
    kept = {k: v for k, v in official.items()
            if not k.startswith('head.') and not k.endswith(('attn_mask', 'relative_position_index'))}
    exported = export_official_swin(convert_official_swin(official))
    assert exported.keys() == kept.keys() and all(exported[k] is kept[k] for k in kept)
