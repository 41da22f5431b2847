"""Peer implementations (mmdet, timm ...) holding exactly our weights, for side-by-side runs.

The benchmark builds its own peers: a builder per family (:func:`register_peers`) exports our
state dict to the official layout with the family's pure converter, and each peer reads it
through its own converter, so the comparison also cross-checks the implementations'
semantics. A family defined elsewhere may instead answer ``benchmark_peers(img_size)`` itself.
Imports go benchmark -> backbones -> converters, never back.
"""
import copy
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

from ..converters.pvt_v2 import export_official_pvtv2
from ..converters.swin import export_official_swin
from ..layers.pyramid import level_sizes

PeerBuilder = Callable[[nn.Module, Tuple[int, int]], Dict[str, nn.Module]]
PEER_BUILDERS: Dict[str, PeerBuilder] = {}


def register_peers(family: str) -> Callable[[PeerBuilder], PeerBuilder]:
    """Decorator: ``builder(ours, img_size) -> {peer name: module}`` for ``family``'s models."""
    def register(builder: PeerBuilder) -> PeerBuilder:
        PEER_BUILDERS[family] = builder
        return builder
    return register


def load_peer(peer: nn.Module, state: Dict[str, torch.Tensor], name: str) -> nn.Module:
    """Load ``state`` into ``peer``; anything missing (but saved buffers) or left over raises."""
    result = peer.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith('relative_position_index')]
    if missing or result.unexpected_keys:
        raise RuntimeError(f'{name} did not take our weights: missing {missing}, '
                           f'unexpected {result.unexpected_keys}')
    return peer


def _defines_own_peers(cls: type) -> bool:
    from ..backbones import BaseBackbone
    return getattr(cls, 'benchmark_peers', None) is not BaseBackbone.benchmark_peers


def peer_families() -> List[str]:
    """Families with peers for ``benchmark --compare``."""
    from ..backbones import family_classes
    return sorted(family for family, cls in family_classes().items()
                  if family in PEER_BUILDERS or _defines_own_peers(cls))


def build_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """The peer implementations of our backbone's family, with our weights."""
    builder = PEER_BUILDERS.get(getattr(ours, 'family', None))
    if builder is not None:
        return builder(ours, img_size)
    if not hasattr(ours, 'benchmark_peers'):
        raise ValueError(f'no peers for {type(ours).__name__}: not an mmvit_ext backbone')
    return ours.benchmark_peers(img_size)


# ---- Swin: mmdet's and timm's ----------------------------------------------------------------
_TIMM_SWIN = {96: {6: 'swin_tiny_patch4_window7_224', 18: 'swin_small_patch4_window7_224'},
              128: {18: 'swin_base_patch4_window7_224'}, 192: {18: 'swin_large_patch4_window7_224'}}


class TimmSwinFeatures(nn.Module):
    """timm's Swin trunk + copies of our output norms, returning NCHW maps like ours."""

    def __init__(self, trunk: nn.Module, norms: List[nn.Module]) -> None:
        super().__init__()
        self.trunk = trunk
        self.norms = nn.ModuleList(copy.deepcopy(n) for n in norms)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        feats = self.trunk.forward_intermediates(x, norm=False, intermediates_only=True)
        return tuple(n(f.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()
                     for n, f in zip(self.norms, feats))


@register_peers('swin')
def swin_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """mmdet's and timm's Swin with the weights of ``ours`` (all four outputs, window 7)."""
    from mmdet.models.backbones.swin import SwinTransformer as MMDetSwin
    from mmdet.models.backbones.swin import swin_converter
    import timm
    from timm.models.swin_transformer import checkpoint_filter_fn
    if ours.out_indices != (0, 1, 2, 3) or ours.window_size != 7:
        raise ValueError('peers are built for out_indices=(0, 1, 2, 3) and window_size=7')
    dims = ours.out_channels[0]
    depths = tuple(len(stage.blocks) for stage in ours.layers)
    heads = tuple(stage.blocks[0].attn.num_heads for stage in ours.layers)
    official = export_official_swin(ours.state_dict())
    mm_state = {k[len('backbone.'):]: v for k, v in swin_converter(official).items()
                if not k.startswith('backbone.norm.')}
    mm_state.update({k: v for k, v in ours.state_dict().items() if k.startswith('norm')})
    mmdet = load_peer(MMDetSwin(embed_dims=dims, depths=depths, num_heads=heads, window_size=7,
                                drop_path_rate=0.0, out_indices=(0, 1, 2, 3)), mm_state,
                      'mmdet Swin')
    name = _TIMM_SWIN.get(dims, {}).get(depths[2])
    if name is None:
        raise ValueError(f'no timm Swin preset with embed_dims={dims}, depths={depths}')
    trunk = timm.create_model(name, pretrained=False, img_size=img_size, drop_path_rate=0.0,
                              num_classes=0)
    load_peer(trunk, checkpoint_filter_fn(dict(official), trunk), 'timm Swin')
    norms = [getattr(ours, f'norm{i}') for i in range(4)]
    return {'mmdet': mmdet, 'timm': TimmSwinFeatures(trunk, norms)}


# ---- PVTv2: mmdet's and timm's ---------------------------------------------------------------
class TimmPVTv2Features(nn.Module):
    """timm's PVTv2 trunk returning every stage's NCHW map (its stages end with their norm)."""

    def __init__(self, trunk: nn.Module) -> None:
        super().__init__()
        self.trunk = trunk

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        feats, x = [], self.trunk.patch_embed(x)
        for stage in self.trunk.stages:
            x = stage(x)
            feats.append(x)
        return tuple(feats)


@register_peers('pvtv2')
def pvtv2_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """mmdet's (not for linear SRA, which it lacks) and timm's PVTv2 with the weights of
    ``ours``, a preset architecture."""
    from mmdet.models.backbones.pvt import PyramidVisionTransformerV2 as MMDetPVTv2
    from mmdet.models.backbones.pvt import pvt_convert
    import timm
    from timm.models.pvt_v2 import checkpoint_filter_fn
    depths = [len(stage.blocks) for stage in ours.layers]
    official = export_official_pvtv2(ours.state_dict())
    arch = {(32, 2): 'b0', (64, 2): 'b1', (64, 3): 'b2'}.get((ours.out_channels[0], depths[0]))
    arch = {(3, 18): 'b3', (8, 27): 'b4', (6, 40): 'b5'}.get((depths[1], depths[2]), arch)
    if arch == 'b2' and ours.linear:
        arch = 'b2_li'
    peers = {}
    if not ours.linear:
        peers['mmdet'] = load_peer(MMDetPVTv2(embed_dims=ours.out_channels[0], num_layers=depths,
                                              drop_path_rate=0.0), pvt_convert(official),
                                   'mmdet PVTv2')
    trunk = timm.create_model(f'pvt_v2_{arch}', pretrained=False, drop_path_rate=0.0,
                              num_classes=0)
    load_peer(trunk, checkpoint_filter_fn(dict(official), trunk), 'timm PVTv2')
    peers['timm'] = TimmPVTv2Features(trunk)
    return peers


# ---- plain ViT-B with ViTDet windows: timm's and mmpretrain's SAM-style ViT -----------------
class PyramidFeatures(nn.Module):
    """A peer's stride-16 trunk (image -> (B, C, h, w)) + a copy of our simple pyramid, so that
    both sides return the same four maps; the pyramid's cost is ours on both sides."""

    def __init__(self, trunk: nn.Module, forward_trunk: Callable, pyramid: nn.Module,
                 strides: Tuple[int, ...]) -> None:
        super().__init__()
        self.trunk = trunk
        self.forward_trunk = forward_trunk
        self.pyramid = copy.deepcopy(pyramid)
        self.strides = strides

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        grid = self.forward_trunk(self.trunk, x)
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
    from ..backbones.vit import resize_rel_pos
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


@register_peers('vit')
def vit_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
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


__all__ = ['PEER_BUILDERS', 'register_peers', 'load_peer', 'peer_families', 'build_peers',
           'swin_peers', 'pvtv2_peers', 'vit_peers', 'TimmSwinFeatures', 'TimmPVTv2Features',
           'PyramidFeatures']
