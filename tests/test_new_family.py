"""docs/adding_a_family.md, followed for a small family defined here: with no other change to
the package it gets the contract suite of tests/contract.py, layer-wise lr decay, the checkpoint
layout and ``tools/convert_checkpoint.py``'s arch inference, ONNX export, and the
``model_stats`` / ``benchmark`` tools."""
import sys
from typing import Any, Dict, List, Optional, Tuple
from unittest import mock

import pytest
import torch
from mmengine.registry import Registry
from torch import nn

import contract
from mmvit_ext.backbones import BaseBackbone, ExportLimits
from mmvit_ext.converters import register_layout
from mmvit_ext.converters.layouts import LAYOUTS
from mmvit_ext.layers import DropPath, Mlp, PatchEmbed, WindowAttention, linear_drop_path_rates
from mmvit_ext.registry import MODELS
from tool_runner import ROOT

# a child of our scope, so the global registry (and the suite's registered-cases check) stays
# as it is; a real family registers with @MODELS.register_module()
TEST_MODELS = Registry('model', parent=MODELS, scope='new_family_test')


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, drop_path: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, heads, window)
        self.mlp = Mlp(dim, 2 * dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class _Stage(nn.Module):
    def __init__(self, in_dim: int, dim: int, depth: int, first: bool, rates: List[float]) -> None:
        super().__init__()
        self.embed = PatchEmbed(in_dim, dim, 4 if first else 2, norm_layer=nn.LayerNorm)
        self.blocks = nn.ModuleList(_Block(dim, 2, 4, rate) for rate in rates[:depth])
        self.norm = nn.LayerNorm(dim)


@TEST_MODELS.register_module()
class TinyPyramidViT(BaseBackbone):
    """Windowed attention stages at strides 4, 8, 16, each opened by a patch embedding."""

    family = 'tinypyramid'
    arch_zoo = {**dict.fromkeys(['t', 'tiny'], dict(embed_dims=(16, 32, 48), depths=(1, 2, 1)))}
    default_arch = 'tiny'
    essential_keys = frozenset({'embed_dims', 'depths'})
    paper_figures = {'tiny': (None, None)}

    def __init__(self, arch='tiny', out_indices=(0, 1, 2), frozen_stages=-1, norm_eval=False,
                 with_cp=False, drop_path_rate=0.0, init_cfg=None) -> None:
        super().__init__(init_cfg=init_cfg)
        settings = self.resolve_arch(arch)
        dims, depths = tuple(settings['embed_dims']), tuple(settings['depths'])
        self._set_contract(out_indices, dims, [4 * 2 ** i for i in range(len(dims))],
                           frozen_stages, len(dims), norm_eval, with_cp)
        self.min_input_size = 4
        rates = linear_drop_path_rates(drop_path_rate, sum(depths))
        self.stages = nn.ModuleList(
            _Stage(3 if i == 0 else dims[i - 1], dims[i], depths[i], i == 0,
                   rates[sum(depths[:i]):]) for i in range(self.out_indices[-1] + 1))

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        outs = []
        for i, stage in enumerate(self.stages):
            tokens, hw = stage.embed(x)
            for block in stage.blocks:
                tokens = self.run_block(block, tokens, hw)
            x = stage.norm(tokens).transpose(1, 2).reshape(tokens.shape[0], -1, *hw)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)

    def frozen_modules(self) -> List[nn.Module]:
        return list(self.stages[:max(self.frozen_stages, 0)]) if self.frozen_stages >= 0 else []

    def unbuilt_prefixes(self) -> Tuple[str, ...]:
        return tuple(f'stages.{i}.' for i in range(len(self.stages), self.num_outputs))

    def layer_depth_groups(self) -> List[Tuple[str, ...]]:
        """The first embedding 0, then one id per block; a stage's norm and the next stage's
        embedding go with its last block."""
        groups: List[Tuple[str, ...]] = [('stages.0.embed',)]
        for i, stage in enumerate(self.stages):
            groups += [(f'stages.{i}.blocks.{j}',) for j in range(len(stage.blocks))]
            groups[-1] += (f'stages.{i}.norm', f'stages.{i + 1}.embed')
        return groups

    @classmethod
    def infer_arch(cls, state_dict: Dict[str, torch.Tensor]) -> Optional[Dict[str, Any]]:
        stages = sorted({int(k.split('.')[1]) for k in state_dict if k.startswith('stages.')})
        return dict(arch=dict(
            embed_dims=[state_dict[f'stages.{i}.embed.proj.weight'].shape[0] for i in stages],
            depths=[len({k.split('.')[3] for k in state_dict
                         if k.startswith(f'stages.{i}.blocks.')}) for i in stages]))

    def export_limits(self) -> ExportLimits:
        """Windows of 4 shrink on maps of 4 or fewer tokens: fixed from 4 x 4 at the deepest
        built stride."""
        limits = super().export_limits()
        return ExportLimits(limits.min_size, self.level_strides[len(self.stages) - 1] * 4 + 1)


CASE = dict(arch='tiny')
CHECKS = [name for name in dir(contract) if name.startswith('check_')]


def test_suite_is_complete():
    assert len(CHECKS) >= 10


@pytest.mark.parametrize('check', CHECKS)
def test_new_family_passes_the_contract(check, tmp_path):
    cls = TEST_MODELS.get('TinyPyramidViT')
    run = getattr(contract, check)
    if check == 'check_output_shapes':
        for size in contract.SIZES:
            run(cls, CASE, size)
    elif check in ('check_state_dict_roundtrip', 'check_unknown_layout_refused'):
        run(cls, CASE, tmp_path / 'weights.pth')
    else:
        run(cls, CASE)


# ---- the rest of the package and the tools, with no edit elsewhere ------------------------------
@pytest.fixture
def registered():
    """The family as a real one is: registered in our scope, with its own key layout (what
    ``@MODELS.register_module()`` and ``converters/<family>.py`` do), for this test only."""
    register_layout('mmvit_ext TinyPyramidViT', 'tinypyramid', r'^stages\.0\.embed\.proj\.',
                    ours=True)
    try:
        with mock.patch.dict(MODELS.module_dict, {'TinyPyramidViT': TinyPyramidViT}):
            yield TinyPyramidViT
    finally:
        LAYOUTS.pop()


def test_found_by_the_registry(registered):
    from mmvit_ext.backbones import family_class, preset_config
    assert family_class('tinypyramid') is registered
    assert preset_config('tinypyramid:t') == dict(type='mmvit_ext.TinyPyramidViT', arch='t')


def test_layer_decay(registered, monkeypatch):
    import test_layer_decay
    monkeypatch.setitem(test_layer_decay.SMALL, 'TinyPyramidViT', CASE)
    test_layer_decay.test_layer_depth_contract('TinyPyramidViT')
    model = registered(**CASE)
    assert model.get_layer_depth('stages.1.blocks.1.mlp.fc1.weight') == (3, 6)


def test_convert_checkpoint_infers_the_arch(registered, tmp_path):
    sys.path.insert(0, str(ROOT / 'tools'))
    from convert_checkpoint import convert
    source = registered(arch=dict(embed_dims=(8, 16, 24), depths=(2, 1, 3)))
    torch.save({'state_dict': source.state_dict()}, tmp_path / 'src.pth')
    out = convert(str(tmp_path / 'src.pth'), str(tmp_path / 'dst.pth'))
    assert 'detected layout: mmvit_ext TinyPyramidViT' in out
    assert "load-checked" in out and "'embed_dims': [8, 16, 24], 'depths': [2, 1, 3]" in out


def test_onnx_export(registered, monkeypatch, tmp_path):
    import test_onnx_export
    monkeypatch.setitem(test_onnx_export.BACKBONES, 'TinyPyramidViT', CASE)
    from mmvit_ext import deploy
    root = deploy.export_root(registered(**CASE), 'backbone')
    assert deploy.min_dynamic_size(root) == 16 * 4 + 1  # from export_limits()
    test_onnx_export.test_backbone_exports_with_dynamic_shapes('TinyPyramidViT', tmp_path)


def test_model_stats_and_benchmark(registered, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / 'tools' / 'analysis'))
    import benchmark
    import model_stats
    assert model_stats.paper_figures()['tinypyramid:tiny'] == (None, None)
    classifier = model_stats.build_preset('tinypyramid:tiny', classifier=True)
    assert classifier.backbone.out_indices == (2,)  # classifier_settings(): the deepest output
    stats = model_stats.count(classifier, (64, 64))
    assert stats['params'] == sum(p.numel() for p in classifier.parameters())
    assert stats['flops'] > 0
    monkeypatch.setattr(sys, 'argv', ['benchmark.py', 'tinypyramid:tiny', '--size', '64', '64',
                                      '--batch', '1', '--warmup', '0', '--repeat', '1'])
    benchmark.main()
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith('SUMMARY tinypyramid:tiny fp32 b1 64x64')
    with pytest.raises(ValueError, match='no peer implementations for TinyPyramidViT'):
        registered(**CASE).benchmark_peers((64, 64))
