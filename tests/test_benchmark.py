"""The benchmark's comparison mode really runs mmdet's and timm's code with our weights."""
import copy
import re
from typing import Dict, Tuple
from pathlib import Path
from unittest import mock

import pytest
import torch

from mmvit_ext.backbones import PyramidVisionTransformerV2, SwinTransformer, VisionTransformer
from mmvit_ext.benchmark import agreement_size, build_peers, check_peers
from tool_runner import tool_process


@pytest.mark.parametrize('ours,size', [
    (lambda: SwinTransformer('tiny', drop_path_rate=0.0), (256, 256)),
    (lambda: PyramidVisionTransformerV2('b0', drop_path_rate=0.0), (96, 128)),
    (lambda: PyramidVisionTransformerV2('b2_li', drop_path_rate=0.0), (96, 128)),
    # ViTDet's ViT-B: a 20-token side pads to two windows; global blocks resize their positions
    (lambda: VisionTransformer('b', use_rel_pos=True, final_norm=False, drop_path_rate=0.0),
     (224, 320)),
])
def test_peers_hold_our_weights_and_match_our_outputs(ours, size):
    ours = ours()
    peers = build_peers(ours, size)
    modules = {name: type(p.trunk if hasattr(p, 'trunk') else p).__module__
               for name, p in peers.items()}
    assert modules['timm'].startswith('timm.models.')
    if isinstance(ours, VisionTransformer):
        assert modules['mmpretrain'].startswith('mmpretrain.models.backbones.')
    elif not getattr(ours, 'linear', False):
        assert modules['mmdet'].startswith('mmdet.models.backbones.')
    else:
        assert 'mmdet' not in peers  # mmdet has no linear SRA
    first_conv = ours.patch_embed.proj.weight if isinstance(ours, (SwinTransformer,
                                                                   VisionTransformer)) \
        else ours.layers[0].patch_embed.proj.weight
    for peer in peers.values():
        convs = [m.weight for m in peer.modules() if isinstance(m, torch.nn.Conv2d)]
        assert torch.equal(convs[0], first_conv)
    report = check_peers(ours, peers, size)
    assert set(report) == set(peers) and all(diff <= 1e-4 for _, diff in report.values())


@pytest.mark.parametrize('arch', ['dinov3_vits16', 'dinov3_vits16plus'])
def test_dinov3_peer_is_timms_vit_dinov3_with_our_weights(arch):
    """timm's ``vit_*_dinov3`` holds our DINOv3 weights (the layout map inverts our converter)
    and computes our maps; a timm without DINOv3 is refused with a reason."""
    import timm

    from mmvit_ext.backbones.vit_peers import timm_dinov3_layout
    from mmvit_ext.converters.dinov3 import convert_timm_dinov3
    ours = VisionTransformer(arch=dict(VisionTransformer.resolve_arch(arch), depth=2),
                             drop_path_rate=0.0)
    torch.manual_seed(0)
    for param in ours.parameters():  # off the init: LayerScale 1e-5 would hide the blocks
        torch.nn.init.normal_(param, std=0.05)
    state = ours.state_dict()
    trunk = {k: v * state[k + '_mask'] if k + '_mask' in state else v  # the k bias masked
             for k, v in state.items()
             if not k.startswith(('pyramid.', 'rope_embed.')) and not k.endswith('bias_mask')}
    back = convert_timm_dinov3(timm_dinov3_layout(ours))
    assert back.keys() == trunk.keys() and all(torch.equal(back[k], trunk[k]) for k in trunk)
    if not timm.list_models('vit_*_dinov3*'):
        with pytest.raises(ValueError, match='DINOv3 presets timm has'):
            build_peers(ours, (64, 96))
        return
    peers = build_peers(ours, (64, 96))
    assert type(peers['timm'].trunk).__module__ == 'timm.models.eva'
    report = check_peers(ours, peers, (64, 96))
    assert report['timm'][1] <= 1e-4
    with pytest.raises(ValueError, match='dense outputs of the last block'):
        build_peers(VisionTransformer(arch=dict(VisionTransformer.resolve_arch(arch), depth=2),
                                      out_indices=0), (64, 96))


def test_converters_are_pure_and_each_family_builds_its_peers():
    """Converter modules import no model library and build nothing; each family with peers
    defines them, and the families list follows the registry."""
    import ast
    from pathlib import Path

    import mmvit_ext.converters as converters
    from mmvit_ext.backbones import CaiT, family_class
    from mmvit_ext.benchmark import has_peers, peer_families
    for path in sorted(Path(converters.__file__).parent.glob('*.py')):
        imported = {alias.name.split('.')[0] for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {(node.module or '').split('.')[0] for node in
                     ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.ImportFrom) and not node.level}
        assert not imported & {'mmdet', 'mmseg', 'mmpretrain', 'timm', 'transformers'}, path
    assert not any(name.endswith('benchmark_peers') for name in dir(converters))
    assert peer_families() == ['pvtv2', 'swin', 'vit']
    # ViT-Adapter subclasses the ViT class: the ViT's peers are not the adapter's
    assert not has_peers(family_class('vit_adapter'))
    with pytest.raises(ValueError, match='peers are built for the ViTDet ViT-B'):
        build_peers(VisionTransformer('b', drop_path_rate=0.0), (64, 64))  # final norm, no rel pos
    with pytest.raises(ValueError, match='no peer implementations for CaiT'):
        build_peers(CaiT('xxs24', out_indices=(-1,)), (64, 64))


def test_shared_benchmark_code_names_no_family_and_families_own_their_peers():
    """mmvit_ext/benchmark/ names no family (nor a family's class); every family with peers
    defines them in its own file: the class's module or ``<that module>_peers``."""
    from pathlib import Path

    import mmvit_ext.benchmark as benchmark
    from mmvit_ext.backbones import family_classes
    from mmvit_ext.benchmark.peers import has_peers, peers_owner
    classes = family_classes()
    names = sorted({*classes, *(cls.__name__ for cls in classes.values())}, key=len,
                   reverse=True)  # longest first: vit_adapter before vit
    words = '|'.join(map(re.escape, names))
    pattern = re.compile(rf'(?<![A-Za-z0-9])({words})(?![A-Za-z0-9])', re.IGNORECASE)
    paths = sorted(Path(benchmark.__file__).parent.glob('*.py'))
    assert len(paths) >= 5
    for path in paths:
        assert not pattern.findall(path.read_text()), path
    with_peers = {family: cls for family, cls in classes.items() if has_peers(cls)}
    assert sorted(with_peers) == ['pvtv2', 'swin', 'vit']
    for family, cls in with_peers.items():
        owner = peers_owner(cls)
        builder = vars(owner)['benchmark_peers']
        assert owner.family == family and owner.__module__ == cls.__module__, family
        assert builder.__module__ == f'{cls.__module__}_peers', (family, builder.__module__)


def _copy_peers(ours: torch.nn.Module, img_size: Tuple[int, int]) -> Dict[str, torch.nn.Module]:
    return {'copy': copy.deepcopy(ours)}


class PeeredPVT(PyramidVisionTransformerV2):
    """A family whose peers are defined here, in its own file."""
    family = 'peeredpvt'
    benchmark_peers = _copy_peers


class BorrowingPVT(PyramidVisionTransformerV2):
    """A family subclassing another's class, with no peers of its own."""
    family = 'borrowingpvt'


def test_a_family_defined_elsewhere_gets_the_benchmark_from_the_registry():
    from mmvit_ext.benchmark import peer_families
    from mmvit_ext.registry import MODELS
    added = {'PeeredPVT': PeeredPVT, 'BorrowingPVT': BorrowingPVT}
    with mock.patch.dict(MODELS.module_dict, added):
        assert peer_families() == ['peeredpvt', 'pvtv2', 'swin', 'vit']
        ours = PeeredPVT('b0', drop_path_rate=0.0)
        peers = build_peers(ours, (64, 64))
        assert list(peers) == ['copy'] and peers['copy'] is not ours
        assert check_peers(ours, peers, (64, 64)) == {'copy': ((64, 64), 0.0)}
        with pytest.raises(ValueError, match='no peer implementations for BorrowingPVT'):
            build_peers(BorrowingPVT('b0'), (64, 64))
    assert 'peeredpvt' not in peer_families()


def test_agreement_sizes_follow_each_peers_semantics():
    swin = SwinTransformer('tiny')
    assert agreement_size(swin, 'mmdet', (512, 512)) == (512, 512)
    assert agreement_size(swin, 'mmdet', (224, 224)) == (256, 256)  # mmdet shifts a 7x7 map
    assert agreement_size(swin, 'timm', (512, 512)) == (224, 224)   # timm rolls before padding
    assert agreement_size(swin, 'timm', (448, 448)) == (448, 448)


def test_benchmark_tool_prints_ratio_summary(tmp_path):
    result = tool_process('tools/analysis/benchmark.py', 'pvtv2:b0', '--size', '64', '64',
                          '--batch', '1', '--warmup', '0', '--repeat', '1', '--compare',
                          '--profile', str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert any(line.startswith('[check] mmdet: outputs match ours') for line in lines)
    summary = lines[-1]
    assert summary.startswith('SUMMARY pvtv2:b0 fp32 b1 64x64')
    for key in ('fwd_speedup_vs_mmdet', 'fwdbwd_speedup_vs_timm', 'fwdbwd_mem_vs_mmdet',
                'fwdbwd_peak_frac'):
        assert re.search(rf'{key}=\d+\.\d\d', summary), key
    # --profile: one table per model and mode, its ops by self time, the matmuls among them
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f'{name}_{mode}.txt' for name in ('ours', 'mmdet', 'timm') for mode in ('fwd', 'fwdbwd'))
    for path in tmp_path.iterdir():
        table = path.read_text()
        assert 'Self CPU' in table and re.search(r'aten::(addmm|mm|linear|bmm)\b', table), path


def test_live_peak_counts_what_a_step_holds():
    """On the meta device: a forward holds its output (exact bytes); backward adds gradients;
    the Refiner recomputing its expanded maps holds far less than keeping them (tool, --device
    meta, ratios against DeepViT)."""
    from torch import nn

    from mmvit_ext.benchmark.live_memory import live_peak_bytes
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 8)).to('meta')
    x = torch.randn(16, 256, device='meta')
    assert live_peak_bytes(model, x, backward=False) == 16 * 512 * 4 * 2  # two live activations
    assert live_peak_bytes(model, x.requires_grad_()) > live_peak_bytes(model, x, backward=False)
    summaries = []
    for setting in ('recompute_maps=True', 'recompute_maps=False'):
        result = tool_process('tools/analysis/benchmark.py', 'refiner:s', '--against', 'deepvit:s',
                              '--device', 'meta', '--batch', '1', '--size', '256', '320',
                              '--modes', 'fwdbwd', '--set', setting, timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        summaries.append(result.stdout.strip().splitlines()[-1])
    ratio = [float(re.search(r'fwdbwd_live_vs_deepvit:s=(\d+\.\d\d)', s).group(1)) for s in summaries]
    assert ratio[0] < 0.6 * ratio[1], summaries


def test_compare_revisions_alternates_variants_and_prints_ratios():
    """Two variants of this checkout (one with extra benchmark arguments), one round: a row per
    model and mode with each variant's median and the ratio to the first."""
    result = tool_process('tools/analysis/compare_revisions.py', 'a=.', 'b=.+--eval',
                          '--rounds', '1', '--', 'pvtv2:b0', '--batch', '1', '--size', '64', '64',
                          '--warmup', '0', '--repeat', '1', '--peak-size', '64', timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith('| ours |')]
    assert [row.split(' | ')[1] for row in rows] == ['fwd', 'fwdbwd']
    for row in rows:
        assert re.fullmatch(r'\| ours \| fwd(bwd)? \| \d+\.\d{3} \| \d+\.\d{3} \| \d+\.\d\dx \|', row), row
    refused = tool_process('tools/analysis/benchmark.py', 'pvtv2:b0', '--compile', '--warmup', '0',
                           timeout=300)
    assert refused.returncode != 0 and '--warmup >= 1' in refused.stderr


def test_benchmark_tool_times_whole_segmentors_against_each_other(tmp_path):
    """--config with --against: an EoMT segmentor (in its trained state: no masks) against an
    adapter + Mask2Former segmentor on the same kind of trunk, inference (predict) and the loss
    step, printed as ratios; --against-options sets the other config only."""
    root = Path(__file__).resolve().parents[1] / 'configs' / 'mmseg'
    tiny = "dict(_delete_=True, embed_dims=64, depth=4, num_heads=2, patch_size=16, layer_scale=1e-5, " \
           "reg_tokens=4, norm_eps=1e-5, rope=dict(base=100.0, normalize='separate'))"
    (tmp_path / 'tiny_eomt.py').write_text(
        f"_base_ = '{root}/eomt_dinov3_vitl16_512x512_ade20k.py'\n"
        f"model = dict(backbone=dict(arch={tiny}, num_blocks=2, img_size=64, init_cfg=None),\n"
        f"             test_cfg=dict(mode='window', crop_size=(64, 64)))\n"
        f"custom_hooks = [dict(type='mmvit_ext.EoMTMaskAnnealingHook', start_iters=[0, 1],\n"
        f"                     end_iters=[1, 2])]\n")
    (tmp_path / 'tiny_m2f.py').write_text(
        f"_base_ = '{root}/mask2former_dinov3_vitl16_adapter_512x512_160k_ade20k.py'\n"
        f"model = dict(backbone=dict(arch={tiny}, interaction_indexes=[0, 1, 2, 3],\n"
        f"                           init_cfg=None),\n"
        f"             decode_head=dict(in_channels=[64] * 4, hidden_dims=256),\n"
        f"             test_cfg=dict(mode='whole'))\n")
    for mode in (['fwd', '--eval'], ['fwdbwd']):
        result = tool_process('tools/analysis/benchmark.py', '--config',
                              str(tmp_path / 'tiny_eomt.py'), '--against',
                              str(tmp_path / 'tiny_m2f.py'), '--against-options',
                              'model.decode_head.hidden_dims=64', '--size', '64', '64',
                              '--batch', '1', '--warmup', '0', '--repeat', '1', '--modes', *mode,
                              timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        out = result.stdout
        assert ('[trained state] tiny_eomt: EoMTMaskAnnealingHook' in out) == (mode[0] == 'fwd')
        assert re.search(rf'\| tiny_m2f \| {mode[0]} \| \d+\.\d+', out), out[-2000:]
        assert re.search(rf'ours vs tiny_m2f {mode[0]}: \d+\.\d\dx speed', out), out[-2000:]
