"""The plain-ViT trunk shared by DeepViT, CaiT and Refined-ViT, made a dense-prediction backbone.

A family subclass only says how to build its patch embedding and its blocks (which attention,
which map transforms, LayerScale, residual scaling). This base adds what detection and
segmentation need: any input size (position embeddings resized to the token grid), window
attention in most blocks with global attention in a few (ViTDet), and a simple feature pyramid
that turns the stride-16 tokens into four maps at strides 4/8/16/32. With ``out_type='cls_token'``
the model is the official classifier trunk (class token, global attention everywhere) and returns
the normalised class token, for mmpretrain classifiers and parity checks.
"""
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..converters.layouts import StateDict
from ..layers import (DropPath, LayerScale, MapTransform, Mlp, Size2, WindowAttention,
                      init_linear_and_norm, linear_drop_path_rates, resize_pos_embed,
                      tokens_to_map)
from ..layers.pyramid import PYRAMID_SCALES, SimplePyramid, level_sizes, pyramid_channels
from ..layers.window import WINDOW_PADDINGS
from .base import AttentionBlock, BaseBackbone
from .vocabulary import (GELU, LN_EPS, Check, ConfigError, Vocabulary, cfg_check, equals, to_pair,
                         translate)
OUT_TYPES = ('featmap', 'cls_token')


def _bool(value: Any, args: Dict[str, Any]) -> Optional[str]:
    return None if isinstance(value, bool) else 'True or False'


_MMSEG_VIT_CHECKS: Dict[str, Check] = {
    'patch_size': equals(16, '16 (the pretrained patch size)'),
    'qkv_bias': equals(True, 'True'),
    'with_cls_token': _bool,
    'output_cls_token': equals(False, "False (out_type='cls_token' returns the class token)"),
    'final_norm': _bool,
    'act_cfg': GELU,
    'norm_cfg': cfg_check(['LN'], LN_EPS, eps=1e-6),
    'patch_norm': equals(False, 'False'),
    'patch_bias': equals(True, 'True (the official patch embedding has a bias)'),
    'patch_pad': equals('corner', "'corner' (bottom / right zero padding)"),
    'pre_norm': equals(False, 'False'),
    'num_fcs': equals(2, '2'),
    'out_origin': equals(False, 'False'),
    'interpolate_mode': equals('bicubic', "'bicubic'"),
    'frozen_exclude': equals(['all'], "['all'] (freeze with frozen_stages)"),
}
# mmseg VisionTransformer names, for every plain-ViT family
MMSEG_VIT_VOCABULARY = Vocabulary(
    arch_args={'embed_dims': 'embed_dims', 'num_layers': 'depth', 'num_heads': 'num_heads',
               'mlp_ratio': 'mlp_ratio'},
    checks=_MMSEG_VIT_CHECKS)


class ViTBlock(nn.Module):
    """Pre-norm transformer block on (B, N, C) tokens of an H x W map.

    ``x + drop_path(ls1(attn(norm1(x * a), hw))) / a``, then the same with the MLP; ``a`` is the
    official DeepViT / Refiner ``scale_adjustment`` (1 elsewhere). The attention takes the
    tokens and their grid (a :class:`~mmvit_ext.layers.WindowAttention` windows them).

    Args:
        dim: token channels.
        attn: the attention module, built by the family.
        mlp_ratio: MLP hidden width over ``dim``.
        mlp: the feed-forward module, built by the family (``None``: an :class:`Mlp` of
            ``mlp_ratio``).
        layer_scale / mlp_layer_scale: LayerScale init on the two branches (``None``: none).
        scale_adjustment: ``a`` above.
    """

    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float = 4.0, drop: float = 0.0,
                 drop_path: float = 0.0, layer_scale: Optional[float] = None,
                 mlp_layer_scale: Optional[float] = None, scale_adjustment: float = 1.0,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 act_layer: Callable[[], nn.Module] = nn.GELU,
                 mlp: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.scale_adjustment = scale_adjustment
        self.norm1 = norm_layer(dim)
        self.attn = attn
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop) \
            if mlp is None else mlp
        self.ls2 = LayerScale(dim, mlp_layer_scale) if mlp_layer_scale else nn.Identity()

    def scaled(self, x: torch.Tensor) -> torch.Tensor:
        a = self.scale_adjustment
        return x * a if a != 1 else x

    def forward(self, x: torch.Tensor, hw: Size2) -> torch.Tensor:
        a = self.scale_adjustment
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(self.scaled(x)), hw))) / a
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(self.scaled(x))))) / a


class PlainViTBase(BaseBackbone):
    """Contract, windows, pyramid and position embeddings for the plain-ViT families.

    Subclasses set ``family``, ``arch_zoo``, the key sets, ``num_prefix_tokens`` (class-token
    slots in the official ``pos_embed``) and implement :meth:`build_patch_embed` and
    :meth:`build_block`; CaiT adds class-attention blocks through :meth:`build_cls_head`.

    Args:
        arch: preset name / alias, or a dict with the family's keys; ``None``: the family's
            default preset, under mmseg's ``embed_dims`` / ``num_layers`` / ``num_heads`` /
            ``mlp_ratio`` if given.
        img_size: pretraining image size, int or (H, W); the position-embedding grid is
            ``img_size / patch``.
        out_type: ``'featmap'`` (dense NCHW maps) or ``'cls_token'`` (the classifier trunk: one
            (B, C) tensor, the normalised class token).
        out_indices: block indices whose tokens are output (negative from the end). With the
            pyramid, one index gives all four levels from that block (ViTDet), four indices one
            level each (BEiT / mmseg multi-level).
        simple_pyramid: resample to strides 4/8/16/32; off: stride-16 maps, one per index.
            ``None``: on, off for peer mmseg (its stride-16 outputs).
        window_size: window side in tokens for the windowed blocks; ``None`` for global attention
            everywhere (as the classifiers are pretrained); ``'auto'``: 14 (the pretraining
            grid), ``None`` for peer mmseg.
        global_blocks: blocks that keep global attention when windows are on; ``None`` picks
            four evenly spaced blocks (the family may adjust them).
        window_padding: how a token grid that is no multiple of the window is padded
            (:class:`~mmvit_ext.layers.WindowAttention` ``padding``): ``'tokens'`` (default,
            detectron2's ViTDet: zero tokens before the qkv projection) or ``'qkv'`` (the
            official ViT-Adapter's ``WindowedAttention``: q, k, v zero-padded after the
            projection, padded keys unmasked); ``'qkv'`` not with decomposed relative positions.
            Either way a grid smaller than the window is padded to one whole window, as every
            windowed-ViT peer does (detectron2, mmpretrain ``ViTSAM``, timm's SAM ViT).
        frozen_stages: -1 none; 0 the patch embedding and position embedding; k > 0 also the
            first k blocks.
        fused_attn: use a fused SDPA kernel in blocks without map transforms, where one takes
            the call.
        peer: ``'mmseg'`` gives mmseg ``VisionTransformer``'s defaults: the class token in the
            trunk (``with_cls_token=True`` where the family has one), global attention,
            stride-16 maps, no final norm (``final_norm=False``); ``'mmdet'``,
            ``'mmpretrain'``, ``'mmvit_ext'``: ours. ``None``: the default scope the config is
            built in (docs/peer_semantics.md).
        **peer_args: mmseg ``VisionTransformer`` names (``with_cls_token``, ``final_norm``,
            ``num_layers``, ``pretrained`` ...): :data:`MMSEG_VIT_VOCABULARY`; see
            :meth:`check_cls_token`.
    """

    num_prefix_tokens = 1
    default_patch_size = 16
    interpolate_mode = 'bicubic'  # position-embedding resizing, at run time and on load
    vocabulary = MMSEG_VIT_VOCABULARY

    def __init__(self, arch: Union[str, dict, None] = None,
                 img_size: Union[int, Sequence[int]] = 224, in_channels: int = 3,
                 out_type: str = 'featmap', out_indices: Union[int, Sequence[int]] = (-1,),
                 simple_pyramid: Optional[bool] = None,
                 window_size: Union[int, str, None] = 'auto',
                 global_blocks: Optional[Sequence[int]] = None, window_padding: str = 'tokens',
                 drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 fused_attn: bool = True, peer: Optional[str] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None, **peer_args: Any) -> None:
        name = type(self).__name__
        args, settings = translate(type(self), dict(arch=arch, init_cfg=init_cfg, peer=peer),
                                   peer_args)
        super().__init__(init_cfg=args['init_cfg'])
        self.peer = args['peer']
        self.validate_arch(settings)
        self.arch_settings = settings
        dim, depth = int(settings['embed_dims']), int(settings['depth'])
        if out_type not in OUT_TYPES:
            raise ValueError(f'{name}: out_type must be one of {OUT_TYPES}, got {out_type!r}')
        if not isinstance(in_channels, int) or in_channels <= 0:
            raise ValueError(f'{name}: in_channels must be a positive int, got {in_channels!r}')
        patch = int(settings.get('patch_size', self.default_patch_size))
        img_hw = to_pair('img_size', name, img_size)
        if min(img_hw) < patch or img_hw[0] % patch or img_hw[1] % patch:
            raise ValueError(f'{name}: img_size must be a positive multiple of the patch size '
                             f'{patch}, got {img_size!r}')
        # peer mmseg: VisionTransformer's defaults (class token in the trunk, global attention,
        # stride-16 maps, no final norm) unless given
        mmseg = self.peer == 'mmseg'
        with_cls_token = bool(peer_args.get('with_cls_token', mmseg and self.num_prefix_tokens))
        final_norm = bool(peer_args.get('final_norm', not mmseg))
        window_size = (None if mmseg else 14) if window_size == 'auto' else window_size
        simple_pyramid = (not mmseg) if simple_pyramid is None else simple_pyramid
        self.check_cls_token(with_cls_token, window_size, final_norm, out_type)
        self.embed_dims, self.depth, self.patch_size = dim, depth, patch
        self.out_type = out_type
        self.in_channels = in_channels
        self.min_input_size = patch
        self.fused_attn = fused_attn
        classify = out_type == 'cls_token'
        if classify:
            window_size, simple_pyramid, out_indices = None, False, (-1,)
        self.window_size = self._check_window(window_size)
        self.global_blocks = self._resolve_global_blocks(global_blocks)
        self.simple_pyramid = simple_pyramid
        self._set_contract(out_indices, [dim] * depth, [patch] * depth, frozen_stages, depth,
                           norm_eval, with_cp)
        if simple_pyramid:
            if len(self.out_indices) not in (1, len(PYRAMID_SCALES)):
                raise ValueError(f'{name}: with simple_pyramid=True, out_indices must name 1 block '
                                 f'(ViTDet) or {len(PYRAMID_SCALES)} blocks (one per level), got '
                                 f'{tuple(out_indices)}; or set simple_pyramid=False')
            if patch != 16:
                raise ValueError(f'{name}: the simple pyramid expects patch 16, got {patch}')

        self.grid_size = (img_hw[0] // patch, img_hw[1] // patch)
        self.patch_embed = self.build_patch_embed(settings, in_channels)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + math.prod(
            self.grid_size), dim)) if self.absolute_positions(settings) else None
        self.pos_drop = nn.Dropout(drop_rate) if drop_rate > 0 else nn.Identity()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) \
            if classify or with_cls_token else None
        rates = self.drop_path_rates(drop_path_rate, depth)
        built = depth if classify else self.out_indices[-1] + 1  # later blocks: no gradient
        self.blocks = nn.ModuleList(
            self.build_block(i, settings, dict(
                drop=drop_rate, attn_drop=attn_drop_rate, drop_path=rates[i],
                window_size=None if i in self.global_blocks else self.window_size))
            for i in range(built))
        self._set_window_padding(window_padding)
        self.cls_blocks = self.build_cls_head(settings, drop_rate, attn_drop_rate,
                                              drop_path_rate) if classify else None
        # the final norm acts on the last block's tokens only
        self.norm = nn.LayerNorm(dim, eps=1e-6) \
            if classify or (built == depth and final_norm) else None
        self.pyramid = SimplePyramid(dim) if simple_pyramid else None
        self.init_parameters()
        self._freeze_stages()

    # ---- family facts ------------------------------------------------------------------------
    @classmethod
    def classifier_settings(cls) -> Dict[str, Any]:
        return dict(out_type='cls_token')

    # ---- family hooks ------------------------------------------------------------------------
    def build_patch_embed(self, settings: dict, in_channels: int) -> nn.Module:
        raise NotImplementedError

    def build_block(self, index: int, settings: dict, common: dict) -> nn.Module:
        """Block ``index``, called as ``block(tokens, hw)``; ``common`` holds drop, attn_drop,
        drop_path and window_size (``None`` for a global block)."""
        raise NotImplementedError

    def build_cls_head(self, settings: dict, drop: float, attn_drop: float,
                       drop_path: float) -> Optional[nn.ModuleList]:
        """Blocks that produce the class token after the trunk (CaiT); ``None``: the class token
        runs through the trunk."""
        return None

    def absolute_positions(self, settings: dict) -> bool:
        """Whether the trunk adds a learned position embedding (``pos_embed``); ``False`` for
        trunks that encode positions in the attention (RoPE)."""
        return True

    @staticmethod
    def drop_path_rates(drop_path_rate: float, depth: int) -> List[float]:
        return linear_drop_path_rates(drop_path_rate, depth)

    def default_global_blocks(self) -> List[int]:
        """Four evenly spaced blocks, the last of each quarter (ViTDet: 2, 5, 8, 11 of 12)."""
        return sorted({(i + 1) * self.depth // 4 - 1 for i in range(4)} - {-1})

    # ---- arguments ---------------------------------------------------------------------------
    def validate_arch(self, settings: dict) -> None:
        """Family checks of the resolved arch (after the peers' names are applied)."""

    def check_cls_token(self, with_cls_token: bool, window_size: Optional[int],
                        final_norm: bool, out_type: str) -> None:
        """mmseg's ``with_cls_token=True``: the class token runs through every block as in the
        official models, so every block must attend globally (a class token belongs to no
        window); ``final_norm=False`` has no final norm, which the classifier needs."""
        name = type(self).__name__
        if with_cls_token and not self.num_prefix_tokens:
            raise ConfigError(f'{name}: with_cls_token=True is not supported; the class token '
                              f'of {name} only enters its class-attention blocks '
                              f"(out_type='cls_token'); use with_cls_token=False")
        if with_cls_token and window_size is not None:
            raise ConfigError(f'{name}: with_cls_token=True with window_size={window_size} is not '
                              f'supported; the class token attends globally in every block, '
                              f'so use window_size=None (or with_cls_token=False for windows)')
        if not final_norm and out_type == 'cls_token':
            raise ConfigError(f"{name}: final_norm=False is not supported with "
                              f"out_type='cls_token' (the class token is normalised)")

    def _check_window(self, window_size: Optional[int]) -> Optional[int]:
        if window_size is None:
            return None
        if not isinstance(window_size, int) or isinstance(window_size, bool) or window_size <= 0:
            raise ValueError(f'{type(self).__name__}: window_size must be a positive int (tokens '
                             f'per window side) or None for global attention, got {window_size!r}')
        return window_size

    def _set_window_padding(self, window_padding: str) -> None:
        """Give every windowed attention of the trunk ``window_padding`` and whole windows on
        grids smaller than the window (once, at build)."""
        name = type(self).__name__
        if window_padding not in WINDOW_PADDINGS:
            raise ConfigError(f'{name}: window_padding must be one of {WINDOW_PADDINGS}, got '
                              f'{window_padding!r}')
        if window_padding == 'qkv' and getattr(self, 'use_rel_pos', False):
            raise ConfigError(f"{name}: window_padding='qkv' does not support use_rel_pos=True "
                              f"(ViTDet's relative positions come with window_padding='tokens')")
        self.window_padding = window_padding
        for block in self.blocks:
            attn = getattr(block, 'attn', None)
            if isinstance(attn, WindowAttention) and attn.window_size is not None:
                attn.set_padding(window_padding)
                attn.pad_small_map = True  # a grid smaller than the window: one padded window

    def _resolve_global_blocks(self, global_blocks: Optional[Sequence[int]]) -> Tuple[int, ...]:
        if self.window_size is None:
            return tuple(range(self.depth))
        if global_blocks is None:
            return tuple(self.default_global_blocks())
        resolved = []
        for index in global_blocks:
            if not isinstance(index, int) or not -self.depth <= index < self.depth:
                raise ValueError(f'{type(self).__name__}: global_blocks entry {index!r} is not a '
                                 f'block index; valid: 0..{self.depth - 1} (or negative)')
            resolved.append(index % self.depth)
        return tuple(sorted(set(resolved)))

    # ---- weights -----------------------------------------------------------------------------
    def init_parameters(self) -> None:
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.apply(init_linear_and_norm)

    def adapt_state_dict(self, state_dict: StateDict) -> Tuple[StateDict, List[str]]:
        """Resize a checkpoint's position embedding from its grid to ours."""
        state_dict, resized = super().adapt_state_dict(state_dict)
        value = state_dict.get('pos_embed')
        prefix = self.num_prefix_tokens
        if value is not None and self.pos_embed is not None \
                and value.shape != self.pos_embed.shape:
            side = math.isqrt(value.shape[1] - prefix)
            if side * side == value.shape[1] - prefix and value.shape[-1] == self.embed_dims:
                state_dict['pos_embed'] = resize_pos_embed(value, (side, side), self.grid_size,
                                                           prefix, self.interpolate_mode)
                resized.append('pos_embed')
        return state_dict, resized

    def unbuilt_prefixes(self) -> Tuple[str, ...]:
        """Blocks after the last output and the norm they would feed; classifier-only keys
        (class token, class-attention blocks) when dense."""
        prefixes = tuple(f'blocks.{i}.' for i in range(len(self.blocks), self.depth))
        if self.norm is None:
            prefixes += ('norm.',)
        if self.cls_token is None:
            prefixes += ('cls_token',)
        if self.cls_blocks is None:
            prefixes += ('cls_blocks.',)
        return prefixes

    def output_spec(self) -> List[Tuple[int, Optional[int]]]:
        if self.out_type == 'cls_token':
            return [(self.embed_dims, None)]  # one (B, C) vector
        if self.pyramid is not None:
            return list(zip(pyramid_channels(self.embed_dims), (4, 8, 16, 32)))
        return super().output_spec()

    def layer_depth_groups(self) -> List[Tuple[str, ...]]:
        """Embeddings (patch, position, class token) 0, block i i+1, then CaiT's
        class-attention blocks; the final norm and the pyramid take the top id."""
        return [('patch_embed', 'pos_embed', 'cls_token'),
                *((f'blocks.{i}',) for i in range(len(self.blocks))),
                *((f'cls_blocks.{i}',) for i in range(len(self.cls_blocks or ())))]

    analysis_settings = dict(window_size=None, simple_pyramid=False)

    def attention_blocks(self) -> List[AttentionBlock]:
        """The trunk blocks (not CaiT's class-attention blocks), all at the patch stride."""
        return [AttentionBlock(block, block.attn, self.patch_size) for block in self.blocks]

    # ---- training behaviour ------------------------------------------------------------------
    def checkpoint_stages(self) -> List[List[nn.Module]]:
        """The trunk's blocks as one stage; CaiT's class-attention blocks as a second."""
        return [list(self.blocks), *([list(self.cls_blocks)] if self.cls_blocks else [])]

    def frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        return [self.patch_embed, *self.blocks[:self.frozen_stages]]

    def frozen_parameters(self) -> List[nn.Parameter]:
        return [p for p in (self.pos_embed, self.cls_token) if p is not None]

    # ---- forward -----------------------------------------------------------------------------
    def output_tokens(self, index: int, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens of block ``index`` as output: the last block's through the final norm."""
        return self.norm(tokens) if index == self.depth - 1 and self.norm is not None else tokens

    def forward_blocks(self, tokens: torch.Tensor, hw: Size2
                       ) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """Run the blocks; returns the output tokens of ``out_indices`` and the last tokens."""
        feats = []
        for i, block in enumerate(self.blocks):
            tokens = self.run_block(block, tokens, hw)
            if i in self.out_indices:
                feats.append(self.output_tokens(i, tokens))
        return feats, tokens

    def forward_cls_token(self, tokens: torch.Tensor) -> torch.Tensor:
        """Trunk output -> normalised class token (B, C)."""
        if self.cls_blocks is None:
            return self.norm(tokens)[:, 0]
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        for block in self.cls_blocks:
            cls = self.run_block(block, cls, tokens)
        return self.norm(cls)[:, 0]

    def position_embedding(self, hw: Size2) -> Optional[torch.Tensor]:
        """(1, num_prefix_tokens + h*w, C): the prefix slots and the grid resized to ``hw``
        (``None`` without a position embedding)."""
        if self.pos_embed is None:
            return None
        return resize_pos_embed(self.pos_embed, self.grid_size, hw, self.num_prefix_tokens,
                                self.interpolate_mode)

    def prefix_tokens(self, batch: int, pos: Optional[torch.Tensor]) -> List[torch.Tensor]:
        """The tokens that run through the trunk before the patch tokens, each (B, n, C), given
        the position embedding's prefix slots ``pos``: the class token where it is in the
        trunk."""
        if self.cls_token is None or self.cls_blocks is not None:
            return []
        cls = self.cls_token.expand(batch, -1, -1)
        return [cls + pos[:, :1] if pos is not None else cls]

    def embed_tokens(self, x: torch.Tensor) -> Tuple[torch.Tensor, Size2]:
        """(B, C_in, H, W) -> the trunk's input tokens (prefix tokens first) and the grid."""
        tokens, hw = self.patch_embed(x)
        pos = self.position_embedding(hw)
        if pos is not None:
            prefix = pos.shape[1] - hw[0] * hw[1]
            tokens, pos = tokens + pos[:, prefix:], pos[:, :prefix]
        extra = self.prefix_tokens(tokens.shape[0], pos)
        if extra:
            tokens = torch.cat([*extra, tokens], dim=1)
        return self.pos_drop(tokens), hw

    def token_outputs(self, feats: List[torch.Tensor], tokens: torch.Tensor,
                      num_patches: int) -> Tuple[torch.Tensor, ...]:
        """The outputs of a non-map ``out_type`` from the output tokens ``feats`` and the
        trunk's last tokens (the last ``num_patches`` are patch tokens): the normalised class
        token."""
        return (self.forward_cls_token(tokens),)

    def map_outputs(self, maps: List[torch.Tensor], feats: List[torch.Tensor],
                    image_hw: Size2) -> Tuple[Any, ...]:
        """The outputs from the maps of ``out_indices`` (and their tokens ``feats``): the maps,
        or the simple pyramid's levels."""
        if self.pyramid is None:
            return tuple(maps)
        if len(maps) == 1:
            maps = maps * len(self.strides)
        return tuple(self.pyramid(maps, level_sizes(image_hw, self.strides)))

    def forward_features(self, x: torch.Tensor) -> Tuple[Any, ...]:
        tokens, hw = self.embed_tokens(x)
        num_patches = hw[0] * hw[1]  # prefix tokens are no map pixels
        feats, tokens = self.forward_blocks(tokens, hw)
        if self.out_type != 'featmap':
            return self.token_outputs(feats, tokens, num_patches)
        maps = [tokens_to_map(f[:, f.shape[1] - num_patches:], hw) for f in feats]
        return self.map_outputs(maps, feats, x.shape[2:])


def plain_attention(dim: int, num_heads: int, common: dict, fused: bool,
                    map_transforms: Sequence[MapTransform] = ()) -> WindowAttention:
    """The trunk's qkv attention, windowed unless ``common['window_size']`` is ``None``, with
    optional map transforms."""
    return WindowAttention(dim, num_heads, common['window_size'], qkv_bias=True,
                           attn_drop=common['attn_drop'], proj_drop=common['drop'],
                           map_transforms=map_transforms, fused=fused)
