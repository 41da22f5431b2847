"""DINOv3 (Siméoni et al., 2025) on the plain-ViT trunk of :class:`~.vit.VisionTransformer`:
the presets of the official hub (``dinov3/hub/backbones.py``), the RoPE attention with the
k-bias mask, and the checkpoint fixes a RoPE trunk needs.

What differs from DINOv2: patch 16, no absolute position embedding but axial RoPE on the patch
tokens' q and k (:mod:`mmvit_ext.layers.rope`), four storage tokens (our ``register_tokens``,
after the class token, no position), LayerScale 1e-5, LayerNorm eps 1e-5, the qkv bias's k part
masked to zero (``attn.qkv.bias_mask``), MLP or SwiGLU (hidden ``int(dim * ratio * 2 / 3)``
rounded up to 8, or 64 for the 7B), optionally a separate norm for the class / storage tokens
(``cls_norm``). The 7B and the SAT-493M ViT-L also hold ``local_cls_norm``, used by the
pretraining on local crops only: dropped on load.
"""
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..converters.io import CheckpointError
from ..errors import ConfigError
from ..converters.layouts import StateDict
from ..layers import RopeEmbedding, Size2, WindowAttention, apply_rope


def _dinov3(dim: int, depth: int, heads: int, mlp_ratio: float = 4, ffn: str = 'mlp',
            **extra: Any) -> dict:
    # dinov3/hub/backbones.py: base 100, 'separate' coords, fp32 periods, 'layernormbf16'
    # (eps 1e-5), LayerScale 1e-5, 4 storage tokens, mask_k_bias, qkv / proj / ffn biases
    return dict(embed_dims=dim, depth=depth, num_heads=heads, mlp_ratio=mlp_ratio, ffn=ffn,
                patch_size=16, layer_scale=1e-5, reg_tokens=4, norm_eps=1e-5,
                rope=dict(base=100.0, normalize='separate'), mask_k_bias=True, **extra)


DINOV3_ARCHS = {
    ('dinov3_vits16', 'dinov3-s', 'dinov3_s', 'dinov3-small'): _dinov3(384, 12, 6),
    ('dinov3_vits16plus', 'dinov3-s+', 'dinov3_s+', 'dinov3-splus', 'dinov3_splus'):
        _dinov3(384, 12, 6, 6, 'swiglu'),
    ('dinov3_vitb16', 'dinov3-b', 'dinov3_b', 'dinov3-base'): _dinov3(768, 12, 12),
    ('dinov3_vitl16', 'dinov3-l', 'dinov3_l', 'dinov3-large'): _dinov3(1024, 24, 16),
    # the SAT-493M ViT-L checkpoint: untie_global_and_local_cls_norm (a local_cls_norm)
    ('dinov3_vitl16_sat493m', 'dinov3-l-sat', 'dinov3_l_sat'):
        _dinov3(1024, 24, 16, local_cls_norm=True),
    ('dinov3_vitl16plus', 'dinov3-l+', 'dinov3_l+', 'dinov3-lplus', 'dinov3_lplus'):
        _dinov3(1024, 24, 16, 6, 'swiglu'),
    ('dinov3_vith16plus', 'dinov3-h+', 'dinov3_h+', 'dinov3-hplus', 'dinov3_hplus'):
        _dinov3(1280, 32, 20, 6, 'swiglu'),
    ('dinov3_vit7b16', 'dinov3-7b', 'dinov3_7b'):
        _dinov3(4096, 40, 32, 3, 'swiglu64', qkv_bias=False, local_cls_norm=True),
}
# the keys a custom arch may add to the plain ViT's
DINOV3_KEYS = frozenset({'rope', 'mask_k_bias', 'qkv_bias', 'norm_eps', 'untie_norms',
                         'local_cls_norm'})
# DINOv3 README (facebookresearch/dinov3), millions of parameters
README_PARAMS = {'dinov3_vits16': 21, 'dinov3_vits16plus': 29, 'dinov3_vitb16': 86,
                 'dinov3_vitl16': 300, 'dinov3_vith16plus': 840, 'dinov3_vit7b16': 6716}


def dinov3_arch_zoo() -> dict:
    """Every name / alias -> its preset."""
    return {name: preset for names, preset in DINOV3_ARCHS.items() for name in names}


def swiglu_hidden(hidden_features: int, align: int = 8) -> int:
    """The official ``SwiGLUFFN`` width: 2/3 of ``hidden_features``, rounded up to ``align``."""
    width = int(hidden_features * 2 / 3)
    return width + (-width % align)


def k_bias_mask(dim: int) -> torch.Tensor:
    """(3 dim,) ones with the k third zero: the official ``bias_mask`` after initialisation."""
    mask = torch.ones(3 * dim)
    mask[dim:2 * dim] = 0
    return mask


class RopeAttention(WindowAttention):
    """Global attention with RoPE on the patch tokens' q and k (the prefix tokens first are not
    rotated) and, with ``mask_k_bias``, the qkv bias multiplied by ``qkv.bias_mask`` (a
    persistent buffer, loaded from the checkpoint: the official ``LinearKMaskedBias``).

    ``rope`` is the model's shared :class:`RopeEmbedding` (held, not registered here: its
    ``periods`` are the model's ``rope_embed.periods``).
    """

    def __init__(self, dim: int, num_heads: int, rope: RopeEmbedding, mask_k_bias: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(dim, num_heads, None, **kwargs)
        if mask_k_bias and self.qkv.bias is not None:
            self.qkv.register_buffer('bias_mask', k_bias_mask(dim))
        self.rope_source: Tuple[RopeEmbedding] = (rope,)

    def qkv_heads(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        bias, mask = self.qkv.bias, getattr(self.qkv, 'bias_mask', None)
        if bias is not None and mask is not None:
            bias = bias * mask.to(bias.dtype)
        return self.split_qkv(F.linear(x, self.qkv.weight, bias))

    def forward(self, x: torch.Tensor, hw: Size2) -> torch.Tensor:
        q, k, v = self.qkv_heads(x)
        sin, cos = self.rope_source[0](hw)
        return self.attend(apply_rope(q, sin, cos), apply_rope(k, sin, cos), v)


ROPE_KEYS = frozenset({'base', 'min_period', 'max_period', 'normalize', 'shift_coords',
                       'jitter_coords', 'rescale_coords'})


def merge_rope(owner: str, preset: Any, given: Any) -> dict:
    """A RoPE arch's ``rope`` settings updated with ``given`` (the constructor's ``rope=``);
    an arch without RoPE, or unknown keys, raise."""
    if not preset:
        raise ConfigError(f'{owner}: rope={given!r} sets the RoPE of a RoPE arch (DINOv3); this '
                          f'arch has none')
    if not isinstance(given, dict) or set(given) - ROPE_KEYS:
        raise ConfigError(f'{owner}: rope must be a dict with keys among {sorted(ROPE_KEYS)}, '
                          f'got {given!r}')
    return {**(preset if isinstance(preset, dict) else {}), **given}


def build_rope(settings: dict, dim: int) -> Optional[RopeEmbedding]:
    """The shared RoPE of a preset / custom arch with a ``rope`` dict (``base``,
    ``min_period``, ``max_period``, ``normalize``, the training-time ``shift_coords``,
    ``jitter_coords``, ``rescale_coords``), else ``None``."""
    rope = settings.get('rope')
    if not rope:
        return None
    rope = dict(rope) if isinstance(rope, dict) else {}
    if set(rope) - ROPE_KEYS:
        raise ConfigError(f'arch rope has unknown keys {sorted(set(rope) - ROPE_KEYS)} (allowed: '
                          f'{sorted(ROPE_KEYS)})')
    periods = rope.get('min_period') is not None and rope.get('max_period') is not None
    rope.setdefault('base', None if periods else 100.0)
    return RopeEmbedding(dim // int(settings['num_heads']), **rope)


def rope_attention(dim: int, settings: dict, rope: RopeEmbedding, common: dict,
                   fused: bool) -> RopeAttention:
    """A DINOv3 block's attention (global only: the class and storage tokens attend with the
    patches in every block)."""
    return RopeAttention(dim, int(settings['num_heads']), rope,
                         mask_k_bias=bool(settings.get('mask_k_bias', False)),
                         qkv_bias=bool(settings.get('qkv_bias', True)),
                         attn_drop=common['attn_drop'], proj_drop=common['drop'], fused=fused)


def fit_qkv_bias(model: nn.Module, state_dict: StateDict) -> StateDict:
    """The qkv bias of a checkpoint computed as the official function by this model: a loaded
    ``bias_mask`` the model has no buffer for is folded into the bias; a bias-free file (timm's
    zero-bias DINOv3 weights) gives zero biases to a model with biases; a non-zero bias into a
    model without one cannot be computed: refused."""
    own = model.state_dict()
    out = dict(state_dict)
    weights = [k for k in out if k.endswith('.attn.qkv.weight')]
    bias_free = weights and not any(k.endswith('.attn.qkv.bias') for k in out)
    for weight_key in weights:
        bias_key, mask_key = weight_key[:-6] + 'bias', weight_key[:-6] + 'bias_mask'
        if bias_free and bias_key in own:
            out[bias_key] = out[weight_key].new_zeros(out[weight_key].shape[0])
        if mask_key in out and mask_key not in own and bias_key in out:
            out[bias_key] = out[bias_key] * out.pop(mask_key).to(out[bias_key].dtype)
        if bias_key in out and bias_key not in own:
            if out[bias_key].abs().max() > 0:
                raise CheckpointError(f'{bias_key}: the checkpoint has a non-zero qkv bias, the '
                                      f'model none (qkv_bias=False); use an arch with qkv_bias')
            del out[bias_key]
            out.pop(mask_key, None)
    return out


def infer_dinov3_arch(state_dict: StateDict, arch_zoo: dict) -> dict:
    """A RoPE trunk's arch and layout from our-layout weights: the head count from the periods
    (``head_dim / 4`` of them; without, the preset's of the same dims and depth, else 64
    channels per head), SwiGLU from ``fc1`` twice ``fc2``'s width."""
    dim, _, patch, _ = state_dict['patch_embed.proj.weight'].shape
    depth = len({k.split('.')[1] for k in state_dict if k.startswith('blocks.')})
    periods = state_dict.get('rope_embed.periods')
    heads = dim // (4 * periods.numel()) if periods is not None else next(
        (a['num_heads'] for a in arch_zoo.values()
         if a.get('rope') and (a['embed_dims'], a['depth']) == (dim, depth)), max(dim // 64, 1))
    hidden = state_dict['blocks.0.mlp.fc2.weight'].shape[1]
    swiglu = state_dict['blocks.0.mlp.fc1.weight'].shape[0] == 2 * hidden
    arch = dict(embed_dims=dim, depth=depth, patch_size=patch, norm_eps=1e-5, rope=dict(base=100.0),
                num_heads=heads,
                mlp_ratio=hidden * (1.5 if swiglu else 1) / dim, ffn='swiglu' if swiglu else 'mlp',
                mask_k_bias='blocks.0.attn.qkv.bias_mask' in state_dict,
                qkv_bias='blocks.0.attn.qkv.bias' in state_dict,
                untie_norms='cls_norm.weight' in state_dict)
    if 'blocks.0.ls1.gamma' in state_dict:
        arch['layer_scale'] = 1e-5
    if 'register_tokens' in state_dict:
        arch['reg_tokens'] = state_dict['register_tokens'].shape[1]
    return dict(arch=arch, out_type='cls_token', final_norm='norm.weight' in state_dict)


def normed_tokens(norm: nn.Module, cls_norm: Optional[nn.Module], tokens: torch.Tensor,
                  num_prefix: int) -> torch.Tensor:
    """The output norm: ``norm`` on every token, or (untied norms) ``cls_norm`` on the class and
    storage tokens and ``norm`` on the patch tokens, as the official
    ``get_intermediate_layers(norm=True)``."""
    if cls_norm is None:
        return norm(tokens)
    return torch.cat([cls_norm(tokens[:, :num_prefix]), norm(tokens[:, num_prefix:])], dim=1)

