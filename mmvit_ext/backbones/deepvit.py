"""DeepViT (Zhou et al., 2021): re-attention regenerates the attention maps of deep blocks by a
learnable mixing of heads, so that they stop collapsing to the same pattern."""
from functools import partial
from typing import Any, Union

from torch import nn

from ..layers import ConvStemEmbed, PatchEmbed, ReAttention
from ..registry import MODELS
from .plain_vit import PlainViTBase, ViTBlock, plain_attention

_base = dict(embed_dims=384, num_heads=12, mlp_ratio=3, conv_stem=None, transform_scale=False,
             scale_adjustment=1.0)


@MODELS.register_module()
class DeepViT(PlainViTBase):
    """DeepViT backbone on the plain-ViT trunk (see :class:`PlainViTBase` for the dense options).

    Args:
        arch: ``16b 24b 32b`` (patch 16, dim 384, all blocks re-attention), ``s`` (dim 396, 16
            blocks, re-attention in the last 5, conv stem), ``l`` (dim 420, 32 blocks, last 12);
            or a dict with ``embed_dims``, ``depth``, ``num_heads``, ``reattention_blocks``
            (how many of the last blocks use re-attention) and optional ``mlp_ratio``,
            ``conv_stem`` (stem channels), ``transform_scale``, ``scale_adjustment``.
    """

    family = 'deepvit'
    arch_zoo = {
        **dict.fromkeys(['16b', 'deepvit_16b', 'deepvit_patch16_224_re_attn_16b'],
                        dict(_base, depth=16, reattention_blocks=16)),
        **dict.fromkeys(['24b', 'deepvit_24b', 'deepvit_patch16_224_re_attn_24b'],
                        dict(_base, depth=24, reattention_blocks=24)),
        **dict.fromkeys(['32b', 'deepvit_32b', 'deepvit_patch16_224_re_attn_32b'],
                        dict(_base, depth=32, reattention_blocks=32)),
        **dict.fromkeys(['s', 'small', 'deepvit_s'],
                        dict(_base, embed_dims=396, depth=16, reattention_blocks=5,
                             conv_stem=(64, 64), transform_scale=True, scale_adjustment=0.5)),
        **dict.fromkeys(['l', 'large', 'deepvit_l'],
                        dict(_base, embed_dims=420, depth=32, reattention_blocks=12,
                             conv_stem=(64, 64), scale_adjustment=0.5)),
    }
    essential_keys = frozenset({'embed_dims', 'depth', 'num_heads', 'reattention_blocks'})
    optional_keys = frozenset({'mlp_ratio', 'conv_stem', 'transform_scale', 'scale_adjustment'})
    default_arch = 's'
    # Zhou et al. 2021 (params of DeepViT-S); the others are counted without a paper figure
    paper_figures = {'16b': (None, None), '24b': (None, None), '32b': (None, None),
                     's': (27, None), 'l': (None, None)}
    official_code = ('models.deep_vision_transformer',  # github.com/zhoudaquan/dvit_repo
                     {'16b': 'deepvit_patch16_224_re_attn_16b',
                      '24b': 'deepvit_patch16_224_re_attn_24b',
                      '32b': 'deepvit_patch16_224_re_attn_32b', 's': 'deepvit_S', 'l': 'deepvit_L'})

    def __init__(self, arch: Union[str, dict, None] = None, **kwargs: Any) -> None:
        super().__init__(arch, **kwargs)

    def validate_arch(self, settings: dict) -> None:
        if not 0 <= settings['reattention_blocks'] <= settings['depth']:
            raise ValueError(f'DeepViT: reattention_blocks={settings["reattention_blocks"]} must '
                             f'be between 0 and depth={settings["depth"]}')

    def build_patch_embed(self, settings: dict, in_channels: int) -> nn.Module:
        stem = settings.get('conv_stem')
        if stem:
            return ConvStemEmbed(in_channels, self.embed_dims, self.patch_size, tuple(stem))
        return PatchEmbed(in_channels, self.embed_dims, self.patch_size)

    def build_block(self, index: int, settings: dict, common: dict) -> nn.Module:
        dim, heads = self.embed_dims, settings['num_heads']
        transforms = []
        if index >= self.depth - settings['reattention_blocks']:
            scale = (dim // heads) ** -0.5 if settings.get('transform_scale', False) else 1.0
            transforms.append(ReAttention(heads, scale))
        attn = plain_attention(dim, heads, common, self.fused_attn, transforms)
        return ViTBlock(dim, attn, settings.get('mlp_ratio', 3), common['drop'],
                        common['drop_path'],
                        scale_adjustment=settings.get('scale_adjustment', 1.0),
                        norm_layer=partial(nn.LayerNorm, eps=1e-6))
