"""DeepViT and Refined-ViT against implementations this project did not write (same weights).

* DeepViT: ``vit_pytorch.deepvit.DeepViT`` (lucidrains/vit-pytorch, MIT; pinned in
  requirements/dev.txt). Where vit-pytorch departs from the paper, the test sets it to the paper's
  choice and says so: re-attention's norm is a BatchNorm over the heads (paper Eq. 3 and the
  official code; vit-pytorch normalises over the heads with a LayerNorm), the patch embedding is
  one linear projection of the flattened patch (vit-pytorch adds a LayerNorm before and after),
  LayerNorm eps 1e-6 (the official models'). The weights go across by the key map below.
* Refined-ViT: a computing / shared block pair against a reference written here from the
  paper's equations (Zhou et al., 2021, "Refiner": attention expansion, distributed local
  attention, reduction) and the official model's placement of its norms, in plain tensor
  operations; nothing from ``mmvit_ext.layers`` is used by the reference.

The bar is 1e-5 (max abs diff).
"""
import math
from typing import Dict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmvit_ext.backbones import DeepViT, RefinedViT

TOL = 1e-5
DIM, HEADS, DEPTH, MLP_RATIO = 32, 4, 3, 3


def _randomise(model: nn.Module, seed: int) -> nn.Module:
    """Every parameter and BatchNorm statistic random, so no branch hides behind its init."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.add_(1.0)
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.weight.add_(1.0)
                module.running_mean.copy_(torch.randn(module.num_features, generator=gen) * 0.1)
                module.running_var.copy_(torch.rand(module.num_features, generator=gen) + 0.5)
    return model.eval()


# ---- DeepViT against vit-pytorch ------------------------------------------------------------
class _HeadsBatchNorm(nn.BatchNorm2d):
    """The paper's re-attention norm: BatchNorm over the head axis of (B, H, N, N) maps."""


def _vit_pytorch_deepvit(patch: int, image: int) -> nn.Module:
    from vit_pytorch.deepvit import DeepViT as Reference
    ref = Reference(image_size=image, patch_size=patch, num_classes=10, dim=DIM, depth=DEPTH,
                    heads=HEADS, dim_head=DIM // HEADS, mlp_dim=DIM * MLP_RATIO)
    # the paper's choices where vit-pytorch departs from them (module docstring)
    ref.to_patch_embedding[1] = nn.Identity()
    ref.to_patch_embedding[3] = nn.Identity()
    for attn, _ in ref.transformer.layers:
        attn.reattn_norm = _HeadsBatchNorm(HEADS)
    for module in ref.modules():
        if isinstance(module, nn.LayerNorm):
            module.eps = 1e-6
    return ref


def _deepvit_key_map(ours: Dict[str, torch.Tensor], patch: int) -> Dict[str, torch.Tensor]:
    """Our DeepViT state dict -> vit-pytorch's keys (its re-attention has no mixing bias and its
    qkv no bias: the test sets ours to zero there, so nothing is dropped)."""
    dim = ours['patch_embed.proj.weight'].shape[0]
    theirs = {
        'cls_token': ours['cls_token'],
        'pos_embedding': ours['pos_embed'],
        # conv over a patch == linear over the patch flattened as (p1 p2 c)
        'to_patch_embedding.2.weight': ours['patch_embed.proj.weight'].permute(0, 2, 3, 1)
                                       .reshape(dim, -1),
        'to_patch_embedding.2.bias': ours['patch_embed.proj.bias'],
        'mlp_head.0.weight': ours['norm.weight'], 'mlp_head.0.bias': ours['norm.bias'],
    }
    for i in range(DEPTH):
        src, attn, ff = f'blocks.{i}.', f'transformer.layers.{i}.0.', f'transformer.layers.{i}.1.'
        mix = src + 'attn.map_transforms.0.'
        heads = ours[mix + 'mix.weight'].shape[0]
        theirs.update({
            attn + 'norm.weight': ours[src + 'norm1.weight'],
            attn + 'norm.bias': ours[src + 'norm1.bias'],
            attn + 'to_qkv.weight': ours[src + 'attn.qkv.weight'],
            # einsum('bhij,hg->bgij', attn, W): W[h, g] is our 1x1 conv's weight[g, h]
            attn + 'reattn_weights': ours[mix + 'mix.weight'].reshape(heads, heads).t(),
            **{attn + f'reattn_norm.{k}': ours[mix + f'norm.{k}']
               for k in ('weight', 'bias', 'running_mean', 'running_var')},
            attn + 'to_out.0.weight': ours[src + 'attn.proj.weight'],
            attn + 'to_out.0.bias': ours[src + 'attn.proj.bias'],
            ff + 'net.0.weight': ours[src + 'norm2.weight'], ff + 'net.0.bias': ours[src + 'norm2.bias'],
            ff + 'net.1.weight': ours[src + 'mlp.fc1.weight'], ff + 'net.1.bias': ours[src + 'mlp.fc1.bias'],
            ff + 'net.4.weight': ours[src + 'mlp.fc2.weight'], ff + 'net.4.bias': ours[src + 'mlp.fc2.bias'],
        })
    return theirs


def test_deepvit_matches_vit_pytorch():
    patch, image = 16, 64
    ours = DeepViT(arch=dict(embed_dims=DIM, depth=DEPTH, num_heads=HEADS,
                             reattention_blocks=DEPTH, mlp_ratio=MLP_RATIO),
                   img_size=image, out_type='cls_token', drop_path_rate=0.0)
    _randomise(ours, seed=0)
    with torch.no_grad():  # vit-pytorch has neither: zero ours
        for i in range(DEPTH):
            ours.blocks[i].attn.qkv.bias.zero_()
            ours.blocks[i].attn.map_transforms[0].mix.bias.zero_()
    ref = _vit_pytorch_deepvit(patch, image).eval()
    weights = _deepvit_key_map(ours.state_dict(), patch)
    result = ref.load_state_dict(weights, strict=False)
    assert not result.unexpected_keys
    # left at its init: the classifier, which is not compared
    assert set(result.missing_keys) == {'mlp_head.1.weight', 'mlp_head.1.bias'}
    captured = {}
    ref.mlp_head[0].register_forward_hook(lambda m, i, o: captured.update(cls=o))
    x = torch.randn(2, 3, image, image, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref(x)
        cls_token = ours(x)[0]
    diff = (cls_token - captured['cls']).abs().max().item()
    print(f'DeepViT vs vit-pytorch DeepViT: class token max abs diff {diff:.2e}')
    assert cls_token.shape == (2, DIM)
    assert diff <= TOL


# ---- Refined-ViT's refiner against the paper's equations ------------------------------------
def _bn(x: torch.Tensor, p: Dict[str, torch.Tensor], eps: float = 1e-5) -> torch.Tensor:
    """Inference BatchNorm over dim 1 of (B, C, N, M)."""
    shape = (1, -1, 1, 1)
    return (x - p['mean'].view(shape)) / torch.sqrt(p['var'].view(shape) + eps) \
        * p['weight'].view(shape) + p['bias'].view(shape)


def _layer_norm(x: torch.Tensor, p: Dict[str, torch.Tensor], eps: float = 1e-6) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * p['weight'] + p['bias']


def _linear(x: torch.Tensor, p: Dict[str, torch.Tensor]) -> torch.Tensor:
    return x @ p['weight'].t() + p['bias']


def _refine(attn: torch.Tensor, p: Dict[str, dict], scale: float) -> torch.Tensor:
    """The refiner on H maps (B, H, N, N): attention expansion to H' = 3H maps by a linear
    map over heads (W_A), distributed local attention (a k x k kernel per expanded map, zero
    padding), reduction back to H (W_R), residual, and the attention block's output norm."""
    heads_out = p['reduce'].shape[0]
    expanded = torch.einsum('gh,bhnm->bgnm', p['expand'], attn)          # W_A A
    expanded = torch.clamp(_bn(expanded, p['bn_expand']), 0.0, 6.0)     # ReLU6(BN(.))
    k = p['local'].shape[-1]
    local = F.conv2d(expanded, p['local'], padding=k // 2, groups=expanded.shape[1])
    local = torch.clamp(_bn(local, p['bn_local']), 0.0, 6.0)
    reduced = _bn(torch.einsum('hg,bgnm->bhnm', p['reduce'], local), p['bn_reduce'])
    assert reduced.shape[1] == heads_out
    return _bn(reduced + attn, p['bn_out']) * scale


def _mlp_branch(x: torch.Tensor, p: dict, a: float) -> torch.Tensor:
    hidden = F.gelu(_linear(_layer_norm(x * a, p['norm2']), p['fc1']))
    return x + p['gamma'] * _linear(hidden, p['fc2']) / a


def _reference_pair(x: torch.Tensor, p: Dict[str, dict], heads: int, a: float):
    """A computing block (its own softmax(QK^T / sqrt(d)) map, carried on) and a shared block
    (values only; the carried map refined and applied), each pre-norm with the official
    input scaling ``a`` (scale_adjustment) and the MLP's layer scale."""
    batch, n, dim = x.shape
    d = dim // heads
    split = lambda t: t.reshape(batch, n, heads, d).transpose(1, 2)  # noqa: E731
    first, second = p['block0'], p['block1']
    q, k, v = _linear(_layer_norm(x * a, first['norm1']), first['qkv']).chunk(3, dim=-1)
    attn = torch.softmax(split(q) @ split(k).transpose(-2, -1) / math.sqrt(d), dim=-1)
    out = (attn @ split(v)).transpose(1, 2).reshape(batch, n, dim)
    x = _mlp_branch(x + _linear(out, first['proj']) / a, first, a)
    v = split(_linear(_layer_norm(x * a, second['norm1']), second['v']))
    refined = _refine(attn, second['refiner'], scale=d ** -0.5)
    out = (refined @ v).transpose(1, 2).reshape(batch, n, dim)
    return _mlp_branch(x + _linear(out, second['proj']) / a, second, a)


def _refiner_key_map(ours: Dict[str, torch.Tensor]) -> Dict[str, dict]:
    """Our RefinedViT block weights -> the reference's names."""
    lin = lambda key: dict(weight=ours[key + '.weight'], bias=ours[key + '.bias'])  # noqa: E731
    bn = lambda key: dict(weight=ours[key + '.weight'], bias=ours[key + '.bias'],  # noqa: E731
                          mean=ours[key + '.running_mean'], var=ours[key + '.running_var'])
    blocks = {}
    for i in (0, 1):
        b = f'blocks.{i}.'
        blocks[f'block{i}'] = dict(norm1=lin(b + 'norm1'), norm2=lin(b + 'norm2'),
                                   proj=lin(b + 'attn.proj'), fc1=lin(b + 'mlp.fc1'),
                                   fc2=lin(b + 'mlp.fc2'), gamma=ours[b + 'ls2.gamma'])
    blocks['block0']['qkv'] = lin('blocks.0.attn.qkv')
    blocks['block1']['v'] = lin('blocks.1.attn.v')
    r = 'blocks.1.attn.refine.'
    blocks['block1']['refiner'] = dict(
        expand=ours[r + 'conv_exp.weight'][:, :, 0, 0], bn_expand=bn(r + 'bn1'),
        local=ours[r + 'depth_sep_conv.weight'], bn_local=bn(r + 'bn2'),
        reduce=ours[r + 'conv_pro.weight'][:, :, 0, 0], bn_reduce=bn(r + 'bn3'),
        bn_out=bn(r + 'adapt_bn'))
    return blocks


def test_refiner_block_pair_matches_the_papers_equations():
    a = 0.5  # the official models' scale_adjustment
    model = RefinedViT(arch=dict(embed_dims=DIM, depth=2, num_heads=HEADS, expand_ratio=3,
                                 kernel_size=3, scale_adjustment=a, mlp_layer_scale=0.3),
                       window_size=None, simple_pyramid=False, out_indices=(1,),
                       drop_path_rate=0.0)
    _randomise(model, seed=2)
    hw = (5, 6)
    x = torch.randn(2, hw[0] * hw[1], DIM, generator=torch.Generator().manual_seed(3))
    def pair(tokens: torch.Tensor) -> torch.Tensor:
        tokens, attn_map = model.blocks[0](tokens, hw)
        return model.blocks[1](tokens, hw, attn_map)[0]

    with torch.no_grad():
        tokens = pair(x)
        expected = _reference_pair(x, _refiner_key_map(model.state_dict()), HEADS, a)
    diff = (tokens - expected).abs().max().item()
    print(f'Refined-ViT block pair vs the paper\'s equations: max abs diff '
          f'{diff:.2e}')
    assert tokens.shape == expected.shape == x.shape
    assert diff <= TOL
