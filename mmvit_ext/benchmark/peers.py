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


__all__ = ['PEER_BUILDERS', 'register_peers', 'load_peer', 'peer_families', 'build_peers',
           'swin_peers', 'pvtv2_peers', 'TimmSwinFeatures', 'TimmPVTv2Features']
