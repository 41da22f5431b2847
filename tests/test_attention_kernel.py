"""Attention's CPU kernel (mmvit_ext.ops.attention): where SDPA has no fused CPU kernel (a bias
that needs a gradient, Swin's position table in training) the fused path runs the explicit
product; chosen at build, shown in the repr, equal to SDPA, differentiable twice, off under
``MMVIT_EXT_KERNELS=portable``; SDPA everywhere else."""
import copy

import pytest
import torch
import torch.nn.functional as F

from mmvit_ext.backbones import SwinTransformer
from mmvit_ext.layers import WindowAttention
from mmvit_ext.ops import find_attention_kernel

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


def _without_kernel(model):
    other = copy.deepcopy(model)
    for module in other.modules():
        if isinstance(module, WindowAttention):
            module.kernel, module.kernel_note = None, 'removed for the test'
    return other


def test_training_swin_runs_the_explicit_product_equal_to_sdpa(sdpa_calls):
    torch.manual_seed(0)
    model = SwinTransformer(**TINY_SWIN).double().train()
    assert 'kernel=explicit (cpu, bias with grad); sdpa elsewhere' in repr(model)
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
