"""CPU kernels (mmvit_ext.ops) against the portable code they stand in for: outputs and
gradients, where each applies, and the one switch that turns them all off."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmvit_ext import flags, ops
from mmvit_ext.layers import explicit_attention, scaled_dot_product_attention
from mmvit_ext.layers.map_transforms import TalkingHeads
from mmvit_ext.ops import cpu_attention, cpu_gemm



@pytest.fixture(autouse=True)
def _kernels_on():
    """These tests are about the CPU kernels themselves: on, whatever MMVIT_EXT_KERNELS says
    (the rest of the suite runs both ways)."""
    with flags.kernels('auto'):
        yield

@pytest.mark.parametrize('shape,bias', [((2, 300, 48), True), ((700, 32), False)])
def test_onednn_linear_matches_f_linear_forward_and_backward(shape, bias):
    layer = nn.Linear(shape[-1], 40, bias=bias)
    x = torch.randn(*shape, requires_grad=True)
    grad = torch.randn(*shape[:-1], 40)
    out = cpu_gemm.linear(x, layer.weight, layer.bias)
    out.backward(grad)
    ours = (out.detach(), x.grad.clone(), layer.weight.grad.clone())
    x.grad, layer.weight.grad = None, None
    ref = F.linear(x, layer.weight, layer.bias)
    ref.backward(grad)
    assert out.is_contiguous() and out.shape == ref.shape
    for a, b in zip(ours, (ref.detach(), x.grad, layer.weight.grad)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # non-contiguous input (a transposed view) gives the same product
    xt = x.detach().transpose(-2, -1).contiguous().transpose(-2, -1)
    torch.testing.assert_close(cpu_gemm.linear(xt, layer.weight, layer.bias), ref.detach(),
                               rtol=1e-4, atol=1e-4)


def test_kernels_route_through_the_mode_and_the_switch(monkeypatch):
    """Inside ops.call an nn.Linear on >= 256 float32 rows runs the oneDNN route; small inputs,
    autocast, float64 and MMVIT_EXT_KERNELS=portable run F.linear as written."""
    calls = []
    real_conv = F.conv2d
    monkeypatch.setattr(F, 'conv2d', lambda *a, **k: calls.append(1) or real_conv(*a, **k))
    layer = nn.Linear(16, 8)
    rows = cpu_gemm.ONEDNN_MIN_ROWS
    ops.call(layer, torch.randn(rows, 16))
    assert len(calls) == 1
    layer(torch.randn(rows, 16))                          # outside the mode: the plain call
    ops.call(layer, torch.randn(rows - 1, 16))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert ops.call(layer, torch.randn(rows, 16)).dtype == torch.bfloat16
    ops.call(layer.double(), torch.randn(rows, 16, dtype=torch.float64))
    assert len(calls) == 1
    layer.float()
    with flags.kernels('portable'):
        assert not ops.cpu_kernels_apply(torch.randn(1))
        ops.call(layer, torch.randn(rows, 16))
    assert len(calls) == 1
    assert not ops.cpu_kernels_apply(torch.randn(1, device='meta'))
    with pytest.raises(ValueError, match='portable'):
        with flags.kernels('fast'):
            pass
    assert flags.kernels.get() == 'auto'  # a refused value changes nothing


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('windows,bias_shape,chunk', [
    (False, (1, 100, 100), None), (True, (5, 3, 49, 49), None),
    (True, (5, 3, 49, 49), 2 * 2 * 3 * 49 * 49), (True, (3, 49, 49), 3 * 2 * 3 * 49 * 49)])
def test_small_map_kernel_matches_sdpa(dtype, windows, bias_shape, chunk, monkeypatch):
    """Outputs and gradients of q, k, v and a per-window (or shared) bias equal the portable
    scaled_dot_product_attention's, also when windows run in chunks (of 2 and 3 windows: the
    last chunk shorter). bf16 training on windows takes the explicit map (autograd)."""
    if chunk is not None:
        monkeypatch.setattr(cpu_attention, 'SMALL_MAP_CHUNK_ELEMENTS', chunk)
    shape = (2, 5, 3, 49, 16) if windows else (2, 3, 100, 16)
    q, k, v = (torch.randn(*shape, dtype=dtype, requires_grad=True) for _ in range(3))
    bias = torch.randn(*bias_shape, requires_grad=True)
    if chunk is not None:
        assert cpu_attention._Chunks(q, k, v, (bias,)).step == chunk // (2 * 3 * 49 * 49)
    assert cpu_attention.small_map_applies(q, k, 0.0)
    assert not cpu_attention.small_map_applies(q, k, 0.1)
    grad = torch.randn(shape, dtype=dtype)
    ours = cpu_attention.scaled_dot_product_attention(q, k, v, bias, scale=0.25)
    kernel = type(ours.grad_fn).__name__ == 'SmallMapAttentionBackward'
    assert kernel == (dtype == torch.float32 or not windows)  # 49 keys vs 100
    ours.backward(grad)
    got = [ours.detach()] + [t.grad.clone() for t in (q, k, v, bias)]
    for t in (q, k, v, bias):
        t.grad = None
    ref = scaled_dot_product_attention(q, k, v, bias, scale=0.25)
    ref.backward(grad)
    want = [ref.detach()] + [t.grad for t in (q, k, v, bias)]
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), **tol)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_small_map_kernel_bias_terms(dtype, monkeypatch):
    """A per-head bias and a per-window mask passed as terms (Swin's shifted windows) give the
    summed bias's output and gradients, and the kernel keeps no (windows x heads) sum: it saves
    the terms as they are. bf16 included (the small-map kernel, the explicit map kept off)."""
    monkeypatch.setattr(cpu_attention, 'EXPLICIT_HALF_MAX_KEYS', 0)
    monkeypatch.setattr(cpu_attention, 'SMALL_MAP_CHUNK_ELEMENTS', 2 * 2 * 3 * 49 * 49)
    q, k, v = (torch.randn(2, 5, 3, 49, 16, dtype=dtype, requires_grad=True) for _ in range(3))
    head_bias = torch.randn(3, 49, 49, requires_grad=True)
    mask = torch.randn(5, 1, 49, 49)
    grad = torch.randn(q.shape, dtype=dtype)
    ours = cpu_attention.scaled_dot_product_attention(q, k, v, (head_bias, mask), scale=0.25)
    assert type(ours.grad_fn).__name__ == 'SmallMapAttentionBackward'
    assert [tuple(t.shape) for t in ours.grad_fn.saved_tensors[3:]] == [(3, 49, 49), (5, 1, 49, 49)]
    got = [ours] + list(torch.autograd.grad(ours, (q, k, v, head_bias), grad))
    ref = scaled_dot_product_attention(q, k, v, head_bias + mask, scale=0.25)
    want = [ref] + list(torch.autograd.grad(ref, (q, k, v, head_bias), grad))
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), **tol)


def test_lean_blocks_keep_no_bf16_map():
    """bf16 training on windows takes the explicit map (saved), inside cpu_attention.lean()
    (blocks checkpointed for memory) the small-map kernel (no map saved)."""
    q, k, v = (torch.randn(2, 5, 3, 49, 16, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = cpu_attention.scaled_dot_product_attention(q, k, v, scale=0.25)
    assert type(out.grad_fn).__name__ != 'SmallMapAttentionBackward'
    with cpu_attention.lean():
        lean = cpu_attention.scaled_dot_product_attention(q, k, v, scale=0.25)
    assert type(lean.grad_fn).__name__ == 'SmallMapAttentionBackward'
    torch.testing.assert_close(lean.float(), out.float(), rtol=3e-2, atol=3e-2)


def test_small_map_kernel_keys_broadcast_over_batch():
    """Keys / values shared by every batch element get their gradients summed over it."""
    q = torch.randn(2, 3, 100, 16, requires_grad=True)
    k, v = (torch.randn(1, 3, 100, 16, requires_grad=True) for _ in range(2))
    grad = torch.randn(2, 3, 100, 16)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # e.g. an out= tensor resized
        got = torch.autograd.grad(cpu_attention.SmallMapAttention.apply(q, k, v, 0.25),
                                  (q, k, v), grad)
    ref = F.scaled_dot_product_attention(q, k.expand_as(q), v.expand_as(q), scale=0.25)
    for a, b in zip(got, torch.autograd.grad(ref, (q, k, v), grad)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_inference_chunks_explicit_maps_on_cpu_only(monkeypatch):
    """At inference on CPU, large explicit maps run in query chunks when the transforms are
    row-local, with the portable result; on another device (meta here) they run whole."""
    monkeypatch.setattr(cpu_attention, 'INFERENCE_CHUNK_ELEMENTS', 2 * 2 * 42 * 10)
    calls = []
    real = cpu_attention.explicit_attention
    monkeypatch.setattr(cpu_attention, 'explicit_attention',
                        lambda q, *a, **k: calls.append(q.shape[-2]) or real(q, *a, **k))
    transforms = nn.ModuleList([TalkingHeads(2)]).eval()
    q, k, v = (torch.randn(2, 2, 42, 8) for _ in range(3))
    with torch.no_grad():
        whole = explicit_attention(q, k, v, 0.3, transforms=transforms)
        chunked = ops.call(lambda t: explicit_attention(t, k, v, 0.3, transforms=transforms), q)
        assert calls == [10, 10, 10, 10, 2]                   # 42 query rows in 5 chunks
        torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=1e-6)
        calls.clear()
        meta = [t.to('meta') for t in (q, k, v)]
        ops.call(lambda t: explicit_attention(t, *meta[1:], 0.3, transforms=transforms), meta[0])
        assert calls == []                                    # not even offered to the kernel


@pytest.mark.parametrize('kind', ['mlp', 'conv_mlp', 'conv_mlp_li'])
@pytest.mark.parametrize('autocast', [False, True])
def test_recomputed_input_linears_match_portable(kind, autocast):
    """``mlp(norm(x))`` as the blocks write it: inside the CPU kernels, fc1 (after the LayerNorm)
    and fc2 (after the GELU) save their producer's input instead of their own, with the portable
    outputs and gradients of the input and of every parameter, in float32 and bf16 autocast."""
    from mmvit_ext.layers import ConvMlp, Mlp
    torch.manual_seed(0)
    norm = nn.LayerNorm(24)
    nn.init.normal_(norm.weight, 1.0, 0.2), nn.init.normal_(norm.bias, 0.0, 0.2)
    mlp = Mlp(24, 64) if kind == 'mlp' else ConvMlp(24, 64, linear=kind == 'conv_mlp_li')
    args = () if kind == 'mlp' else ((10, 30),)
    x = torch.randn(2, 300, 24, requires_grad=True)
    grad = torch.randn(2, 300, 24)
    params = [x, *norm.parameters(), *mlp.parameters()]

    def run(kernels):
        with flags.kernels(kernels), torch.autocast('cpu', dtype=torch.bfloat16,
                                                    enabled=autocast):
            out = ops.call(lambda t: mlp(norm(t), *args), x)
        return out, [out.detach().float(), *torch.autograd.grad(out.float(), params, grad)]

    (out, ours), (_, ref) = run('auto'), run('portable')
    assert type(out.grad_fn).__name__ == 'RecomputedInputLinearBackward'  # fc2 after the GELU
    tol = dict(rtol=1e-4, atol=1e-4) if not autocast else dict(rtol=5e-2, atol=5e-2)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **tol)


def test_recomputed_input_linear_declines_what_it_does_not_implement():
    from mmvit_ext.ops import cpu_mlp
    x = torch.randn(1, 10, 8)
    weight, bias = torch.ones(8), torch.zeros(8)
    assert cpu_mlp.layer_norm(x.double(), (8,), weight.double(), bias.double()) \
        is NotImplemented
    assert cpu_mlp.layer_norm(x, (8,)) is NotImplemented  # not affine
    assert cpu_mlp.gelu(x, approximate='tanh') is NotImplemented
    with torch.no_grad():  # nothing saved at inference: nothing to gain
        assert cpu_mlp.layer_norm(x, (8,), weight, bias) is NotImplemented
        assert cpu_mlp.gelu(x) is NotImplemented
    assert cpu_mlp.linear(x, torch.ones(4, 8)) is NotImplemented  # an untagged input
    tagged = cpu_mlp.gelu(x)
    assert cpu_mlp.linear(tagged, torch.ones(4, 8)) is not NotImplemented


def test_mlp_inference_row_chunks_equal_whole(monkeypatch):
    """At inference inside ops.call, an Mlp runs on row chunks through its own forward (the
    module kernel), with the whole run's values; the module is left as it was."""
    from mmvit_ext.layers import Mlp
    from mmvit_ext.ops import cpu_mlp
    monkeypatch.setattr(cpu_mlp, 'MLP_CHUNK_ELEMENTS', 32 * 300)
    mlp = Mlp(8, 32)
    rows = []
    mlp.fc1.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    x = torch.randn(2, 700, 8)
    with torch.no_grad():
        chunked = ops.call(mlp, x)
        assert rows == [300, 300, 300, 300, 200]
        torch.testing.assert_close(chunked, mlp(x), rtol=1e-5, atol=1e-5)
    assert 'forward' not in vars(mlp)


@pytest.mark.parametrize('name', ['SwinTransformer', 'PyramidVisionTransformerV2'])
def test_bf16_autocast_training_matches_portable(name):
    """A backbone's forward and backward under bf16 autocast with the CPU kernels on is as close
    to the float32 run as the portable bf16 run is: outputs and every parameter's gradient
    (bf16 rounding differs between the two, so each is held to the portable run's error)."""
    from backbone_cases import SMALL
    from mmvit_ext.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(dict(type=f'mmvit_ext.{name}', **SMALL[name])).train()
    x = torch.randn(2, 3, 64, 64)
    params = [p for p in model.parameters() if p.requires_grad]
    weights = [torch.randn(o.shape) for o in model(x)]  # a loss with a gradient to every param

    def run(kernels, dtype):
        torch.manual_seed(1)  # the same drop-path draws in every run
        with flags.kernels(kernels), torch.autocast('cpu', dtype=dtype,
                                                    enabled=dtype != torch.float32):
            outs = model(x)
        loss = sum((o.float() * w).sum() for o, w in zip(outs, weights))
        return [o.detach().float() for o in outs] + list(torch.autograd.grad(loss, params))

    ref = run('portable', torch.float32)
    ours, portable = run('auto', torch.bfloat16), run('portable', torch.bfloat16)
    errors = []
    for a, b, r in zip(ours, portable, ref):
        scale = r.abs().max().clamp_min(1e-6)
        errors.append(((a - r).abs().max() / scale, (b - r).abs().max() / scale))
    ours_err, portable_err = (torch.stack(e) for e in zip(*errors))
    assert len(errors) == len(ref) and portable_err.median() > 0
    assert ours_err.median() < 1.5 * portable_err.median()
    assert ours_err.max() < 2 * portable_err.max()
