"""The peers' Swin (mmdet's and timm's) holding exactly our weights, for ``benchmark --compare``.

Our state dict is exported to the official layout with the family's pure converter, and each
peer reads it through its own converter, so the comparison also cross-checks the
implementations' semantics. :class:`~.swin.SwinTransformer` answers ``benchmark_peers`` with
:func:`swin_peers`; the peer libraries are imported only when the peers are built.
"""
import copy
from typing import Dict, List, Tuple

import torch
from torch import nn

from ..converters.swin import export_official_swin
from .base import load_peer

# timm's Swin presets by (embed_dims, depth of the third stage)
TIMM_SWIN = {96: {6: 'swin_tiny_patch4_window7_224', 18: 'swin_small_patch4_window7_224'},
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
    name = TIMM_SWIN.get(dims, {}).get(depths[2])
    if name is None:
        raise ValueError(f'no timm Swin preset with embed_dims={dims}, depths={depths}')
    trunk = timm.create_model(name, pretrained=False, img_size=img_size, drop_path_rate=0.0,
                              num_classes=0)
    load_peer(trunk, checkpoint_filter_fn(dict(official), trunk), 'timm Swin')
    norms = [getattr(ours, f'norm{i}') for i in range(4)]
    return {'mmdet': mmdet, 'timm': TimmSwinFeatures(trunk, norms)}


__all__ = ['TimmSwinFeatures', 'swin_peers']
