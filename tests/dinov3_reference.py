"""An independent DINOv3 ViT written from the official semantics (facebookresearch/dinov3:
``models/vision_transformer.py``, ``layers/rope_position_encoding.py``, ``layers/attention.py``,
``layers/ffn_layers.py``), on the official key names, none of mmvit_ext's code. Plain functions
over a state dict, so a checkpoint in the official layout is its whole input.

Also the two other layouts' key conventions (timm ``vit_*_dinov3``, transformers
``DINOv3ViTModel``) written from those libraries' converters, for the layout tests when the
installed versions lack the models.
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

StateDict = Dict[str, torch.Tensor]

TINY = dict(embed_dim=32, depth=3, num_heads=2, ffn_ratio=4.0, ffn_layer='mlp',
            n_storage_tokens=4, qkv_bias=True, mask_k_bias=True,
            untie_cls_and_patch_norms=False, untie_global_and_local_cls_norm=False)


def ffn_hidden(cfg: dict) -> int:
    """Mlp: int(dim * ratio); SwiGLUFFN(align_to): int(that * 2 / 3) rounded up to align."""
    hidden = int(cfg['embed_dim'] * cfg['ffn_ratio'])
    if cfg['ffn_layer'] == 'mlp':
        return hidden
    align = {'swiglu': 8, 'swiglu32': 32, 'swiglu64': 64, 'swiglu128': 128}[cfg['ffn_layer']]
    d = int(hidden * 2 / 3)
    return d + (-d % align)


def official_state_dict(cfg: dict, seed: int = 0, patch: int = 16) -> StateDict:
    """Random weights (away from any init) in the official hub layout of ``cfg``."""
    gen = torch.Generator().manual_seed(seed)
    dim, hidden = cfg['embed_dim'], ffn_hidden(cfg)

    def rnd(*shape, std=0.05, mean=0.0):
        return torch.randn(*shape, generator=gen) * std + mean

    sd = {'cls_token': rnd(1, 1, dim, std=0.5), 'mask_token': rnd(1, dim),
          'patch_embed.proj.weight': rnd(dim, 3, patch, patch, std=0.02),
          'patch_embed.proj.bias': rnd(dim),
          'rope_embed.periods': 100.0 ** (2 * torch.arange(dim // cfg['num_heads'] // 4,
                                                            dtype=torch.float32)
                                          / (dim // cfg['num_heads'] // 2)),
          'norm.weight': rnd(dim, std=0.1, mean=1.0), 'norm.bias': rnd(dim)}
    if cfg['n_storage_tokens']:
        sd['storage_tokens'] = rnd(1, cfg['n_storage_tokens'], dim, std=0.5)
    norms = ['cls_norm'] if cfg['untie_cls_and_patch_norms'] else []
    norms += ['local_cls_norm'] if cfg['untie_global_and_local_cls_norm'] else []
    for name in norms:
        sd[f'{name}.weight'], sd[f'{name}.bias'] = rnd(dim, std=0.1, mean=1.0), rnd(dim)
    for i in range(cfg['depth']):
        p = f'blocks.{i}.'
        for n in ('norm1', 'norm2'):
            sd[p + n + '.weight'], sd[p + n + '.bias'] = rnd(dim, std=0.1, mean=1.0), rnd(dim)
        sd[p + 'attn.qkv.weight'] = rnd(3 * dim, dim, std=0.15)
        if cfg['qkv_bias']:
            sd[p + 'attn.qkv.bias'] = rnd(3 * dim, std=0.2)  # k part non-zero: the mask matters
            if cfg['mask_k_bias']:
                mask = torch.ones(3 * dim)
                mask[dim:2 * dim] = 0
                sd[p + 'attn.qkv.bias_mask'] = mask
        sd[p + 'attn.proj.weight'], sd[p + 'attn.proj.bias'] = rnd(dim, dim, std=0.15), rnd(dim)
        sd[p + 'ls1.gamma'], sd[p + 'ls2.gamma'] = rnd(dim, std=0.3), rnd(dim, std=0.3)
        if cfg['ffn_layer'] == 'mlp':
            names = (('fc1', hidden, dim), ('fc2', dim, hidden))
        else:
            names = (('w1', hidden, dim), ('w2', hidden, dim), ('w3', dim, hidden))
        for n, out_f, in_f in names:
            sd[f'{p}mlp.{n}.weight'], sd[f'{p}mlp.{n}.bias'] = rnd(out_f, in_f, std=0.1), rnd(out_f)
    return sd


def _rope(sd: StateDict, h: int, w: int, augment: Optional[dict] = None
          ) -> Tuple[torch.Tensor, torch.Tensor]:
    """RopePositionEmbedding.forward, normalize_coords='separate'; ``augment`` (``shift``,
    ``jitter``, ``rescale``, each optional): training mode, the draws made as the official
    does: float32, shift (2,) uniform, jitter (2,) exp of uniform in +-log, rescale (1,) alike."""
    periods = sd['rope_embed.periods'].float()
    ch = torch.arange(0.5, h, dtype=torch.float32) / h
    cw = torch.arange(0.5, w, dtype=torch.float32) / w
    coords = torch.stack(torch.meshgrid(ch, cw, indexing='ij'), dim=-1).flatten(0, 1) * 2.0 - 1.0
    augment = augment or {}
    if augment.get('shift') is not None:
        coords += torch.empty(2).uniform_(-augment['shift'], augment['shift'])[None, :]
    if augment.get('jitter') is not None:
        top = float(np.log(augment['jitter']))
        coords *= torch.empty(2).uniform_(-top, top).exp()[None, :]
    if augment.get('rescale') is not None:
        top = float(np.log(augment['rescale']))
        coords *= torch.empty(1).uniform_(-top, top).exp()
    angles = (2 * math.pi * coords[:, :, None] / periods[None, None, :]).flatten(1, 2).tile(2)
    return torch.sin(angles), torch.cos(angles)


def _rot(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


def _block(sd: StateDict, p: str, x: torch.Tensor, rope, cfg: dict, eps: float) -> torch.Tensor:
    dim, heads = cfg['embed_dim'], cfg['num_heads']
    B, N, _ = x.shape
    y = F.layer_norm(x, (dim,), sd[p + 'norm1.weight'], sd[p + 'norm1.bias'], eps)
    bias = sd.get(p + 'attn.qkv.bias')
    if bias is not None and p + 'attn.qkv.bias_mask' in sd:
        bias = bias * sd[p + 'attn.qkv.bias_mask']
    qkv = F.linear(y, sd[p + 'attn.qkv.weight'], bias).reshape(B, N, 3, heads, dim // heads)
    q, k, v = qkv.unbind(2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    sin, cos = rope
    pre = N - sin.shape[0]
    q = torch.cat([q[:, :, :pre], _rot(q[:, :, pre:], sin, cos)], dim=2)
    k = torch.cat([k[:, :, :pre], _rot(k[:, :, pre:], sin, cos)], dim=2)
    attn = ((q * (dim // heads) ** -0.5) @ k.transpose(-2, -1)).softmax(-1)
    y = (attn @ v).transpose(1, 2).reshape(B, N, dim)
    x = x + sd[p + 'ls1.gamma'] * F.linear(y, sd[p + 'attn.proj.weight'], sd[p + 'attn.proj.bias'])
    y = F.layer_norm(x, (dim,), sd[p + 'norm2.weight'], sd[p + 'norm2.bias'], eps)
    if p + 'mlp.fc1.weight' in sd:
        y = F.linear(F.gelu(F.linear(y, sd[p + 'mlp.fc1.weight'], sd[p + 'mlp.fc1.bias'])),
                     sd[p + 'mlp.fc2.weight'], sd[p + 'mlp.fc2.bias'])
    else:
        gate = F.linear(y, sd[p + 'mlp.w1.weight'], sd[p + 'mlp.w1.bias'])
        val = F.linear(y, sd[p + 'mlp.w2.weight'], sd[p + 'mlp.w2.bias'])
        y = F.linear(F.silu(gate) * val, sd[p + 'mlp.w3.weight'], sd[p + 'mlp.w3.bias'])
    return x + sd[p + 'ls2.gamma'] * y


@torch.no_grad()
def get_intermediate_layers(sd: StateDict, cfg: dict, x: torch.Tensor, n: Sequence[int],
                            norm: bool = True, eps: float = 1e-5, patch: int = 16,
                            rope_augment: Optional[dict] = None
                            ) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """The official ``get_intermediate_layers(x, n=n, reshape=True, return_class_token=True,
    norm=norm)``: per block of ``n``, the (B, C, h, w) patch map and the (B, C) class token.
    ``rope_augment``: in training mode, with the RoPE's coordinate augmentation, which the
    official trunk draws anew for every block (its RoPE is called inside the block loop)."""
    dim = cfg['embed_dim']
    B, _, H, W = x.shape
    h, w = H // patch, W // patch
    tokens = F.conv2d(x, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=patch)
    tokens = tokens.flatten(2).transpose(1, 2)
    prefix = [sd['cls_token'].expand(B, -1, -1)]
    if 'storage_tokens' in sd:
        prefix.append(sd['storage_tokens'].expand(B, -1, -1))
    tokens = torch.cat(prefix + [tokens], dim=1)
    num_prefix = 1 + (sd['storage_tokens'].shape[1] if 'storage_tokens' in sd else 0)
    rope = _rope(sd, h, w)
    outs = []
    for i in range(cfg['depth']):
        if rope_augment:
            rope = _rope(sd, h, w, rope_augment)
        tokens = _block(sd, f'blocks.{i}.', tokens, rope, cfg, eps)
        if i in n:
            outs.append(tokens)
    results = []
    for out in outs:
        if norm and 'cls_norm.weight' in sd:
            out = torch.cat([F.layer_norm(out[:, :num_prefix], (dim,), sd['cls_norm.weight'],
                                          sd['cls_norm.bias'], eps),
                             F.layer_norm(out[:, num_prefix:], (dim,), sd['norm.weight'],
                                          sd['norm.bias'], eps)], dim=1)
        elif norm:
            out = F.layer_norm(out, (dim,), sd['norm.weight'], sd['norm.bias'], eps)
        patches = out[:, num_prefix:].reshape(B, h, w, dim).permute(0, 3, 1, 2)
        results.append((patches, out[:, 0]))
    return results


# ---- the other layouts, from their libraries' conventions ------------------------------------
def official_to_timm(sd: StateDict) -> StateDict:
    """timm eva ``checkpoint_filter_fn`` (DINOv3 branch) as it maps the official keys, plus a
    model's own non-persistent / zero k bias left out."""
    out = {}
    for k, v in sd.items():
        if k.endswith(('.periods', '.bias_mask')) or k == 'mask_token' \
                or k.startswith('local_cls_norm'):
            continue
        if k.endswith('qkv.bias'):
            q, _, val = v.chunk(3)
            out[k.replace('qkv.bias', 'q_bias')], out[k.replace('qkv.bias', 'v_bias')] = q, val
            continue
        k = k.replace('ls1.gamma', 'gamma_1').replace('ls2.gamma', 'gamma_2')
        k = k.replace('storage_tokens', 'reg_token')
        k = k.replace('mlp.w1', 'mlp.fc1_g').replace('mlp.w2', 'mlp.fc1_x').replace('mlp.w3',
                                                                                       'mlp.fc2')
        out[k] = v
    return out


def official_to_hf(sd: StateDict, key_bias: bool = False) -> StateDict:
    """transformers ``convert_dinov3_vit_to_hf.py`` key mapping onto ``DINOv3ViTModel``'s
    modules (q / k / v / o_proj, layer_scale*.lambda1, up / down / gate_proj); the k bias is
    dropped (``key_bias=False``) or kept masked."""
    out = {}
    for k, v in sd.items():
        if k in ('rope_embed.periods',) or k.endswith('bias_mask') or k.startswith(
                ('local_cls_norm', 'cls_norm')):
            continue
        k2 = {'cls_token': 'embeddings.cls_token', 'mask_token': 'embeddings.mask_token',
              'storage_tokens': 'embeddings.register_tokens'}.get(k, k)
        k2 = k2.replace('patch_embed.proj.', 'embeddings.patch_embeddings.')
        if k2.startswith('blocks.'):
            _, i, rest = k2.split('.', 2)
            rest = rest.replace('attn.proj.', 'attention.o_proj.')
            rest = rest.replace('ls1.gamma', 'layer_scale1.lambda1')
            rest = rest.replace('ls2.gamma', 'layer_scale2.lambda1')
            for a, b in (('mlp.fc1.', 'mlp.up_proj.'), ('mlp.fc2.', 'mlp.down_proj.'),
                         ('mlp.w1.', 'mlp.gate_proj.'), ('mlp.w2.', 'mlp.up_proj.'),
                         ('mlp.w3.', 'mlp.down_proj.')):
                rest = rest.replace(a, b)
            if rest.startswith('attn.qkv.'):
                kind = rest.rsplit('.', 1)[1]
                if kind == 'bias' and f'blocks.{i}.attn.qkv.bias_mask' in sd:
                    v = v * sd[f'blocks.{i}.attn.qkv.bias_mask']
                for name, part in zip('qkv', v.chunk(3)):
                    if name == 'k' and kind == 'bias' and not key_bias:
                        continue
                    out[f'layer.{i}.attention.{name}_proj.{kind}'] = part
                continue
            k2 = f'layer.{i}.{rest}'
        out[k2] = v
    return out
