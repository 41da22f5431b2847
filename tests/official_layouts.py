"""State dicts in the official key layouts, written from the published key lists and shapes
(random values), so converters and parity checks are tested without downloading weights."""
from typing import Dict, Sequence

import torch


def _rand(gen: torch.Generator, *shape: int, std: float = 0.05, mean: float = 0.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std + mean


def official_swin_rel_index(window: int) -> torch.Tensor:
    """relative_position_index exactly as the official WindowAttention computes it."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing='ij'))
    flat = coords.flatten(1)
    rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += window - 1
    rel[:, :, 1] += window - 1
    rel[:, :, 0] *= 2 * window - 1
    return rel.sum(-1)


def official_swin_state_dict(embed_dims: int = 96, depths: Sequence[int] = (2, 2, 6, 2),
                             num_heads: Sequence[int] = (3, 6, 12, 24), window: int = 7,
                             img_size: int = 224, num_classes: int = 1000, seed: int = 0,
                             ) -> Dict[str, torch.Tensor]:
    """microsoft/Swin-Transformer classification checkpoint layout (``model`` contents)."""
    gen = torch.Generator().manual_seed(seed)
    sd: Dict[str, torch.Tensor] = {
        'patch_embed.proj.weight': _rand(gen, embed_dims, 3, 4, 4, std=0.2),
        'patch_embed.proj.bias': _rand(gen, embed_dims),
        'patch_embed.norm.weight': _rand(gen, embed_dims, std=0.1, mean=1.0),
        'patch_embed.norm.bias': _rand(gen, embed_dims),
    }
    n = window * window
    for i, (depth, heads) in enumerate(zip(depths, num_heads)):
        dim = embed_dims * 2 ** i
        res = img_size // 4 // 2 ** i
        for j in range(depth):
            p = f'layers.{i}.blocks.{j}.'
            sd[p + 'norm1.weight'] = _rand(gen, dim, std=0.1, mean=1.0)
            sd[p + 'norm1.bias'] = _rand(gen, dim)
            sd[p + 'attn.relative_position_bias_table'] = _rand(gen, (2 * window - 1) ** 2, heads, std=1.0)
            sd[p + 'attn.relative_position_index'] = official_swin_rel_index(window)
            sd[p + 'attn.qkv.weight'] = _rand(gen, 3 * dim, dim)
            sd[p + 'attn.qkv.bias'] = _rand(gen, 3 * dim)
            sd[p + 'attn.proj.weight'] = _rand(gen, dim, dim)
            sd[p + 'attn.proj.bias'] = _rand(gen, dim)
            sd[p + 'norm2.weight'] = _rand(gen, dim, std=0.1, mean=1.0)
            sd[p + 'norm2.bias'] = _rand(gen, dim)
            sd[p + 'mlp.fc1.weight'] = _rand(gen, 4 * dim, dim)
            sd[p + 'mlp.fc1.bias'] = _rand(gen, 4 * dim)
            sd[p + 'mlp.fc2.weight'] = _rand(gen, dim, 4 * dim)
            sd[p + 'mlp.fc2.bias'] = _rand(gen, dim)
            if j % 2 == 1 and res > window:  # the official model saves the SW-MSA mask buffer
                sd[p + 'attn_mask'] = torch.zeros((res // window) ** 2, n, n)
        if i < len(depths) - 1:
            sd[f'layers.{i}.downsample.norm.weight'] = _rand(gen, 4 * dim, std=0.1, mean=1.0)
            sd[f'layers.{i}.downsample.norm.bias'] = _rand(gen, 4 * dim)
            sd[f'layers.{i}.downsample.reduction.weight'] = _rand(gen, 2 * dim, 4 * dim)
    last = embed_dims * 2 ** (len(depths) - 1)
    sd['norm.weight'] = _rand(gen, last, std=0.1, mean=1.0)
    sd['norm.bias'] = _rand(gen, last)
    sd['head.weight'] = _rand(gen, num_classes, last)
    sd['head.bias'] = _rand(gen, num_classes)
    return sd


def official_pvtv2_state_dict(embed_dims: Sequence[int] = (64, 128, 320, 512),
                              depths: Sequence[int] = (3, 4, 6, 3),
                              num_heads: Sequence[int] = (1, 2, 5, 8),
                              mlp_ratios: Sequence[int] = (8, 8, 4, 4),
                              sr_ratios: Sequence[int] = (8, 4, 2, 1), linear: bool = False,
                              num_classes: int = 1000, seed: int = 0) -> Dict[str, torch.Tensor]:
    """whai362/PVT ``pvt_v2.py`` classification checkpoint layout."""
    gen = torch.Generator().manual_seed(seed)
    sd: Dict[str, torch.Tensor] = {}
    in_dim = 3
    for n, (dim, depth, mlp, sr) in enumerate(zip(embed_dims, depths, mlp_ratios, sr_ratios), 1):
        k = 7 if n == 1 else 3
        sd[f'patch_embed{n}.proj.weight'] = _rand(gen, dim, in_dim, k, k, std=0.1)
        sd[f'patch_embed{n}.proj.bias'] = _rand(gen, dim)
        sd[f'patch_embed{n}.norm.weight'] = _rand(gen, dim, std=0.1, mean=1.0)
        sd[f'patch_embed{n}.norm.bias'] = _rand(gen, dim)
        hidden = dim * mlp
        for j in range(depth):
            p = f'block{n}.{j}.'
            for norm in ('norm1', 'norm2'):
                sd[p + norm + '.weight'] = _rand(gen, dim, std=0.1, mean=1.0)
                sd[p + norm + '.bias'] = _rand(gen, dim)
            sd[p + 'attn.q.weight'] = _rand(gen, dim, dim, std=0.1)
            sd[p + 'attn.q.bias'] = _rand(gen, dim)
            sd[p + 'attn.kv.weight'] = _rand(gen, 2 * dim, dim, std=0.1)
            sd[p + 'attn.kv.bias'] = _rand(gen, 2 * dim)
            sd[p + 'attn.proj.weight'] = _rand(gen, dim, dim)
            sd[p + 'attn.proj.bias'] = _rand(gen, dim)
            if linear or sr > 1:
                ks = 1 if linear else sr
                sd[p + 'attn.sr.weight'] = _rand(gen, dim, dim, ks, ks, std=0.05)
                sd[p + 'attn.sr.bias'] = _rand(gen, dim)
                sd[p + 'attn.norm.weight'] = _rand(gen, dim, std=0.1, mean=1.0)
                sd[p + 'attn.norm.bias'] = _rand(gen, dim)
            sd[p + 'mlp.fc1.weight'] = _rand(gen, hidden, dim)
            sd[p + 'mlp.fc1.bias'] = _rand(gen, hidden)
            sd[p + 'mlp.dwconv.dwconv.weight'] = _rand(gen, hidden, 1, 3, 3, std=0.2)
            sd[p + 'mlp.dwconv.dwconv.bias'] = _rand(gen, hidden)
            sd[p + 'mlp.fc2.weight'] = _rand(gen, dim, hidden)
            sd[p + 'mlp.fc2.bias'] = _rand(gen, dim)
        sd[f'norm{n}.weight'] = _rand(gen, dim, std=0.1, mean=1.0)
        sd[f'norm{n}.bias'] = _rand(gen, dim)
        in_dim = dim
    sd['head.weight'] = _rand(gen, num_classes, embed_dims[-1])
    sd['head.bias'] = _rand(gen, num_classes)
    return sd
