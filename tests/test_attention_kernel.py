"""Attention's CPU kernel (mmvit_ext.ops.attention): where SDPA's CPU kernels are the slower way
(a bias that needs a gradient, Swin's position table in training; bfloat16 maps of at most
2**18 query-key pairs per image and head; bfloat16 maps of any size without a gradient, in
pieces) the fused path runs the explicit product; chosen at build, shown in the repr, equal to
SDPA, differentiable twice, off under ``MMVIT_EXT_KERNELS=portable``; SDPA everywhere else
(float32 without a bias gradient, float16, larger bf16 maps to train)."""
import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

from mmvit_ext import flags
from mmvit_ext.backbones import PyramidVisionTransformerV2, SwinTransformer, VisionTransformer
from mmvit_ext.layers import Attention, WindowAttention
import mmvit_ext.layers.attention as attention_layers
import mmvit_ext.ops.attention as kernel_module
from mmvit_ext.ops import ExplicitAttentionKernel, find_attention_kernel

TINY_SWIN = dict(arch=dict(embed_dims=16, depths=(1, 2, 2, 1), num_heads=(1, 2, 4, 8)),
                 window_size=4, drop_path_rate=0.0)
BLOCKS = 6


@pytest.fixture
def sdpa_calls(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, 'scaled_dot_product_attention',
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _set_kernel(model, kernel, note=''):
    """Every attention of ``model`` with ``kernel`` (``None``: SDPA only)."""
    for module in model.modules():
        if hasattr(module, 'kernel_note'):
            module.kernel, module.kernel_note = kernel, note
    return model


def _with_bf16_rule(model):
    """The kernel with its bf16 rule, as built on a CPU with bf16 matmuls (this test's machine
    may have none: the rule's speed is measured there, its arithmetic is tested here)."""
    return _set_kernel(model, ExplicitAttentionKernel())


def test_bf16_rule_only_where_the_cpu_has_bf16_matmuls(monkeypatch):
    for has, shown in ((True, 'explicit (cpu: bias with grad; bf16 maps <= 262144, any '
                              'without grad); sdpa elsewhere'),
                       (False, 'explicit (cpu: bias with grad); sdpa elsewhere')):
        monkeypatch.setattr(kernel_module, 'cpu_has_bf16_matmul', lambda: has)
        kernel, _ = find_attention_kernel()
        assert kernel.describe() == shown
        assert f'kernel={shown}' in repr(Attention(8, 2))
        q = torch.randn(1, 2, 49, 4, dtype=torch.bfloat16)
        assert (kernel.blocker(q, q, ()) is None) == has


def _without_kernel(model):
    return _set_kernel(copy.deepcopy(model), None, 'removed for the test')


def test_training_swin_runs_the_explicit_product_equal_to_sdpa(sdpa_calls):
    torch.manual_seed(0)
    model = SwinTransformer(**TINY_SWIN).double().train()
    assert 'kernel=explicit (cpu: bias with grad' in repr(model)
    reference = _without_kernel(model)
    x = torch.randn(2, 3, 40, 56, dtype=torch.float64)
    outs = model(x)
    assert not sdpa_calls  # every block: the kernel
    ref_outs = reference(x)
    assert len(sdpa_calls) == BLOCKS  # the same blocks through SDPA (its CPU math path)
    for out, ref in zip(outs, ref_outs):
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    sum(o.square().sum() for o in outs).backward()
    sum(o.square().sum() for o in ref_outs).backward()
    grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, rtol=1e-9, atol=1e-12, msg=name)


def test_sdpa_runs_without_a_bias_gradient(sdpa_calls):
    model = SwinTransformer(**TINY_SWIN).train()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        model(x)
    assert len(sdpa_calls) == BLOCKS  # inference: SDPA's fused CPU kernel takes the bias
    model.requires_grad_(False)
    model(x.requires_grad_())  # frozen table: no bias gradient
    assert len(sdpa_calls) == 2 * BLOCKS


def test_kernel_path_is_twice_differentiable(sdpa_calls):
    torch.manual_seed(0)
    attn = WindowAttention(4, 2, window_size=2, shift=True, rel_pos=True).double().train()
    with torch.no_grad():
        attn.rel_pos.relative_position_bias_table.normal_()
    x = torch.randn(1, 16, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: attn(t, (4, 4)), (x,))
    assert not sdpa_calls


def test_portable_env_builds_without_the_kernel(monkeypatch, sdpa_calls):
    monkeypatch.setenv('MMVIT_EXT_KERNELS', 'portable')
    assert find_attention_kernel() == (None, 'MMVIT_EXT_KERNELS=portable')
    model = SwinTransformer(**TINY_SWIN).train()
    assert 'kernel=sdpa (MMVIT_EXT_KERNELS=portable)' in repr(model)
    model(torch.randn(1, 3, 64, 64))
    assert len(sdpa_calls) == BLOCKS


def test_bf16_training_runs_the_explicit_product_on_maps_up_to_2_18_pairs(sdpa_calls):
    torch.manual_seed(0)
    attn = _with_bf16_rule(Attention(16, 2).eval())  # parameters with a gradient: training
    for tokens, expected_sdpa in ((512, 0), (513, 1)):
        x = torch.randn(1, tokens, 16)
        sdpa_calls.clear()
        with torch.autocast('cpu', torch.bfloat16):
            out = attn(x)
        assert len(sdpa_calls) == expected_sdpa, tokens  # 513 x 513 > 2**18: SDPA, no (N, M) map
        if expected_sdpa:
            continue  # SDPA's own bf16 rounding: not the explicit product's bits
        with torch.autocast('cpu', torch.bfloat16), flags.fused_attention(False):
            ref = attn(x)  # the explicit path itself
        with torch.no_grad():
            full = attn(x)  # float32, SDPA
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        torch.testing.assert_close(out.float(), full, rtol=0.05, atol=0.05)


def _count_pieces(monkeypatch):
    calls = []
    real = attention_layers.explicit_attention
    monkeypatch.setattr(attention_layers, 'explicit_attention',
                        lambda q, *a, **k: calls.append(tuple(q.shape)) or real(q, *a, **k))
    return calls


@pytest.mark.parametrize('budget,pieces', [(2 ** 22, [(3, 2, 600, 8)]),  # one piece: all
                                           (2 * 2 * 600 * 600, [(2, 2, 600, 8), (1, 2, 600, 8)]),
                                           (2 * 250 * 600, [(1, 2, 250, 8), (1, 2, 250, 8),
                                                            (1, 2, 100, 8)] * 3)])
def test_bf16_inference_runs_the_explicit_product_in_pieces(monkeypatch, sdpa_calls, budget,
                                                            pieces):
    """No gradient: any bf16 map, in pieces of at most ``bf16_piece_map`` pairs (several images'
    maps, or rows of one image's maps), equal to the whole explicit product up to bf16 rounding
    (oneDNN blocks a 250-row product differently from a 600-row one)."""
    torch.manual_seed(0)
    attn = _set_kernel(Attention(16, 2).eval(), ExplicitAttentionKernel(bf16_piece_map=budget))
    x = torch.randn(3, 600, 16)  # 600 x 600 > 2**18: SDPA in training
    calls = _count_pieces(monkeypatch)
    with torch.no_grad(), torch.autocast('cpu', torch.bfloat16):
        out = attn(x)
    assert not sdpa_calls and calls == pieces
    with torch.no_grad(), torch.autocast('cpu', torch.bfloat16), flags.fused_attention(False):
        whole = attn(x)
    with torch.no_grad():
        full = attn(x)  # float32, SDPA
    torch.testing.assert_close(out, whole, rtol=0.02, atol=0.01)
    torch.testing.assert_close(out.float(), full, rtol=0.05, atol=0.05)


def test_bf16_swin_inference_pieces_take_their_bias_rows(monkeypatch, sdpa_calls):
    """Windows with a per-head table and a per-window shift mask: each piece (whole windows,
    or query rows of one window) adds its part of both terms."""
    torch.manual_seed(0)
    model = SwinTransformer(**TINY_SWIN).eval()
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, 'relative_position_bias_table'):
                module.relative_position_bias_table.normal_()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad(), torch.autocast('cpu', torch.bfloat16), flags.fused_attention(False):
        whole = model(x)
    for budget in (1 * 16 * 16 * 3, 7):  # three windows of stage 1 per piece; 7 pairs: rows
        _set_kernel(model, ExplicitAttentionKernel(bf16_piece_map=budget))
        calls = _count_pieces(monkeypatch)
        with torch.no_grad(), torch.autocast('cpu', torch.bfloat16):
            outs = model(x)
        assert not sdpa_calls and len(calls) > BLOCKS, budget
        for out, ref in zip(outs, whole):
            torch.testing.assert_close(out, ref, rtol=0.02, atol=0.02)


def test_bf16_pvtv2_training_step_runs_no_sdpa_and_is_as_close_to_float32(sdpa_calls):
    torch.manual_seed(0)
    model = PyramidVisionTransformerV2(dict(embed_dims=(8, 16, 16, 16), depths=(1, 1, 1, 1),
                                            num_heads=(1, 2, 2, 2)), drop_path_rate=0.0).train()
    _with_bf16_rule(model)
    x = torch.randn(2, 3, 64, 64)
    weights = [torch.randn(2, 8, 16, 16)] + [torch.randn(2, 16, s, s) for s in (8, 4, 2)]

    def grads(net, dtype):
        with (torch.autocast('cpu', dtype) if dtype != torch.float32
              else contextlib.nullcontext()):  # torch 2.1 refuses a float32 autocast
            outs = net(x)
        sum((o.float() * w).sum() for o, w in zip(outs, weights)).backward()
        return outs, {name: p.grad for name, p in net.named_parameters()}

    sdpa_model, float_model = _without_kernel(model), copy.deepcopy(model)
    outs, kernel = grads(model, torch.bfloat16)
    assert not sdpa_calls  # every block's attention: the explicit product
    ref_outs, sdpa = grads(sdpa_model, torch.bfloat16)
    assert len(sdpa_calls) == 4
    float_outs, exact = grads(float_model, torch.float32)
    for out, ref, full in zip(outs, ref_outs, float_outs):
        assert (out.float() - full).norm() <= 2 * (ref.float() - full).norm() + 1e-3
    for name, g in exact.items():  # bf16 rounding only: as close to float32 as bf16 SDPA
        err, sdpa_err = ((grad[name] - g).norm() / g.norm() for grad in (kernel, sdpa))
        assert err <= 2 * sdpa_err + 0.01 and err < 0.1, (name, err, sdpa_err)


def test_float16_and_float32_without_bias_gradient_run_sdpa(sdpa_calls):
    kernel = ExplicitAttentionKernel()
    q = torch.randn(1, 2, 49, 8)
    table = torch.zeros(2, 49, 49, requires_grad=True)
    assert kernel.blocker(q, q, (table,)) is None  # float32, a bias with a gradient: explicit
    assert kernel.blocker(q, q, ()) == 'fused kernel'
    # float16 on CPU: never the explicit product (no fast float16 matmul), bias gradient or not
    assert kernel.blocker(q.half(), q.half(), (table,)) == 'torch.float16 (SDPA faster)'
    with torch.no_grad():
        Attention(16, 2)(torch.randn(1, 49, 16))
    assert len(sdpa_calls) == 1


def test_rel_pos_vit_in_bf16_takes_the_explicit_product_not_the_fold(monkeypatch, sdpa_calls):
    torch.manual_seed(0)
    model = VisionTransformer(dict(embed_dims=32, depth=2, num_heads=2), use_rel_pos=True,
                              window_size=2, global_blocks=(1,), img_size=64,
                              drop_path_rate=0.0).eval()
    _with_bf16_rule(model)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad(), torch.autocast('cpu', torch.bfloat16):
        out = model(x)
    assert not sdpa_calls  # 4-token windows and a 16-token global block: the explicit product
    with torch.no_grad():
        ref = model(x)  # float32: the tables folded into q and k, SDPA
    assert len(sdpa_calls) == 2
    torch.testing.assert_close(out[0].float(), ref[0], rtol=0.05, atol=0.05)
    _set_kernel(model, ExplicitAttentionKernel(bf16_piece_map=2 * 16 * 5))  # 5 rows a piece
    calls = _count_pieces(monkeypatch)
    with torch.no_grad(), torch.autocast('cpu', torch.bfloat16):
        pieces = model(x)
    assert len(sdpa_calls) == 2
    # the global block in row pieces, its tables folded into q and k (24 = 8 + 4 + 4 + 8 pad)
    assert (1, 2, 5, 24) in calls and (1, 2, 1, 24) in calls
    torch.testing.assert_close(pieces[0].float(), ref[0], rtol=0.05, atol=0.05)
