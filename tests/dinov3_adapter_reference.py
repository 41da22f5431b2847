"""The official DINOv3 adapter (facebookresearch/dinov3,
``dinov3/eval/segmentation/models/backbone/dinov3_adapter.py``: ``DINOv3_Adapter``) written from
its semantics on the official key names, none of mmvit_ext's code: the trunk is
:func:`dinov3_reference.get_intermediate_layers` (normed outputs of the listed blocks), the SPM,
extractors and deformable attention are :mod:`vit_adapter_reference`'s (the same modules in the
official DINOv3 file, ``SyncBatchNorm`` there, ``BatchNorm2d`` here: the same in eval).

``official_state_dict`` is what ``DINOv3_Adapter.state_dict()`` holds: the trunk under
``backbone.``, the adapter at the top level. Eval-mode comparisons only; inputs of multiples of
32, as the official forward needs.
"""
from typing import Dict, List, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import dinov3_reference
from vit_adapter_reference import Extractor, SpatialPriorModule, reference_points

StateDict = Dict[str, torch.Tensor]


class InteractionBlockWithCls(nn.Module):
    """An extractor (two extra ones in the last interaction); no injector."""

    def __init__(self, dim: int, heads: int, points: int, ratio: float, with_cffn: bool,
                 cffn_ratio: float, extra_extractor: bool) -> None:
        super().__init__()
        self.extractor = Extractor(dim, heads, points, ratio, with_cffn, cffn_ratio)
        self.extra_extractors = nn.Sequential(*[
            Extractor(dim, heads, points, ratio, with_cffn, cffn_ratio) for _ in range(2)
        ]) if extra_extractor else None

    def forward(self, x, c, ref, shapes, h, w):
        for extractor in [self.extractor, *(self.extra_extractors or [])]:
            c = extractor(c, ref, x, shapes, h, w)
        return c


class DINOv3AdapterReference(nn.Module):
    def __init__(self, embed_dim: int, interaction_indexes: Sequence[int], conv_inplane: int,
                 n_points: int, deform_num_heads: int, deform_ratio: float,
                 cffn_ratio: float = 0.25, with_cffn: bool = True,
                 use_extra_extractor: bool = True) -> None:
        super().__init__()
        self.interaction_indexes = list(interaction_indexes)
        last = len(self.interaction_indexes) - 1
        self.level_embed = nn.Parameter(torch.zeros(3, embed_dim))
        self.spm = SpatialPriorModule(conv_inplane, embed_dim)
        self.interactions = nn.Sequential(*[
            InteractionBlockWithCls(embed_dim, deform_num_heads, n_points, deform_ratio,
                                    with_cffn, cffn_ratio, use_extra_extractor and i == last)
            for i in range(last + 1)])
        self.up = nn.ConvTranspose2d(embed_dim, embed_dim, 2, 2)
        for i in range(1, 5):
            setattr(self, f'norm{i}', nn.BatchNorm2d(embed_dim))

    def official_state_dict(self, trunk: StateDict) -> StateDict:
        """``DINOv3_Adapter.state_dict()``: the trunk's keys under ``backbone.``."""
        return {**{f'backbone.{k}': v for k, v in trunk.items()}, **self.state_dict()}

    def forward(self, image: torch.Tensor, trunk: StateDict, trunk_cfg: dict
                ) -> List[torch.Tensor]:
        batch, _, height, width = image.shape
        hc, wc = height // 16, width // 16
        layers = dinov3_reference.get_intermediate_layers(trunk, trunk_cfg, image,
                                                          self.interaction_indexes)
        c1, c2, c3, c4 = self.spm(image)
        c = torch.cat([c2 + self.level_embed[0], c3 + self.level_embed[1],
                       c4 + self.level_embed[2]], dim=1)
        ref = reference_points([(height // 8, width // 8), (hc, wc), (height // 32, width // 32)])
        vit_maps = []
        for (patches, _), interaction in zip(layers, self.interactions):
            c = interaction(patches.flatten(2).transpose(1, 2), c, ref, [(hc, wc)], hc, wc)
            vit_maps.append(patches)
        n2, n3 = c2.shape[1], c3.shape[1]
        dim = c.shape[2]
        c2 = c[:, :n2].transpose(1, 2).reshape(batch, dim, 2 * hc, 2 * wc)
        c3 = c[:, n2:n2 + n3].transpose(1, 2).reshape(batch, dim, hc, wc)
        c4 = c[:, n2 + n3:].transpose(1, 2).reshape(batch, dim, hc // 2, wc // 2)
        c1 = self.up(c2) + c1
        sizes = [(4 * hc, 4 * wc), (2 * hc, 2 * wc), (hc, wc), (hc // 2, wc // 2)]
        maps = [c1, c2, c3, c4]
        maps = [m + F.interpolate(v, size=s, mode='bilinear', align_corners=False)
                for m, v, s in zip(maps, vit_maps, sizes)]
        return [getattr(self, f'norm{i + 1}')(m) for i, m in enumerate(maps)]
