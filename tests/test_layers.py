"""Shared layers on small tensors (the portable code: no CPU kernel is involved here, since
the layers are called directly rather than through a backbone's forward)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmvit_ext.layers import (POST_SOFTMAX, PRE_SOFTMAX, Attention, LayerScale, MapTransform,
                              PatchEmbed, RelativePositionBias, WindowAttention,
                              adaptive_avg_pool2d, linear_drop_path_rates, pad_to_multiple,
                              relative_position_index, resize_grid, resize_pos_embed,
                              resize_rel_pos_table, scaled_dot_product_attention,
                              shifted_window_mask, window_partition, window_reverse)
from official_layouts import official_swin_rel_index
from op_names import RecordOpNames


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
    padded = pad_to_multiple(x, (7, 7), channels_last=True)
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


def _reference_window_attention(attn: WindowAttention, x: torch.Tensor, hw, window, shift):
    """pad -> roll -> partition -> explicit attention with bias + mask -> reverse, written out
    the way the official Swin does it."""
    b, n, c = x.shape
    grid = pad_to_multiple(x.view(b, *hw, c), window, channels_last=True)
    hp, wp = grid.shape[1:3]
    if any(shift):
        grid = torch.roll(grid, (-shift[0], -shift[1]), (1, 2))
    windows = window_partition(grid, window)                     # (B, nW, N, C)
    qkv = attn.qkv(windows).reshape(*windows.shape[:3], 3, attn.num_heads, attn.head_dim)
    q, k, v = qkv.permute(3, 0, 1, 4, 2, 5)                      # (B, nW, H, N, d)
    logits = (q * attn.scale) @ k.transpose(-2, -1)
    if attn.rel_pos is not None:
        logits = logits + attn.rel_pos(window)
    if any(shift):
        logits = logits + shifted_window_mask(hp, wp, window, shift).unsqueeze(1)
    out = (logits.softmax(-1) @ v).transpose(2, 3).flatten(-2)
    out = window_reverse(attn.proj(out), window, hp, wp)
    if any(shift):
        out = torch.roll(out, shift, (1, 2))
    return out[:, :hw[0], :hw[1]].reshape(b, n, c)


@pytest.mark.parametrize('hw,shift,rel_pos', [((16, 19), False, True), ((16, 19), True, True),
                                              ((7, 10), True, False), ((5, 3), True, True)])
def test_window_attention_equals_pad_roll_partition(hw, shift, rel_pos):
    """WindowAttention (windows folded into the batch axis of the fused kernel) computes what
    the written-out official sequence computes; a map shorter than the window shrinks it."""
    attn = WindowAttention(24, 3, 7, shift=shift, rel_pos=rel_pos).eval()
    if rel_pos:
        nn.init.normal_(attn.rel_pos.relative_position_bias_table)
    x = torch.randn(2, hw[0] * hw[1], 24, requires_grad=True)
    window = (min(7, hw[0]), min(7, hw[1]))
    shift_size = tuple(3 if shift and s > 7 else 0 for s in hw)
    ours = attn(x, hw)
    ref = _reference_window_attention(attn, x, hw, window, shift_size)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(ours.pow(2).sum(), [x, *attn.parameters()])
    ref_grads = torch.autograd.grad(ref.pow(2).sum(), [x, *attn.parameters()])
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_window_attention_global_and_argument_checks():
    attn = WindowAttention(16, 2, None).eval()
    x = torch.randn(1, 12, 16)
    torch.testing.assert_close(attn(x, (3, 4)), Attention.forward(attn, x))
    with pytest.raises(ValueError, match='need a window_size'):
        WindowAttention(16, 2, None, shift=True)


def test_sdpa_folds_windows_into_the_batch_axis(monkeypatch):
    """Leading dims (batch, windows) go to the fused kernel's batch axis, the head axis stays
    the heads; a per-window bias is expanded over the batch."""
    seen = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, 'scaled_dot_product_attention',
                        lambda q, *a, **k: seen.append(tuple(q.shape)) or real(q, *a, **k))
    q, k, v = (torch.randn(2, 5, 3, 9, 4) for _ in range(3))
    bias = torch.randn(5, 3, 9, 9)
    out = scaled_dot_product_attention(q, k, v, bias)
    assert seen == [(10, 3, 9, 4)] and out.shape == (2, 5, 3, 9, 4)
    per_window = torch.stack([real(q[:, w], k[:, w], v[:, w], attn_mask=bias[w])
                              for w in range(5)], dim=1)
    torch.testing.assert_close(out, per_window, atol=1e-6, rtol=0)


def test_sdpa_broadcasts_a_bias_shared_by_every_window(monkeypatch):
    """A per-head bias (Swin's position bias outside shifted blocks) reaches the kernel as a
    (1, H, N, N) view of itself (4-D: the CPU flash kernel's gate refuses 3-D masks), broadcast
    over batch x windows, never copied per window."""
    masks = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, 'scaled_dot_product_attention',
                        lambda q, k, v, attn_mask=None, **kw: masks.append(attn_mask)
                        or real(q, k, v, attn_mask=attn_mask, **kw))
    q, k, v = (torch.randn(2, 5, 3, 9, 4) for _ in range(3))
    bias = torch.randn(3, 9, 9)
    out = scaled_dot_product_attention(q, k, v, bias)
    assert masks[0].data_ptr() == bias.data_ptr() and masks[0].shape == (1, 3, 9, 9)
    want = torch.softmax(q @ k.transpose(-1, -2) * 4 ** -0.5 + bias, -1) @ v
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize('mode', ['bicubic', 'bilinear'])
@pytest.mark.parametrize('src,dst', [((14, 14), (20, 33)), ((7, 9), (3, 4)), ((5, 5), (5, 5))])
def test_resize_grid_equals_interpolate(mode, src, dst):
    grid = torch.randn(2, 6, *src, dtype=torch.float64)
    ref = F.interpolate(grid, size=dst, mode=mode, align_corners=False)
    torch.testing.assert_close(resize_grid(grid, dst, mode), ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize('size', [(7, 7), (20, 33), (9, 13), (3, 2)])
def test_adaptive_avg_pool_equals_torch(size):
    x = torch.randn(2, 4, *size, dtype=torch.float64)
    torch.testing.assert_close(adaptive_avg_pool2d(x, (7, 7)), F.adaptive_avg_pool2d(x, 7),
                               atol=1e-12, rtol=0)


def test_resampling_backward_uses_no_nondeterministic_kernel():
    """The position-embedding resize and the PVTv2-li pooling differentiate through matrix
    products: their backward never reaches the upsample / adaptive-pool backward kernels that
    torch refuses on CUDA under ``torch.use_deterministic_algorithms(True)``."""
    pos = torch.randn(1, 1 + 14 * 14, 8, requires_grad=True)
    grid = torch.randn(1, 8, 20, 33, requires_grad=True)
    with RecordOpNames() as record:
        out = resize_pos_embed(pos, (14, 14), (20, 33), num_prefix_tokens=1).sum()
        out = out + adaptive_avg_pool2d(grid, (7, 7)).sum()
        out.backward()
    backward = [n for n in record.names if 'backward' in n]
    assert not [n for n in backward if 'upsample' in n or 'adaptive_avg_pool' in n], backward
    assert pos.grad.abs().sum() > 0 and grid.grad.abs().sum() > 0
