"""The benchmark's comparison mode really runs mmdet's and timm's code with our weights."""
import re

import pytest
import torch

from mmvit_ext.backbones import PyramidVisionTransformerV2, SwinTransformer
from mmvit_ext.benchmark import agreement_size, build_peers, check_peers
from tool_runner import tool_process


@pytest.mark.parametrize('ours,size', [
    (lambda: SwinTransformer('tiny', drop_path_rate=0.0), (256, 256)),
    (lambda: PyramidVisionTransformerV2('b0', drop_path_rate=0.0), (96, 128)),
    (lambda: PyramidVisionTransformerV2('b2_li', drop_path_rate=0.0), (96, 128)),
])
def test_peers_hold_our_weights_and_match_our_outputs(ours, size):
    ours = ours()
    peers = build_peers(ours, size)
    modules = {name: type(p.trunk if hasattr(p, 'trunk') else p).__module__
               for name, p in peers.items()}
    assert modules['timm'].startswith('timm.models.')
    if not getattr(ours, 'linear', False):
        assert modules['mmdet'].startswith('mmdet.models.backbones.')
    else:
        assert 'mmdet' not in peers  # mmdet has no linear SRA
    first_conv = ours.patch_embed.proj.weight if isinstance(ours, SwinTransformer) \
        else ours.layers[0].patch_embed.proj.weight
    for peer in peers.values():
        convs = [m.weight for m in peer.modules() if isinstance(m, torch.nn.Conv2d)]
        assert torch.equal(convs[0], first_conv)
    report = check_peers(ours, peers, size)
    assert set(report) == set(peers) and all(diff <= 1e-4 for _, diff in report.values())


def test_agreement_sizes_follow_each_peers_semantics():
    swin = SwinTransformer('tiny')
    assert agreement_size(swin, 'mmdet', (512, 512)) == (512, 512)
    assert agreement_size(swin, 'mmdet', (224, 224)) == (256, 256)  # mmdet shifts a 7x7 map
    assert agreement_size(swin, 'timm', (512, 512)) == (224, 224)   # timm rolls before padding
    assert agreement_size(swin, 'timm', (448, 448)) == (448, 448)


def test_benchmark_tool_prints_ratio_summary():
    result = tool_process('tools/analysis/benchmark.py', 'pvtv2:b0', '--size', '64', '64',
                          '--batch', '1', '--warmup', '0', '--repeat', '1', '--compare',
                          timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert any(line.startswith('[check] mmdet: outputs match ours') for line in lines)
    summary = lines[-1]
    assert summary.startswith('SUMMARY pvtv2:b0 fp32 b1 64x64')
    for key in ('fwd_speedup_vs_mmdet', 'fwdbwd_speedup_vs_timm', 'fwdbwd_mem_vs_mmdet',
                'fwdbwd_peak_frac'):
        assert re.search(rf'{key}=\d+\.\d\d', summary), key
