"""Swin Transformer (Liu et al., 2021): shifted-window attention, a 4-level pyramid.

Keys follow the official layout (``layers.{i}.blocks.{j}``, ``layers.{i}.downsample`` at the end
of stage i), so the converter only renames the bias table and the final norm.
"""
import math
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import (DropPath, Mlp, PatchEmbed, WindowAttention, init_linear_and_norm, known_zero,
                      linear_drop_path_rates, resize_pos_embed)
from ..registry import MODELS
from .base import AttentionBlock, BaseBackbone
from .vocabulary import ConfigError, to_pair, translate

Size2 = Tuple[int, int]


class SwinBlock(nn.Module):
    """(Shifted-)window attention block on tokens (B, H*W, C) of an H x W map."""

    def __init__(self, dim: int, num_heads: int, window_size: int = 7, shift: bool = False,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: Optional[float] = None,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 act_layer: Callable[[], nn.Module] = nn.GELU, fused_attn: bool = True,
                 pad_small_map: bool = False) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = WindowAttention(dim, num_heads, window_size, shift=shift, rel_pos=True,
                                    qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop,
                                    proj_drop=drop, fused=fused_attn, pad_small_map=pad_small_map)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(self, x: torch.Tensor, hw: Size2) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    """2x2 neighbourhood concat (official order) -> LayerNorm(4C) -> Linear(4C, out)."""

    def __init__(self, dim: int, out_dim: int,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.norm = norm_layer(4 * dim)
        self.reduction = nn.Linear(4 * dim, out_dim, bias=False)

    def forward(self, x: torch.Tensor, hw: Size2) -> Tuple[torch.Tensor, Size2]:
        b, _, c = x.shape
        h, w = hw
        x = x.view(b, h, w, c)
        if not known_zero((h % 2, w % 2)):  # no size branch under export
            x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        h2, w2 = x.shape[1] // 2, x.shape[2] // 2
        # (row parity, col parity) order (0,0), (1,0), (0,1), (1,1) as in the official model
        x = x.view(b, h2, 2, w2, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, h2 * w2, 4 * c)
        return self.reduction(self.norm(x)), (h2, w2)


class SwinStage(nn.Module):
    """``depth`` blocks alternating W-MSA / SW-MSA, then an optional patch merging."""

    def __init__(self, dim: int, depth: int, num_heads: int, drop_paths: Sequence[float],
                 downsample: bool, block_cfg: dict) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            SwinBlock(dim, num_heads, shift=j % 2 == 1, drop_path=drop_paths[j], **block_cfg)
            for j in range(depth))
        norm_layer = block_cfg.get('norm_layer', nn.LayerNorm)
        self.downsample = PatchMerging(dim, 2 * dim, norm_layer) if downsample else None


@MODELS.register_module()
class SwinTransformer(BaseBackbone):
    """Swin Transformer backbone: 4 NCHW maps at strides 4/8/16/32, a LayerNorm on each.

    Args:
        arch: ``tiny/small/base/large`` (aliases ``t/s/b/l``, ``swin_t`` ...), or a dict with
            ``embed_dims``, ``depths``, ``num_heads``; ``None``: tiny, or the peers' explicit
            ``embed_dims`` / ``depths`` / ``num_heads`` over tiny.
        pretrain_img_size: image size of pretraining (int or (H, W)); sets the absolute
            position grid. mmpretrain's ``img_size``.
        window_size: 7 (224 pretraining) or 12 (384); tables of other sizes are resized on load.
        use_abs_pos_embed: add an absolute position embedding (resized to every input).
        fused_attn: fused attention with bias and masks as an additive mask
            (``F.scaled_dot_product_attention``); ``False`` materialises maps for analysis
            hooks.
        patch_norm: LayerNorm after the patch embedding.
        pad_small_map: on a map shorter than the window, ``False`` shrinks the window to the map
            and drops the shift (official Swin), ``True`` zero-pads the map to the window and
            keeps the shift (mmdet / mmseg Swin, mmpretrain ``pad_small_map=True``). ``None``:
            ``True`` under mmdet / mmseg names (``embed_dims``, ``depths``, ``strides`` ...),
            else ``False``.
        out_indices: stages whose maps are returned; stages after the last one are not built.
            ``None``: all four, or ``(3,)`` with mmpretrain's names (its default).
        frozen_stages: -1 nothing; k the patch embedding and stages 0..k-1 (mmdet / mmseg).
            With mmpretrain's names (``img_size``, ``stage_cfgs`` ...) mmpretrain's count:
            k freezes stages 0..k.
        **peer_args: mmdet / mmseg / mmpretrain names (``embed_dims``, ``depths``,
            ``num_heads``, ``strides``, ``img_size``, ``pretrained``, ``act_cfg`` ...), mapped
            or validated by :mod:`mmvit_ext.backbones.vocabulary`.
    """

    family = 'swin'
    arch_zoo = {
        **dict.fromkeys(['t', 'tiny', 'swin_t', 'swin_tiny'],
                        dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))),
        **dict.fromkeys(['s', 'small', 'swin_s', 'swin_small'],
                        dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24))),
        **dict.fromkeys(['b', 'base', 'swin_b', 'swin_base'],
                        dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))),
        **dict.fromkeys(['l', 'large', 'swin_l', 'swin_large'],
                        dict(embed_dims=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48))),
    }
    essential_keys = frozenset({'embed_dims', 'depths', 'num_heads'})

    def __init__(self, arch: Union[str, dict, None] = None,
                 pretrain_img_size: Union[int, Sequence[int]] = 224, in_channels: int = 3,
                 patch_size: int = 4, window_size: int = 7, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, qk_scale: Optional[float] = None, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 use_abs_pos_embed: bool = False, patch_norm: bool = True,
                 out_indices: Optional[Sequence[int]] = None, frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, fused_attn: bool = True,
                 pad_small_map: Optional[bool] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None, **peer_args: Any) -> None:
        args, settings = translate('SwinTransformer', self.family, dict(
            arch=arch, pretrain_img_size=pretrain_img_size, window_size=window_size,
            patch_size=patch_size, init_cfg=init_cfg, pad_small_map=pad_small_map), peer_args,
            'tiny', self.resolve_arch)
        super().__init__(init_cfg=args['init_cfg'])
        pretrain_img_size, window_size = args['pretrain_img_size'], args['window_size']
        if args['_dialect'] == 'mmpretrain':  # its frozen_stages=k freezes stages 0..k
            out_indices = (3,) if out_indices is None else out_indices
            frozen_stages = frozen_stages + 1 if frozen_stages >= 0 else frozen_stages
        out_indices = (0, 1, 2, 3) if out_indices is None else out_indices
        # maps shorter than the window: the official Swin shrinks the window (and drops the shift),
        # mmdet / mmseg pad the map to the window (our default under their names), mmpretrain's
        # pad_small_map=False refuses them
        pad_small_map = args['pad_small_map']
        if pad_small_map is not None and not isinstance(pad_small_map, bool):
            raise ConfigError(f'SwinTransformer: pad_small_map={pad_small_map!r} is not '
                              f'supported; we support True or False')
        if pad_small_map is None:
            pad_small_map = args['_dialect'] == 'mmdet'
        self.pad_small_map = bool(pad_small_map)
        self.refuse_small_maps = args['_dialect'] == 'mmpretrain' and not self.pad_small_map
        self.arch_settings = settings
        embed_dims, depths, num_heads = (settings['embed_dims'], tuple(settings['depths']),
                                         tuple(settings['num_heads']))
        if len(depths) != len(num_heads):
            raise ConfigError(f'SwinTransformer: depths {depths} and num_heads {num_heads} must '
                              f'have one entry per stage')
        if not isinstance(window_size, int) or window_size <= 0:
            raise ConfigError(f'SwinTransformer: window_size must be a positive int, got '
                              f'{window_size!r}')
        if not isinstance(in_channels, int) or in_channels <= 0:
            raise ConfigError(f'SwinTransformer: in_channels must be a positive int, got '
                              f'{in_channels!r}')
        num_stages = len(depths)
        dims = [embed_dims * 2 ** i for i in range(num_stages)]
        self._set_contract(out_indices, dims, [patch_size * 2 ** i for i in range(num_stages)],
                           frozen_stages, num_stages, norm_eval, with_cp)
        self.in_channels = in_channels
        self.min_input_size = patch_size
        self.pretrain_img_size = to_pair('pretrain_img_size', 'SwinTransformer', pretrain_img_size)
        self.window_size = window_size
        norm_layer = nn.LayerNorm

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch_size,
                                      norm_layer=norm_layer if patch_norm else None)
        self.abs_pos_grid = tuple(s // patch_size for s in self.pretrain_img_size)
        self.absolute_pos_embed = nn.Parameter(
            torch.zeros(1, self.abs_pos_grid[0] * self.abs_pos_grid[1], embed_dims)
        ) if use_abs_pos_embed else None
        self.drop_after_pos = nn.Dropout(drop_rate) if drop_rate > 0 else nn.Identity()

        rates = linear_drop_path_rates(drop_path_rate, sum(depths))
        block_cfg = dict(window_size=window_size, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                         qk_scale=qk_scale, drop=drop_rate, attn_drop=attn_drop_rate,
                         norm_layer=norm_layer, fused_attn=fused_attn,
                         pad_small_map=self.pad_small_map)
        last = self.out_indices[-1]  # later stages would get no gradient: not built
        self.layers = nn.ModuleList()
        for i in range(last + 1):
            start = sum(depths[:i])
            self.layers.append(SwinStage(dims[i], depths[i], num_heads[i],
                                         rates[start:start + depths[i]], downsample=i < last,
                                         block_cfg=block_cfg))
        for i in self.out_indices:
            self.add_module(f'norm{i}', norm_layer(dims[i]))
        self.apply(init_linear_and_norm)
        if self.absolute_pos_embed is not None:
            nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        self._freeze_stages()

    @property
    def stages(self) -> nn.ModuleList:
        """mmpretrain's name for :attr:`layers`."""
        return self.layers

    def check_input(self, x: torch.Tensor) -> None:
        super().check_input(x)
        if not self.refuse_small_maps:
            return
        for stride in self.level_strides[:len(self.layers)]:
            hw = tuple(math.ceil(s / stride) for s in x.shape[2:])
            if min(hw) < self.window_size:
                raise ConfigError(f'SwinTransformer: the input shape {hw} at stride {stride} is '
                                  f'smaller than the window size ({self.window_size}), which '
                                  f'mmpretrain\'s names (img_size ...) refuse; decrease '
                                  f'window_size, or use our pretrain_img_size to shrink the '
                                  f'window to the map as the official Swin does')

    def unbuilt_prefixes(self) -> Tuple[str, ...]:
        last = self.out_indices[-1]
        return (*(f'layers.{i}.' for i in range(last + 1, self.num_outputs)),
                f'layers.{last}.downsample.',
                *(f'norm{i}.' for i in range(self.num_outputs) if i not in self.out_indices))

    def layer_depth_groups(self) -> List[Tuple[str, ...]]:
        """mmpretrain's Swin ids: one per block across stages; a stage's patch merging goes
        with its last block. Unlike mmpretrain, the absolute position embedding is layer 0."""
        groups: List[Tuple[str, ...]] = [('patch_embed', 'absolute_pos_embed')]
        for i, stage in enumerate(self.layers):
            groups += [(f'layers.{i}.blocks.{j}',) for j in range(len(stage.blocks))]
            groups[-1] += (f'layers.{i}.downsample',)
        return groups

    def attention_blocks(self) -> List[AttentionBlock]:
        return [AttentionBlock(block, block.attn, self.level_strides[i])
                for i, stage in enumerate(self.layers) for block in stage.blocks]

    def frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        modules: List[nn.Module] = [self.patch_embed, self.drop_after_pos]
        for i in range(min(self.frozen_stages, len(self.layers))):
            modules.append(self.layers[i])
            if i in self.out_indices:
                modules.append(getattr(self, f'norm{i}'))
        return modules

    def frozen_parameters(self) -> List[nn.Parameter]:
        return [self.absolute_pos_embed] if self.absolute_pos_embed is not None else []

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        x, hw = self.patch_embed(x)
        if self.absolute_pos_embed is not None:
            x = x + resize_pos_embed(self.absolute_pos_embed, self.abs_pos_grid, hw)
        x = self.drop_after_pos(x)
        outs = []
        for i, stage in enumerate(self.layers):
            for block in stage.blocks:
                x = self.run_block(block, x, hw)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(x)
                grid = out.view(out.shape[0], *hw, out.shape[-1])
                outs.append(grid.permute(0, 3, 1, 2).contiguous())
            if stage.downsample is not None:
                x, hw = stage.downsample(x, hw)
        return tuple(outs)

    def adapt_state_dict(self, state_dict):
        state_dict, resized = super().adapt_state_dict(state_dict)
        pos = state_dict.get('absolute_pos_embed')
        if pos is not None and self.absolute_pos_embed is not None and pos.dim() == 3 \
                and pos.shape != self.absolute_pos_embed.shape:
            side = math.isqrt(pos.shape[1])
            state_dict['absolute_pos_embed'] = resize_pos_embed(pos, (side, side), self.abs_pos_grid)
            resized.append('absolute_pos_embed')
        return state_dict, resized
