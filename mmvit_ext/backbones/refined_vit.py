"""Refined-ViT (Zhou et al., 2021): the Refiner expands the attention heads, convolves every
expanded map locally (distributed local attention) and reduces them back; in the official models
every second block reuses the previous block's map through the Refiner instead of computing one."""
from functools import partial
from typing import Any, List, Optional, Tuple, Union

import torch
from torch import nn

from ..layers import (AttnBias, ConvStemEmbed, RefinerMap, Size2, WindowAttention,
                      attention_probs, final_map, map_attention)
from ..registry import MODELS
from .plain_vit import PlainViTBase, ViTBlock


class RefinerAttention(WindowAttention):
    """Refined-ViT attention over (B, H*W, C) tokens, inside windows or global; returns
    ``(out, map carried to the next block)``.

    A computing block (``shared=False``) is the shared qkv attention whose probabilities get
    ``scale`` times the map carried from the previous pair added (the official residual map
    connection); it carries its own map on. A shared block computes no map: it refines the carried one with
    :class:`~mmvit_ext.layers.RefinerMap`, applies it to its values
    (:func:`~mmvit_ext.layers.map_attention`) and carries the received map on unchanged (so both
    blocks of a pair must use the same windows).
    """

    def __init__(self, dim: int, num_heads: int, shared: bool, window_size: Optional[int] = None,
                 expand_ratio: float = 3, kernel_size: int = 3, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__(dim, num_heads, window_size, qkv_bias=qkv_bias, attn_drop=attn_drop,
                         proj_drop=proj_drop, fused=False)
        self.shared = shared
        if shared:  # values only: the map comes from the block before
            del self.qkv
            self.v = nn.Linear(dim, dim, bias=qkv_bias)
            self.refine = RefinerMap(num_heads, expand_ratio, kernel_size, scale=self.scale)

    def attend_carried(self, x: torch.Tensor, attn_bias: AttnBias,
                       prev_map: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Tokens (*batch, N, C) -> (output tokens, map carried on)."""
        *batch, n, _ = x.shape
        if self.shared:
            if prev_map is None or prev_map.shape[-1] != n or prev_map.shape[:-3] != tuple(batch):
                raise RuntimeError('RefinerAttention: a shared block needs the map of the block '
                                   'before it, over the same tokens/windows')
            v = self.v(x).reshape(*batch, n, self.num_heads, self.head_dim).transpose(-3, -2)
            out = map_attention(prev_map, v, self.dropout_p, (self.refine,), self.attn_map)
            return self.project(out), prev_map
        q, k, v = self.qkv_heads(x)
        maps_shape = (*batch, self.num_heads, n, n)
        carried = prev_map * self.scale \
            if prev_map is not None and prev_map.shape == maps_shape else None
        attn = attention_probs(q, k, self.scale, attn_bias, self.map_transforms)
        if carried is not None:
            attn = attn + carried
        attn = final_map(attn, self.map_transforms, self.attn_map)  # the map carried on
        return self.project(map_attention(attn, v, self.dropout_p)), attn

    def forward(self, x: torch.Tensor, hw: Size2, prev_map: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        windows, bias, geometry = self.to_windows(x, hw)
        out, carried = self.attend_carried(windows, bias, prev_map)
        return self.from_windows(out, geometry), carried


class RefinerBlock(ViTBlock):
    """A :class:`ViTBlock` whose attention also receives and carries on an attention map."""

    def forward(self, x: torch.Tensor, hw: Size2, prev_map: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        a = self.scale_adjustment
        out, attn_map = self.attn(self.norm1(self.scaled(x)), hw, prev_map)
        x = x + self.drop_path(self.ls1(out)) / a
        x = x + self.drop_path(self.ls2(self.mlp(self.norm2(self.scaled(x))))) / a
        return x, attn_map


@MODELS.register_module()
class RefinedViT(PlainViTBase):
    """Refined-ViT backbone on the plain-ViT trunk (see :class:`PlainViTBase` for dense options).

    Blocks alternate computing / shared (official ``[False, True] * n``); a shared block must use
    the same windows as the block before it, so by default the global blocks come in pairs.

    Args:
        arch: ``s m l`` (dim 384/420/512, depth 16/32/32, heads 12/12/16, MLP 3) or a dict with
            ``embed_dims``, ``depth``, ``num_heads`` and optional ``mlp_ratio``, ``expand_ratio``,
            ``kernel_size``, ``conv_stem``, ``scale_adjustment``, ``mlp_layer_scale``.
        recompute_maps: in training, recompute the Refiner's expanded maps in backward instead
            of keeping them (:class:`~mmvit_ext.layers.RefinerMap` ``recompute``); equal
            outputs and gradients, a fraction of the activation memory. It normalises with
            this process's batch only: a Refiner made SyncBatchNorm (mmengine ``sync_bn``) is
            refused in training with one line; use ``recompute_maps=False`` there. The
            Refiners count a batch in their running statistics once per training forward,
            whoever calls the blocks, also when ``with_cp`` recomputes them in backward. At
            inference (frozen norms) the Refiners run folded, a band of map rows at a time,
            never holding the expanded maps whole (:class:`~mmvit_ext.layers.RefinerMap`);
            nothing to set.
    """

    family = 'refiner'
    _base = dict(mlp_ratio=3, expand_ratio=3, kernel_size=3, conv_stem=(32, 64, 128),
                 scale_adjustment=0.5, mlp_layer_scale=1e-5)
    arch_zoo = {
        **dict.fromkeys(['s', 'small', 'refiner_vit_s'],
                        dict(_base, embed_dims=384, depth=16, num_heads=12)),
        **dict.fromkeys(['m', 'medium', 'refiner_vit_m'],
                        dict(_base, embed_dims=420, depth=32, num_heads=12)),
        **dict.fromkeys(['l', 'large', 'refiner_vit_l'],
                        dict(_base, embed_dims=512, depth=32, num_heads=16)),
    }
    del _base
    essential_keys = frozenset({'embed_dims', 'depth', 'num_heads'})
    optional_keys = frozenset({'mlp_ratio', 'expand_ratio', 'kernel_size', 'conv_stem',
                               'scale_adjustment', 'mlp_layer_scale'})
    default_arch = 's'
    paper_figures = {'s': (25, None), 'm': (55, None), 'l': (81, None)}  # Zhou et al. 2021
    official_code = ('models.refined_transformer',
                     {'s': 'Refiner_ViT_S', 'm': 'Refiner_ViT_M', 'l': 'Refiner_ViT_L'})

    def __init__(self, arch: Union[str, dict, None] = None, recompute_maps: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(arch, **kwargs)
        for module in self.modules():
            if isinstance(module, RefinerMap):
                module.recompute = recompute_maps
        for i in range(1, self.depth, 2):  # shared blocks reuse block i-1's map
            if (i in self.global_blocks) != (i - 1 in self.global_blocks):
                raise ValueError(f'RefinedViT: block {i} reuses the attention map of block {i - 1}, '
                                 f'so both must be global or both windowed; global_blocks='
                                 f'{self.global_blocks}')

    def default_global_blocks(self) -> List[int]:
        """Two computing/shared pairs: the middle one and the last one."""
        half = self.depth // 2 - self.depth // 2 % 2
        return sorted({half - 2, half - 1, self.depth - 2, self.depth - 1} & set(range(self.depth)))

    def build_patch_embed(self, settings: dict, in_channels: int) -> nn.Module:
        return ConvStemEmbed(in_channels, self.embed_dims, self.patch_size,
                             tuple(settings.get('conv_stem', (32, 64, 128))))

    def build_block(self, index: int, settings: dict, common: dict) -> nn.Module:
        dim, heads = self.embed_dims, settings['num_heads']
        attn = RefinerAttention(dim, heads, shared=index % 2 == 1,
                                window_size=common['window_size'],
                                expand_ratio=settings.get('expand_ratio', 3),
                                kernel_size=settings.get('kernel_size', 3),
                                attn_drop=common['attn_drop'], proj_drop=common['drop'])
        return RefinerBlock(dim, attn, settings.get('mlp_ratio', 3), common['drop'],
                            common['drop_path'],
                        mlp_layer_scale=settings.get('mlp_layer_scale', 1e-5),
                        scale_adjustment=settings.get('scale_adjustment', 0.5),
                        norm_layer=partial(nn.LayerNorm, eps=1e-6))

    def forward_blocks(self, tokens: torch.Tensor, hw: Size2
                       ) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """As the trunk's, with each block's attention map handed to the next block."""
        feats, attn_map = [], None
        for i, block in enumerate(self.blocks):
            tokens, attn_map = self.run_block(block, tokens, hw, attn_map)
            if i in self.out_indices:
                feats.append(self.output_tokens(i, tokens))
        return feats, tokens
