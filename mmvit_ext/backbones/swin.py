"""Swin Transformer (Liu et al., 2021): shifted-window attention, a 4-level pyramid.

Keys follow the official layout (``layers.{i}.blocks.{j}``, ``layers.{i}.downsample`` at the end
of stage i), so the converter only renames the bias table and the final norm.
"""
import math
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..layers import (DropPath, Mlp, PatchEmbed, Size2, WindowAttention, init_linear_and_norm,
                      linear_drop_path_rates, pad_to_multiple, resize_pos_embed,
                      tokens_to_map)
from ..registry import MODELS
from .base import AttentionBlock, BaseBackbone, ExportLimits
from .swin_peers import swin_peers
from .vocabulary import (GELU, LN_EPS, ConfigError, Vocabulary, cfg_check, equals, is_bool,
                         seq_equals, to_pair, translate)


def _stage_cfgs(value: Any, args: Dict[str, Any]) -> Optional[str]:
    """mmpretrain ``stage_cfgs``: only ``block_cfgs=dict(window_size=...)``, the same for all
    stages (it becomes ``window_size``)."""
    stages = value if isinstance(value, Sequence) else [value]
    windows = set()
    for stage in stages:
        blocks = dict(stage or {}).pop('block_cfgs', {}) or {}
        if set(dict(stage or {})) - {'block_cfgs'} or set(blocks) - {'window_size'}:
            return 'only stage_cfgs=dict(block_cfgs=dict(window_size=N)), the same for every stage'
        windows.add(blocks.get('window_size', args['window_size']))
    if len(windows) > 1:
        return 'one window_size for every stage'
    args['window_size'] = windows.pop()
    return None


def _patch_cfg(value: Any, args: Dict[str, Any]) -> Optional[str]:
    """mmpretrain ``patch_cfg``: accepted when it restates our non-overlapping patch embedding."""
    allowed = dict(kernel_size=args['patch_size'], stride=args['patch_size'], padding=0,
                   conv_type='Conv2d', norm_cfg=dict(type='LN'), input_size=args['pretrain_img_size'],
                   in_channels=args.get('in_channels', 3))
    bad = {k: v for k, v in dict(value or {}).items() if allowed.get(k, object()) != v}
    return f'only keys restating the patch embedding {allowed}' if bad else None


# mmdet / mmseg SwinTransformer and mmpretrain SwinTransformer names
SWIN_VOCABULARY = Vocabulary(
    renames={'img_size': 'pretrain_img_size'},
    arch_args={'embed_dims': 'embed_dims', 'depths': 'depths', 'num_heads': 'num_heads'},
    checks={
        'strides': seq_equals(lambda a: (a['patch_size'],) + (2,) * (len(a['_arch']['depths']) - 1),
                              'patch embedding stride = patch_size, then 2x2 merging'),
        'act_cfg': GELU,
        'norm_cfg': cfg_check(['LN'], LN_EPS, eps=1e-5),
        'convert_weights': is_bool,
        'interpolate_mode': equals('bicubic', "'bicubic'"),
        'out_after_downsample': equals(False, 'False (maps are taken before merging)'),
        'stage_cfgs': _stage_cfgs,
        'patch_cfg': _patch_cfg,
    })


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
        x = pad_to_multiple(x.view(b, h, w, c), (2, 2), channels_last=True)
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
            (``F.scaled_dot_product_attention``) where a fused kernel takes them (the repr
            names it per mode); ``False`` materialises maps for analysis hooks.
        patch_norm: LayerNorm after the patch embedding.
        pad_small_map: on a map shorter than the window, ``False`` shrinks the window to the map
            and drops the shift (official Swin), ``True`` zero-pads the map to the window and
            keeps the shift (mmdet / mmseg Swin, mmpretrain ``pad_small_map=True``). ``None``:
            ``True`` for peer mmdet / mmseg, else ``False``.
        out_indices: stages whose maps are returned; stages after the last one are not built.
            ``None``: all four, or ``(3,)`` for peer mmpretrain (its default).
        frozen_stages: -1 nothing; k the patch embedding and stages 0..k-1 (ours, mmdet /
            mmseg); for peer mmpretrain its count: k freezes stages 0..k.
        peer: whose semantics the three settings above follow: ``'mmdet'``, ``'mmseg'``,
            ``'mmpretrain'``, ``'mmvit_ext'`` (ours), or ``None``: the default scope the
            config is built in (docs/peer_semantics.md). With peer mmpretrain and
            ``pad_small_map=False``, maps smaller than the window are refused, as mmpretrain
            does.
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
    default_arch = 'tiny'
    essential_keys = frozenset({'embed_dims', 'depths', 'num_heads'})
    vocabulary = SWIN_VOCABULARY
    # Liu et al. 2021, Tab. 1
    paper_figures = {'tiny': (28, 4.5), 'small': (50, 8.7), 'base': (88, 15.4)}
    benchmark_peers = swin_peers  # mmdet's and timm's Swin holding our weights

    def __init__(self, arch: Union[str, dict, None] = None,
                 pretrain_img_size: Union[int, Sequence[int]] = 224, in_channels: int = 3,
                 patch_size: int = 4, window_size: int = 7, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, qk_scale: Optional[float] = None, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 use_abs_pos_embed: bool = False, patch_norm: bool = True,
                 out_indices: Optional[Sequence[int]] = None, frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, fused_attn: bool = True,
                 pad_small_map: Optional[bool] = None, peer: Optional[str] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None, **peer_args: Any) -> None:
        args, settings = translate(type(self), dict(
            arch=arch, pretrain_img_size=pretrain_img_size, window_size=window_size,
            patch_size=patch_size, init_cfg=init_cfg, peer=peer), peer_args)
        super().__init__(init_cfg=args['init_cfg'])
        pretrain_img_size, window_size = args['pretrain_img_size'], args['window_size']
        self.peer = args['peer']
        if self.peer == 'mmpretrain':  # its frozen_stages=k freezes stages 0..k
            out_indices = (3,) if out_indices is None else out_indices
            frozen_stages = frozen_stages + 1 if frozen_stages >= 0 else frozen_stages
        out_indices = (0, 1, 2, 3) if out_indices is None else out_indices
        # maps shorter than the window: the official Swin shrinks the window (and drops the shift),
        # mmdet / mmseg pad the map to the window, mmpretrain's pad_small_map=False refuses them
        if pad_small_map is not None and not isinstance(pad_small_map, bool):
            raise ConfigError(f'SwinTransformer: pad_small_map={pad_small_map!r} is not '
                              f'supported; we support True or False')
        if pad_small_map is None:
            pad_small_map = self.peer in ('mmdet', 'mmseg')
        self.pad_small_map = pad_small_map
        self.refuse_small_maps = self.peer == 'mmpretrain' and not self.pad_small_map
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
                                  f'mmpretrain refuses (peer={self.peer!r}); decrease '
                                  f'window_size, set pad_small_map=True, or peer=\'mmvit_ext\' '
                                  f'to shrink the window to the map as the official Swin does')

    # ---- family facts ----------------------------------------------------------------------
    @classmethod
    def infer_arch(cls, state_dict: Dict[str, torch.Tensor]) -> Optional[Dict[str, Any]]:
        """Dims, depths, heads and window read off the stages' first relative-position tables."""
        stages = sorted({int(k.split('.')[1]) for k in state_dict
                         if k.startswith('layers.') and k.split('.')[1].isdigit()})
        tables = [state_dict.get(f'layers.{i}.blocks.0.attn.rel_pos.relative_position_bias_table')
                  for i in stages]
        if not stages or any(t is None for t in tables) or 'patch_embed.proj.weight' not in \
                state_dict:
            return None
        depths = [len({k.split('.')[3] for k in state_dict if k.startswith(f'layers.{i}.blocks.')})
                  for i in stages]
        return dict(arch=dict(embed_dims=state_dict['patch_embed.proj.weight'].shape[0],
                              depths=depths, num_heads=[t.shape[1] for t in tables]),
                    window_size=(math.isqrt(tables[0].shape[0]) + 1) // 2,
                    use_abs_pos_embed='absolute_pos_embed' in state_dict)

    def export_limits(self) -> ExportLimits:
        """Shrinking windows (``pad_small_map=False``): the deepest built stage longer than one
        window keeps the window layout fixed."""
        limits = super().export_limits()
        if self.pad_small_map:
            return limits
        deepest = self.level_strides[len(self.layers) - 1]
        return ExportLimits(limits.min_size, deepest * self.window_size + 1)

    def peer_agreement_size(self, peer: str, size: Tuple[int, int]) -> Tuple[int, int]:
        """mmdet shifts windows even when a map fits in one window (the official classifier and
        we do not), so it agrees when the last map is larger than the window; timm rolls before
        it pads, so it agrees when no padding happens (every map a multiple of the window)."""
        if peer == 'mmdet':
            deepest = [s // 32 for s in size]
            ok = all(s % 32 == 0 for s in size) and min(deepest) > self.window_size
            return size if ok else (256, 256)
        ok = all(s % (32 * self.window_size) == 0 for s in size)
        return size if ok else (224, 224)

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
                outs.append(tokens_to_map(getattr(self, f'norm{i}')(x), hw))
            if stage.downsample is not None:
                x, hw = stage.downsample(x, hw)
        return tuple(outs)

    def adapt_state_dict(self, state_dict):
        state_dict, resized = super().adapt_state_dict(state_dict)
        if 'norm.weight' in state_dict and not any(re.match(r'norm\d', k) for k in state_dict):
            last = self.num_outputs - 1  # one final norm (mmpretrain's files before version 2)
            state_dict = {(f'norm{last}.' + k[5:] if k.startswith('norm.') else k): v
                          for k, v in state_dict.items()}
        pos = state_dict.get('absolute_pos_embed')
        if pos is not None and self.absolute_pos_embed is not None and pos.dim() == 3 \
                and pos.shape != self.absolute_pos_embed.shape:
            side = math.isqrt(pos.shape[1])
            state_dict['absolute_pos_embed'] = resize_pos_embed(pos, (side, side), self.abs_pos_grid)
            resized.append('absolute_pos_embed')
        return state_dict, resized
