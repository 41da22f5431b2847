"""The peers' PVTv2 (mmdet's and timm's) holding exactly our weights, for ``benchmark --compare``.

Our state dict is exported to the official layout with the family's pure converter, and each
peer reads it through its own converter. :class:`~.pvt_v2.PyramidVisionTransformerV2` answers
``benchmark_peers`` with :func:`pvtv2_peers`; the peer libraries are imported only when the
peers are built.
"""
from typing import Dict, Tuple

import torch
from torch import nn

from ..converters.pvt_v2 import export_official_pvtv2
from .base import load_peer


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


__all__ = ['TimmPVTv2Features', 'pvtv2_peers']
