"""The plain Vision Transformer (Dosovitskiy et al., 2021) and its descendants on the plain-ViT
trunk: DeiT, MAE and AugReg weights (patch 16), DINOv2 (patch 14, LayerScale, register tokens,
SwiGLU FFN for the giant), ViTDet's dense options (windowed + global blocks, decomposed relative
positions, the simple pyramid) and the classifier outputs of mmpretrain (class token, mean of
the patch tokens).

Key names follow timm's ``VisionTransformer`` (``blocks.{i}.attn.qkv``, ``ls1.gamma``,
``mlp.fc1``, ``norm``...); register tokens keep DINOv2's ``register_tokens`` and the position
embedding always has the class-token slot, as the official models have it.
"""
import math
import re
from functools import partial
from typing import Any, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..converters.layouts import StateDict
from ..layers import (AttnBias, CheckpointedCall, Mlp, OperandForm, PatchEmbed, Size2,
                      WindowAttention, bias_terms, interpolation_matrix, kernel_for_call,
                      known_equal, scaled_dot_product_attention)
from ..registry import MODELS
from .dinov3 import (DINOV3_KEYS, build_rope, dinov3_arch_zoo, fit_qkv_bias,
                     infer_dinov3_arch, merge_rope, normed_tokens, rope_attention,
                     swiglu_hidden)
from .plain_vit import PlainViTBase, ViTBlock
from .vit_rel_pos import (decomposed_rel_pos, fold_decomposed_rel_pos, fold_width,  # noqa: F401
                          rel_pos_factors, rel_pos_lookup, resize_rel_pos)
from .vit_peers import (VIT_VOCABULARY, Facts, peer_arch, preset_facts, read_peer_args,
                        resolve_layout, vit_peers)
from .vocabulary import ConfigError, resolve_peer, translate

VIT_OUT_TYPES = ('featmap', 'cls_token', 'avg_featmap', 'raw')


def _vit(dim: int, depth: int, heads: int, **extra: Any) -> dict:
    return dict(embed_dims=dim, depth=depth, num_heads=heads, mlp_ratio=4, **extra)


# DINOv2 (Oquab et al., 2023): patch 14, LayerScale 1e-5, the official pos-embed interpolation
_dinov2 = partial(_vit, patch_size=14, layer_scale=1e-5, interpolate_offset=0.1, img_size=518)


class SwiGLU(CheckpointedCall, nn.Module):
    """SwiGLU FFN (DINOv2 giant, DINOv3): ``fc2(silu(a) * b)`` with ``(a, b)`` the halves of
    ``fc1(x)``. The hidden width is the official one: 2/3 of ``hidden_features`` rounded up to a
    multiple of ``align`` (8; DINOv3 7B's ``swiglu64``: 64).
    """

    token_wise = True

    def __init__(self, dim: int, hidden_features: int, drop: float = 0.0, align: int = 8) -> None:
        super().__init__()
        hidden = swiglu_hidden(hidden_features, align)
        self.fc1 = nn.Linear(dim, 2 * hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)
        return self.drop(self.fc2(self.drop(F.silu(gate) * value)))


class RelPosAttention(WindowAttention):
    """Window / global attention with the decomposed relative position bias (``use_rel_pos``).

    The tables span the window (windowed blocks) or the pretraining grid (global blocks) and are
    resized to the grid attended at run time (global blocks at another input size; windows
    attend whole, padded windows).
    """

    def __init__(self, dim: int, num_heads: int, window_size: Optional[int], grid: Size2,
                 **kwargs: Any) -> None:
        super().__init__(dim, num_heads, window_size, **kwargs)
        side = self.window_size or grid
        self.rel_pos_h = nn.Parameter(torch.zeros(2 * side[0] - 1, self.head_dim))
        self.rel_pos_w = nn.Parameter(torch.zeros(2 * side[1] - 1, self.head_dim))
        self.attn_grid: Size2 = tuple(side)

    def forward(self, x: torch.Tensor, hw: Size2) -> torch.Tensor:
        # the grid each attention call sees: the (fitted) window, or the whole map
        self.attn_grid = hw if self.window_size is None else self.fitted_window(hw)[0]
        return super().forward(x, hw)

    def operand_forms(self, training: bool) -> Tuple[OperandForm, ...]:
        # the fold (q, k widened, no mask) first, else the bias as a mask: computed from q, it
        # needs a gradient in training
        return (OperandForm(same_value_dim=False), self.bias_form(True, training))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               attn_bias: AttnBias = None) -> torch.Tensor:
        # no (N, N) bias for SDPA where a fused kernel takes q and k wider than v: the tables
        # folded into q and k (a symbolic grid, in export, keeps the bias)
        if self.fused_kernel() and not bias_terms(attn_bias) \
                and all(isinstance(side, int) for side in self.attn_grid) \
                and kernel_for_call(q, v, (), self.dropout_p, fold_width(q, self.attn_grid)):
            q, k = fold_decomposed_rel_pos(q, k, self.rel_pos_h, self.rel_pos_w, self.attn_grid,
                                           self.scale)
            return self.project(scaled_dot_product_attention(q, k, v, None, self.dropout_p, 1.0))
        bias = decomposed_rel_pos(q, self.rel_pos_h, self.rel_pos_w, self.attn_grid)
        return super().attend(q, k, v, (*bias_terms(attn_bias), bias))


def dinov2_resize_pos_embed(pos_embed: torch.Tensor, src_hw: Size2, dst_hw: Size2,
                            offset: float) -> torch.Tensor:
    """The official DINOv2 interpolation: bicubic with scale factors ``(dst + offset) / src``
    (not the output size), which samples slightly differently; none at the pretraining grid."""
    if known_equal(tuple(src_hw), tuple(dst_hw)):
        return pos_embed
    cls, grid = pos_embed[:, :1], pos_embed[:, 1:]
    dim = grid.shape[-1]
    grid = grid.reshape(1, src_hw[0], src_hw[1], dim).permute(0, 3, 1, 2).float()
    matrices = []
    for src, dst in zip(src_hw, dst_hw):
        eye = torch.eye(src, device=grid.device).view(1, 1, src, src)
        matrices.append(F.interpolate(eye, scale_factor=((dst + offset) / src, 1.0),
                                      mode='bicubic', align_corners=False)[0, 0])
    grid = matrices[0] @ grid @ matrices[1].T
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, dim).to(pos_embed.dtype)
    return torch.cat([cls, grid], dim=1)


@MODELS.register_module()
class VisionTransformer(PlainViTBase):
    """Plain ViT backbone (see :class:`PlainViTBase` for windows, global blocks and the pyramid),
    and a drop-in for mmseg's and mmpretrain's ``VisionTransformer`` (:mod:`.vit_peers`).

    Args:
        arch: ``ti s b l h`` (patch 16; aliases ``deit-t deit-s deit-b``, ``mae_b mae_l``,
            ``tiny small base large huge``), ``mae_h`` (patch 14), ``dinov2_s dinov2_b
            dinov2_l dinov2_g`` (patch 14, LayerScale, SwiGLU FFN for g; ``dinov2-s`` ...
            too), the DINOv3 hub names ``dinov3_vits16 ... dinov3_vit7b16`` (``dinov3-s`` ...;
            RoPE, storage tokens, k-bias mask: :mod:`.dinov3`), or a dict with ``embed_dims``, ``depth`` (or ``num_layers``), ``num_heads``
            and optional ``mlp_ratio`` (or ``feedforward_channels``), ``patch_size``,
            ``layer_scale``, ``ffn`` (``'mlp'`` / ``'swiglu'``), ``reg_tokens``,
            ``interpolate_offset`` (DINOv2's pos-embed interpolation, 0: size-based),
            ``img_size`` (the preset's pretraining size: 518 for DINOv2), DINOv3's ``rope``,
            ``mask_k_bias``, ``qkv_bias``, ``norm_eps``, ``untie_norms`` (``cls_norm``). Under peer mmpretrain
            its own preset names mean its presets (``'s'``: 768-dim, 8 blocks).
        patch_size: overrides the preset's patch size.
        out_type: ``'featmap'`` (NCHW maps), ``'cls_token'`` (the class token, (B, C)),
            ``'avg_featmap'`` (the mean of the patch tokens through ``fc_norm``), ``'raw'``
            (all tokens, (B, L, C)); one output per ``out_indices`` entry. ``None``: the peer's
            (``'cls_token'`` for mmpretrain, else ``'featmap'``).
        with_cls_token: run the class token through the blocks (needs global attention); dense
            outputs never include it. ``None``: the peers' ``True``; ours: only where the
            classifier needs it.
        reg_tokens: register tokens (DINOv2 with registers); ``None``: the preset's (0).
        final_norm: the last block's tokens pass through ``norm``. ``None``: ``False`` for peer
            mmseg, else ``True``.
        use_rel_pos: ViTDet's decomposed relative position bias in every block.
        patch_bias: a bias in the patch projection; ``None``: none for peer mmseg, none with
            ``pre_norm`` (CLIP), else a bias.
        layer_scale: LayerScale init (``None``: the preset's, none for ViT, 1e-5 for DINOv2).
        out_norm: every output's tokens through the final norm (DINOv3's / DINOv2's
            ``get_intermediate_layers(norm=True)``); off: the last block's only.
        rope: settings merged into a RoPE arch's ``rope`` (DINOv3): the official training-time
            coordinate augmentation ``shift_coords`` / ``jitter_coords`` / ``rescale_coords``
            (the hub models': ``rescale_coords=2``), drawn in training only
            (:class:`~mmvit_ext.layers.RopeEmbedding`); ``None``: the preset's (none).
        **kwargs: the trunk's (:class:`PlainViTBase`): ``img_size``, ``out_indices``,
            ``window_size``, ``global_blocks``, ``simple_pyramid`` (default: on for patch 16),
            ``drop_path_rate`` ...; and the peers' names (:data:`VIT_VOCABULARY`):
            ``output_cls_token`` (each map comes as ``[map, class token]``, mmseg), ``pre_norm``
            (a LayerNorm before the blocks, CLIP), ``patch_norm``, ``norm_cfg`` (its eps),
            ``interpolate_mode`` (``'bicubic'`` / ``'bilinear'`` position-embedding resizing),
            ``layer_scale_init_value``, ``layer_cfgs`` (``ffn_type``), ``patch_cfg`` ...
    """

    vocabulary = VIT_VOCABULARY
    family = 'vit'
    arch_zoo = {
        **dict.fromkeys(['ti', 'tiny', 'deit-t', 'deit-tiny', 'deit_tiny'], _vit(192, 12, 3)),
        **dict.fromkeys(['s', 'small', 'deit-s', 'deit-small', 'deit_small'], _vit(384, 12, 6)),
        **dict.fromkeys(['b', 'base', 'deit-b', 'deit-base', 'deit_base', 'mae_b', 'mae-b'],
                        _vit(768, 12, 12)),
        **dict.fromkeys(['l', 'large', 'mae_l', 'mae-l'], _vit(1024, 24, 16)),
        **dict.fromkeys(['h', 'huge'], _vit(1280, 32, 16)),
        **dict.fromkeys(['mae_h', 'mae-h'], _vit(1280, 32, 16, patch_size=14)),
        **dict.fromkeys(['dinov2_s', 'dinov2-s', 'dinov2-small'], _dinov2(384, 12, 6)),
        **dict.fromkeys(['dinov2_b', 'dinov2-b', 'dinov2-base'], _dinov2(768, 12, 12)),
        **dict.fromkeys(['dinov2_l', 'dinov2-l', 'dinov2-large'], _dinov2(1024, 24, 16)),
        **dict.fromkeys(['dinov2_g', 'dinov2-g', 'dinov2-giant'],
                        _dinov2(1536, 40, 24, ffn='swiglu')),
        **dinov3_arch_zoo(),  # DINOv3: the official hub names and short aliases (.dinov3)
    }
    essential_keys = frozenset({'embed_dims', 'depth', 'num_heads'})
    optional_keys = frozenset({'mlp_ratio', 'patch_size', 'layer_scale', 'ffn', 'reg_tokens',
                               'interpolate_offset', 'img_size'}) | DINOV3_KEYS
    default_arch = 'b'
    build_hints = ((r'^patch_embed\.proj\.bias$', 'patch_bias=True'),
                   (r'^patch_embed\.norm\.', 'patch_norm=True'), (r'^norm_pre\.', 'pre_norm=True'),
                   (r'^blocks\.\d+\.ls[12]\.', 'layer_scale=<its init, e.g. 1e-5>'),
                   (r'^blocks\.\d+\.attn\.rel_pos_[hw]$', 'use_rel_pos=True'),
                   (r'^pyramid\.', 'simple_pyramid=True'))
    # DeiT (Touvron et al., 2021) Table 1 and timm's counts: (M params, GFLOPs at 224)
    paper_figures = {'ti': (5.7, 1.3), 's': (22.1, 4.6), 'b': (86.6, 17.6)}
    # timm's DINOv3 for a RoPE trunk; timm's and mmpretrain's SAM ViT for our ViTDet ViT-B
    benchmark_peers = vit_peers

    def __init__(self, arch: Union[str, dict, None] = None, patch_size: Optional[int] = None,
                 out_type: Optional[str] = None, with_cls_token: Optional[bool] = None,
                 reg_tokens: Optional[int] = None, final_norm: Optional[bool] = None,
                 use_rel_pos: bool = False, layer_scale: Optional[float] = None,
                 patch_bias: Optional[bool] = None, simple_pyramid: Optional[bool] = None,
                 out_norm: bool = False, rope: Optional[dict] = None,
                 window_size: Union[int, str, None] = 'auto', peer: Optional[str] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None, **kwargs: Any) -> None:
        name = type(self).__name__
        peer = resolve_peer(name, peer)
        # the peers' names checked once here, before they are read; explicit dims over the arch
        names = {k: v for k, v in kwargs.items() if k in self.vocabulary.names}
        _, settings = translate(type(self), dict(arch=peer_arch(arch, peer), init_cfg=init_cfg,
                                                 peer=peer), names)
        for key in self.vocabulary.arch_args:
            kwargs.pop(key, None)
        options = read_peer_args(peer, kwargs)
        for key, value in (('patch_size', patch_size), ('reg_tokens', reg_tokens),
                           ('layer_scale', layer_scale if layer_scale is not None
                            else options.get('layer_scale')), ('ffn', options.get('ffn'))):
            if value is not None:
                settings[key] = value
        if rope is not None:
            settings['rope'] = merge_rope(name, settings.get('rope'), rope)
        given = dict(out_type=out_type, with_cls_token=with_cls_token, final_norm=final_norm,
                     patch_bias=patch_bias if patch_bias is not None
                     else options.get('patch_bias'), norm_eps=options.get('norm_eps'),
                     simple_pyramid=simple_pyramid, drop_path_rate=kwargs.pop('drop_path_rate',
                                                                              None))
        given = {k: v for k, v in given.items() if v is not None}
        if window_size != 'auto':
            given['window_size'] = window_size
        self.facts = Facts(given, preset_facts(self.arch_zoo, arch, peer, settings), peer,
                           dict(patch_bias=not options['pre_norm']))
        out_type = self.facts['out_type']
        if out_type not in VIT_OUT_TYPES:
            raise ValueError(f'{name}: out_type must be one of {VIT_OUT_TYPES}, got {out_type!r}')
        with_cls_token, window_size, simple_pyramid = resolve_layout(self.facts, settings)
        final_norm = self.facts['final_norm']
        self.output_cls_token = options['output_cls_token']
        self._check_options(settings, out_type, with_cls_token, use_rel_pos, window_size,
                            simple_pyramid)
        self.use_rel_pos = use_rel_pos
        self.with_patch_norm = options['patch_norm']
        self.patch_bias = self.facts['patch_bias']
        self.norm_eps = self.facts['norm_eps']
        self.interpolate_mode = options['interpolate_mode']
        kwargs.setdefault('img_size', settings.pop('img_size', 224))
        settings.pop('img_size', None)
        kwargs['drop_path_rate'] = self.facts['drop_path_rate']
        super().__init__(settings, out_type='featmap', simple_pyramid=simple_pyramid,
                         window_size=window_size, with_cls_token=with_cls_token,
                         final_norm=final_norm, peer=peer, init_cfg=init_cfg, **kwargs)
        self.out_type = out_type
        self.with_cls_token = with_cls_token
        num_reg = int(settings.get('reg_tokens', 0))
        self.register_tokens = nn.Parameter(torch.zeros(1, num_reg, self.embed_dims)) \
            if num_reg else None
        if self.register_tokens is not None:
            nn.init.trunc_normal_(self.register_tokens, std=0.02)
        self.out_norm = out_norm
        if out_norm and self.norm is None:
            self.norm = self._layer_norm()
        if self.norm is not None:
            self.norm.eps = self.norm_eps
        self.cls_norm = self._layer_norm() if self.norm is not None and \
            settings.get('untie_norms') else None
        self.norm_pre = self._layer_norm() if options['pre_norm'] else nn.Identity()
        self.fc_norm = self._layer_norm() if out_type == 'avg_featmap' else None
        self.interpolate_offset = float(settings.get('interpolate_offset', 0.0))
        self._freeze_stages()

    def peer_drop(self, key: str) -> Optional[str]:
        """mmseg's ViT builds no patch bias by default and drops it from its own weights."""
        if key != 'patch_embed.proj.bias' or self.facts.source('patch_bias') != 'scope':
            return None
        return (f"{self.peer}'s VisionTransformer drops them by default (patch_bias=False; "
                f'patch_bias=True or a named preset keeps them: docs/migrating.md)')

    def absolute_positions(self, settings: dict) -> bool:
        return not settings.get('rope')

    def _layer_norm(self) -> nn.LayerNorm:
        return nn.LayerNorm(self.embed_dims, eps=self.norm_eps)

    @property
    def num_layers(self) -> int:
        """Blocks of the architecture (mmseg's / mmpretrain's name)."""
        return self.depth

    @classmethod
    def resolve_arch(cls, arch: Union[str, dict]) -> dict:
        """Presets, or a custom dict in our names or mmpretrain's (``num_layers``,
        ``feedforward_channels``)."""
        if isinstance(arch, dict):
            arch = dict(arch)
            if 'num_layers' in arch:
                arch['depth'] = arch.pop('num_layers')
            if 'feedforward_channels' in arch and 'embed_dims' in arch:
                arch['mlp_ratio'] = arch.pop('feedforward_channels') / arch['embed_dims']
        return super().resolve_arch(arch)

    @classmethod
    def infer_arch(cls, state_dict: StateDict) -> Optional[dict]:
        """Dims, depth, patch, FFN, LayerScale, registers, the position grid and the optional
        norms / patch bias from our-layout weights; the head count (no weight shape holds it) from the preset of the same dims and
        depth, else 64 channels per head."""
        needed = ('patch_embed.proj.weight', 'blocks.0.mlp.fc1.weight', 'blocks.0.mlp.fc2.weight',
                  'pos_embed')
        if 'pos_embed' not in state_dict and all(k in state_dict for k in needed[:3]):
            return infer_dinov3_arch(state_dict, cls.arch_zoo)  # a RoPE trunk
        if any(k not in state_dict for k in needed):
            return None
        dim, _, patch, _ = state_dict['patch_embed.proj.weight'].shape
        depth = len({k.split('.')[1] for k in state_dict if k.startswith('blocks.')})
        fc1, fc2 = state_dict['blocks.0.mlp.fc1.weight'], state_dict['blocks.0.mlp.fc2.weight']
        swiglu = fc1.shape[0] == 2 * fc2.shape[1]
        heads = next((a['num_heads'] for a in cls.arch_zoo.values()
                      if a['embed_dims'] == dim and a['depth'] == depth), max(dim // 64, 1))
        arch = dict(embed_dims=dim, depth=depth, num_heads=heads, patch_size=patch,
                    mlp_ratio=fc1.shape[0] / dim if not swiglu else 4, ffn='swiglu' if swiglu
                    else 'mlp')
        if 'blocks.0.ls1.gamma' in state_dict:
            arch['layer_scale'] = 1e-5
        if 'register_tokens' in state_dict:
            arch['reg_tokens'] = state_dict['register_tokens'].shape[1]
        side = math.isqrt(state_dict['pos_embed'].shape[1] - 1)
        layout = dict(arch=arch, img_size=patch * side,
                      patch_bias='patch_embed.proj.bias' in state_dict,
                      pre_norm='norm_pre.weight' in state_dict,
                      patch_norm='patch_embed.norm.weight' in state_dict)
        if 'blocks.0.attn.rel_pos_h' in state_dict:
            return dict(layout, use_rel_pos=True, with_cls_token=False)
        return dict(layout, out_type='cls_token', final_norm='norm.weight' in state_dict)

    def _check_options(self, settings: dict, out_type: str, with_cls_token: bool,
                       use_rel_pos: bool, window_size: Optional[int],
                       simple_pyramid: bool) -> None:
        name = type(self).__name__
        if not re.fullmatch(r'mlp|swiglu(8|16|32|64|128)?', str(settings.get('ffn', 'mlp'))):
            raise ConfigError(f"{name}: arch ffn must be 'mlp' or 'swiglu' ('swiglu64': hidden "
                              f"width aligned to 64), got {settings['ffn']!r}")
        if settings.get('rope') and (window_size is not None or use_rel_pos):
            raise ConfigError(f'{name}: a RoPE arch (DINOv3) attends globally with its class and '
                              f'storage tokens; use window_size=None and use_rel_pos=False')
        if out_type == 'cls_token' and not with_cls_token:
            raise ConfigError(f"{name}: with_cls_token must be True when out_type='cls_token'")
        if self.output_cls_token and not with_cls_token:
            raise ConfigError(f'{name}: with_cls_token must be True if output_cls_token=True, '
                              f'but got {with_cls_token}')
        if self.output_cls_token and (out_type != 'featmap' or simple_pyramid):
            raise ConfigError(f"{name}: output_cls_token=True gives [map, class token] pairs of "
                              f"out_type='featmap' without the simple pyramid "
                              f"(simple_pyramid=False)")
        if settings.get('reg_tokens') and not with_cls_token:
            raise ConfigError(f'{name}: register tokens come after the class token; use '
                              f'with_cls_token=True (or reg_tokens=0)')
        if with_cls_token and window_size is not None:
            raise ConfigError(f'{name}: with_cls_token=True with window_size={window_size} is not '
                              f'supported; the class token attends globally in every block, so '
                              f'use window_size=None (or with_cls_token=False for windows)')
        if use_rel_pos and with_cls_token:
            raise ConfigError(f'{name}: use_rel_pos=True is for grids of patch tokens only; use '
                              f'with_cls_token=False (ViTDet drops the class token)')

    # ---- trunk hooks -------------------------------------------------------------------------
    def build_patch_embed(self, settings: dict, in_channels: int) -> nn.Module:
        norm = partial(nn.LayerNorm, eps=self.norm_eps) if self.with_patch_norm else None
        embed = PatchEmbed(in_channels, self.embed_dims, self.patch_size, norm_layer=norm)
        if not self.patch_bias:  # mmseg's default, and CLIP's (pre_norm)
            embed.proj = nn.Conv2d(in_channels, self.embed_dims, self.patch_size,
                                   self.patch_size, bias=False)
        return embed

    def build_block(self, index: int, settings: dict, common: dict) -> nn.Module:
        dim, heads = self.embed_dims, settings['num_heads']
        options = dict(qkv_bias=True, attn_drop=common['attn_drop'], proj_drop=common['drop'],
                       fused=self.fused_attn)
        if settings.get('rope'):
            if getattr(self, 'rope_embed', None) is None:  # one RoPE, shared by every block
                self.rope_embed = build_rope(settings, dim)
            attn = rope_attention(dim, settings, self.rope_embed, common, self.fused_attn)
        elif self.use_rel_pos:
            attn = RelPosAttention(dim, heads, common['window_size'], self.grid_size, **options)
        else:
            attn = WindowAttention(dim, heads, common['window_size'], **options)
        layer_scale = settings.get('layer_scale')
        mlp_ratio = settings.get('mlp_ratio', 4)
        hidden = round(dim * mlp_ratio)  # mmpretrain's feedforward_channels, exactly
        ffn = str(settings.get('ffn', 'mlp'))
        mlp = SwiGLU(dim, hidden, common['drop'], int(ffn[6:] or 8)) if ffn.startswith('swiglu') \
            else Mlp(dim, hidden, drop=common['drop'])
        return ViTBlock(dim, attn, mlp_ratio, common['drop'], common['drop_path'],
                        layer_scale=layer_scale, mlp_layer_scale=layer_scale,
                        norm_layer=partial(nn.LayerNorm, eps=self.norm_eps), mlp=mlp)

    # ---- weights -----------------------------------------------------------------------------
    def adapt_state_dict(self, state_dict: StateDict) -> Tuple[StateDict, List[str]]:
        """Resize the position embedding (the trunk) and the relative-position tables, linearly
        as ViTDet does, to this model's window / grid. The position embedding is resized with
        ``interpolate_mode`` (mmseg's SETR configs: bilinear)."""
        state_dict, resized = super().adapt_state_dict(state_dict)
        if self.arch_settings.get('rope'):
            state_dict = fit_qkv_bias(self, state_dict)
        own = {k: v for k, v in self.named_parameters() if k.endswith(('rel_pos_h', 'rel_pos_w'))}
        for key, value in own.items():
            given = state_dict.get(key)
            if given is not None and given.shape != value.shape and given.shape[1] == value.shape[1]:
                matrix = interpolation_matrix(given.shape[0], value.shape[0], 'bilinear',
                                              dtype=torch.float32)
                state_dict[key] = (matrix @ given.float()).to(given.dtype)
                resized.append(key)
        return state_dict, resized

    def unbuilt_prefixes(self) -> Tuple[str, ...]:
        prefixes = super().unbuilt_prefixes()
        if self.register_tokens is None:
            prefixes += ('register_tokens',)
        if self.fc_norm is None:
            prefixes += ('fc_norm.',)
        if self.cls_norm is None:
            prefixes += ('cls_norm.',)
        return prefixes

    def output_spec(self) -> List[Tuple[int, Optional[int]]]:
        if self.out_type != 'featmap':  # vectors (B, C), or raw tokens (B, L, C)
            return [(self.embed_dims, None)] * len(self.out_indices)
        return super().output_spec()

    def layer_depth_groups(self) -> List[Tuple[str, ...]]:
        groups = super().layer_depth_groups()
        return [groups[0] + ('register_tokens',), *groups[1:]]

    def frozen_modules(self) -> List[nn.Module]:
        """``frozen_stages=k``: the embeddings (patch, position, class / register tokens,
        ``norm_pre``) and blocks 0..k-1; peer mmpretrain freezes nothing for k = 0 and also the
        output norms for k = depth."""
        mmpretrain = self.peer == 'mmpretrain'
        if self.frozen_stages < 0 or (mmpretrain and self.frozen_stages == 0):
            return []
        modules = [*super().frozen_modules(), getattr(self, 'norm_pre', nn.Identity())]
        if self.frozen_stages == self.depth and getattr(self, 'rope_embed', None) is not None:
            modules.append(self.rope_embed)  # a frozen trunk draws no RoPE augmentation
        if mmpretrain and self.frozen_stages == self.depth:
            modules += [m for m in (self.norm, getattr(self, 'fc_norm', None)) if m is not None]
        return modules

    def frozen_parameters(self) -> List[nn.Parameter]:
        if self.peer == 'mmpretrain' and self.frozen_stages == 0:
            return []
        extra = getattr(self, 'register_tokens', None)
        return super().frozen_parameters() + ([extra] if extra is not None else [])

    # ---- forward -----------------------------------------------------------------------------
    def position_embedding(self, hw: Size2) -> torch.Tensor:
        """(1, 1 + h*w, C): the class-token slot and the grid resized to ``hw``."""
        if self.interpolate_offset and self.pos_embed is not None:
            return dinov2_resize_pos_embed(self.pos_embed, self.grid_size, hw,
                                           self.interpolate_offset)
        return super().position_embedding(hw)

    def embed_tokens(self, x: torch.Tensor) -> Tuple[torch.Tensor, Size2]:
        tokens, hw = super().embed_tokens(x)
        return self.norm_pre(tokens), hw

    def prefix_tokens(self, batch: int, pos: torch.Tensor) -> List[torch.Tensor]:
        """The class token (with its position) and the register tokens (without one, as
        DINOv2 adds them after the position embedding)."""
        cls = self.cls_token.expand(batch, -1, -1) if self.cls_token is not None else None
        prefix = [] if cls is None else [cls + pos if pos is not None else cls]
        if self.register_tokens is not None:
            prefix.append(self.register_tokens.expand(batch, -1, -1))
        return prefix

    def output_tokens(self, index: int, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens of block ``index`` as output: through the final norm (``cls_norm`` on the
        prefix tokens when untied) for the last block, or for every block with ``out_norm``."""
        if self.norm is None or not (self.out_norm or index == self.depth - 1):
            return tokens
        num_prefix = int(self.cls_token is not None) + (
            0 if self.register_tokens is None else self.register_tokens.shape[1])
        return normed_tokens(self.norm, self.cls_norm, tokens, num_prefix)

    def token_outputs(self, feats: List[torch.Tensor], tokens: torch.Tensor,
                      num_patches: int) -> Tuple[torch.Tensor, ...]:
        """Per output index: the tokens (``'raw'``), the class token or the patch tokens'
        mean through ``fc_norm``."""
        if self.out_type == 'raw':
            return tuple(feats)
        if self.out_type == 'cls_token':
            return tuple(f[:, 0] for f in feats)
        return tuple(self.fc_norm(f[:, -num_patches:].mean(dim=1)) for f in feats)

    def map_outputs(self, maps: List[torch.Tensor], feats: List[torch.Tensor],
                    image_hw: Size2) -> Tuple[Any, ...]:
        if self.output_cls_token:  # mmseg: [map, class token] per output
            return tuple([m, f[:, 0]] for m, f in zip(maps, feats))
        return super().map_outputs(maps, feats, image_hw)
