"""mmdet's and timm's own Swin / PVTv2 holding exactly our weights, for side-by-side runs.

Our state dict is exported to the official layout and read by each peer's own converter, so the
comparison also cross-checks the three implementations' semantics.
"""
import copy
from typing import Dict, List, Tuple

import torch
from torch import nn

from ..backbones import PyramidVisionTransformerV2, SwinTransformer
from ..converters import export_official_pvtv2, export_official_swin

PEER_FAMILIES = ('swin', 'pvtv2')
_TIMM_SWIN = {96: {6: 'swin_tiny_patch4_window7_224', 18: 'swin_small_patch4_window7_224'},
              128: {18: 'swin_base_patch4_window7_224'}, 192: {18: 'swin_large_patch4_window7_224'}}


class _NormedFeatures(nn.Module):
    """Peer trunk + copies of our output norms, returning NCHW maps like ours."""

    def __init__(self, trunk: nn.Module, norms: List[nn.Module], kind: str) -> None:
        super().__init__()
        self.trunk = trunk
        self.norms = nn.ModuleList(copy.deepcopy(n) for n in norms)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if self.kind == 'timm_swin':
            feats = self.trunk.forward_intermediates(x, norm=False, intermediates_only=True)
            return tuple(n(f.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()
                         for n, f in zip(self.norms, feats))
        feats, x = [], self.trunk.patch_embed(x)  # timm PVTv2: stages end with their norm
        for stage in self.trunk.stages:
            x = stage(x)
            feats.append(x)
        return tuple(feats)


def _load(peer: nn.Module, state: Dict[str, torch.Tensor], name: str) -> nn.Module:
    result = peer.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith('relative_position_index')]
    if missing or result.unexpected_keys:
        raise RuntimeError(f'{name} did not take our weights: missing {missing}, '
                           f'unexpected {result.unexpected_keys}')
    return peer


def _swin_peers(ours: SwinTransformer, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
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
    mmdet = _load(MMDetSwin(embed_dims=dims, depths=depths, num_heads=heads, window_size=7,
                            drop_path_rate=0.0, out_indices=(0, 1, 2, 3)), mm_state, 'mmdet Swin')
    name = _TIMM_SWIN.get(dims, {}).get(depths[2])
    if name is None:
        raise ValueError(f'no timm Swin preset with embed_dims={dims}, depths={depths}')
    trunk = timm.create_model(name, pretrained=False, img_size=img_size, drop_path_rate=0.0,
                              num_classes=0)
    _load(trunk, checkpoint_filter_fn(dict(official), trunk), 'timm Swin')
    norms = [getattr(ours, f'norm{i}') for i in range(4)]
    return {'mmdet': mmdet, 'timm': _NormedFeatures(trunk, norms, 'timm_swin')}


def _pvt_peers(ours: PyramidVisionTransformerV2, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
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
    if not ours.linear:  # mmdet has no linear SRA
        peers['mmdet'] = _load(MMDetPVTv2(embed_dims=ours.out_channels[0], num_layers=depths,
                                          drop_path_rate=0.0), pvt_convert(official), 'mmdet PVTv2')
    trunk = timm.create_model(f'pvt_v2_{arch}', pretrained=False, drop_path_rate=0.0, num_classes=0)
    _load(trunk, checkpoint_filter_fn(dict(official), trunk), 'timm PVTv2')
    peers['timm'] = _NormedFeatures(trunk, [], 'timm_pvt')
    return peers


def build_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """mmdet's and timm's implementation of our backbone's family, with our weights."""
    if isinstance(ours, SwinTransformer):
        return _swin_peers(ours, img_size)
    if isinstance(ours, PyramidVisionTransformerV2):
        return _pvt_peers(ours, img_size)
    raise ValueError(f'no peers for {type(ours).__name__}; peers exist for {PEER_FAMILIES}')
