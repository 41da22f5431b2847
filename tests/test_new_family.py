"""docs/adding_a_family.md, followed for a small family defined here: it gets the contract
suite of tests/contract.py with no other change to the package."""
from typing import List, Tuple

import pytest
import torch
from mmengine.registry import Registry
from torch import nn

import contract
from mmvit_ext.backbones import BaseBackbone
from mmvit_ext.layers import DropPath, Mlp, PatchEmbed, WindowAttention, linear_drop_path_rates
from mmvit_ext.registry import MODELS

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
    essential_keys = frozenset({'embed_dims', 'depths'})

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
