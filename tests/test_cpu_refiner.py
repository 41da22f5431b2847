"""The Refined-ViT CPU inference kernels (mmvit_ext.ops.cpu_refiner) against the portable code:
the folded, row-chunked Refiner, the chunked map application and the carried-map softmax."""
import pytest
import torch
from torch import nn

from mmvit_ext import flags
from mmvit_ext.backbones import RefinedViT
from mmvit_ext.layers import RefinerMap
from mmvit_ext.ops import cpu_refiner


@pytest.fixture(autouse=True)
def _kernels_on():
    with flags.kernels('auto'):
        yield


def _random_statistics(module: nn.Module) -> nn.Module:
    """Non-trivial BatchNorm statistics and affine parameters, so that folding is exercised."""
    torch.manual_seed(0)
    for norm in (m for m in module.modules() if isinstance(m, nn.BatchNorm2d)):
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.5, 2)
        norm.weight.data.uniform_(0.5, 1.5)
        norm.bias.data.uniform_(-1, 1)
    return module.eval()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize('expand_ratio,kernel_size,shape', [
    (3, 3, (2, 3, 2, 37, 29)),   # (batch, windows, heads, N, M): several maps per chunk
    (3, 5, (1, 2, 40, 40)),      # a global map cut into row chunks with a 2-row halo
    (1, 3, (1, 4, 33, 21)),      # no expansion
])
@pytest.mark.parametrize('chunk', [2 ** 12, 2 ** 21])
def test_refiner_kernel_matches_module(expand_ratio, kernel_size, shape, chunk, monkeypatch):
    monkeypatch.setattr(cpu_refiner, 'REFINER_CHUNK_ELEMENTS', chunk)
    monkeypatch.setattr(cpu_refiner, 'REFINER_MIN_ROWS', 3)
    refiner = _random_statistics(RefinerMap(shape[-3], expand_ratio, kernel_size, scale=0.3))
    maps = torch.rand(shape)
    values = torch.randn(*shape[:-2], shape[-1], 8)
    with torch.no_grad():
        ref = refiner(maps)
        out = cpu_refiner.refiner_kernel(refiner, maps)
        applied = cpu_refiner.map_attention(maps, values, transforms=(refiner,))
    assert out.shape == ref.shape
    assert _relative(out, ref) < 1e-5
    assert _relative(applied, ref @ values) < 1e-5


def test_refiner_kernel_declines_training_and_gradients():
    refiner = _random_statistics(RefinerMap(2))
    maps = torch.rand(1, 2, 12, 12)
    with torch.no_grad():
        assert cpu_refiner.applies(refiner, maps)
        assert not cpu_refiner.applies(refiner, maps.double())
        refiner.bn2.train()
        assert not cpu_refiner.applies(refiner, maps)
        refiner.bn2.eval()
    assert not cpu_refiner.applies(refiner, maps)  # gradients on
    out = cpu_refiner.refiner_kernel(refiner, maps.requires_grad_())
    assert out.requires_grad  # the module's own forward ran
    assert cpu_refiner.map_attention(maps, maps, transforms=(refiner,)) is NotImplemented


def test_refined_vit_kernels_equal_portable(monkeypatch):
    """A tiny Refined-ViT with windowed and global pairs at an odd size: every kernel of this
    file runs (counted) and the outputs equal the portable path's; flags.fused_attention(False)
    keeps whole maps for the ``attn_map`` hooks."""
    monkeypatch.setattr(cpu_refiner, 'REFINER_CHUNK_ELEMENTS', 2 ** 11)
    monkeypatch.setattr(cpu_refiner, 'REFINER_MIN_ROWS', 4)
    calls = {'refine': 0, 'carried': 0}
    chunks, carried = cpu_refiner._refined_chunks, cpu_refiner.carried_explicit_attention

    def count_chunks(*args):
        calls['refine'] += 1
        return chunks(*args)

    def count_carried(*args, **kwargs):
        out = carried(*args, **kwargs)
        calls['carried'] += out is not NotImplemented
        return out

    monkeypatch.setattr(cpu_refiner, '_refined_chunks', count_chunks)
    monkeypatch.setattr(cpu_refiner, 'carried_explicit_attention', count_carried)
    model = _random_statistics(RefinedViT(dict(embed_dims=48, depth=4, num_heads=4,
                                               conv_stem=(8, 8, 16)),
                                          window_size=3, global_blocks=(2, 3)))
    x = torch.randn(2, 3, 112, 137)
    with torch.no_grad():
        with flags.kernels('portable'):
            ref = model(x)
        out = model(x)
        assert calls == {'refine': 2, 'carried': 2}  # per pair: the refined map, its source
        for a, b in zip(out, ref):
            assert a.shape == b.shape and _relative(a, b) < 1e-5
        seen = []
        model.blocks[3].attn.attn_map.register_forward_hook(
            lambda module, args, output: seen.append(output.shape))
        with flags.fused_attention(False):
            whole = model(x)
        assert seen == [(2, 4, 63, 63)]  # 7 x 9 tokens: one whole refined map per image pair
        for a, b in zip(whole, ref):
            assert _relative(a, b) < 1e-5
