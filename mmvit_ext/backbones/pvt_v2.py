"""PVTv2 (Wang et al., 2022): overlapping patch embedding, spatial-reduction attention (or
linear SRA for ``b2_li``), convolutional FFN; a 4-level pyramid with a norm after every stage."""
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..layers import (ConvMlp, DropPath, PatchEmbed, Size2, SpatialReductionAttention,
                      init_linear_and_norm, linear_drop_path_rates, tokens_to_map)
from ..registry import MODELS
from .base import AttentionBlock, BaseBackbone
from .pvt_v2_peers import pvtv2_peers
from .vocabulary import (GELU, LN_EPS, Vocabulary, cfg_check, equals, is_bool, pair_check,
                         seq_equals, translate)


def _mmdet_dims(explicit: Dict[str, Any], settings: Dict[str, Any]) -> Dict[str, Any]:
    """mmdet's ``embed_dims`` is the first stage's width per head: stage i gets
    ``embed_dims * num_heads[i]``."""
    if isinstance(explicit.get('embed_dims'), int):
        heads = explicit.get('num_heads', settings['num_heads'])
        explicit = dict(explicit, embed_dims=tuple(explicit['embed_dims'] * h for h in heads))
    return explicit


_V2_EMBEDDING = 'PVTv2 overlapping embedding'
# mmdet PyramidVisionTransformerV2 (its PVT v1 options only with their v2 values)
PVTV2_VOCABULARY = Vocabulary(
    arch_args={'embed_dims': 'embed_dims', 'num_layers': 'depths', 'num_heads': 'num_heads',
               'mlp_ratios': 'mlp_ratios', 'sr_ratios': 'sr_ratios'},
    checks={
        'pretrain_img_size': pair_check,  # only sizes a pos-embed (PVTv2 has none)
        'num_stages': lambda v, a: None if v == len(a['_arch']['depths']) else
        f"len(num_layers) = {len(a['_arch']['depths'])}",
        'patch_sizes': seq_equals(lambda a: (7, 3, 3, 3), _V2_EMBEDDING),
        'strides': seq_equals(lambda a: (4, 2, 2, 2), _V2_EMBEDDING),
        'paddings': seq_equals(lambda a: (3, 1, 1, 1), _V2_EMBEDDING),
        'use_abs_pos_embed': equals(False, 'False (PVTv2 has no absolute position embedding)'),
        'norm_after_stage': equals(True, 'True (PVTv2 normalises after every stage)'),
        'use_conv_ffn': equals(True, 'True (PVTv2 conv FFN)'),
        'act_cfg': GELU,
        'norm_cfg': cfg_check(['LN'], LN_EPS, eps=1e-6),
        'convert_weights': is_bool,
    },
    adapt_arch=_mmdet_dims)


class PVTv2Block(nn.Module):
    """norm -> SRA -> residual; norm -> conv-FFN -> residual, on tokens of an H x W map."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, sr_ratio: int,
                 linear: bool = False, qkv_bias: bool = True, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 fused_attn: bool = True) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = SpatialReductionAttention(dim, num_heads, sr_ratio, linear=linear,
                                              qkv_bias=qkv_bias, attn_drop=attn_drop,
                                              proj_drop=drop, fused=fused_attn)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = ConvMlp(dim, int(dim * mlp_ratio), drop=drop, linear=linear)

    def forward(self, x: torch.Tensor, hw: Size2) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x), hw))


class PVTv2Stage(nn.Module):
    """Overlapping patch embedding, ``depth`` blocks, LayerNorm."""

    def __init__(self, in_dim: int, dim: int, depth: int, first: bool, drop_paths: Sequence[float],
                 norm_layer: Callable[[int], nn.Module], block_cfg: dict) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(in_dim, dim, patch_size=7 if first else 3,
                                      stride=4 if first else 2, norm_layer=nn.LayerNorm)
        self.blocks = nn.ModuleList(PVTv2Block(dim, drop_path=rate, norm_layer=norm_layer, **block_cfg)
                                    for rate in drop_paths)
        self.norm = norm_layer(dim)


@MODELS.register_module()
class PyramidVisionTransformerV2(BaseBackbone):
    """PVTv2 backbone: 4 NCHW maps at strides 4/8/16/32.

    Args:
        arch: ``b0 b1 b2 b2_li b3 b4 b5`` (aliases ``pvt_v2_b2`` ...) or a dict with
            ``embed_dims``, ``depths``, ``num_heads`` (optional ``mlp_ratios``, ``sr_ratios``,
            ``linear``); ``None``: b2, or mmdet's explicit ``embed_dims`` (first-stage width,
            stage i gets ``embed_dims * num_heads[i]``), ``num_layers``, ``num_heads``,
            ``mlp_ratios``, ``sr_ratios`` over b2.
        fused_attn: fused attention (``F.scaled_dot_product_attention``) where a fused kernel
            takes the call; ``False`` materialises maps for analysis hooks.
        out_indices: stages whose maps are returned; stages after the last one are not built.
        peer: accepted for every family (docs/peer_semantics.md); the peers agree on PVTv2.
        **peer_args: mmdet ``PyramidVisionTransformerV2`` names (``num_layers``, ``strides``,
            ``pretrained``, ``use_conv_ffn`` ...): :data:`PVTV2_VOCABULARY`.
    """

    family = 'pvtv2'
    _small = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4),
                  sr_ratios=(8, 4, 2, 1))
    arch_zoo = {
        **dict.fromkeys(['b0', 'pvt_v2_b0'], dict(_small, embed_dims=(32, 64, 160, 256),
                                                   depths=(2, 2, 2, 2))),
        **dict.fromkeys(['b1', 'pvt_v2_b1'], dict(_small, depths=(2, 2, 2, 2))),
        **dict.fromkeys(['b2', 'pvt_v2_b2'], dict(_small, depths=(3, 4, 6, 3))),
        **dict.fromkeys(['b2_li', 'b2-li', 'pvt_v2_b2_li'], dict(_small, depths=(3, 4, 6, 3),
                                                                 linear=True)),
        **dict.fromkeys(['b3', 'pvt_v2_b3'], dict(_small, depths=(3, 4, 18, 3))),
        **dict.fromkeys(['b4', 'pvt_v2_b4'], dict(_small, depths=(3, 8, 27, 3))),
        **dict.fromkeys(['b5', 'pvt_v2_b5'], dict(_small, depths=(3, 6, 40, 3),
                                                   mlp_ratios=(4, 4, 4, 4))),
    }
    del _small
    default_arch = 'b2'
    essential_keys = frozenset({'embed_dims', 'depths', 'num_heads'})
    optional_keys = frozenset({'mlp_ratios', 'sr_ratios', 'linear'})
    vocabulary = PVTV2_VOCABULARY
    # the official whai362/PVT model table
    paper_figures = {'b0': (3.7, 0.6), 'b1': (14.0, 2.1), 'b2': (25.4, 4.0),
                     'b2_li': (22.6, 3.9), 'b3': (45.2, 6.9), 'b4': (62.6, 10.1),
                     'b5': (82.0, 11.8)}
    benchmark_peers = pvtv2_peers  # mmdet's and timm's PVTv2 holding our weights

    def __init__(self, arch: Union[str, dict, None] = None, in_channels: int = 3,
                 qkv_bias: bool = True, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 fused_attn: bool = True, peer: Optional[str] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None, **peer_args: Any) -> None:
        args, settings = translate(type(self), dict(arch=arch, init_cfg=init_cfg, peer=peer),
                                   peer_args)
        super().__init__(init_cfg=args['init_cfg'])
        self.peer = args['peer']  # the peers agree on every PVTv2 setting
        self.arch_settings = settings
        dims, depths, heads = (tuple(settings[k]) for k in ('embed_dims', 'depths', 'num_heads'))
        num_stages = len(depths)
        mlp_ratios = tuple(settings.get('mlp_ratios', (8, 8, 4, 4)[:num_stages]))
        sr_ratios = tuple(settings.get('sr_ratios', (8, 4, 2, 1)[:num_stages]))
        linear = bool(settings.get('linear', False))
        for key, value in (('embed_dims', dims), ('num_heads', heads), ('mlp_ratios', mlp_ratios),
                           ('sr_ratios', sr_ratios)):
            if len(value) != num_stages:
                raise ValueError(f'PyramidVisionTransformerV2: arch {key} {value} must have one '
                                 f'entry per stage ({num_stages}, from depths {depths})')
        if not isinstance(in_channels, int) or in_channels <= 0:
            raise ValueError(f'PyramidVisionTransformerV2: in_channels must be a positive int, '
                             f'got {in_channels!r}')
        self._set_contract(out_indices, dims, [4 * 2 ** i for i in range(num_stages)],
                           frozen_stages, num_stages, norm_eval, with_cp)
        self.in_channels = in_channels
        self.min_input_size = 4
        self.linear = linear
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        rates = linear_drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i in range(self.out_indices[-1] + 1):  # later stages would get no gradient
            start = sum(depths[:i])
            block_cfg = dict(num_heads=heads[i], mlp_ratio=mlp_ratios[i], sr_ratio=sr_ratios[i],
                             linear=linear, qkv_bias=qkv_bias, drop=drop_rate,
                             attn_drop=attn_drop_rate, fused_attn=fused_attn)
            self.layers.append(PVTv2Stage(in_channels if i == 0 else dims[i - 1], dims[i],
                                          depths[i], i == 0, rates[start:start + depths[i]],
                                          norm_layer, block_cfg))
        self.apply(self._init_module)
        self._freeze_stages()

    @classmethod
    def infer_arch(cls, state_dict: Dict[str, torch.Tensor]) -> Optional[Dict[str, Any]]:
        """Dims, depths, MLP and SR ratios read off the weights; the heads do not shape them
        (one head per stage: the same parameters)."""
        stages = sorted({int(k.split('.')[1]) for k in state_dict
                         if k.startswith('layers.') and k.split('.')[1].isdigit()})
        if not stages or any(f'layers.{i}.patch_embed.proj.weight' not in state_dict
                             for i in stages):
            return None
        depths = [len({k.split('.')[3] for k in state_dict if k.startswith(f'layers.{i}.blocks.')})
                  for i in stages]
        dims = [state_dict[f'layers.{i}.patch_embed.proj.weight'].shape[0] for i in stages]
        sr = [state_dict.get(f'layers.{i}.blocks.0.attn.sr.weight') for i in stages]
        linear = all(w is not None and w.shape[-1] == 1 for w in sr)
        return dict(arch=dict(embed_dims=dims, depths=depths, num_heads=[1] * len(stages),
                              mlp_ratios=[state_dict[f'layers.{i}.blocks.0.mlp.fc1.weight'].shape[0]
                                          // d for i, d in zip(stages, dims)],
                              sr_ratios=[1 if w is None or linear else w.shape[-1] for w in sr],
                              linear=linear))

    @staticmethod
    def _init_module(module: nn.Module) -> None:
        init_linear_and_norm(module)
        if isinstance(module, nn.Conv2d):  # fan-out normal, as in the official model
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
            nn.init.normal_(module.weight, 0, (2.0 / (fan_out // module.groups)) ** 0.5)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def unbuilt_prefixes(self) -> Tuple[str, ...]:
        return tuple(f'layers.{i}.' for i in range(len(self.layers), self.num_outputs))

    def layer_depth_groups(self) -> List[Tuple[str, ...]]:
        """One id per block across stages, as Swin's: the first patch embedding is layer 0; a
        stage's norm and the next stage's patch embedding (its downsampling, Swin's patch
        merging) go with the stage's last block."""
        groups: List[Tuple[str, ...]] = [('layers.0.patch_embed',)]
        for i, stage in enumerate(self.layers):
            groups += [(f'layers.{i}.blocks.{j}',) for j in range(len(stage.blocks))]
            groups[-1] += (f'layers.{i}.norm', f'layers.{i + 1}.patch_embed')
        return groups

    def frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        return [self.layers[0].patch_embed, *self.layers[:self.frozen_stages]]

    def attention_blocks(self) -> List[AttentionBlock]:
        return [AttentionBlock(block, block.attn, self.level_strides[i])
                for i, stage in enumerate(self.layers) for block in stage.blocks]

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        outs = []
        for i, stage in enumerate(self.layers):
            tokens, hw = stage.patch_embed(x)
            for block in stage.blocks:
                tokens = self.run_block(block, tokens, hw)
            x = tokens_to_map(stage.norm(tokens), hw)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)
