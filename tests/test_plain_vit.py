"""DeepViT, CaiT and Refined-ViT: map transforms, official layouts, CaiT parity with timm, exact
parameter counts, dense options (DeepViT and Refined-ViT parity: test_independent_parity.py)."""
import pytest
import torch
from torch import nn

from mmvit_ext.backbones import CaiT, DeepViT, RefinedViT
from mmvit_ext.converters import (convert_official_cait, convert_official_deepvit,
                                  convert_official_refiner, export_official_cait,
                                  export_official_deepvit, export_official_refiner,
                                  save_state_dict)
from mmvit_ext.layers import (POST_SOFTMAX, PRE_SOFTMAX, Attention, ReAttention, RefinerMap,
                              TalkingHeads)

TINY = {
    DeepViT: dict(embed_dims=32, depth=4, num_heads=2, reattention_blocks=2, conv_stem=(8, 8),
                  transform_scale=True, scale_adjustment=0.5),
    CaiT: dict(embed_dims=32, depth=3, num_heads=2, layer_scale=0.1),
    RefinedViT: dict(embed_dims=32, depth=4, num_heads=2, conv_stem=(8, 8, 16),
                     mlp_layer_scale=0.1),
}
CONVERTERS = {DeepViT: (convert_official_deepvit, export_official_deepvit),
              CaiT: (convert_official_cait, export_official_cait),
              RefinedViT: (convert_official_refiner, export_official_refiner)}


def _randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter and BatchNorm statistic random, so no branch hides behind its init."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
            if name.endswith(('norm.weight', 'norm1.weight', 'norm2.weight')):
                param.add_(1.0)
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.running_mean.copy_(torch.randn(module.num_features, generator=gen) * 0.1)
                module.running_var.copy_(torch.rand(module.num_features, generator=gen) + 0.5)
    return model


# ---- map transforms ---------------------------------------------------------------------------
def _identity_reattention(heads):
    transform = ReAttention(heads).eval()
    with torch.no_grad():
        transform.mix.weight.copy_(torch.eye(heads).view(heads, heads, 1, 1))
        transform.mix.bias.zero_()
    transform.norm.running_var.fill_(1.0 - transform.norm.eps)  # var + eps == 1 exactly
    return transform


def _identity_talking_heads(heads, stage):
    transform = TalkingHeads(heads, stage)
    with torch.no_grad():
        transform.proj.weight.copy_(torch.eye(heads))
        transform.proj.bias.zero_()
    return transform


def _identity_refiner(heads):
    transform = RefinerMap(heads, expand_ratio=3, kernel_size=3).eval()
    with torch.no_grad():
        transform.conv_pro.weight.zero_()
        transform.bn3.bias.zero_()
    transform.adapt_bn.running_var.fill_(1.0 - transform.adapt_bn.eps)
    return transform


@pytest.mark.parametrize('make', [
    _identity_reattention, _identity_refiner,
    lambda h: _identity_talking_heads(h, PRE_SOFTMAX),
    lambda h: _identity_talking_heads(h, POST_SOFTMAX),
])
@pytest.mark.parametrize('batch', [(2,), (2, 3)])  # plain, and windows (B, nW)
def test_identity_transform_is_plain_attention(make, batch):
    torch.manual_seed(0)
    plain = Attention(16, 4).eval()
    transformed = Attention(16, 4, map_transforms=[make(4)]).eval()
    transformed.load_state_dict(plain.state_dict(), strict=False)
    x = torch.randn(*batch, 9, 16)
    torch.testing.assert_close(transformed(x), plain(x), atol=1e-5, rtol=0)


def test_talking_heads_mix_heads_like_a_linear_layer():
    transform = TalkingHeads(3)
    attn = torch.randn(2, 3, 5, 5)
    expected = torch.einsum('gh,bhnm->bgnm', transform.proj.weight, attn) \
        + transform.proj.bias.view(1, 3, 1, 1)
    torch.testing.assert_close(transform(attn), expected, atol=1e-6, rtol=1e-5)


def test_refiner_conv_is_local_on_the_map():
    """A 3x3 depthwise conv: changing one map entry changes only its 3x3 neighbourhood."""
    transform = _randomise(RefinerMap(2, expand_ratio=3, kernel_size=3)).eval()
    attn = torch.rand(1, 2, 8, 8)
    changed = attn.clone()
    changed[..., 4, 4] += 1.0
    delta = (transform(changed) - transform(attn)).abs().sum(dim=(0, 1))
    assert delta[3:6, 3:6].min() > 0
    delta[3:6, 3:6] = 0
    assert delta.max() == 0


# ---- official layouts -------------------------------------------------------------------------
@pytest.mark.parametrize('cls', [DeepViT, CaiT, RefinedViT])
def test_converter_roundtrip_and_idempotence(cls):
    convert, export = CONVERTERS[cls]
    model = cls(arch=TINY[cls], out_type='cls_token')
    ours = model.state_dict()
    official = export(ours)
    assert set(official) != set(ours)  # the layouts really differ
    official['head.weight'] = torch.zeros(10, 32)
    converted = convert(official)
    assert set(converted) == set(ours)
    assert all(torch.equal(converted[k], ours[k]) for k in ours)
    assert convert(converted).keys() == converted.keys()  # idempotent


def test_official_key_names():
    deepvit = export_official_deepvit(DeepViT(arch=TINY[DeepViT], out_type='cls_token').state_dict())
    assert {'blocks.3.attn.reatten_matrix.weight', 'blocks.3.attn.var_norm.running_var',
            'patch_embed.conv1.weight', 'patch_embed.bn2.weight', 'cls_token'} <= set(deepvit)
    assert deepvit['blocks.3.attn.reatten_matrix.weight'].shape == (2, 2, 1, 1)
    assert 'blocks.0.attn.reatten_matrix.weight' not in deepvit  # only the last 2 blocks
    cait = export_official_cait(CaiT(arch=TINY[CaiT], out_type='cls_token').state_dict())
    assert {'blocks.0.gamma_1', 'blocks.0.attn.proj_l.weight', 'blocks.0.attn.proj_w.weight',
            'blocks_token_only.1.attn.q.weight', 'blocks_token_only.1.gamma_2'} <= set(cait)
    assert cait['pos_embed'].shape == (1, 196, 32)  # no class-token slot
    refiner = export_official_refiner(RefinedViT(arch=TINY[RefinedViT],
                                                 out_type='cls_token').state_dict())
    assert refiner['blocks.1.attn.qkv.weight'].shape == (32, 32)  # shared block: values only
    assert refiner['blocks.0.attn.qkv.weight'].shape == (96, 32)
    assert {'blocks.1.attn.DLA.conv_exp.weight', 'blocks.1.attn.DLA.depth_sep_conv.weight',
            'blocks.1.attn.DLA.bn3.running_mean', 'blocks.1.attn.adapt_bn.weight',
            'blocks.0.mlp.scale_channel', 'patch_embed.conv3.weight'} <= set(refiner)
    assert refiner['blocks.1.attn.DLA.conv_exp.weight'].shape == (6, 2, 1, 1)  # H -> 3H


def test_cait_matches_timm_with_official_checkpoint(tmp_path):
    import timm
    reference = _randomise(timm.create_model('cait_xxs24_224', pretrained=False)).eval()
    path = tmp_path / 'XXS24_224.pth'
    torch.save({'model': {'module.' + k: v for k, v in reference.state_dict().items()}}, path)
    ours = CaiT(arch='xxs24', out_type='cls_token',
                init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    ours.init_weights()
    ours.eval()
    dense = CaiT(arch='xxs24', window_size=None, simple_pyramid=False, out_indices=(11,),
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    dense.init_weights()
    dense.eval()
    x = torch.randn(2, 3, 224, 224)
    captured = {}
    reference.blocks[11].register_forward_hook(lambda m, i, o: captured.update(tokens=o))
    with torch.no_grad():
        expected_cls = reference.forward_features(x)[:, 0]
        cls_token = ours(x)[0]
        feat = dense(x)[0]
    assert (cls_token - expected_cls).abs().max() <= 1e-4
    expected_map = captured['tokens'].transpose(1, 2).reshape(2, 192, 14, 14)
    assert (feat - expected_map).abs().max() <= 1e-4


# exact counts with a 1000-class head (the official Refiner's extra token-labelling aux_head is
# not built), and the papers' figures as printed (their precision is the bar)
@pytest.mark.parametrize('cls,arch,img_size,count,paper_m', [
    (CaiT, 'xxs24', 224, 11_956_264, '12.0'), (CaiT, 's24', 224, 46_916_200, '46.9'),
    (CaiT, 's36', 384, 68_366_632, '68.4'), (DeepViT, 's', 224, 27_312_632, '27'),
    (DeepViT, 'l', 224, 58_883_708, None), (RefinedViT, 's', 224, 25_023_656, '25'),
    (RefinedViT, 'm', 224, 55_029_932, '55'), (RefinedViT, 'l', 224, 80_637_192, '81')])
def test_classifier_param_counts(cls, arch, img_size, count, paper_m):
    """CaiT-S36 is released at 384 px only; its 24x24 position embedding is counted."""
    model = cls(arch=arch, img_size=img_size, out_type='cls_token')
    head = model.embed_dims * 1000 + 1000
    total = sum(p.numel() for p in model.parameters()) + head
    assert total == count
    if paper_m is not None:  # the paper's figure is this count rounded to its printed digits
        digits = len(paper_m.split('.')[1]) if '.' in paper_m else 0
        assert f'{total / 1e6:.{digits}f}' == paper_m, (total, paper_m)


@pytest.mark.parametrize('arch', ['xxs24', 's24'])
def test_cait_param_count_equals_timms(arch):
    """An implementation we did not write, counted the same way (timm's head included)."""
    import timm
    reference = timm.create_model(f'cait_{arch}_224', pretrained=False)
    ours = CaiT(arch=arch, out_type='cls_token')
    head = ours.embed_dims * 1000 + 1000
    assert sum(p.numel() for p in ours.parameters()) + head == \
        sum(p.numel() for p in reference.parameters())


# ---- dense options ----------------------------------------------------------------------------
def _tokens_out(result):
    return result[0] if isinstance(result, tuple) else result  # Refined-ViT: (out, map)


@pytest.mark.parametrize('cls', [DeepViT, CaiT, RefinedViT])
def test_window_covering_the_map_pads_it_to_one_window(cls):
    """A window as large as the map is global attention (8 x 8 tokens, window 8); on a smaller
    map (6 x 7 tokens) it is global attention over the map zero-padded to the window, cropped
    back (detectron2's ViTDet pads; keys of padded tokens are the qkv bias). 2 x 2 windows
    really restrict attention."""
    torch.manual_seed(0)
    glob = _randomise(cls(arch=TINY[cls], window_size=None, simple_pyramid=False)).eval()
    windowed, small = (cls(arch=TINY[cls], window_size=side, global_blocks=(),
                           simple_pyramid=False).eval() for side in (8, 2))
    windowed.load_state_dict(glob.state_dict())
    small.load_state_dict(glob.state_dict())
    x = torch.randn(1, 3, 128, 128)  # an 8 x 8 token grid
    tokens = torch.randn(1, 42, glob.embed_dims)  # a 6 x 7 grid, as the attention sees it
    padded = torch.nn.functional.pad(tokens.view(1, 6, 7, -1), (0, 0, 0, 1, 0, 2)).view(1, 64, -1)
    with torch.no_grad():
        torch.testing.assert_close(windowed(x)[0], glob(x)[0], atol=1e-5, rtol=1e-5)
        assert (small(x)[0] - glob(x)[0]).abs().max() > 1e-3
        want = _tokens_out(glob.blocks[0].attn(padded, (8, 8))).view(1, 8, 8, -1)[:, :6, :7]
        got = _tokens_out(windowed.blocks[0].attn(tokens, (6, 7)))
        torch.testing.assert_close(got, want.reshape(1, 42, -1), atol=1e-5, rtol=1e-5)
        unpadded = _tokens_out(glob.blocks[0].attn(tokens, (6, 7)))
        assert (got - unpadded).abs().max() > 1e-3  # the padded keys take their share


def test_simple_pyramid_levels_and_multi_level_indices():
    model = DeepViT(arch=TINY[DeepViT], out_indices=(0, 1, 2, 3), window_size=2,
                    global_blocks=(3,)).eval()
    assert model.out_channels == (8, 16, 32, 32) and model.strides == (4, 8, 16, 32)
    outs = model(torch.randn(1, 3, 129, 100))
    assert [tuple(o.shape) for o in outs] == [(1, 8, 33, 25), (1, 16, 17, 13), (1, 32, 9, 7),
                                             (1, 32, 5, 4)]
    with pytest.raises(ValueError, match='out_indices must name 1 block'):
        DeepViT(arch=TINY[DeepViT], out_indices=(1, 2))


def test_cls_token_output_and_dense_drop_classifier_keys(tmp_path):
    classifier = CaiT(arch=TINY[CaiT], out_type='cls_token').eval()
    out = classifier(torch.randn(2, 3, 64, 48))
    assert len(out) == 1 and out[0].shape == (2, 32)
    path = tmp_path / 'cls.pth'
    save_state_dict(classifier.state_dict(), path)
    from mmvit_ext.converters import load_pretrained
    dense = CaiT(arch=TINY[CaiT], simple_pyramid=False)
    report = load_pretrained(dense, path)
    assert 'cls_token' in report.dropped and any(k.startswith('cls_blocks.') for k in report.dropped)
    assert not report.missing and not report.unexpected


def test_pos_embed_resized_from_checkpoint_and_at_every_size(tmp_path):
    source = DeepViT(arch=TINY[DeepViT], img_size=384, out_type='cls_token')
    path = tmp_path / 'ckpt.pth'
    torch.save({'state_dict': export_official_deepvit(source.state_dict())}, path)
    from mmvit_ext.converters import load_pretrained
    target = DeepViT(arch=TINY[DeepViT], simple_pyramid=False)
    report = load_pretrained(target, path)
    assert 'pos_embed' in report.resized and target.pos_embed.shape == (1, 197, 32)
    target.eval()
    buffers = {name for name, _ in target.named_buffers()}
    with torch.no_grad():
        a = target(torch.randn(1, 3, 80, 96))[0]
        b = target(torch.randn(1, 3, 96, 80))[0]
    assert a.shape == (1, 32, 5, 6) and b.shape == (1, 32, 6, 5)
    assert {name for name, _ in target.named_buffers()} == buffers  # nothing kept per size
    target.train()
    target(torch.randn(1, 3, 80, 96))[0].sum().backward()
    assert target.pos_embed.grad is not None and target.pos_embed.grad.abs().sum() > 0


def test_refiner_pairs_share_windows():
    with pytest.raises(ValueError, match='block 1 reuses the attention map of block 0'):
        RefinedViT(arch=TINY[RefinedViT], window_size=2, global_blocks=(1,))
    assert RefinedViT(arch='s').global_blocks == (6, 7, 14, 15)
    assert DeepViT(arch='s').global_blocks == (3, 7, 11, 15)


@pytest.mark.parametrize('bad,match', [
    (dict(window_size=0), 'window_size must be a positive int'),
    (dict(window_size=-3), 'window_size must be a positive int'),
    (dict(global_blocks=(99,)), 'global_blocks entry 99'),
    (dict(out_type='logits'), "out_type must be one of"),
    (dict(img_size=100), 'img_size must be a positive multiple'),
])
def test_bad_dense_arguments(bad, match):
    with pytest.raises(ValueError, match=match):
        DeepViT(arch=TINY[DeepViT], **bad)


def test_refined_vit_runs_the_shared_attention_functions(monkeypatch):
    """Every computing block of Refined-ViT computes its map with layers.attention_probs (and
    carries it on), every block applies one with layers.map_attention; attn_map hooks see all."""
    from mmvit_ext.backbones import refined_vit
    calls = []
    for name in ('attention_probs', 'map_attention'):
        real = getattr(refined_vit, name)
        monkeypatch.setattr(refined_vit, name, lambda *args, real=real, name=name, **kwargs:
                            calls.append(name) or real(*args, **kwargs))
    model = RefinedViT(arch=TINY[RefinedViT], window_size=None, simple_pyramid=False).eval()
    maps = []
    for entry in model.attention_blocks():
        entry.attention.attn_map.register_forward_hook(lambda m, i, o: maps.append(o.shape))
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 48))
    # blocks 0 and 2 compute maps (block 2 with block 0's carried on), blocks 1 and 3 reuse them
    assert calls == ['attention_probs', 'map_attention', 'map_attention'] * 2
    assert maps == [(1, 2, 12, 12)] * 4


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd keeps for backward of ``model(x)``."""
    seen = {}
    torch.manual_seed(1)  # the same stochastic depth draws in both runs

    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outs = model(x)
    return sum(seen.values()), outs


def test_refiner_recomputes_expanded_maps_with_equal_gradients_and_statistics():
    """Training keeps only the Refiner's H input maps (the r*H expanded ones are recomputed in
    backward): output, every gradient and the BatchNorm running statistics (counted once) equal
    the run that keeps them, and autograd saves less."""
    torch.manual_seed(0)
    # float64: the comparison is of the two paths, not of float32 summation orders, which
    # change with the thread count
    again = RefinedViT(arch=dict(TINY[RefinedViT], expand_ratio=6),
                       window_size=None).train().double()
    keep = RefinedViT(arch=dict(TINY[RefinedViT], expand_ratio=6), window_size=None,
                      recompute_maps=False).train().double()
    keep.load_state_dict(again.state_dict())
    assert not any(m.recompute for m in keep.modules() if isinstance(m, RefinerMap))
    refiners = [m for m in again.modules() if isinstance(m, RefinerMap)]
    assert refiners and all(m.recompute for m in refiners)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    saved_keep, out_keep = _saved_bytes(keep, x)
    saved_again, out_again = _saved_bytes(again, x)
    for a, b in zip(out_keep, out_again):  # equal up to the order of the reduction's sums
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    sum(o.square().sum() for o in out_keep).backward()
    sum(o.square().sum() for o in out_again).backward()
    grads = {n: p.grad for n, p in again.named_parameters() if p.grad is not None}
    assert any('refine' in n for n in grads)
    for name, p in keep.named_parameters():
        if p.grad is None:
            assert name not in grads, name
            continue
        # equal up to float32 summation order, relative to each gradient's own scale
        assert (grads[name] - p.grad).abs().max() <= 1e-4 * p.grad.abs().max() + 1e-5, name
    for (name, a), b in zip(keep.named_buffers(), again.buffers()):
        # running statistics updated once, num_batches_tracked counted once
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    assert saved_again < saved_keep, (saved_again, saved_keep)


@pytest.mark.parametrize('with_cp', [True, 'attn'])
def test_checkpointed_reattention_counts_its_batchnorm_statistics_once(with_cp):
    """with_cp recomputes re-attention (its BatchNorm in training) in backward: the running
    statistics and num_batches_tracked still count the step once, as without checkpointing."""
    torch.manual_seed(0)
    arch = dict(TINY[DeepViT], reattention_blocks=2)
    plain = DeepViT(arch=arch, window_size=None, drop_path_rate=0.0).train().double()
    checkpointed = DeepViT(arch=arch, window_size=None, drop_path_rate=0.0,
                           with_cp=with_cp).train().double()
    checkpointed.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    for model in (plain, checkpointed):
        sum(o.square().sum() for o in model(x)).backward()
    norms = [n for n, m in checkpointed.named_modules()
             if isinstance(m, nn.BatchNorm2d) and 'map_transforms' in n]
    assert len(norms) == 2
    buffers = dict(plain.named_buffers())
    for name, buffer in checkpointed.named_buffers():
        torch.testing.assert_close(buffer, buffers[name], rtol=1e-10, atol=1e-12, msg=name)
    assert all(int(buffers[f'{n}.num_batches_tracked']) == 1 for n in norms)
