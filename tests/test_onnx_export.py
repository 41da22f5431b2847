"""ONNX export: each family's backbone with dynamic batch / height / width, a whole RetinaNet and
a whole Semantic FPN, each checked in ONNX Runtime against PyTorch at batches and sizes the
export never saw (the way a frozen size shows up: wrong shapes, or right shapes and wrong values).

Time on the idle machine: 140 s (dynamic exports of tiny archs: 7-30 s each)."""
import re

import onnx
import pytest
import torch

from backbone_cases import OWN_CODE as SMALL  # not library wrappers
from backbone_cases import TINY_DINOV3
from mmvit_ext import deploy
from mmvit_ext.layers import WindowAttention
from mmvit_ext.registry import MODELS
from tool_runner import ROOT, run_tool

TOLERANCE = 1e-4  # relative, fp32
# the plain ViTs' presets all end in the simple pyramid (deconvolutions, a ceil max-pool, crops)
PYRAMID = {'CaiT': dict(simple_pyramid=True), 'RefinedViT': dict(simple_pyramid=True)}
# ViT-Adapter's dynamic-shape export (both forms) is not supported yet (its deformable attention
# exports at a fixed size: tests/test_vit_adapter.py)
BACKBONES = {**{name: dict(cfg, **PYRAMID.get(name, {})) for name, cfg in SMALL.items()
                if name not in ('ViTAdapter', 'DINOv3Adapter')},
             'PyramidVisionTransformerV2-li': dict(arch=dict(
                 embed_dims=(16, 32, 40, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 5, 8),
                 linear=True)),
             'VisionTransformer-dinov3': TINY_DINOV3}
RETINANET = 'configs/mmdet/retinanet_pvtv2_b0_fpn_1x_coco.py'
SEMANTIC_FPN = 'configs/mmseg/fpn_pvtv2_b0_512x512_40k_ade20k.py'


def symbolic_input_axes(path) -> list:
    dims = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    return [i for i, d in enumerate(dims) if d.dim_param and not d.dim_value]


@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_backbone_exports_with_dynamic_shapes(name, tmp_path):
    torch.manual_seed(0)
    backbone = MODELS.build(dict(type=name.split('-')[0], **BACKBONES[name])).eval()
    root = deploy.export_root(backbone, 'backbone')
    low = deploy.min_dynamic_size(root)
    height, width = deploy.export_shape(low)
    path = tmp_path / 'backbone.onnx'
    deploy.export_onnx(root, torch.randn(2, 3, height, width), path, min_size=low)
    model = onnx.load(str(path))
    assert {node.domain for node in model.graph.node} <= {'', 'ai.onnx'}
    assert [o.name for o in model.graph.output] == \
        [f'feat{i}_s{s}' for i, s in enumerate(backbone.strides)]
    assert symbolic_input_axes(path) == [0, 2, 3]
    session = deploy.ort_session(path)
    for batch, h, w in deploy.check_sizes(height, width, low):
        assert (h, w) != (height, width)
        assert deploy.max_relative_diff(root, session, torch.randn(batch, 3, h, w)) <= TOLERANCE


class WindowLayer(torch.nn.Module):
    """Shifted window attention with a relative-position bias over a (B, C, H, W) map."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = WindowAttention(16, 2, window_size=4, shift=True, rel_pos=True)
        torch.nn.init.normal_(self.attn.rel_pos.relative_position_bias_table)

    def output_names(self, example: torch.Tensor) -> list:
        return ['out']

    def forward(self, grid: torch.Tensor) -> tuple:
        b, c, h, w = grid.shape
        out = self.attn(grid.flatten(2).transpose(1, 2), (h, w))
        return (out.transpose(1, 2).reshape(b, c, h, w),)


def test_one_window_graph_for_maps_shorter_and_longer_than_the_window(tmp_path):
    """Below the default minimum (``--min-size``), window fitting is graph arithmetic: one graph
    shrinks the window to short sides (no shift) and pads and shifts long ones."""
    torch.manual_seed(0)
    root = WindowLayer().eval()
    path = deploy.export_onnx(root, torch.randn(2, 16, 6, 9), tmp_path / 'window.onnx',
                              min_size=2)
    session = deploy.ort_session(path)
    for batch, h, w in [(1, 2, 3), (1, 4, 4), (3, 5, 4), (2, 7, 11), (1, 12, 8)]:
        inputs = torch.randn(batch, 16, h, w)
        assert deploy.max_relative_diff(root, session, inputs) <= TOLERANCE, (h, w)


def test_static_export_below_the_dynamic_minimum(tmp_path):
    """A static graph works where windows shrink to fit small maps (the deepest Swin map, 2 px,
    is shorter than its 4 px window), at batch 1: checked at its own shape."""
    torch.manual_seed(0)
    backbone = MODELS.build(dict(type='SwinTransformer', **SMALL['SwinTransformer'])).eval()
    root = deploy.export_root(backbone, 'backbone')
    assert deploy.min_dynamic_size(root) > 64
    inputs = torch.randn(1, 3, 64, 48)
    path = deploy.export_onnx(root, inputs, tmp_path / 'static.onnx', dynamic=False)
    assert symbolic_input_axes(path) == []
    assert deploy.max_relative_diff(root, deploy.ort_session(path), inputs) <= TOLERANCE


def test_retinanet_whole_model_cli(tmp_path):
    """A user's command: the whole detector's raw head outputs, dynamic, checked by the tool."""
    out = run_tool('tools/deployment/export_onnx.py', RETINANET, 'none', '--out',
                   str(tmp_path / 'retinanet.onnx'), '--part', 'model', '--dynamic')
    checks = re.findall(r'\[check\] batch (\d) at (\d+)x(\d+): max relative diff vs PyTorch '
                        r'(\S+)', out)
    assert len(checks) == 2 and {c[0] for c in checks} == {'1', '3'}, out[-2000:]
    assert all(float(c[3]) <= TOLERANCE for c in checks), checks
    names = [o.name for o in onnx.load(str(tmp_path / 'retinanet.onnx')).graph.output]
    assert names == [f'{g}_{i}' for g in ('cls_score', 'bbox_pred') for i in range(5)]


def test_semantic_fpn_whole_model(tmp_path):
    """mmseg's decode head upsamples through ``Upsample``, whose Python-int sizes the export
    rewrite replaces: without it the logits are off by ~5e-2 at every other size."""
    torch.manual_seed(0)
    model = deploy.build_from_config(ROOT / SEMANTIC_FPN)
    root = deploy.export_root(model, 'model')
    with deploy.export_rewrites(root) as rewritten:
        assert sum('scale_heads' in name for name in rewritten) == 6
    assert all('forward' not in m.__dict__ for m in root.modules())  # restored
    low = deploy.min_dynamic_size(root)
    height, width = deploy.export_shape(low)
    path = deploy.export_onnx(root, torch.randn(2, 3, height, width), tmp_path / 'seg.onnx',
                              min_size=low)
    session = deploy.ort_session(path)
    for batch, h, w in deploy.check_sizes(height, width, low):
        inputs = torch.randn(batch, 3, h, w)
        assert deploy.max_relative_diff(root, session, inputs) <= TOLERANCE
        assert session.run(None, {'inputs': inputs.numpy()})[0].shape == (batch, 150, -(-h // 4),
                                                                         -(-w // 4))


def test_cli_refuses_sizes_the_graph_cannot_serve(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location('export_onnx',
                                                  ROOT / 'tools/deployment/export_onnx.py')
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = str(tmp_path / 'x.onnx')
    with pytest.raises(SystemExit, match='--min-size 100: .* sides >= 256'):
        tool.main([str(ROOT / RETINANET), 'none', '--out', out, '--part', 'model', '--dynamic',
                   '--min-size', '100'])
    with pytest.raises(SystemExit, match='--shape 200 300: .* sides >= 256'):
        tool.main([str(ROOT / RETINANET), 'none', '--out', out, '--part', 'model', '--dynamic',
                   '--shape', '200', '300'])


def test_two_stage_model_export_is_refused_with_the_way_out():
    model = deploy.build_from_config(ROOT / 'configs/mask_rcnn_pvtv2_b2.py')
    with pytest.raises(ValueError, match='RoIAlign.*--part backbone'):
        deploy.export_root(model, 'model')


def test_rewrite_refuses_a_fractional_upsample():
    from mmseg.models.utils import Upsample
    with pytest.raises(ValueError, match='scale_factor 1.5'):
        with deploy.export_rewrites(torch.nn.Sequential(Upsample(scale_factor=1.5))):
            pass


def test_whole_model_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    trained = deploy.build_from_config(ROOT / RETINANET)
    path = tmp_path / 'retinanet.pth'
    torch.save({'meta': {}, 'state_dict': trained.state_dict()}, path)
    torch.manual_seed(1)
    loaded = deploy.build_from_config(ROOT / RETINANET, str(path))
    for (name, a), b in zip(trained.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def test_backbone_checkpoint_loads_into_the_whole_model(tmp_path):
    """A backbone-only file in the official PVT layout goes into the detector's backbone."""
    from mmvit_ext.converters import load_pretrained
    from official_layouts import official_pvtv2_state_dict
    path = tmp_path / 'pvt_v2_b0.pth'
    torch.save(official_pvtv2_state_dict(embed_dims=(32, 64, 160, 256), depths=(2, 2, 2, 2)), path)
    loaded = deploy.build_from_config(ROOT / RETINANET, str(path)).backbone
    expected = MODELS.build(dict(type='PyramidVisionTransformerV2', arch='b0'))
    load_pretrained(expected, str(path))
    for (name, a), b in zip(expected.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def test_ort_benchmark_prints_the_ratio():
    out = run_tool('tools/deployment/ort_benchmark.py', RETINANET, '--part', 'backbone',
                   '--shape', '96', '128', '--runs', '2')
    found = re.search(r'eager ([\d.]+) ms, onnxruntime ([\d.]+) ms .*= ([\d.]+)x', out)
    assert found, out[-2000:]
    eager, ort, ratio = map(float, found.groups())
    assert eager > 0 and ort > 0 and abs(ratio - ort / eager) < 0.01 + 0.01 * ratio
    diff = float(re.search(r'max relative diff (\S+)', out).group(1))
    assert diff <= TOLERANCE
