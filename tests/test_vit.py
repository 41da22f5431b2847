"""The plain ViT family (mmvit_ext.VisionTransformer): parameter counts against timm, DINOv2's
position-embedding interpolation, ViTDet's decomposed relative positions, and refusals. Every
checkpoint layout runs against its own implementation on every load path in test_layouts.py
(the cases are tests/vit_peers.py; ``pytest -s tests/test_layouts.py -k every_layout`` prints
the table of max feature differences).
"""
import pytest
import torch
import torch.nn.functional as F

import vit_peers
from layout_peers import build_ours
from mmvit_ext.backbones.vit import VisionTransformer, decomposed_rel_pos, fold_decomposed_rel_pos
from mmvit_ext.converters import CheckpointError

TOL = 1e-4


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize('ours, timm_name, published', [
    ('b', 'vit_base_patch16_224', 86.57e6),
    ('dinov2_s', 'vit_small_patch14_dinov2', 22.06e6),
    ('l', None, 304.33e6),  # timm's figure for vit_large_patch16_224 (1.2 GB to build here)
])
def test_parameter_counts_match_timm(ours, timm_name, published):
    """Classifier trunk + a 1000-class head (DINOv2 has none) = timm's model and its published
    figure (ViT-B/16 86.6 M, DINOv2 ViT-S/14 22.1 M, ViT-L/16 304 M)."""
    import timm
    with torch.device('meta'):
        model = VisionTransformer(ours, out_type='cls_token')
    head = 0 if ours.startswith('dinov2') else model.embed_dims * 1000 + 1000
    total = _count(model) + head
    if timm_name is not None:  # timm's constructor does not run on the meta device
        assert total == _count(timm.create_model(timm_name, pretrained=False))
    assert abs(total - published) < 0.005e6


def test_other_families_checkpoints_are_not_ours():
    """CaiT / DeepViT share ``blocks.{i}.attn.qkv``: their files are refused by name."""
    cait = build_ours(dict(type='CaiT', arch=dict(embed_dims=32, depth=2, num_heads=2),
                           img_size=64, drop_path_rate=0.0))
    with pytest.raises(CheckpointError, match="'cait' family"):
        build_ours(vit_peers.ours()).load_state_dict(cait.state_dict())


def test_no_silent_partial_loads():
    torch.manual_seed(0)
    deit = vit_peers.vit_cases()['timm ViT / DeiT'].checkpoint
    wider = build_ours(vit_peers.ours(arch=dict(embed_dims=64, depth=3, num_heads=2)))
    with pytest.raises(CheckpointError, match='shape mismatches'):
        wider.load_state_dict(deit)
    distilled = dict(deit, dist_token=torch.zeros(1, 1, vit_peers.DIM),
                     pos_embed=torch.zeros(1, 2 + 16, vit_peers.DIM))
    with pytest.raises(CheckpointError, match='pos_embed'):
        build_ours(vit_peers.ours()).load_state_dict(distilled)
    shallower = {k: v for k, v in deit.items() if not k.startswith('blocks.2.')}
    with pytest.raises(CheckpointError, match='unloaded'):
        build_ours(vit_peers.ours()).load_state_dict(shallower)


@pytest.mark.parametrize('size', [(98, 98), (70, 126), (518, 518)])
def test_dinov2_position_embedding_follows_the_official_interpolation(size):
    """The official rule: bicubic with scale factors (side + 0.1) / M, no antialiasing, none at
    the pretraining grid."""
    model = VisionTransformer('dinov2_s', out_type='cls_token').eval()
    torch.nn.init.normal_(model.pos_embed)
    grid = (size[0] // 14, size[1] // 14)
    pos = model.pos_embed
    side = int((pos.shape[1] - 1) ** 0.5)
    if grid == (side, side):
        want = pos
    else:
        patch = pos[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
        patch = F.interpolate(patch, scale_factor=((grid[0] + 0.1) / side, (grid[1] + 0.1) / side),
                              mode='bicubic', antialias=False)
        want = torch.cat([pos[:, :1], patch.permute(0, 2, 3, 1).reshape(1, -1, pos.shape[-1])], 1)
    assert (model.position_embedding(grid) - want).abs().max().item() < 1e-5


def _vitdet_rel_pos(q, rel_h, rel_w, grid):
    """ViTDet's ``add_decomposed_rel_pos`` on a zero map, written from its equations."""
    def lookup(table, size):
        length = 2 * size - 1
        if table.shape[0] != length:
            table = F.interpolate(table.T[None], size=length, mode='linear')[0].T
        coords = torch.arange(size)
        return table[(coords[:, None] - coords[None, :] + size - 1)]
    h, w = grid
    b, heads, n, d = q.shape
    r_q = q.reshape(b * heads, h, w, d)
    rel_h_term = torch.einsum('bhwc,hkc->bhwk', r_q, lookup(rel_h, h))
    rel_w_term = torch.einsum('bhwc,wkc->bhwk', r_q, lookup(rel_w, w))
    attn = rel_h_term[:, :, :, :, None] + rel_w_term[:, :, :, None, :]
    return attn.reshape(b, heads, n, n)


@pytest.mark.parametrize('grid, table', [((4, 4), 7), ((3, 5), 7), ((6, 6), 7)])
def test_decomposed_rel_pos_matches_vitdet(grid, table):
    q = torch.randn(2, 3, grid[0] * grid[1], 8)
    rel_h, rel_w = torch.randn(table, 8), torch.randn(table, 8)
    got = decomposed_rel_pos(q, rel_h, rel_w, grid)
    assert (got - _vitdet_rel_pos(q, rel_h, rel_w, grid)).abs().max().item() < 1e-4


@pytest.mark.parametrize('lead, grid, d', [((2,), (4, 4), 8), ((2, 3), (3, 5), 16), ((1,), (6, 5), 64)])
def test_folded_rel_pos_equals_the_masked_product(lead, grid, d):
    """The fused path carries the bias in widened queries and keys: the same attention and the
    same gradients as the (N, N) bias as a mask, in float64; widths padded to multiples of 8."""
    n = grid[0] * grid[1]
    q, k, v = (torch.randn(*lead, 3, n, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    tables = [torch.randn(2 * side - 1, d, dtype=torch.float64, requires_grad=True) for side in grid]
    scale = d ** -0.5
    want = F.scaled_dot_product_attention(q, k, v, decomposed_rel_pos(q, *tables, grid), scale=scale)
    qf, kf = fold_decomposed_rel_pos(q, k, *tables, grid, scale)
    assert qf.shape[-1] == kf.shape[-1] and qf.shape[-1] % 8 == 0 and qf.shape[-1] >= d + sum(grid)
    got = F.scaled_dot_product_attention(qf, kf, v, scale=1.0)
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad(got.square().sum(), [q, k, v, *tables])
    for g, w in zip(grads, torch.autograd.grad(want.square().sum(), [q, k, v, *tables])):
        assert torch.allclose(g, w, rtol=1e-9, atol=1e-10)


def test_rel_pos_blocks_fold_only_on_the_fused_path():
    """The ViTDet blocks give the same output fused (bias folded into q / k) and with the map
    materialised (the bias added to it; that path's softmax runs in float32)."""
    model = VisionTransformer(dict(embed_dims=32, depth=4, num_heads=2), use_rel_pos=True,
                              window_size=4, global_blocks=(1, 3), img_size=64,
                              drop_path_rate=0.0).double().eval()
    for name, param in model.named_parameters():
        if 'rel_pos' in name:
            torch.nn.init.normal_(param)
    x = torch.randn(1, 3, 80, 112, dtype=torch.float64)
    fused = model(x)
    for block in model.blocks:
        block.attn.fused = False
    assert {type(block.attn.window_size) for block in model.blocks} == {tuple, type(None)}
    for a, b in zip(fused, model(x)):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('size', [(160, 176), (256, 304)])
def test_vitdet_vit_b_equals_the_peers_on_small_and_padded_grids(size):
    """ViTDet's ViT-B (random relative-position tables) equals timm's SAM ViT and mmpretrain's
    ``ViTSAM`` trunks holding its weights: on a 10 x 11 grid, smaller than the 14-token window
    (padded to one window, as detectron2 does), and on a 16 x 19 grid padded to whole windows."""
    from mmvit_ext.backbones.vit_peers import vitdet_peers
    ours = VisionTransformer('b', use_rel_pos=True, final_norm=False, drop_path_rate=0.0).eval()
    with torch.no_grad():
        for name, param in ours.named_parameters():
            if 'rel_pos' in name:
                param.normal_(0, 0.5)
    peers = vitdet_peers(ours, size)
    assert set(peers) == {'timm', 'mmpretrain'}
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        want = ours(x)
        for name, peer in peers.items():
            for a, b in zip(want, peer(x)):
                assert (a - b).abs().max() <= TOL * b.abs().max(), name


def test_rel_pos_tables_resize_with_the_window():
    """A ViTDet checkpoint trained with 14-token windows loads into 7-token windows, its tables
    resized (as ViTDet interpolates them) and reported."""
    arch = dict(embed_dims=32, depth=8, num_heads=2)  # global blocks 1, 3, 5, 7
    source = VisionTransformer(arch, use_rel_pos=True, window_size=14, img_size=448,
                               drop_path_rate=0.0)
    for name, param in source.named_parameters():
        if 'rel_pos' in name:
            torch.nn.init.normal_(param)
    target = VisionTransformer(arch, use_rel_pos=True, window_size=7, img_size=224,
                               drop_path_rate=0.0)
    target.load_state_dict(source.state_dict())
    resized = target.load_report.resized
    assert 'blocks.0.attn.rel_pos_h' in resized and 'pos_embed' in resized
    assert target.blocks[0].attn.rel_pos_h.shape == (13, 16)
    assert target.blocks[1].attn.rel_pos_h.shape == (27, 16)  # global: the 14 x 14 grid
    out = target(torch.randn(1, 3, 100, 132))
    assert [tuple(o.shape[2:]) for o in out] == [(25, 33), (13, 17), (7, 9), (4, 5)]


def test_options_are_validated():
    with pytest.raises(ValueError, match='out_type'):
        VisionTransformer('s', out_type='raw_tokens')
    with pytest.raises(Exception, match='with_cls_token'):
        VisionTransformer('s', with_cls_token=True, window_size=14)
    with pytest.raises(Exception, match='use_rel_pos'):
        VisionTransformer('s', with_cls_token=True, window_size=None, use_rel_pos=True)
    with pytest.raises(Exception, match='register'):
        VisionTransformer('dinov2_s', reg_tokens=4, with_cls_token=False)
    with pytest.raises(Exception, match='unknown arch'):
        VisionTransformer('vit-xxl')


def test_classifier_outputs():
    """cls_token: the normalised class token; avg_featmap: fc_norm of the mean patch token."""
    model = VisionTransformer('deit-t', out_type='avg_featmap', final_norm=False,
                              drop_path_rate=0.0).eval()
    x = torch.randn(2, 3, 64, 80)
    (pooled,) = model(x)
    assert pooled.shape == (2, 192) and model.out_channels == (192,)
    tokens, hw = model.patch_embed(x)
    assert hw == (4, 5)
    cls = VisionTransformer('deit-t', out_type='cls_token').eval()
    assert cls(x)[0].shape == (2, 192) and cls.strides == (None,)


def test_convert_checkpoint_names_and_load_checks_every_layout(tmp_path):
    """``tools/convert_checkpoint.py`` detects each layout a user holds (the cases of
    tests/vit_peers.py), converts it and loads the written file back strictly into the
    architecture it reads off the weights (``infer_arch``)."""
    import sys
    from tool_runner import ROOT
    sys.path.insert(0, str(ROOT / 'tools'))
    from convert_checkpoint import convert
    cases = vit_peers.vit_cases()
    assert len(cases) == 20
    for name, case in cases.items():
        src, dst = tmp_path / 'src.pth', tmp_path / 'dst.safetensors'
        torch.save(case.checkpoint, src)
        out = convert(str(src), str(dst))
        assert f'detected layout: {case.layout}' in out, (name, out)
        assert 'load-checked' in out and 'VisionTransformer' in out, (name, out)


@pytest.mark.parametrize('peer', ['mmvit_ext', 'mmseg', 'mmpretrain'])
def test_peer_semantics_follow_the_rule(peer):
    """The peer's meaning of arch names, defaults and frozen_stages (docs/vit.md), whichever
    names are given; the same by peer= as by the default scope (tests/test_peer_configs.py)."""
    with torch.device('meta'):
        small = VisionTransformer('s', peer=peer)
    assert (small.embed_dims, small.depth, small.blocks[0].mlp.fc1.out_features) == \
        ((768, 8, 2304) if peer == 'mmpretrain' else (384, 12, 1536))
    arch = dict(embed_dims=32, num_layers=3, num_heads=2)

    def frozen(k: int) -> set:
        model = VisionTransformer(arch, img_size=32, frozen_stages=k, out_type='avg_featmap',
                                  peer=peer)
        return {n.split('.')[0] for n, p in model.named_parameters() if not p.requires_grad}
    embeddings = {'patch_embed', 'pos_embed', 'cls_token'}
    if peer == 'mmpretrain':
        assert frozen(0) == set() and frozen(2) == embeddings | {'blocks'}
        assert frozen(3) == embeddings | {'blocks', 'norm', 'fc_norm'}
    else:
        assert frozen(0) == embeddings and frozen(3) == embeddings | {'blocks'}
    model = VisionTransformer(arch, img_size=32, peer=peer)
    (out, *rest) = model(torch.randn(1, 3, 48, 64))
    eps = model.blocks[0].norm1.eps
    if peer == 'mmseg':  # stride-16 map, no final norm, no patch bias, nn.LayerNorm's eps
        assert out.shape == (1, 32, 3, 4) and model.norm is None and eps == 1e-5
        assert model.patch_embed.proj.bias is None and model.cls_token is not None
    elif peer == 'mmpretrain':  # the normalised class token
        assert out.shape == (1, 32) and model.norm is not None and eps == 1e-6
    else:  # the simple pyramid
        assert [o.shape[-1] for o in (out, *rest)] == [16, 8, 4, 2] and model.cls_token is None
