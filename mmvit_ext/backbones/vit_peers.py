"""The peers' plain ViT, as facts of our ``VisionTransformer`` family: mmseg's and mmpretrain's
``VisionTransformer`` argument names, mmpretrain's arch table, each peer's defaults, and the
peers holding our weights for ``benchmark --compare`` (:func:`vit_peers`: timm's DINOv3 for a
RoPE trunk, the ViTDet trunks of timm and mmpretrain otherwise).

A config of either peer builds ours after changing only ``type``. Where the peers give a name or
a default different meanings (mmpretrain's ``arch='s'`` is 768-dim with 8 blocks, ours 384-dim;
its ``frozen_stages=0`` freezes nothing; mmseg has no final norm, no patch bias and LayerNorm
eps 1e-5 by default), the meaning follows the peer rule (docs/peer_semantics.md).
"""
import copy
from collections import ChainMap
from numbers import Number
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..layers.pyramid import level_sizes
from .base import load_peer
from .plain_vit import MMSEG_VIT_VOCABULARY
from .vit_rel_pos import resize_rel_pos
from .vocabulary import GELU, OURS, Vocabulary, equals


def _vit(dim: int, depth: int, heads: int, hidden: int) -> dict:
    return dict(embed_dims=dim, depth=depth, num_heads=heads, mlp_ratio=hidden / dim)


# mmpretrain VisionTransformer.arch_zoo (v1.2) in our keys; its names win under peer mmpretrain
MMPRETRAIN_ARCHS: Dict[str, dict] = {
    **dict.fromkeys(['s', 'small'], _vit(768, 8, 8, 768 * 3)),
    **dict.fromkeys(['b', 'base'], _vit(768, 12, 12, 3072)),
    **dict.fromkeys(['l', 'large'], _vit(1024, 24, 16, 4096)),
    **dict.fromkeys(['h', 'huge'], _vit(1280, 32, 16, 5120)),
    **dict.fromkeys(['eva-g', 'eva-giant'], _vit(1408, 40, 16, 6144)),
    **dict.fromkeys(['deit-t', 'deit-tiny'], _vit(192, 12, 3, 192 * 4)),
    **dict.fromkeys(['deit-s', 'deit-small', 'dinov2-s', 'dinov2-small'], _vit(384, 12, 6, 1536)),
    **dict.fromkeys(['deit-b', 'deit-base'], _vit(768, 12, 12, 3072)),
    **dict.fromkeys(['dinov2-g', 'dinov2-giant'], _vit(1536, 40, 24, 6144)),
}

# defaults where the peers differ; an explicit argument always wins
PEER_DEFAULTS: Dict[str, Dict[str, Any]] = {
    # ours: dense maps through the simple pyramid, windows when the class token is out
    OURS: dict(out_type='featmap', final_norm=True, norm_eps=1e-6, drop_path_rate=0.1,
               window_size='auto', simple_pyramid=None),
    'mmdet': dict(out_type='featmap', final_norm=True, norm_eps=1e-6, drop_path_rate=0.1,
                  window_size='auto', simple_pyramid=None),
    # mmseg VisionTransformer: class token in the trunk, stride-16 maps, no final norm, no
    # patch bias, nn.LayerNorm's eps
    'mmseg': dict(out_type='featmap', with_cls_token=True, final_norm=False, patch_bias=False,
                  norm_eps=1e-5, drop_path_rate=0.0, window_size=None, simple_pyramid=False),
    # mmpretrain VisionTransformer: the classifier trunk
    'mmpretrain': dict(arch='base', out_type='cls_token', with_cls_token=True, final_norm=True,
                       norm_eps=1e-6, drop_path_rate=0.0, window_size=None,
                       simple_pyramid=False),
}


FACT_LEVELS = ('argument', 'preset', 'scope', 'ours')


class Facts(ChainMap):
    """The settings that build a ViT, in the one order: an explicit argument, then the named
    preset's facts, then the peer scope's default, then ours. ``None`` arguments are not given.
    :meth:`source` names the level a setting came from (a checkpoint tensor the scope's default
    leaves out is the peer's own drop; one an argument or a preset leaves out is an error).
    ``arguments`` holds only what was given."""

    def __init__(self, arguments: Mapping[str, Any], preset: Mapping[str, Any], peer: str,
                 ours: Mapping[str, Any]) -> None:
        scope = PEER_DEFAULTS[peer] if peer != OURS else {}
        super().__init__(dict(arguments), dict(preset), dict(scope),
                         {**PEER_DEFAULTS[OURS], **ours})

    def source(self, key: str) -> Optional[str]:
        return next((level for level, m in zip(FACT_LEVELS, self.maps) if key in m), None)


def preset_facts(arch_zoo: Mapping[str, dict], arch: Union[str, dict, None], peer: str,
                 settings: Mapping[str, Any]) -> Dict[str, Any]:
    """What a named preset of ``arch_zoo`` fixes in every scope, as its checkpoints hold it: a
    patch bias and LayerNorm eps 1e-6 (DeiT, MAE, timm); DINOv2 / DINOv3 also the final norm and
    the class token in the trunk (with their registers / storage tokens). An arch dict's
    ``norm_eps`` and a RoPE arch's class token count here too. An mmpretrain name under peer
    mmpretrain is mmpretrain's preset, which fixes none of these."""
    facts: Dict[str, Any] = {}
    name = arch.lower() if isinstance(arch, str) else None
    if name in arch_zoo and peer_arch(arch, peer) == arch:
        facts.update(patch_bias=True, norm_eps=1e-6)
        if name.startswith(('dinov2', 'dinov3')):
            facts.update(final_norm=True, with_cls_token=True)
    if settings.get('rope'):
        facts['with_cls_token'] = True  # DINOv3: the class token runs through the trunk
    if 'norm_eps' in settings:
        facts['norm_eps'] = settings['norm_eps']
    return facts


def peer_arch(arch: Union[str, dict, None], peer: str) -> Union[str, dict, None]:
    """mmpretrain's preset names mean its presets under peer mmpretrain (others: ours)."""
    default = PEER_DEFAULTS[peer].get('arch', arch)
    arch = default if arch is None else arch
    if peer == 'mmpretrain' and isinstance(arch, str) and arch.lower() in MMPRETRAIN_ARCHS:
        return dict(MMPRETRAIN_ARCHS[arch.lower()])
    return arch


def resolve_layout(facts: Facts, settings: Dict[str, Any]
                   ) -> Tuple[bool, Optional[int], bool]:
    """Class token, window and pyramid from ``facts``; without a class-token fact: in the trunk
    for classifier outputs and register tokens. Ours: windows of 14 when the class token is out,
    the simple pyramid for patch 16. Classifier outputs attend globally, without the pyramid."""
    dense = facts['out_type'] == 'featmap'
    with_cls_token = facts.get('with_cls_token')
    if with_cls_token is None:
        with_cls_token = not dense or bool(settings.get('reg_tokens'))
    window_size, simple_pyramid = facts['window_size'], facts['simple_pyramid']
    if not dense:
        window_size, simple_pyramid = None, False
    if simple_pyramid is None:
        simple_pyramid = int(settings.get('patch_size', 16)) == 16
    if window_size == 'auto':
        window_size = 14 if with_cls_token is False else None
    return with_cls_token, window_size, simple_pyramid


def _bool(value: Any, args: Dict[str, Any]) -> Optional[str]:
    return None if isinstance(value, bool) else 'True or False'


def _layer_norm(value: Any, args: Dict[str, Any]) -> Optional[str]:
    """``norm_cfg``: LayerNorm with any eps (its eps is used), trainable."""
    ok = isinstance(value, Mapping) and str(value.get('type', '')).upper() == 'LN' and \
        set(value) <= {'type', 'eps', 'requires_grad'} and value.get('requires_grad', True) \
        is True and isinstance(value.get('eps', 1e-5), Number)
    return None if ok else "dict(type='LN', eps=...) (LayerNorm, trainable)"


def _interpolate(value: Any, args: Dict[str, Any]) -> Optional[str]:
    return None if value in ('bicubic', 'bilinear') else "'bicubic' or 'bilinear'"


def _scale(value: Any, args: Dict[str, Any]) -> Optional[str]:
    ok = isinstance(value, Number) and not isinstance(value, bool) and value >= 0
    return None if ok else 'a LayerScale init value >= 0 (0: no LayerScale)'


FFN_TYPES = {'origin': 'mlp', 'swiglu_fused': 'swiglu'}


def _layer_cfgs(value: Any, args: Dict[str, Any]) -> Optional[str]:
    """mmpretrain ``layer_cfgs``: only ``ffn_type``, the same for every layer."""
    layers = [value] if isinstance(value, Mapping) else value
    if not isinstance(layers, Sequence) or not all(isinstance(c, Mapping) for c in layers):
        return 'a dict or a list of dicts'
    if any(set(c) - {'ffn_type'} or c.get('ffn_type', 'origin') not in FFN_TYPES
           for c in layers) or len({c.get('ffn_type', 'origin') for c in layers}) > 1:
        return f'only dict(ffn_type=...) with ffn_type in {sorted(FFN_TYPES)}, the same for ' \
               f'every layer'
    return None


_PATCH_CFG_KEYS = {'conv_type': 'Conv2d', 'padding': 'corner', 'dilation': 1, 'norm_cfg': None}


def _patch_cfg(value: Any, args: Dict[str, Any]) -> Optional[str]:
    """mmpretrain ``patch_cfg``: keys restating the non-overlapping patch projection."""
    if not isinstance(value, Mapping):
        return 'a dict'
    bad = {k: v for k, v in value.items() if k in _PATCH_CFG_KEYS and _PATCH_CFG_KEYS[k] != v
           or k not in _PATCH_CFG_KEYS and k != 'bias'}
    return None if not bad else f'only {_PATCH_CFG_KEYS} and bias (use patch_size / patch_bias)'


# mmseg's and mmpretrain's VisionTransformer names (the trunk's mmseg names, extended)
VIT_VOCABULARY = Vocabulary(
    arch_args=MMSEG_VIT_VOCABULARY.arch_args,
    checks={**MMSEG_VIT_VOCABULARY.checks,
            'output_cls_token': _bool, 'patch_norm': _bool, 'pre_norm': _bool,
            'norm_cfg': _layer_norm, 'interpolate_mode': _interpolate,
            'layer_scale_init_value': _scale, 'layer_cfgs': _layer_cfgs,
            'patch_cfg': _patch_cfg, 'act_cfg': GELU, 'patch_pad': equals('corner', "'corner'")})
VIT_OWN_NAMES = ('output_cls_token', 'patch_norm', 'pre_norm', 'norm_cfg', 'interpolate_mode',
                 'layer_scale_init_value', 'layer_cfgs', 'patch_cfg')


def read_peer_args(peer: str, peer_args: Dict[str, Any]) -> Dict[str, Any]:
    """Pop the names above from ``peer_args`` (already checked) into our settings."""
    got = {name: peer_args.pop(name) for name in VIT_OWN_NAMES if name in peer_args}
    pre_norm = got.get('pre_norm', False)
    settings = dict(output_cls_token=got.get('output_cls_token', False),
                    patch_norm=got.get('patch_norm', False), pre_norm=pre_norm,
                    interpolate_mode=got.get('interpolate_mode', 'bicubic'))
    if 'norm_cfg' in got:
        settings['norm_eps'] = got['norm_cfg'].get('eps', 1e-5)
    if got.get('layer_scale_init_value'):
        settings['layer_scale'] = float(got['layer_scale_init_value'])
    cfgs = got.get('layer_cfgs')
    if cfgs:
        first = cfgs if isinstance(cfgs, Mapping) else cfgs[0]
        settings['ffn'] = FFN_TYPES[first.get('ffn_type', 'origin')]
    if 'bias' in got.get('patch_cfg', {}):
        settings['patch_bias'] = bool(got['patch_cfg']['bias'])
    return settings


# ---- benchmark peers: timm's and mmpretrain's SAM-style ViT-B with ViTDet windows ----------
class PyramidFeatures(nn.Module):
    """A peer's stride-16 trunk (image -> (B, C, h, w)) + a copy of our simple pyramid (if any),
    so that both sides return the same maps; the pyramid's cost is ours on both sides."""

    def __init__(self, trunk: nn.Module, forward_trunk: Callable, pyramid: Optional[nn.Module],
                 strides: Tuple[int, ...]) -> None:
        super().__init__()
        self.trunk = trunk
        self.forward_trunk = forward_trunk
        self.pyramid = copy.deepcopy(pyramid)
        self.strides = strides

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        grid = self.forward_trunk(self.trunk, x)
        if self.pyramid is None:
            return (grid,)
        sizes = level_sizes(x.shape[2:], self.strides)
        return tuple(self.pyramid([grid] * len(self.strides), sizes))


def _timm_sam_trunk(trunk: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from timm.layers import resample_abs_pos_embed_nhwc
    x = trunk.patch_embed(x)
    x = trunk.blocks(x + resample_abs_pos_embed_nhwc(trunk.pos_embed, x.shape[1:3]))
    return x.permute(0, 3, 1, 2)


def _mmpretrain_sam_trunk(trunk: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return trunk(x)[-1]


def _sam_layout(ours: nn.Module, grid: Tuple[int, int]) -> Dict[str, torch.Tensor]:
    """Our ViTDet weights in timm's SAM-ViT keys, the position embedding at ``grid`` (NHWC) and
    each global block's relative positions resized to that grid, as ours resizes them."""
    state = {k: v for k, v in ours.state_dict().items()
             if k.startswith(('patch_embed.', 'blocks.'))}
    pos = ours.position_embedding(grid)[:, -grid[0] * grid[1]:]
    state['pos_embed'] = pos.reshape(1, *grid, -1)
    for i in ours.global_blocks:
        for axis, side in (('h', grid[0]), ('w', grid[1])):
            key = f'blocks.{i}.attn.rel_pos_{axis}'
            state[key] = resize_rel_pos(state[key], side)
    return state


def _mmpretrain_sam_keys(key: str) -> str:
    for ours, theirs in (('patch_embed.proj.', 'patch_embed.projection.'), ('blocks.', 'layers.'),
                         ('.norm1.', '.ln1.'), ('.norm2.', '.ln2.'),
                         ('.mlp.fc1.', '.ffn.layers.0.0.'), ('.mlp.fc2.', '.ffn.layers.1.')):
        key = key.replace(ours, theirs)
    return key


def vitdet_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """timm's ``samvit_base_patch16`` and mmpretrain's ``ViTSAM`` trunks (ViTDet's windowed ViT-B
    without the SAM neck) with the weights of ``ours``, each ahead of a copy of our pyramid."""
    import timm
    vitdet = (ours.embed_dims == 768 and ours.depth == 12 and ours.window_size == 14
              and ours.global_blocks == (2, 5, 8, 11) and getattr(ours, 'use_rel_pos', False)
              and ours.cls_token is None and ours.pyramid is not None
              and ours.out_indices == (11,) and ours.norm is None)
    if not vitdet:
        raise ValueError('peers are built for the ViTDet ViT-B: window_size=14, global_blocks='
                         '(2, 5, 8, 11), use_rel_pos=True, with_cls_token=False, '
                         'final_norm=False, the simple pyramid from the last block')
    grid = (img_size[0] // ours.patch_size, img_size[1] // ours.patch_size)
    state = _sam_layout(ours, grid)
    trunk = timm.create_model('samvit_base_patch16', pretrained=False, img_size=img_size,
                              num_classes=0, drop_path_rate=0.0)
    trunk.neck = nn.Identity()
    load_peer(trunk, state, 'timm SAM ViT')
    peers = {'timm': PyramidFeatures(trunk, _timm_sam_trunk, ours.pyramid, ours.strides)}
    try:  # mmpretrain 1.2 / onedl-mmpretrain 1.3.6 do not import beside transformers 5
        from mmpretrain.models.backbones import ViTSAM
    except (ImportError, TypeError) as err:
        print(f'[peers] mmpretrain ViTSAM left out: mmpretrain does not import here '
              f'({type(err).__name__}: {err})')
        return peers
    sam = ViTSAM(arch='base', img_size=img_size, out_channels=0, out_type='featmap',
                 window_size=14, use_rel_pos=True)
    load_peer(sam, {_mmpretrain_sam_keys(k): v for k, v in state.items()}, 'mmpretrain ViTSAM')
    peers['mmpretrain'] = PyramidFeatures(sam, _mmpretrain_sam_trunk, ours.pyramid, ours.strides)
    return peers


# ---- benchmark peers: timm's DINOv3 (timm.models.eva ``vit_*_dinov3``) ---------------------
# (embed_dims, ffn) of the official presets -> timm's model (``_qkvb``: with the qkv bias);
# the depth is passed along
TIMM_DINOV3 = {(384, 'mlp'): 'vit_small_patch16_dinov3',
               (384, 'swiglu'): 'vit_small_plus_patch16_dinov3',
               (768, 'mlp'): 'vit_base_patch16_dinov3', (1024, 'mlp'): 'vit_large_patch16_dinov3',
               (1280, 'swiglu'): 'vit_huge_plus_patch16_dinov3',
               (4096, 'swiglu64'): 'vit_7b_patch16_dinov3'}


def timm_dinov3_layout(ours: nn.Module) -> Dict[str, torch.Tensor]:
    """Our DINOv3 trunk's weights in timm's keys (the inverse of
    :func:`~mmvit_ext.converters.dinov3.convert_timm_dinov3`): the qkv bias as ``q_bias`` /
    ``v_bias`` (its k part is masked to zero), SwiGLU ``fc1`` split into ``fc1_g`` / ``fc1_x``."""
    state = {}
    for key, tensor in ours.state_dict().items():
        if key.startswith(('pyramid.', 'rope_embed.')) or key.endswith('.bias_mask'):
            continue
        if key.endswith('.attn.qkv.bias'):
            q, _, v = tensor.chunk(3)
            state[key.replace('qkv.bias', 'q_bias')] = q
            state[key.replace('qkv.bias', 'v_bias')] = v
        elif '.mlp.fc1.' in key and ours.arch_settings['ffn'] != 'mlp':
            gate, value = tensor.chunk(2)
            state[key.replace('.fc1.', '.fc1_g.')] = gate
            state[key.replace('.fc1.', '.fc1_x.')] = value
        else:
            key = key.replace('.ls1.gamma', '.gamma_1').replace('.ls2.gamma', '.gamma_2')
            state['reg_token' if key == 'register_tokens' else key] = tensor
    return state


def _timm_dinov3_trunk(trunk: nn.Module, x: torch.Tensor) -> torch.Tensor:
    tokens = trunk.forward_features(x)[:, trunk.num_prefix_tokens:]
    h, w = (side // trunk.patch_embed.patch_size[0] for side in x.shape[2:])
    return tokens.transpose(1, 2).reshape(x.shape[0], -1, h, w)


def dinov3_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """timm's ``vit_*_dinov3`` trunk with the weights of ``ours`` (a DINOv3 preset's width and
    MLP, any depth; the last block's normed patch tokens), ahead of a copy of our pyramid."""
    import timm
    settings = ours.arch_settings
    name = TIMM_DINOV3.get((ours.embed_dims, settings['ffn']))
    if name and ours.blocks[0].attn.qkv.bias is not None:
        name += '_qkvb'  # timm's variants with the qkv bias
    dense_last = (ours.out_indices == (ours.depth - 1,) and ours.norm is not None
                  and ours.cls_token is not None and ours.window_size is None)
    if name is None or not dense_last or not timm.list_models(name):
        raise ValueError(f'timm peers are built for the DINOv3 presets timm has ({timm.__version__}: '
                         f'{", ".join(timm.list_models("vit_*_dinov3")) or "none"}), dense '
                         f'outputs of the last block through the final norm')
    trunk = timm.create_model(name, pretrained=False, num_classes=0, depth=ours.depth,
                              dynamic_img_size=True, drop_path_rate=0.0)
    load_peer(trunk, timm_dinov3_layout(ours), f'timm {name}')
    return {'timm': PyramidFeatures(trunk, _timm_dinov3_trunk, ours.pyramid, ours.strides)}


def vit_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """The peers of our plain ViT: timm's DINOv3 for a RoPE trunk, else the ViTDet peers."""
    if ours.arch_settings.get('rope'):
        return dinov3_peers(ours, img_size)
    return vitdet_peers(ours, img_size)


__all__ = ['MMPRETRAIN_ARCHS', 'PEER_DEFAULTS', 'VIT_VOCABULARY', 'PyramidFeatures', 'peer_arch',
           'TIMM_DINOV3', 'dinov3_peers', 'read_peer_args', 'resolve_layout',
           'timm_dinov3_layout', 'vit_peers', 'vitdet_peers']
