"""ViT-Adapter and the pure-PyTorch multi-scale deformable attention.

The contract suite covers the backbone's shapes, freezing, with_cp and loading
(tests/backbone_cases.py); here: the attention against mmcv's reference, autocast, ONNX, the
paper's settings, odd sizes, running without mmcv's compiled ops, the official layout's keys (our
exporter round trip: strictness and idempotence only), with_cp, drop path and the forms'
arguments. Equivalence with the official code: tests/test_vit_adapter_reference.py.
Budget: under 40 s on the idle 2-core CPU (tiny archs; presets are built on the meta device)."""
import sys

import pytest
import torch

from mmvit_ext.backbones import ViTAdapter
from mmvit_ext.converters import (CheckpointError, convert_official_vit_adapter,
                                  export_official_vit_adapter, save_state_dict)
from mmvit_ext.layers import MSDeformAttn, multi_scale_deformable_attention

TINY = dict(arch=dict(embed_dims=48, depth=4, num_heads=2), deform_num_heads=2, conv_inplane=8,
            window_size=2, global_blocks=(3,), drop_path_rate=0.0)
SHAPES = ((12, 10), (6, 5), (3, 3))


def _inputs(seed: int = 0, queries: int = 50, heads: int = 3, head_dim: int = 8, points: int = 4):
    gen = torch.Generator().manual_seed(seed)
    size = sum(h * w for h, w in SHAPES)
    value = torch.randn(2, size, heads, head_dim, generator=gen)
    # some locations outside [0, 1]: zero padding
    locations = torch.rand(2, queries, heads, len(SHAPES), points, 2, generator=gen) * 1.2 - 0.1
    weights = torch.rand(2, queries, heads, len(SHAPES), points, generator=gen).softmax(-1)
    return value, locations, weights


@pytest.mark.parametrize('recompute', [False, True])
def test_deform_attention_equals_mmcv_reference(recompute):
    from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch
    value, locations, weights = _inputs()
    for tensor in (value, locations, weights):
        tensor.requires_grad_(True)
    shapes = torch.tensor(SHAPES)
    ours = multi_scale_deformable_attention(value, shapes, locations, weights, recompute)
    theirs = multi_scale_deformable_attn_pytorch(value, shapes, locations, weights)
    assert ours.shape == (2, 50, 24)
    assert (ours - theirs).abs().max().item() <= 1e-5
    grads = torch.autograd.grad(ours.square().sum(), (value, locations, weights))
    ref_grads = torch.autograd.grad(theirs.square().sum(), (value, locations, weights))
    for ours_grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(ours_grad, ref_grad, atol=1e-4, rtol=1e-4)
    # (H, W) pairs instead of a tensor: the same
    again = multi_scale_deformable_attention(value, SHAPES, locations, weights)
    assert torch.equal(again, ours.detach()) or (again - ours).abs().max() == 0


@pytest.mark.parametrize('dtype,bound', [(torch.bfloat16, 3e-2), (torch.float16, 5e-3)])
def test_deform_attention_module_under_autocast(dtype, bound):
    torch.manual_seed(0)
    module = MSDeformAttn(48, len(SHAPES), 3, 4)
    with torch.no_grad():
        module.sampling_offsets.weight.normal_(0, 0.05)
        module.attention_weights.weight.normal_(0, 0.05)
    query = torch.randn(2, 30, 48, requires_grad=True)
    feat = torch.randn(2, sum(h * w for h, w in SHAPES), 48)
    ref = torch.rand(1, 30, 1, 2)
    expected = module(query, ref, feat, SHAPES)
    with torch.autocast('cpu', dtype=dtype):
        out = module(query, ref, feat, SHAPES)
    out.float().sum().backward()
    assert torch.isfinite(query.grad).all()
    error = (out.float() - expected).abs().max() / expected.abs().max()
    assert error.item() <= bound


def test_deform_attention_module_init_is_deformable_detrs():
    module = MSDeformAttn(48, 3, 6, 4)
    bias = module.sampling_offsets.bias.view(6, 3, 4, 2)
    assert torch.equal(bias[0, 0, :, 0], torch.tensor([1.0, 2.0, 3.0, 4.0]))  # head 0: +x
    assert torch.equal(bias[:, 0], bias[:, 2])  # the same ring on every level
    assert bias.abs().amax(-1)[:, 0, 0].eq(1).all()  # unit max-norm directions at point 0
    assert module.attention_weights.weight.abs().sum() == 0
    with pytest.raises(ValueError, match='num_heads=5'):
        MSDeformAttn(48, 3, 5, 4)


def test_deform_attention_exports_to_onnx(tmp_path):
    onnxruntime = pytest.importorskip('onnxruntime')
    torch.manual_seed(0)
    module = MSDeformAttn(24, len(SHAPES), 3, 2).eval()
    with torch.no_grad():
        module.sampling_offsets.weight.normal_(0, 0.1)

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = module

        def forward(self, query, ref, feat):
            return self.attn(query, ref, feat, SHAPES)

    args = (torch.randn(1, 20, 24), torch.rand(1, 20, 1, 2),
            torch.randn(1, sum(h * w for h, w in SHAPES), 24))
    path = tmp_path / 'msda.onnx'
    torch.onnx.export(Wrapped(), args, str(path), opset_version=17, dynamo=False)
    session = onnxruntime.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    got = torch.from_numpy(session.run(None, feeds)[0])
    torch.testing.assert_close(got, Wrapped()(*args).detach(), atol=1e-5, rtol=1e-4)


def test_paper_settings_of_the_presets():
    """ViT-Adapter-T/S/B: 12 blocks in [[0, 2], [3, 5], [6, 8], [9, 11]], 6 / 6 / 12 deformable
    heads, 4 points, extra extractors in the last interaction, level embedding of 3 levels."""
    with torch.device('meta'):
        models = {arch: ViTAdapter(arch=arch) for arch in ('ti', 's', 'b')}
    for arch, heads in (('ti', 6), ('s', 6), ('b', 12)):
        model = models[arch]
        assert model.interaction_indexes == ((0, 2), (3, 5), (6, 8), (9, 11))
        attn = model.interactions[0].injector.attn
        assert (attn.num_heads, attn.num_points, attn.num_levels) == (heads, 4, 3)
        assert model.interactions[0].extractor.attn.num_levels == 1
        assert [i.extra_extractors is not None for i in model.interactions] == [0, 0, 0, 1]
        assert model.out_channels == (model.embed_dims,) * 4 and model.strides == (4, 8, 16, 32)
        assert model.global_blocks == (2, 5, 8, 11) and model.window_size == 14
        hidden = model.interactions[0].extractor.ffn.fc1.out_features
        assert hidden == model.embed_dims // 4  # cffn_ratio 0.25


@pytest.mark.parametrize('size', [(224, 224), (225, 263)])
def test_four_maps_for_any_size(size):
    model = ViTAdapter(**TINY).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    assert [tuple(o.shape[1:]) for o in outs] == model.output_shapes(*size)
    assert [o.shape[2] for o in outs] == [-(-size[0] // s) for s in (4, 8, 16, 32)]


def test_bf16_autocast_forward_backward_finite_on_cpu():
    torch.manual_seed(0)
    model = ViTAdapter(**TINY).train()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(2, 3, 64, 80))
    sum(o.float().square().mean() for o in outs).backward()
    assert all(torch.isfinite(o).all() for o in outs)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_runs_with_mmcv_compiled_ops_unavailable(monkeypatch):
    """Importing ``mmcv.ops`` fails (no compiled ops): the adapter builds, runs and trains."""
    for name in [m for m in sys.modules if m == 'mmcv.ops' or m.startswith('mmcv.ops.')]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, 'mmcv.ops', None)  # import mmcv.ops -> ImportError
    with pytest.raises(ImportError):
        import mmcv.ops  # noqa: F401
    model = ViTAdapter(**TINY).train()
    outs = model(torch.randn(2, 3, 64, 64))
    sum(o.sum() for o in outs).backward()
    assert [o.shape[-1] for o in outs] == [16, 8, 4, 2]
    import mmvit_ext.backbones.vit_adapter as source
    import mmvit_ext.layers.deform_attn as layer
    for module in (source, layer):
        assert 'mmcv' not in open(module.__file__).read()


def test_bad_interaction_indexes_raise():
    with pytest.raises(ValueError, match='contiguous from block 0'):
        ViTAdapter(**TINY, interaction_indexes=[[0, 1], [3, 3]])
    with pytest.raises(ValueError, match='must end at the last block'):
        ViTAdapter(**TINY, interaction_indexes=[[0, 1], [2, 2]])
    with pytest.raises(ValueError, match='with_cls_token is fixed'):
        ViTAdapter(**TINY, with_cls_token=True)


def _official(model: ViTAdapter) -> dict:
    """Our weights in the official layout, as an mmdet detector file holds them."""
    state = export_official_vit_adapter(model.state_dict())
    assert any(k.endswith('.gamma1') for k in state)
    assert any('.ffn.dwconv.dwconv.' in k for k in state)
    whole = {f'backbone.{k}': v for k, v in state.items()}
    whole['neck.lateral_convs.0.conv.weight'] = torch.zeros(1)
    return whole


def test_official_layout_loads_and_converter_is_idempotent(tmp_path):
    torch.manual_seed(0)
    source = ViTAdapter(**TINY).eval()
    with torch.no_grad():
        for param in source.parameters():
            param.add_(torch.randn_like(param) * 0.01)
    official = {k[len('backbone.'):]: v for k, v in _official(source).items()
                if k.startswith('backbone.')}
    once = convert_official_vit_adapter(official)
    assert convert_official_vit_adapter(once) == once
    assert set(once) == set(source.state_dict())
    path = tmp_path / 'mask_rcnn_vit_adapter.pth'
    torch.save({'state_dict': _official(source), 'meta': {}}, path)
    target = ViTAdapter(**TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    target.init_weights()
    assert target.load_report.layout.startswith('official ViT-Adapter')
    x = torch.randn(1, 3, 64, 96)
    for a, b in zip(source(x), target.eval()(x)):
        assert torch.equal(a, b)
    # strict: an incomplete adapter checkpoint names what is missing
    broken = {k: v for k, v in _official(source).items() if 'interactions.1.injector' not in k}
    torch.save({'state_dict': broken}, path)
    model = ViTAdapter(**TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match=r'interactions\.1\.injector'):
        model.init_weights()


def test_trunk_checkpoints_load_with_the_adapter_initialised(tmp_path):
    """A DeiT-style timm file (head, class token, no LayerScale) and a DINOv2 file (patch 14,
    LayerScale, mask token) load into the trunk; the adapter keeps its initialisation."""
    from mmvit_ext.backbones import VisionTransformer
    arch = dict(embed_dims=48, depth=4, num_heads=2)
    deit = VisionTransformer(arch=arch, out_type='cls_token', window_size=None).state_dict()
    deit['head.weight'] = torch.zeros(10, 48)
    save_state_dict(deit, tmp_path / 'deit.pth')
    model = ViTAdapter(**TINY, init_cfg=dict(type='Pretrained',
                                             checkpoint=str(tmp_path / 'deit.pth')))
    model.init_weights()
    report = model.load_report
    assert report.layout.startswith('timm ViT')
    assert 'blocks.0.ls1.gamma' in report.expected_missing and 'spm.fc2.weight' in \
        report.expected_missing
    assert torch.equal(model.blocks[0].attn.qkv.weight, deit['blocks.0.attn.qkv.weight'])
    dinov2 = VisionTransformer(arch=dict(arch, patch_size=14, layer_scale=1e-5),
                               out_type='cls_token', window_size=None, img_size=56).state_dict()
    dinov2['mask_token'] = torch.zeros(1, 48)
    save_state_dict(dinov2, tmp_path / 'dinov2.pth')
    model = ViTAdapter(**dict(TINY, arch=dict(arch, patch_size=14, layer_scale=1e-5),
                              img_size=64),
                       init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'dinov2.pth')))
    model.init_weights()
    assert 'patch_embed.proj.weight' in model.load_report.resized
    assert model.patch_embed.proj.weight.shape[-1] == 16
    assert torch.equal(model.blocks[1].ls2.gamma, dinov2['blocks.1.ls2.gamma'])


def test_layer_decay_groups_put_the_adapter_on_top():
    model = ViTAdapter(**TINY)
    depth_of = {name: model.get_layer_depth(name)[0] for name, _ in model.named_parameters()}
    top = len(model.blocks) + 1
    assert depth_of['pos_embed'] == 0 and depth_of['patch_embed.proj.weight'] == 0
    assert depth_of['blocks.2.attn.qkv.weight'] == 3
    assert depth_of['spm.level_encoding'] == depth_of['spm.stem.0.weight'] == top
    assert depth_of['interactions.0.injector.gamma'] == depth_of['norm1.weight'] == top


@pytest.mark.parametrize('setting,adapter_recomputed', [(True, True), ('attn', True), (2, False)])
def test_with_cp_recomputes_the_adapter_when_every_block_is_selected(setting, adapter_recomputed):
    """The trunk as its with_cp says (the contract's counts, outputs and gradients); the
    injectors and extractors recomputed whole when every trunk block is selected, else not."""
    import contract
    from mmvit_ext.backbones.vit_adapter import Extractor, Injector
    contract.check_with_cp(ViTAdapter, {k: v for k, v in TINY.items() if k != 'drop_path_rate'},
                           setting)
    torch.manual_seed(0)
    plain = ViTAdapter(**TINY).train()
    model = ViTAdapter(**TINY, with_cp=setting).train()
    model.load_state_dict(plain.state_dict())
    assert model.recomputes_adapter() is adapter_recomputed
    calls = {}
    for name, module in model.interactions.named_modules():
        if isinstance(module, (Injector, Extractor)):
            module.register_forward_pre_hook(
                lambda *_, key=name: calls.__setitem__(key, calls.get(key, 0) + 1))
    x = torch.randn(2, 3, 64, 96)
    sum(o.square().mean() for o in plain(x)).backward()
    sum(o.square().mean() for o in model(x)).backward()
    assert len(calls) == 4 * 2 + 2  # injector + extractor each, 2 extra extractors
    assert set(calls.values()) == {2 if adapter_recomputed else 1}, calls
    grads = dict(model.named_parameters())
    for name, param in plain.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, atol=1e-6, rtol=1e-5)


def test_extractors_drop_path_is_the_backbones_rate():
    model = ViTAdapter(**dict(TINY, drop_path_rate=0.3))
    last = model.interactions[-1]
    for extractor in (model.interactions[0].extractor, last.extractor, *last.extra_extractors):
        assert extractor.drop_path.drop_prob == pytest.approx(0.3)


def test_forms_and_windows_are_chosen_by_one_argument_each():
    from mmvit_ext.backbones import VisionTransformer
    model = ViTAdapter(**TINY)
    assert model.vit_features == 'final' and model.window_padding == 'qkv'
    windowed = [b.attn for b in model.blocks if b.attn.window_size is not None]
    assert windowed and all(a.padding == 'qkv' for a in windowed)
    assert "padding='qkv'" in repr(model.blocks[0].attn)
    vitdet = VisionTransformer(arch=dict(embed_dims=48, depth=4, num_heads=2), window_size=2)
    assert vitdet.window_padding == 'tokens' and vitdet.blocks[0].attn.padding == 'tokens'
    with pytest.raises(ValueError, match='vit_features must be one of'):
        ViTAdapter(**TINY, vit_features='segmentation')
    with pytest.raises(ValueError, match='needs 4 interactions'):
        ViTAdapter(**TINY, vit_features='per_interaction', interaction_indexes=[[0, 1], [2, 3]])
    with pytest.raises(ValueError, match='window_padding must be one of'):
        ViTAdapter(**TINY, window_padding='keys')
    with pytest.raises(ValueError, match='use_rel_pos'):
        VisionTransformer(arch=dict(embed_dims=48, depth=4, num_heads=2), window_size=2,
                          use_rel_pos=True, window_padding='qkv', simple_pyramid=False)


@pytest.mark.parametrize('path,form,padding', [
    ('configs/mmdet/mask_rcnn_vit_adapter_s_fpn_ms_3x_coco.py', 'final', 'qkv'),
    ('configs/mmdet/mask_rcnn_vit_adapter_b_fpn_ms_3x_coco.py', 'final', 'qkv'),
    ('configs/mmseg/upernet_vit_adapter_b_512x512_160k_ade20k.py', 'per_interaction', None),
    ('configs/mmseg/upernet_dinov2_s_vit_adapter_512x512_160k_ade20k.py', 'per_interaction', None),
    ('configs/mmseg/upernet_dinov2_b_vit_adapter_512x512_160k_ade20k.py', 'per_interaction', None),
])
def test_shipped_configs_select_the_official_form(path, form, padding):
    """mmdet configs: the detection form and the official windows; mmseg configs: the
    segmentation form, global attention (as the official segmentation configs)."""
    from pathlib import Path

    from mmengine.config import Config
    cfg = Config.fromfile(str(Path(__file__).resolve().parents[1] / path)).model.backbone
    assert cfg.vit_features == form
    if padding is None:
        assert cfg.window_size is None
    else:
        assert cfg.window_padding == padding and cfg.window_size == 14
