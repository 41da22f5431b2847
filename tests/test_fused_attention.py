"""Attention's fused path is SDPA where one of its fused kernels takes the call
(:mod:`mmvit_ext.layers.sdpa_kernels`): on the CPU, Swin's windows call
``F.scaled_dot_product_attention`` once per block in inference, in every dtype, and take the
explicit product in training (the CPU flash kernel refuses a bias with a gradient; SDPA's math
fallback would compute in float32); the repr names both. SDPA with a bias gradient (the form CUDA's
memory-efficient kernel takes) equals the explicit product; the training path is differentiable
twice; ViTDet's tables become a mask where no kernel takes q and k wider than v."""
import contextlib
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from mmvit_ext import flags
from mmvit_ext.backbones import PyramidVisionTransformerV2, SwinTransformer, VisionTransformer
from mmvit_ext.layers import WindowAttention, explicit_attention, scaled_dot_product_attention

TINY_SWIN = dict(arch=dict(embed_dims=16, depths=(1, 2, 2, 1), num_heads=(1, 2, 4, 8)),
                 window_size=4, drop_path_rate=0.0)
BLOCKS = 6


@pytest.fixture
def sdpa_calls(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, 'scaled_dot_product_attention',
                        lambda *a, **k: calls.append(a[0].dtype) or real(*a, **k))
    return calls


def _autocast(dtype):
    return (torch.autocast('cpu', dtype) if dtype != torch.float32
            else contextlib.nullcontext())  # torch 2.1 refuses a float32 autocast


def _computed(dtype):
    """The dtype a CPU matmul computes in under ``_autocast(dtype)``: torch < 2.3 has no float16
    CPU autocast and runs float32 (with a warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with _autocast(dtype):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('grad', [True, False])
def test_swin_calls_sdpa_where_a_fused_kernel_takes_the_bias(sdpa_calls, dtype, grad):
    model = SwinTransformer(**TINY_SWIN).train(grad)
    attns = [m for m in model.modules() if isinstance(m, WindowAttention)]
    assert len(attns) == BLOCKS and all(
        m.extra_repr().endswith('fused: cpu flash in inference; explicit in training')
        for m in attns)
    with torch.set_grad_enabled(grad), _autocast(dtype):
        outs = model(torch.randn(1, 3, 64, 64))
    assert sdpa_calls == ([] if grad else [dtype] * BLOCKS)
    if grad:  # the table's gradient comes through the explicit product
        sum(o.float().sum() for o in outs).backward()
        table = model.layers[0].blocks[0].attn.rel_pos.relative_position_bias_table
        assert table.grad is not None and table.grad.abs().sum() > 0


def test_fused_equals_explicit_with_a_bias_gradient(sdpa_calls):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 2, 9, 8, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    table = torch.randn(2, 9, 9, dtype=torch.float64, requires_grad=True)
    shift = torch.randn(4, 1, 9, 9, dtype=torch.float64)
    grads = []
    for attend in (lambda: scaled_dot_product_attention(q, k, v, (table, shift), scale=0.3),
                   lambda: explicit_attention(q, k, v, 0.3, (table, shift))):
        out = attend()
        grads.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v, table))))
    assert len(sdpa_calls) == 1
    for fused, explicit in zip(*grads):
        torch.testing.assert_close(fused, explicit, rtol=1e-12, atol=1e-12)
    model = SwinTransformer(**TINY_SWIN).double().eval()  # inference: SDPA with the mask
    x = torch.randn(2, 3, 40, 56, dtype=torch.float64)
    with torch.no_grad():
        outs = model(x)
        with flags.fused_attention(False):
            ref_outs = model(x)
    assert len(sdpa_calls) == 1 + BLOCKS
    for out, ref in zip(outs, ref_outs):
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_training_path_is_twice_differentiable(sdpa_calls):
    torch.manual_seed(0)
    attn = WindowAttention(4, 2, window_size=2, shift=True, rel_pos=True).double().train()
    with torch.no_grad():
        attn.rel_pos.relative_position_bias_table.normal_()
    x = torch.randn(1, 16, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: attn(t, (4, 4)), (x,))
    assert not sdpa_calls  # explicit: the CPU flash kernel has no double backward either


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_pvtv2_reduced_precision_step_is_sdpa_and_close_to_float32(sdpa_calls, dtype):
    torch.manual_seed(0)
    model = PyramidVisionTransformerV2(dict(embed_dims=(8, 16, 16, 16), depths=(1, 1, 1, 1),
                                            num_heads=(1, 2, 2, 2)), drop_path_rate=0.0).train()
    full = copy.deepcopy(model)
    x = torch.randn(2, 3, 64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with _autocast(dtype):
            outs = model(x)
    assert sdpa_calls == [_computed(dtype)] * 4
    for out, ref in zip(outs, full(x)):
        torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.05)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_rel_pos_vit_calls_sdpa_in_every_dtype(sdpa_calls, dtype):
    torch.manual_seed(0)
    model = VisionTransformer(dict(embed_dims=32, depth=2, num_heads=2), use_rel_pos=True,
                              window_size=2, global_blocks=(1,), img_size=64,
                              drop_path_rate=0.0).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad(), _autocast(dtype):
        out = model(x)
    # the CPU flash kernel takes no q / k wider than v: the tables are a (4-D) mask here
    assert sdpa_calls == [dtype] * 2
    assert all(m.extra_repr().endswith('fused: cpu flash in inference; explicit in training')
               for m in model.modules() if isinstance(m, WindowAttention))
    with torch.no_grad(), flags.fused_attention(False):
        ref = model(x)
    torch.testing.assert_close(out[0].float(), ref[0], rtol=0.05, atol=0.05)
