"""CaiT (Touvron et al., 2021): LayerScale on every residual branch, talking-heads attention in
the trunk, and class-attention blocks that read the class token out of the frozen patch tokens."""
import math
from functools import partial
from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

from ..layers import (POST_SOFTMAX, PRE_SOFTMAX, AttentionBase, DropPath, LayerScale, Mlp, norm_mlp,
                      PatchEmbed, TalkingHeads)
from ..registry import MODELS
from .plain_vit import PlainViTBase, ViTBlock, plain_attention


class ClassAttention(AttentionBase):
    """CaiT class attention: the class token (B, 1, C) attends to [class token, patch tokens]."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, fused: bool = True) -> None:
        super().__init__(dim, num_heads, None, attn_drop, proj_drop, (), fused)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q(x[:, :1]).reshape(b, 1, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        return self.attend(q, k, v)


class ClassAttentionBlock(nn.Module):
    """``cls += ls1(class_attn(norm1([cls, x])))``; ``cls += ls2(mlp(norm2(cls)))``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, layer_scale: float,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 fused_attn: bool = True) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ClassAttention(dim, num_heads, attn_drop=attn_drop, proj_drop=drop,
                                   fused=fused_attn)
        self.ls1 = LayerScale(dim, layer_scale)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.ls2 = LayerScale(dim, layer_scale)

    def forward(self, cls: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        joint = torch.cat([cls, tokens], dim=1)
        cls = cls + self.drop_path(self.ls1(self.attn(self.norm1(joint))))
        return cls + self.drop_path(self.ls2(norm_mlp(cls, self.norm2, self.mlp)))


def _cait(dim: int, depth: int, heads: int, layer_scale: float) -> dict:
    return dict(embed_dims=dim, depth=depth, num_heads=heads, mlp_ratio=4, layer_scale=layer_scale,
                cls_depth=2)


@MODELS.register_module()
class CaiT(PlainViTBase):
    """CaiT backbone on the plain-ViT trunk (see :class:`PlainViTBase` for the dense options).

    The position embedding has no class-token slot and the class token only enters the two
    class-attention blocks, which exist with ``out_type='cls_token'`` (the classifier).

    Args:
        arch: ``xxs24 xxs36 xs24 s24 s36 m36 m48`` (aliases ``cait_s24`` ...) or a dict with
            ``embed_dims``, ``depth``, ``num_heads`` and optional ``mlp_ratio``, ``layer_scale``
            (LayerScale init), ``cls_depth`` (class-attention blocks).
        drop_path_rate: the same rate in every trunk block, as in the official model.
    """

    family = 'cait'
    num_prefix_tokens = 0
    arch_zoo = {
        **dict.fromkeys(['xxs24', 'cait_xxs24'], _cait(192, 24, 4, 1e-5)),
        **dict.fromkeys(['xxs36', 'cait_xxs36'], _cait(192, 36, 4, 1e-5)),
        **dict.fromkeys(['xs24', 'cait_xs24'], _cait(288, 24, 6, 1e-5)),
        **dict.fromkeys(['s24', 'cait_s24'], _cait(384, 24, 8, 1e-5)),
        **dict.fromkeys(['s36', 'cait_s36'], _cait(384, 36, 8, 1e-6)),
        **dict.fromkeys(['m36', 'cait_m36'], _cait(768, 36, 16, 1e-6)),
        **dict.fromkeys(['m48', 'cait_m48'], _cait(768, 48, 16, 1e-6)),
    }
    essential_keys = frozenset({'embed_dims', 'depth', 'num_heads'})
    optional_keys = frozenset({'mlp_ratio', 'layer_scale', 'cls_depth'})
    default_arch = 's24'
    # Touvron et al. 2021, Tab. 3 (S36 counted at 224)
    paper_figures = {'xxs24': (12.0, 2.5), 'xxs36': (17.3, 3.8), 'xs24': (26.6, 5.4),
                     's24': (46.9, 9.4), 's36': (68.2, 13.9), 'm36': (270.1, 53.7),
                     'm48': (356.5, 71.5)}

    def __init__(self, arch: Union[str, dict, None] = None, **kwargs: Any) -> None:
        super().__init__(arch, **kwargs)

    @classmethod
    def infer_arch(cls, state_dict: Dict[str, torch.Tensor]) -> Optional[Dict[str, Any]]:
        """Dims, depths, heads (the talking-heads projection) and the position grid."""
        needed = ('patch_embed.proj.weight', 'blocks.0.attn.map_transforms.0.proj.weight',
                  'blocks.0.mlp.fc1.weight', 'pos_embed')
        if any(k not in state_dict for k in needed):
            return None
        dim = state_dict['patch_embed.proj.weight'].shape[0]
        arch = dict(embed_dims=dim,
                    depth=len({k.split('.')[1] for k in state_dict if k.startswith('blocks.')}),
                    num_heads=state_dict['blocks.0.attn.map_transforms.0.proj.weight'].shape[0],
                    mlp_ratio=state_dict['blocks.0.mlp.fc1.weight'].shape[0] // dim,
                    cls_depth=len({k.split('.')[1] for k in state_dict
                                   if k.startswith('cls_blocks.')}))
        side = math.isqrt(state_dict['pos_embed'].shape[1])
        return dict(arch=arch, img_size=cls.default_patch_size * side,
                    out_type='cls_token' if 'cls_token' in state_dict else 'featmap')

    @staticmethod
    def drop_path_rates(drop_path_rate: float, depth: int) -> List[float]:
        if not 0.0 <= drop_path_rate < 1.0:
            raise ValueError(f'drop_path_rate must be in [0, 1), got {drop_path_rate}')
        return [drop_path_rate] * depth

    def build_patch_embed(self, settings: dict, in_channels: int) -> nn.Module:
        return PatchEmbed(in_channels, self.embed_dims, self.patch_size)

    def build_block(self, index: int, settings: dict, common: dict) -> nn.Module:
        dim, heads = self.embed_dims, settings['num_heads']
        talking_heads = [TalkingHeads(heads, PRE_SOFTMAX), TalkingHeads(heads, POST_SOFTMAX)]
        attn = plain_attention(dim, heads, common, self.fused_attn, talking_heads)
        layer_scale = settings.get('layer_scale', 1e-5)
        return ViTBlock(dim, attn, settings.get('mlp_ratio', 4), common['drop'],
                        common['drop_path'], layer_scale=layer_scale,
                        mlp_layer_scale=layer_scale, norm_layer=partial(nn.LayerNorm, eps=1e-6))

    def build_cls_head(self, settings: dict, drop: float, attn_drop: float,
                       drop_path: float) -> Optional[nn.ModuleList]:
        return nn.ModuleList(
            ClassAttentionBlock(self.embed_dims, settings['num_heads'],
                                settings.get('mlp_ratio', 4), settings.get('layer_scale', 1e-5),
                                fused_attn=self.fused_attn)
            for _ in range(settings.get('cls_depth', 2)))
