"""ViT-Adapter against an independent reference of the official code (tests/vit_adapter_reference.py,
official module and parameter names, nothing of mmvit_ext): its state dict loads into ours through
the normal load path (layout detection and conversion), and both compute the same maps in both
forms (detection: the last ViT map on every level; segmentation: interaction i's on level i),
with the official windows (q, k, v zero-padded to whole 14 x 14 windows) at grids that are and
are not multiples of 14. Also the init, on the tiny model and on a shipped config's backbone.
Budget: a few seconds on the 2-core CPU, plus ~10 s for the shipped ViT-Adapter-S."""
from pathlib import Path

import pytest
import torch

from mmvit_ext.backbones import ViTAdapter
from mmvit_ext.layers import MSDeformAttn
from vit_adapter_reference import MSDeformAttn as ReferenceAttn
from vit_adapter_reference import ViTAdapterReference

ROOT = Path(__file__).resolve().parents[1]
INDEXES = [[0, 0], [1, 1], [2, 2], [3, 3]]
# the official detection configs' windows (global every third block), in 4 blocks
WINDOWS = [14, 14, None, 14]
FORMS = {  # form -> (reference options, our options), as the official configs set them
    'detection': (dict(window_size=WINDOWS, deform_ratio=1.0),
                  dict(window_size=14, global_blocks=(2,), deform_ratio=1.0,
                       vit_features='final')),
    'segmentation': (dict(window_size=[None] * 4, deform_ratio=0.5, segmentation=True),
                     dict(window_size=None, deform_ratio=0.5, vit_features='per_interaction')),
    # the segmentation form with windows: both choices at once
    'segmentation_windows': (dict(window_size=WINDOWS, deform_ratio=1.0, segmentation=True),
                             dict(window_size=14, global_blocks=(2,), deform_ratio=1.0,
                                  vit_features='per_interaction')),
}
SIZES = [(160, 192), (256, 320), (224, 224)]  # grids 10x12 and 16x20 (no multiples of 14), 14x14


def _reference(form: str) -> ViTAdapterReference:
    return ViTAdapterReference(embed_dim=48, depth=4, num_heads=3, interaction_indexes=INDEXES,
                               conv_inplane=8, n_points=4, deform_num_heads=3, **FORMS[form][0])


def _ours(form: str, **kwargs) -> ViTAdapter:
    return ViTAdapter(arch=dict(embed_dims=48, depth=4, num_heads=3), conv_inplane=8,
                      n_points=4, deform_num_heads=3, interaction_indexes=INDEXES,
                      drop_path_rate=0.0, **FORMS[form][1], **kwargs)


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight and BatchNorm statistic moved off its init, so that every path counts
    (the zero injector gammas, the zero offset / attention-weight projections ...)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.add_(noise * (0.3 if name.endswith('.gamma') else 0.05))
        for name, buffer in model.named_buffers():
            if name.endswith('running_mean'):
                buffer.copy_(torch.randn(buffer.shape, generator=gen) * 0.1)
            elif name.endswith('running_var'):
                buffer.copy_(torch.rand(buffer.shape, generator=gen) + 0.5)
    return model.eval()


@pytest.fixture(scope='module')
def loaded(tmp_path_factory):
    """form -> (reference, ours loaded from the reference's official state dict)."""
    pairs = {}
    for index, form in enumerate(FORMS):
        torch.manual_seed(index)
        reference = _perturbed(_reference(form), seed=index)
        path = tmp_path_factory.mktemp(form) / 'official_vit_adapter.pth'
        # as an official detector / segmentor file holds it
        torch.save({'state_dict': {f'backbone.{k}': v for k, v in
                                   reference.state_dict().items()}}, path)
        ours = _ours(form, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
        ours.init_weights()
        assert ours.load_report.layout.startswith('official ViT-Adapter')
        pairs[form] = (reference, ours.eval())
    return pairs


@pytest.mark.parametrize('size', SIZES, ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('form', list(FORMS))
def test_outputs_equal_the_official_reference(loaded, form, size):
    reference, ours = loaded[form]
    image = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected, got = reference(image), ours(image)
    assert len(got) == 4
    errors = []
    for level, (a, b) in enumerate(zip(expected, got)):
        assert a.shape == b.shape == (1, 48, size[0] // 4 // 2 ** level, size[1] // 4 // 2 ** level)
        assert a.abs().max() > 0.1  # the maps carry signal
        errors.append((a - b).abs().max().item())
    print(f'{form} {size}: max abs difference per level {["%.1e" % e for e in errors]}')
    assert max(errors) <= 1e-4, errors


def test_the_forms_and_windows_matter(loaded):
    """The comparison above can tell the forms and the window paddings apart."""
    image = torch.randn(1, 3, 160, 192, generator=torch.Generator().manual_seed(3))
    reference, ours = loaded['detection']
    with torch.no_grad():
        expected = reference(image)
        ours.vit_features = 'per_interaction'
        wrong_form = ours(image)
        ours.vit_features = 'final'
        for block in ours.blocks:
            if block.attn.window_size is not None:
                block.attn.set_padding('tokens')  # ViTDet's: padded tokens, a shrunk window
        wrong_windows = ours(image)
        for block in ours.blocks:
            if block.attn.window_size is not None:
                block.attn.set_padding('qkv')
        right = ours(image)
    assert max((a - b).abs().max() for a, b in zip(expected, right)) <= 1e-4
    assert max((a - b).abs().max() for a, b in zip(expected, wrong_form)) > 1e-2
    assert max((a - b).abs().max() for a, b in zip(expected, wrong_windows)) > 1e-2


def _official_state(model: torch.nn.Module) -> dict:
    from mmvit_ext.converters import export_official_vit_adapter
    state = model.state_dict()
    return export_official_vit_adapter(state) if isinstance(model, ViTAdapter) else state


def test_init_is_the_officials():
    """Every adapter tensor the official init makes constant (Deformable DETR's offset ring,
    zero attention-weight projections, zero biases, unit norms) is equal; every random one is
    drawn at the official scale. The trunk is left out: the official one is always loaded."""
    torch.manual_seed(0)
    reference = _official_state(_reference('detection'))
    ours = _official_state(_ours('detection'))
    assert set(reference) == set(ours)
    for key, expected in reference.items():
        if key.startswith(('blocks.', 'patch_embed.', 'pos_embed')) or not expected.is_floating_point():
            continue
        got = ours[key]
        if expected.numel() == 1 or expected.min() == expected.max() or \
                key.endswith('sampling_offsets.bias'):
            assert torch.equal(got, expected), key
        else:
            assert got.min() != got.max(), key
            if expected.numel() >= 64:
                ratio = (got.std() / expected.std()).item()
                assert 0.6 < ratio < 1.6, (key, ratio)


def _deformable_detr_check(module: MSDeformAttn) -> None:
    reference = ReferenceAttn(module.value_proj.in_features, module.num_levels,
                              module.num_heads, module.num_points,
                              module.value_proj.out_features / module.value_proj.in_features)
    assert torch.equal(module.sampling_offsets.bias, reference.sampling_offsets.bias)
    for param in (module.sampling_offsets.weight, module.attention_weights.weight,
                  module.attention_weights.bias, module.value_proj.bias, module.output_proj.bias):
        assert not param.any()
    for proj in (module.value_proj, module.output_proj):  # Xavier, not trunc-normal 0.02
        fan_in, fan_out = proj.in_features, proj.out_features
        ratio = proj.weight.std().item() / (2 / (fan_in + fan_out)) ** 0.5
        assert 0.9 < ratio < 1.1, ratio


def test_shipped_config_backbone_has_deformable_detr_init_after_init_weights(tmp_path):
    """configs/mmdet/mask_rcnn_vit_adapter_s_fpn_ms_3x_coco.py's backbone, its DeiT-S trunk file
    replaced by one of random weights: after ``init_weights()`` every deformable attention has
    Deformable DETR's init."""
    from mmengine.config import Config

    from mmvit_ext.backbones import VisionTransformer
    from mmvit_ext.converters import save_state_dict
    from mmvit_ext.registry import MODELS
    cfg = Config.fromfile(str(ROOT / 'configs/mmdet/mask_rcnn_vit_adapter_s_fpn_ms_3x_coco.py'))
    backbone = cfg.model.backbone.to_dict()
    backbone.pop('_delete_', None)
    trunk = VisionTransformer(arch='deit-s', out_type='cls_token', window_size=None)
    save_state_dict(trunk.state_dict(), tmp_path / 'deit_s.pth')
    backbone['init_cfg'] = dict(type='Pretrained', checkpoint=str(tmp_path / 'deit_s.pth'))
    model = MODELS.build(backbone)
    model.init_weights()
    assert 'ViT' in model.load_report.layout and not model.load_report.unexpected
    assert torch.equal(model.blocks[3].attn.qkv.weight, trunk.blocks[3].attn.qkv.weight)
    attentions = [m for m in model.modules() if isinstance(m, MSDeformAttn)]
    assert len(attentions) == 4 * 2 + 2  # an injector and an extractor each, 2 extra
    for module in attentions:
        _deformable_detr_check(module)
    assert model.vit_features == 'final' and model.window_padding == 'qkv'
