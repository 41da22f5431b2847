"""The Refiner with frozen norms (inference, ``norm_eval``): BatchNorms and scale folded into its
convolutions, the map refined a band of rows at a time, channels-last. It
must equal the Refiner run through its modules, for any band height (bands meet at the local
convolution's halo), and hold far less than the expanded maps at once."""
import pytest
import torch
from torch import nn

from mmvit_ext.backbones import DeepViT, RefinedViT
from mmvit_ext.benchmark.live_memory import LiveTensorPeak
from mmvit_ext.layers import RefinerMap, map_transforms
from mmvit_ext.layers.attention import fold_leading

TINY = dict(arch=dict(embed_dims=32, depth=4, num_heads=2, conv_stem=(8, 8, 16),
                      mlp_layer_scale=0.1))


def _randomise(module: nn.Module, seed: int = 0) -> nn.Module:
    """Every weight and BatchNorm statistic random (no fold hides behind an identity init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.5)
        for norm in module.modules():
            if isinstance(norm, nn.BatchNorm2d):
                norm.running_mean.copy_(torch.randn(norm.num_features, generator=gen))
                norm.running_var.copy_(torch.rand(norm.num_features, generator=gen) + 0.5)
    return module


def _band_bytes_for(rows: int, maps: torch.Tensor, hidden: int) -> int:
    """REFINER_BAND_BYTES that makes bands of ``rows`` rows over ``maps`` (..., H, N, M)."""
    return rows * fold_leading(maps).shape[0] * hidden * maps.shape[-1] * maps.element_size()


@pytest.mark.parametrize('heads,ratio,kernel,lead', [
    (2, 3, 3, (2,)),        # the official Refiner: 3x expansion, 3x3
    (3, 1, 5, (2, 3)),      # no expansion, 5x5, windows (B, nW)
    (4, 2.5, 3, (1,)),      # expansion to a count that is no multiple of H
])
@pytest.mark.parametrize('rows', [1, 2, 5, None])  # None: one band, as under compile / export
def test_frozen_refiner_equals_its_modules(monkeypatch, heads, ratio, kernel, lead, rows):
    refiner = _randomise(RefinerMap(heads, ratio, kernel, scale=0.7).double()).eval()
    maps = torch.rand(*lead, heads, 17, 13, dtype=torch.float64).softmax(-1)
    expected = refiner._refine(fold_leading(maps)).reshape(maps.shape)  # through the modules
    hidden = refiner.depth_sep_conv.out_channels
    monkeypatch.setattr(map_transforms, 'REFINER_BAND_BYTES',
                        _band_bytes_for(rows, maps, hidden) if rows else 2 ** 40)
    with torch.no_grad():
        torch.testing.assert_close(refiner(maps), expected, rtol=1e-12, atol=1e-13)
    # with gradients (eval with autograd, or norm_eval in training without the recompute)
    refiner.train()
    refiner.recompute = False
    for norm in refiner.modules():
        if isinstance(norm, nn.BatchNorm2d):
            norm.eval()
    leaf = maps.clone().requires_grad_()
    (grad,) = torch.autograd.grad(refiner(leaf).square().sum(), leaf)
    leaf_ref = maps.clone().requires_grad_()
    (grad_ref,) = torch.autograd.grad(refiner._refine(fold_leading(leaf_ref)).square().sum(),
                                      leaf_ref)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-13)


def test_refiner_with_training_norms_runs_its_modules():
    """Norms in training (batch statistics) are not folded: the modules run and count."""
    refiner = RefinerMap(2, 3, 3, recompute=False).train()
    calls = []
    refiner.bn2.register_forward_hook(lambda *args: calls.append(1))
    refiner(torch.rand(2, 2, 6, 6))
    assert calls == [1] and int(refiner.bn2.num_batches_tracked) == 1
    refiner.eval()
    refiner(torch.rand(2, 2, 6, 6))
    assert calls == [1]  # folded: the BatchNorm module is not called at inference


def test_refined_vit_inference_equals_the_module_refiner(monkeypatch):
    """The whole backbone in eval: banded and folded Refiners give the outputs of the modules."""
    torch.manual_seed(0)
    model = _randomise(RefinedViT(**TINY, window_size=None).double()).eval()
    x = torch.randn(2, 3, 64, 80, dtype=torch.float64)
    monkeypatch.setattr(map_transforms, 'REFINER_BAND_BYTES', 1)  # one row per band
    with torch.no_grad():
        banded = model(x)
        monkeypatch.setattr(RefinerMap, '_norms_frozen', lambda self: False)
        modules = model(x)
    for a, b in zip(banded, modules):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _inference_live_bytes(model: nn.Module, size) -> int:
    model = model.eval().to('meta')
    x = torch.randn(1, 3, *size, device='meta')
    with torch.no_grad(), LiveTensorPeak([x, *model.parameters(), *model.buffers()]) as live:
        model(x)
    return live.peak


def test_refined_vit_inference_memory_near_deepvit():
    """Inference holds a little more than DeepViT-S (the maps and one band of their expansion,
    not all r*H expanded maps: 4.6x before the bands; counted on the meta device, no_grad, which
    takes the bands of a GPU, half a map each)."""
    size = (512, 640)  # 1,280 tokens: each global map is 12 x 1280 x 1280 floats (75 MiB)
    refiner = _inference_live_bytes(RefinedViT(arch='s'), size)
    deepvit = _inference_live_bytes(DeepViT(arch='s'), size)
    assert refiner <= 1.6 * deepvit, (refiner / 2 ** 20, deepvit / 2 ** 20)  # 1.42x


def test_a_trace_serves_other_sizes(monkeypatch):
    """Traced (torch.jit.trace, the legacy ONNX exporter's tracer) the map is one band, so a
    trace made on 17 x 13 maps (one-row bands untraced) refines 40 x 31 maps as the modules
    do."""
    monkeypatch.setattr(map_transforms, 'REFINER_BAND_BYTES', 1)
    refiner = _randomise(RefinerMap(2, 3, 3, scale=0.7).double()).eval()
    with torch.no_grad():
        traced = torch.jit.trace(refiner, torch.rand(2, 2, 17, 13, dtype=torch.float64))
        maps = torch.rand(2, 2, 40, 31, dtype=torch.float64).softmax(-1)
        expected = refiner._refine(fold_leading(maps)).reshape(maps.shape)
        torch.testing.assert_close(traced(maps), expected, rtol=1e-12, atol=1e-13)


def test_bands_per_device():
    """CPU: cache-sized bands; any other device: about 2r bands, each band's expanded maps half
    the input map (no CPU cache size there)."""
    cpu = torch.empty(1, 12, 3800, 3800)
    rows = map_transforms.refiner_band_rows(cpu, 36, 1)
    assert rows == map_transforms.REFINER_BAND_BYTES // (36 * 3800 * 4) - 2
    gpu_like = torch.empty(1, 12, 3800, 3800, device='meta')
    rows = map_transforms.refiner_band_rows(gpu_like, 36, 1)
    assert rows == 634 and -(-3800 // rows) == 6  # six bands of 36 x 634 rows
    assert map_transforms.refiner_band_rows(torch.empty(2, 4, 10, 10, device='meta'), 10, 1) == 2
