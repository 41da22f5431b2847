"""model_stats, attention_collapse, visualize_attention, convert_checkpoint, image_demo."""
import csv
import sys

import numpy as np
import pytest
import torch

from mmvit_ext.analysis import (capture, cross_head_similarity, cross_layer_similarity,
                                feature_evolution, nearest_layer_similarity, similar_block_ratio)
from mmvit_ext.backbones import CaiT, DeepViT
from mmvit_ext.converters import export_official_cait
from tool_runner import ROOT, tool_process

sys.path.insert(0, str(ROOT / 'tools' / 'analysis'))
TINY_DEEPVIT = dict(embed_dims=32, depth=4, num_heads=2, reattention_blocks=2, conv_stem=(8, 8))


_run = tool_process


def _png_size(path):
    import mmcv
    image = mmcv.imread(str(path))
    assert image is not None, f'{path} does not decode'
    return image.shape[:2]


# ---- statistics ---------------------------------------------------------------------------------
def test_identical_maps_have_similarity_one_and_metrics_are_exact():
    maps = [torch.softmax(torch.randn(2, 3, 5, 5), -1)] * 3
    sim = cross_layer_similarity(maps)
    torch.testing.assert_close(sim, torch.ones(3, 3))
    assert torch.equal(nearest_layer_similarity(sim, 2), torch.ones(3))
    assert torch.equal(similar_block_ratio(sim, 0.9), torch.ones(3))
    other = [maps[0], torch.eye(5).expand(2, 3, 5, 5)]  # columns one-hot vs softmax
    expected = (maps[0] / maps[0].norm(dim=-2, keepdim=True)).diagonal(dim1=-2, dim2=-1).mean()
    assert cross_layer_similarity(other)[0, 1].item() == pytest.approx(expected.item(), abs=1e-6)
    same_heads = torch.softmax(torch.randn(1, 1, 4, 4), -1).expand(1, 3, 4, 4)
    assert cross_head_similarity(same_heads) == pytest.approx(1.0, abs=1e-6)
    feats = [torch.randn(1, 4, 8)] * 2
    assert feature_evolution(feats)[1].item() == pytest.approx(1.0, abs=1e-6)


def test_model_with_identical_layers_has_similarity_one():
    """q = k = 0 in every block: every map is uniform, so every pair of layers is identical."""
    model = DeepViT(arch=dict(TINY_DEEPVIT, reattention_blocks=0), window_size=None,
                    simple_pyramid=False).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[:64].zero_()
            block.attn.qkv.bias[:64].zero_()
    maps, feats = capture(model, torch.randn(2, 3, 64, 80))
    assert len(maps) == len(feats) == 4 and maps[0].shape == (2, 2, 20, 20)
    torch.testing.assert_close(cross_layer_similarity(maps), torch.ones(4, 4))
    from mmvit_ext import flags
    assert flags.fused_attention.get()  # the switch is back on after capturing
    assert all(block.attn.fused for block in model.blocks)  # modules are never touched


def test_attention_tools_and_stats_see_dinov3():
    """DINOv3's RoPE attention on the explicit path: the maps the tools capture (class, 4 storage
    and 20 patch tokens), the same outputs as the fused path, and model_stats' count."""
    from model_stats import count
    from backbone_cases import TINY_DINOV3
    from mmvit_ext import flags
    from mmvit_ext.backbones import VisionTransformer
    torch.manual_seed(0)
    model = VisionTransformer(**TINY_DINOV3).eval()
    x = torch.randn(1, 3, 64, 80)
    maps, feats = capture(model, x)
    assert len(maps) == len(feats) == 4 and maps[0].shape == (1, 2, 25, 25)
    with torch.no_grad():
        fused = model(x)
        with flags.fused_attention(False):
            explicit = model(x)
    for a, b in zip(fused, explicit):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert count(model, (64, 80))['params'] == sum(p.numel() for p in model.parameters())


def test_attention_collapse_tool_writes_csv_and_plots(tmp_path):
    arch = repr(dict(TINY_DEEPVIT, embed_dims=48, depth=6, num_heads=3))
    out = tmp_path / 'collapse'
    result = _run('tools/analysis/attention_collapse.py', 'deepvit:s', '--set', f'arch={arch}',
                  '--num-images', 3, '--batch', 2, '--size', 64, 64, '--compare-plain',
                  '--out', out)
    assert result.returncode == 0, result.stderr[-2000:]
    with open(out / 'similarity.csv') as f:
        rows = list(csv.reader(f))
    assert len(rows) == 7 and len(rows[1]) == 7
    matrix = np.array([[float(v) for v in row[1:]] for row in rows[1:]])
    np.testing.assert_allclose(np.diag(matrix), 1.0, atol=1e-5)
    np.testing.assert_allclose(matrix, matrix.T, atol=1e-6)
    with open(out / 'layers.csv') as f:
        layers = list(csv.DictReader(f))
    assert len(layers) == 6 and 'plain_cross_head_similarity' in layers[0]
    assert layers[0]['feature_evolution'] == 'nan' and 0 < float(layers[1]['feature_evolution']) <= 1
    assert _png_size(out / 'similarity_heatmap.png') == (420, 500)
    assert _png_size(out / 'collapse_curves.png') == (360, 1600)
    assert 'mean similarity to 2 nearest layers' in result.stdout


def test_visualize_attention_draws_every_head(tmp_path):
    import mmcv
    image = tmp_path / 'scene.png'
    mmcv.imwrite(np.random.default_rng(0).integers(0, 255, (96, 128, 3), dtype=np.uint8),
                 str(image))
    out = tmp_path / 'attn.png'
    result = _run('tools/analysis/visualize_attention.py', image, 'swin:tiny', '--block', 1,
                  '--size', 112, 112, '--out', out)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'wrote' in result.stdout and '3 heads, 28x28 tokens' in result.stdout
    assert _png_size(out) == (260, 780)


def test_model_stats_counts_params_like_numel_and_flops_like_the_paper():
    from model_stats import all_presets_table, build_preset, count
    model = build_preset('cait:xxs24', classifier=True)
    stats = count(model, (224, 224))
    assert stats['params'] == sum(p.numel() for p in model.parameters())
    swin = count(build_preset('swin:tiny', classifier=True), (224, 224))
    assert swin['flops'] / 1e9 == pytest.approx(4.5, abs=0.15)  # Swin paper: 4.5 G
    table = all_presets_table(presets=['pvtv2:b0', 'deepvit:s'])
    lines = table.splitlines()
    assert lines[0].startswith('| preset | params (M) | paper params (M)')
    numel = sum(p.numel() for p in build_preset('deepvit:s', classifier=True).parameters())
    assert lines[3].split('|')[2].strip() == f'{numel / 1e6:.2f}'
    assert lines[2].split('|')[3].strip() == '3.7'


# ---- conversion and demo ------------------------------------------------------------------------
def test_convert_checkpoint_tool(tmp_path):
    source = CaiT(arch=dict(embed_dims=32, depth=2, num_heads=2), out_type='cls_token')
    official = export_official_cait(source.state_dict())
    official['head.weight'] = torch.zeros(10, 32)
    official['head.bias'] = torch.zeros(10)
    src = tmp_path / 'S24.pth'
    torch.save({'model': {'module.' + k: v for k, v in official.items()}}, src)
    dst = tmp_path / 'converted.safetensors'
    result = _run('tools/convert_checkpoint.py', src, dst)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'official CaiT' in result.stdout and 'dropped (classifier heads' in result.stdout
    assert 'load-checked' in result.stdout and 'CaiT' in result.stdout
    from safetensors.torch import load_file
    converted = load_file(str(dst))
    assert set(converted) == set(source.state_dict())
    assert all(torch.equal(converted[k], v) for k, v in source.state_dict().items())

    bad = tmp_path / 'resnet.pth'
    torch.save({'state_dict': {'conv1.weight': torch.zeros(2), 'fc.bias': torch.zeros(2)}}, bad)
    refused = _run('tools/convert_checkpoint.py', bad, tmp_path / 'x.pth')
    assert refused.returncode != 0 and 'no known layout' in refused.stderr
    assert "'conv1.weight'" in refused.stderr and not (tmp_path / 'x.pth').exists()


def test_image_demo_draws_detections(tmp_path):
    from mmengine.config import Config
    import mmcv
    from mmvit_ext.utils import build_model
    from mmvit_ext.datasets.synthetic_shapes import render_scene
    config = ROOT / 'configs/demo/mask_rcnn_pvtv2_b2_demo.py'
    cfg = Config.fromfile(str(config))
    detector = build_model(cfg)
    ckpt = tmp_path / 'demo.pth'
    torch.save({'state_dict': detector.state_dict(),
                'meta': {'dataset_meta': {'classes': cfg.metainfo['classes']}}}, ckpt)
    image = tmp_path / 'scene.png'
    mmcv.imwrite(render_scene(np.random.default_rng(3), (200, 240))[0][..., ::-1], str(image))
    out = tmp_path / 'pred.png'
    result = _run('demo/image_demo.py', image, config, ckpt, '--out', out, '--score-thr', 0.0)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'detections with score >= 0.0' in result.stdout
    assert _png_size(out) == (200, 240)


@pytest.mark.parametrize('tool', ['tools/analysis/model_stats.py',
                                  'tools/analysis/attention_collapse.py',
                                  'tools/analysis/visualize_attention.py',
                                  'tools/analysis/official_parity.py',
                                  'tools/convert_checkpoint.py', 'demo/image_demo.py'])
def test_tools_have_help_with_an_example(tool):
    result = _run(tool, '--help')
    assert result.returncode == 0 and 'Example:' in result.stdout


# ---- device_check: a plain op wrong on the platform is named, not blamed on a family ---------
class _WrongInBf16(torch.nn.Conv2d):
    """A convolution as a buggy bf16 kernel computes it (oneDNN AMX, docs/install.md): the right
    result in float32, twice it in bfloat16."""

    def forward(self, x):
        out = super().forward(x)
        return out * 2 if out.dtype == torch.bfloat16 else out


def test_device_check_names_a_wrong_plain_op_as_the_platform():
    from device_check import platform_errors
    torch.manual_seed(0)
    model = DeepViT(arch=TINY_DEEPVIT, out_indices=(3,)).eval()
    cpu = torch.device('cpu')
    x = torch.randn(1, 3, 64, 48)
    assert platform_errors(model, x, cpu, 'bf16') == []  # every plain op right here
    proj = model.patch_embed.proj  # the conv stem's 8x8 stride-8 projection of 8 channels
    wrong = _WrongInBf16(proj.in_channels, proj.out_channels, proj.kernel_size, proj.stride)
    wrong.load_state_dict(proj.state_dict())
    model.patch_embed.proj = wrong
    found = platform_errors(model, x, cpu, 'bf16')
    assert len(found) == 1 and found[0].startswith('patch_embed.proj ') and 'off by 1.0e+00' \
        in found[0], found
