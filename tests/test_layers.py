"""Shared layers on small tensors."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmvit_ext.layers import (POST_SOFTMAX, PRE_SOFTMAX, Attention, ConvMlp, LayerScale, Linear,
                              MapTransform, Mlp, PatchEmbed, RelativePositionBias, get_cpu_gemm,
                              linear_drop_path_rates, pad_to_windows, relative_position_index,
                              resize_pos_embed, resize_rel_pos_table, set_cpu_gemm,
                              shifted_window_mask, WindowLayout, window_partition,
                              window_reverse)
from mmvit_ext.layers import attention as attention_module
from mmvit_ext.layers.attention import _ExplicitAttention, _use_explicit_cpu
from mmvit_ext.layers.linear import ONEDNN_MIN_ROWS, _initial_cpu_gemm
from official_layouts import official_swin_rel_index


def _explicit_copy(attn: Attention) -> Attention:
    other = Attention(attn.qkv.in_features, attn.num_heads, fused=False)
    other.load_state_dict(attn.state_dict())
    return other


@pytest.mark.parametrize('with_bias', [False, True])
def test_fused_equals_explicit(with_bias):
    attn = Attention(32, 4).eval()
    x = torch.randn(3, 10, 32)
    bias = torch.randn(4, 10, 10) if with_bias else None
    fused = attn(x, attn_bias=bias)
    explicit = _explicit_copy(attn).eval()(x, attn_bias=bias)
    assert fused.shape == (3, 10, 32)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)


def test_fused_equals_explicit_windows_with_per_window_mask():
    attn = Attention(24, 3).eval()
    x = torch.randn(2, 5, 9, 24)                      # (B, windows, N, C)
    bias = torch.randn(3, 9, 9).unsqueeze(0) + torch.randn(5, 1, 9, 9)  # (windows, heads, N, N)
    fused = attn(x, attn_bias=bias)
    explicit = _explicit_copy(attn).eval()(x, attn_bias=bias)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    # and equal to running every window on its own
    per_window = torch.stack([attn(x[:, w], attn_bias=bias[w]) for w in range(5)], dim=1)
    torch.testing.assert_close(fused, per_window, atol=1e-5, rtol=0)


class _Double(MapTransform):
    stage = PRE_SOFTMAX

    def forward(self, logits):
        return logits * 2


class _Record(MapTransform):
    stage = POST_SOFTMAX

    def forward(self, attn):
        self.seen = attn
        return attn


def test_map_transforms_act_on_logits_and_probabilities():
    record = _Record()
    attn = Attention(16, 2, map_transforms=[_Double(), record]).eval()
    x = torch.randn(1, 6, 16)
    attn(x)
    q, k, _ = attn.qkv(x).reshape(1, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
    expected = ((q * attn.scale) @ k.transpose(-2, -1) * 2).softmax(-1)
    torch.testing.assert_close(record.seen, expected, atol=1e-6, rtol=0)
    assert torch.allclose(record.seen.sum(-1), torch.ones(1, 2, 6))


def test_attention_map_hook_on_explicit_path():
    attn = Attention(16, 4, fused=False).eval()
    maps = []
    attn.attn_map.register_forward_hook(lambda m, i, o: maps.append(o))
    attn(torch.randn(2, 7, 16))
    assert maps[0].shape == (2, 4, 7, 7)


def test_attention_rejects_indivisible_heads():
    with pytest.raises(ValueError, match='num_heads'):
        Attention(30, 4)


def test_window_partition_roundtrip_and_padding():
    x = torch.randn(2, 10, 13, 5)
    padded = pad_to_windows(x, (7, 7))
    assert padded.shape == (2, 14, 14, 5)
    assert torch.equal(padded[:, :10, :13], x) and padded[:, 10:].abs().sum() == 0
    windows = window_partition(padded, (7, 7))
    assert windows.shape == (2, 4, 49, 5)
    # window 1 is the top-right block
    assert torch.equal(windows[0, 1].view(7, 7, 5), padded[0, :7, 7:14])
    assert torch.equal(window_reverse(windows, (7, 7), 14, 14), padded)


def test_shifted_window_mask_regions():
    mask = shifted_window_mask(8, 8, (4, 4), (2, 2))
    assert mask.shape == (4, 16, 16)
    assert mask[0].abs().sum() == 0                       # top-left window: one region
    assert set(mask.unique().tolist()) == {0.0, -100.0}
    assert torch.equal(mask, mask.transpose(1, 2))
    # bottom-right window holds 4 regions of 2x2 tokens: each token sees 4 of 16
    assert (mask[3] == 0).sum(-1).tolist() == [4] * 16


def test_relative_position_index_matches_official_and_sub_windows():
    assert torch.equal(relative_position_index((7, 7)), official_swin_rel_index(7))
    table = RelativePositionBias((7, 7), 3)
    full = table()                                         # (3, 49, 49)
    sub = table((3, 5))                                    # tokens of the top-left 3x5 corner
    corner = torch.tensor([r * 7 + c for r in range(3) for c in range(5)])
    torch.testing.assert_close(sub, full[:, corner][:, :, corner])
    with pytest.raises(ValueError, match='larger'):
        relative_position_index((8, 7), (7, 7))


def test_resize_rel_pos_table():
    table = torch.randn(13 * 13, 4)
    assert resize_rel_pos_table(table, (7, 7), (7, 7)) is table
    resized = resize_rel_pos_table(table, (7, 7), (12, 12))
    assert resized.shape == (23 * 23, 4)
    constant = torch.ones(13 * 13, 2) * 3.0
    torch.testing.assert_close(resize_rel_pos_table(constant, (7, 7), (12, 12)),
                               torch.full((23 * 23, 2), 3.0), atol=1e-5, rtol=0)


def test_resize_pos_embed_keeps_prefix():
    pos = torch.randn(1, 1 + 14 * 14, 8)
    out = resize_pos_embed(pos, (14, 14), (20, 10), num_prefix_tokens=1)
    assert out.shape == (1, 1 + 200, 8)
    assert torch.equal(out[:, :1], pos[:, :1])
    with pytest.raises(ValueError, match='grid tokens'):
        resize_pos_embed(pos, (10, 10), (20, 10), num_prefix_tokens=1)


def test_patch_embed_padding_and_overlap():
    embed = PatchEmbed(3, 16, 4, norm_layer=nn.LayerNorm)
    tokens, hw = embed(torch.randn(2, 3, 13, 17))
    assert hw == (4, 5) and tokens.shape == (2, 20, 16)
    overlap = PatchEmbed(3, 8, 7, stride=4)
    tokens, hw = overlap(torch.randn(1, 3, 13, 17))
    assert hw == (4, 5)
    with pytest.raises(ValueError, match=r'\(B, 3, H, W\)'):
        embed(torch.randn(2, 4, 16, 16))


def test_drop_path_rates_and_layer_scale():
    assert linear_drop_path_rates(0.3, 4) == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert linear_drop_path_rates(0.0, 3) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match='drop_path_rate'):
        linear_drop_path_rates(1.5, 3)
    ls = LayerScale(4, 1e-5)
    torch.testing.assert_close(ls(torch.ones(2, 4)), torch.full((2, 4), 1e-5))


@pytest.mark.parametrize('shape,bias', [((2, 300, 48), True), ((700, 32), False)])
def test_onednn_linear_matches_f_linear_forward_and_backward(shape, bias):
    torch.manual_seed(0)
    layer = Linear(shape[-1], 40, bias=bias)
    x = torch.randn(*shape, requires_grad=True)
    grad = torch.randn(*shape[:-1], 40)
    assert get_cpu_gemm() == 'onednn'
    out = layer(x)
    out.backward(grad)
    ours = (out.detach(), x.grad.clone(), layer.weight.grad.clone())
    x.grad, layer.weight.grad = None, None
    ref = F.linear(x, layer.weight, layer.bias)
    ref.backward(grad)
    assert out.is_contiguous() and out.shape == ref.shape
    for a, b in zip(ours, (ref.detach(), x.grad, layer.weight.grad)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    if bias:
        assert layer.bias.grad is not None
    # non-contiguous input (a transposed view) gives the same product
    xt = x.detach().transpose(-2, -1).contiguous().transpose(-2, -1)
    torch.testing.assert_close(layer(xt), ref.detach(), rtol=1e-4, atol=1e-4)


def test_onednn_linear_routing_and_switch(monkeypatch):
    calls = []
    real_conv = F.conv2d
    monkeypatch.setattr(F, 'conv2d', lambda *a, **k: calls.append(1) or real_conv(*a, **k))
    layer = Linear(16, 8)
    layer(torch.randn(ONEDNN_MIN_ROWS, 16))
    assert len(calls) == 1                                # large float32: oneDNN route
    layer(torch.randn(ONEDNN_MIN_ROWS - 1, 16))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert layer(torch.randn(ONEDNN_MIN_ROWS, 16)).dtype == torch.bfloat16
    layer.double()(torch.randn(ONEDNN_MIN_ROWS, 16, dtype=torch.float64))
    assert len(calls) == 1                                # small, autocast, float64: F.linear
    layer.float()
    previous = set_cpu_gemm('native')
    try:
        layer(torch.randn(ONEDNN_MIN_ROWS, 16))
        assert len(calls) == 1
    finally:
        set_cpu_gemm(previous)
    with pytest.raises(ValueError, match='onednn'):
        set_cpu_gemm('mkl')
    monkeypatch.setenv('MMVIT_EXT_CPU_GEMM', 'fast')
    with pytest.raises(ValueError, match='MMVIT_EXT_CPU_GEMM'):
        _initial_cpu_gemm()
    assert isinstance(layer, torch.nn.Linear) and set(layer.state_dict()) == {'weight', 'bias'}


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('conv', [False, True])
def test_fused_gelu_fc2_matches_module_ops(dtype, conv):
    """Mlp / ConvMlp route GELU -> fc2 through one op that saves only fc2's pre-activation
    input and recomputes the GELU in backward: same outputs and gradients as the plain ops."""
    torch.manual_seed(0)
    mlp = ConvMlp(16, 64) if conv else Mlp(16, 64)
    x = torch.randn(2, 300, 16, requires_grad=True)
    args = ((15, 20),) if conv else ()

    def run(fused: bool):
        x.grad = None
        mlp.zero_grad()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype != torch.float32):
            if fused:
                out = mlp(x, *args)
            else:  # the unfused chain of the same modules
                h = mlp.fc1(x)
                if conv:
                    grid = h.transpose(1, 2).reshape(2, 64, 15, 20)
                    h = mlp.dwconv(grid).flatten(2).transpose(1, 2)
                out = mlp.fc2(mlp.act(h))
        out.float().pow(2).sum().backward()
        return [out.detach().float(), x.grad.clone()] + [p.grad.clone() for p in mlp.parameters()]

    fused, plain = run(True), run(False)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    assert fused[0].dtype == plain[0].dtype
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, **tol)
    with torch.no_grad():
        torch.testing.assert_close(mlp(x, *args).float(), plain[0], **tol)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('windows,bias_shape,chunk', [
    (False, (1, 100, 100), None), (True, (5, 3, 49, 49), None),
    (True, (5, 3, 49, 49), 2 * 2 * 3 * 49 * 49), (True, (3, 49, 49), 3 * 2 * 3 * 49 * 49)])
def test_explicit_cpu_attention_matches_sdpa(dtype, windows, bias_shape, chunk, monkeypatch):
    """The hand-written CPU kernel for small maps: outputs and gradients of q, k, v and a
    per-window (or shared) bias equal F.scaled_dot_product_attention's, also when windows run in
    chunks (of 2 and 3 windows: the last chunk shorter)."""
    if chunk is not None:
        monkeypatch.setattr(attention_module, 'EXPLICIT_CPU_CHUNK_ELEMENTS', chunk)
    torch.manual_seed(0)
    shape = (2, 5, 3, 49, 16) if windows else (2, 3, 100, 16)
    q, k, v = (torch.randn(*shape, dtype=dtype, requires_grad=True) for _ in range(3))
    bias = torch.randn(*bias_shape, requires_grad=True)
    if chunk is not None:
        assert attention_module._Chunks(q, k, v, bias).step == chunk // (2 * 3 * 49 * 49)
    assert _use_explicit_cpu(q, k, 0.0) and not _use_explicit_cpu(q, k, 0.1)
    grad = torch.randn(shape, dtype=dtype)
    ours = _ExplicitAttention.apply(q, k, v, bias, 0.25)
    ours.backward(grad)
    got = [ours.detach()] + [t.grad.clone() for t in (q, k, v, bias)]
    for t in (q, k, v, bias):
        t.grad = None
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(dtype), scale=0.25)
    ref.backward(grad)
    want = [ref.detach()] + [t.grad for t in (q, k, v, bias)]
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), **tol)


def test_explicit_cpu_attention_keys_broadcast_over_batch():
    """Keys / values shared by every batch element get their gradients summed over it."""
    torch.manual_seed(0)
    q = torch.randn(2, 3, 100, 16, requires_grad=True)
    k, v = (torch.randn(1, 3, 100, 16, requires_grad=True) for _ in range(2))
    grad = torch.randn(2, 3, 100, 16)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # e.g. an out= tensor resized
        got = torch.autograd.grad(_ExplicitAttention.apply(q, k, v, None, 0.25), (q, k, v), grad)
    ref = F.scaled_dot_product_attention(q, k.expand_as(q), v.expand_as(q), scale=0.25)
    for a, b in zip(got, torch.autograd.grad(ref, (q, k, v), grad)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('relu', [False, True])
def test_layer_norm_fused_into_fc1_matches_module_ops(dtype, relu):
    """ConvMlp(norm=...) fuses the block's LayerNorm into fc1 (and the PVTv2-li ReLU after it):
    same outputs and gradients as norm -> fc1 -> relu -> dwconv -> gelu -> fc2."""
    torch.manual_seed(0)
    mlp, norm = ConvMlp(16, 64, linear=relu), nn.LayerNorm(16)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    x = torch.randn(2, 300, 16, requires_grad=True)
    params = list(mlp.parameters()) + list(norm.parameters())

    def run(fused: bool):
        x.grad = None
        for p in params:
            p.grad = None
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype != torch.float32):
            if fused:
                out = mlp(x, (15, 20), norm=norm)
            else:
                h = mlp.fc1(norm(x))
                h = torch.relu(h) if relu else h
                grid = h.transpose(1, 2).reshape(2, 64, 15, 20)
                out = mlp.fc2(F.gelu(mlp.dwconv(grid).flatten(2).transpose(1, 2)))
        out.float().pow(2).sum().backward()
        return [out.detach().float(), x.grad.clone()] + [p.grad.clone() for p in params]

    fused, plain = run(True), run(False)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize('hw,shift', [((16, 19), (0, 0)), ((16, 19), (3, 3)), ((7, 10), (3, 3))])
def test_window_layout_equals_pad_roll_partition(hw, shift):
    """One gather each way gives exactly pad -> roll -> partition and its reverse, and the same
    gradients (padded positions are zeros that receive none)."""
    b, c, win = 2, 5, (7, 7)
    h, w = hw
    layout = WindowLayout(b, h, w, win, shift, torch.device('cpu'))
    x = torch.randn(b, h * w, c, requires_grad=True)

    def reference(t):
        t = pad_to_windows(t.view(b, h, w, c), win)
        return torch.roll(t, (-shift[0], -shift[1]), (1, 2)) if any(shift) else t

    ref = window_partition(reference(x), win)
    ours = layout.to_windows(x)
    assert torch.equal(ours, ref) and layout.padded == reference(x).shape[1:3]
    weights = torch.randn_like(ref)
    back = layout.from_windows(ours * weights)
    hp, wp = layout.padded
    ref_back = window_reverse(ref * weights, win, hp, wp)
    ref_back = torch.roll(ref_back, shift, (1, 2)) if any(shift) else ref_back
    assert torch.equal(back, ref_back[:, :h, :w].reshape(b, h * w, c))
    (grad,) = torch.autograd.grad((back ** 2).sum(), x)
    (ref_grad,) = torch.autograd.grad((ref_back[:, :h, :w] ** 2).sum(), x)
    torch.testing.assert_close(grad, ref_grad)
