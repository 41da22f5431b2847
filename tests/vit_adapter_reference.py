"""A small ViT-Adapter written from the official code's semantics (czczup/ViT-Adapter), for tests
of equivalence that do not compare mmvit_ext with itself: nothing here imports mmvit_ext.

What it follows, file by file (the behaviour, in our own code):

* ``detection/mmdet_custom/models/backbones/base/vit.py``: the trunk (``TIMMVisionTransformer``:
  patch embedding, ``pos_embed`` with a class-token slot resized bicubically to the grid, pre-norm
  blocks with ``gamma1 / gamma2``), its global ``Attention`` and its ``WindowedAttention``, which
  projects first and zero-pads q, k, v to whole windows (padded keys unmasked).
* ``adapter_modules.py``: ``SpatialPriorModule``, ``Injector``, ``Extractor`` (ConvFFN whose
  ``DWConv`` splits the prior tokens into the three levels by the ViT grid), ``InteractionBlock``
  and the deformable inputs (reference points at pixel centres).
* ``ops/modules/ms_deform_attn.py``: ``MSDeformAttn`` and its ``_reset_parameters`` (Deformable
  DETR's init); the sampling is ``ms_deform_attn_core_pytorch``'s (``grid_sample``, every level's
  samples stacked, then weighted).
* ``detection/.../vit_adapter.py`` (``segmentation=False``: the last ViT map added to every level)
  and ``segmentation/.../vit_adapter.py`` (``segmentation=True``: the map after interaction i
  added to level i); both init the SPM, the interactions and ``up`` with ``_init_weights``, then
  every ``MSDeformAttn`` with its own init, then the level embedding normal.

Module and parameter names are the official ones, so ``state_dict()`` is an official checkpoint.
For eval-mode comparisons only: no drop path, dropout or checkpointing; ``BatchNorm2d`` for the
official ``SyncBatchNorm`` (the same in eval); inputs of multiples of 32, as the official code
needs. The trunk keeps PyTorch's default init (the official trunk is always loaded from weights).
"""
import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

Shape = Tuple[int, int]


def deform_core(value: torch.Tensor, shapes: Sequence[Shape], locations: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor:
    """value (B, S, M, D); locations (B, Q, M, L, P, 2) as (x, y) in [0, 1]; weights
    (B, Q, M, L, P) -> (B, Q, M*D)."""
    batch, _, heads, head_dim = value.shape
    _, queries, _, levels, points, _ = locations.shape
    per_level = value.split([h * w for h, w in shapes], dim=1)
    sampled = []
    for level, (h, w) in enumerate(shapes):
        level_map = per_level[level].permute(0, 2, 3, 1).reshape(batch * heads, head_dim, h, w)
        grid = 2 * locations[:, :, :, level] - 1  # (B, Q, M, P, 2) in [-1, 1]
        grid = grid.permute(0, 2, 1, 3, 4).reshape(batch * heads, queries, points, 2)
        sampled.append(F.grid_sample(level_map, grid, mode='bilinear', padding_mode='zeros',
                                     align_corners=False))  # (B*M, D, Q, P)
    stacked = torch.stack(sampled, dim=3)  # (B*M, D, Q, L, P)
    w = weights.permute(0, 2, 1, 3, 4).reshape(batch * heads, 1, queries, levels, points)
    out = (stacked * w).sum(dim=(-1, -2))  # (B*M, D, Q)
    return out.reshape(batch, heads * head_dim, queries).transpose(1, 2)


class MSDeformAttn(nn.Module):
    def __init__(self, d_model: int, n_levels: int, n_heads: int, n_points: int,
                 ratio: float = 1.0) -> None:
        super().__init__()
        self.n_levels, self.n_heads, self.n_points = n_levels, n_heads, n_points
        self.value_dim = int(d_model * ratio)
        self.sampling_offsets = nn.Linear(d_model, n_heads * n_levels * n_points * 2)
        self.attention_weights = nn.Linear(d_model, n_heads * n_levels * n_points)
        self.value_proj = nn.Linear(d_model, self.value_dim)
        self.output_proj = nn.Linear(self.value_dim, d_model)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """Deformable DETR: head h looks along angle 2*pi*h/M (scaled to a unit max-norm), point
        p at distance p + 1, on every level; uniform weights; Xavier projections."""
        nn.init.zeros_(self.sampling_offsets.weight)
        ring = torch.zeros(self.n_heads, self.n_levels, self.n_points, 2)
        # float32 angles and trigonometry, as the official init computes them
        angles = torch.arange(self.n_heads, dtype=torch.float32) * (2.0 * math.pi / self.n_heads)
        for head in range(self.n_heads):
            direction = torch.stack([angles[head].cos(), angles[head].sin()])
            direction = direction / direction.abs().max()
            for point in range(self.n_points):
                ring[head, :, point] = direction * (point + 1)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(ring.flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for proj in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def forward(self, query: torch.Tensor, ref: torch.Tensor, feat: torch.Tensor,
                shapes: Sequence[Shape]) -> torch.Tensor:
        batch, queries, _ = query.shape
        m, lv, p = self.n_heads, self.n_levels, self.n_points
        value = self.value_proj(feat).view(batch, feat.shape[1], m, self.value_dim // m)
        offsets = self.sampling_offsets(query).view(batch, queries, m, lv, p, 2)
        weights = self.attention_weights(query).view(batch, queries, m, lv * p).softmax(-1)
        weights = weights.view(batch, queries, m, lv, p)
        normaliser = torch.tensor([[w, h] for h, w in shapes], dtype=query.dtype)
        locations = ref[:, :, None, :, None, :] + offsets / normaliser[None, None, None, :, None]
        return self.output_proj(deform_core(value, shapes, locations, weights))


def reference_points(shapes: Sequence[Shape]) -> torch.Tensor:
    """Pixel centres of every level, (1, sum H*W, 1, 2) as (x, y) in [0, 1]."""
    points = []
    for h, w in shapes:
        ys = torch.linspace(0.5, h - 0.5, h) / h
        xs = torch.linspace(0.5, w - 0.5, w) / w
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing='ij')
        points.append(torch.stack([grid_x.reshape(-1), grid_y.reshape(-1)], -1))
    return torch.cat(points, 0)[None, :, None]


class DWConv(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        sizes = [(2 * h, 2 * w), (h, w), (h // 2, w // 2)]  # strides 8, 16, 32
        parts = x.split([a * b for a, b in sizes], dim=1)
        outs = [self.dwconv(part.transpose(1, 2).reshape(x.shape[0], x.shape[2], *size))
                for part, size in zip(parts, sizes)]
        return torch.cat([o.flatten(2).transpose(1, 2) for o in outs], dim=1)


class ConvFFN(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = DWConv(hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        return self.fc2(self.act(self.dwconv(self.fc1(x), h, w)))


def _ln(dim: int) -> nn.LayerNorm:
    return nn.LayerNorm(dim, eps=1e-6)


class Extractor(nn.Module):
    def __init__(self, dim: int, heads: int, points: int, ratio: float, with_cffn: bool,
                 cffn_ratio: float) -> None:
        super().__init__()
        self.query_norm, self.feat_norm = _ln(dim), _ln(dim)
        self.attn = MSDeformAttn(dim, 1, heads, points, ratio)
        self.with_cffn = with_cffn
        if with_cffn:
            self.ffn = ConvFFN(dim, int(dim * cffn_ratio))
            self.ffn_norm = _ln(dim)

    def forward(self, query, ref, feat, shapes, h, w):
        query = query + self.attn(self.query_norm(query), ref, self.feat_norm(feat), shapes)
        if self.with_cffn:
            query = query + self.ffn(self.ffn_norm(query), h, w)
        return query


class Injector(nn.Module):
    def __init__(self, dim: int, heads: int, points: int, ratio: float,
                 init_values: float) -> None:
        super().__init__()
        self.query_norm, self.feat_norm = _ln(dim), _ln(dim)
        self.attn = MSDeformAttn(dim, 3, heads, points, ratio)
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, query, ref, feat, shapes):
        return query + self.gamma * self.attn(self.query_norm(query), ref, self.feat_norm(feat),
                                              shapes)


class InteractionBlock(nn.Module):
    def __init__(self, dim, heads, points, ratio, init_values, with_cffn, cffn_ratio,
                 extra_extractor):
        super().__init__()
        self.injector = Injector(dim, heads, points, ratio, init_values)
        self.extractor = Extractor(dim, heads, points, ratio, with_cffn, cffn_ratio)
        self.extra_extractors = nn.Sequential(*[
            Extractor(dim, heads, points, ratio, with_cffn, cffn_ratio) for _ in range(2)
        ]) if extra_extractor else None

    def forward(self, x, c, blocks, inputs1, inputs2, h, w):
        x = self.injector(x, inputs1[0], c, inputs1[1])
        for block in blocks:
            x = block(x, h, w)
        extractors = [self.extractor, *(self.extra_extractors or [])]
        for extractor in extractors:
            c = extractor(c, inputs2[0], x, inputs2[1], h, w)
        return x, c


def _conv_bn_relu(cin: int, cout: int, stride: int) -> List[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True)]


class SpatialPriorModule(nn.Module):
    def __init__(self, inplanes: int, dim: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn_relu(3, inplanes, 2),
                                  *_conv_bn_relu(inplanes, inplanes, 1),
                                  *_conv_bn_relu(inplanes, inplanes, 1),
                                  nn.MaxPool2d(3, 2, 1))
        self.conv2 = nn.Sequential(*_conv_bn_relu(inplanes, 2 * inplanes, 2))
        self.conv3 = nn.Sequential(*_conv_bn_relu(2 * inplanes, 4 * inplanes, 2))
        self.conv4 = nn.Sequential(*_conv_bn_relu(4 * inplanes, 4 * inplanes, 2))
        self.fc1 = nn.Conv2d(inplanes, dim, 1)
        self.fc2 = nn.Conv2d(2 * inplanes, dim, 1)
        self.fc3 = nn.Conv2d(4 * inplanes, dim, 1)
        self.fc4 = nn.Conv2d(4 * inplanes, dim, 1)

    def forward(self, x):
        c1 = self.stem(x)
        c2 = self.conv2(c1)
        c3 = self.conv3(c2)
        c4 = self.conv4(c3)
        tokens = [fc(c).flatten(2).transpose(1, 2)
                  for fc, c in ((self.fc2, c2), (self.fc3, c3), (self.fc4, c4))]
        return (self.fc1(c1), *tokens)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def attend(self, qkv: torch.Tensor) -> torch.Tensor:
        """qkv (..., N, 3C) -> (..., N, C), before the output projection."""
        *lead, n, c3 = qkv.shape
        q, k, v = qkv.view(*lead, n, 3, self.heads, c3 // 3 // self.heads).movedim(-3, 0)
        q, k, v = (t.transpose(-3, -2) for t in (q, k, v))  # (..., heads, N, d)
        attn = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)
        return (attn @ v).transpose(-3, -2).reshape(*lead, n, c3 // 3)

    def forward(self, x, h, w):
        return self.proj(self.attend(self.qkv(x)))


class WindowedAttention(Attention):
    """Project, zero-pad q/k/v on the bottom / right to whole windows (never shrunk), attend in
    each window (padded keys unmasked), crop, project."""

    def __init__(self, dim: int, heads: int, window_size: int) -> None:
        super().__init__(dim, heads)
        self.window_size = window_size

    def forward(self, x, h, w):
        ws = self.window_size
        batch, _, dim = x.shape
        padded_h, padded_w = math.ceil(h / ws) * ws, math.ceil(w / ws) * ws
        qkv = self.qkv(x).view(batch, h, w, 3 * dim)
        qkv = F.pad(qkv, (0, 0, 0, padded_w - w, 0, padded_h - h))
        rows, cols = padded_h // ws, padded_w // ws
        windows = qkv.view(batch, rows, ws, cols, ws, 3 * dim).permute(0, 1, 3, 2, 4, 5)
        out = self.attend(windows.reshape(batch, rows * cols, ws * ws, 3 * dim))
        out = out.view(batch, rows, cols, ws, ws, dim).permute(0, 1, 3, 2, 4, 5)
        out = out.reshape(batch, padded_h, padded_w, dim)[:, :h, :w]
        return self.proj(out.reshape(batch, h * w, dim))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float, window: Optional[int]) -> None:
        super().__init__()
        self.norm1 = _ln(dim)
        self.attn = WindowedAttention(dim, heads, window) if window else Attention(dim, heads)
        self.norm2 = _ln(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.gamma1 = nn.Parameter(torch.ones(dim))
        self.gamma2 = nn.Parameter(torch.ones(dim))

    def forward(self, x, h, w):
        x = x + self.gamma1 * self.attn(self.norm1(x), h, w)
        return x + self.gamma2 * self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, 16, 16)

    def forward(self, x):
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), x.shape[2], x.shape[3]


class ViTAdapterReference(nn.Module):
    """The official ViT-Adapter (``segmentation``: its segmentation form) at small sizes;
    ``window_size[i]`` ``None`` for a global block."""

    def __init__(self, embed_dim: int, depth: int, num_heads: int,
                 interaction_indexes: Sequence[Sequence[int]], window_size: Sequence[Optional[int]],
                 mlp_ratio: float = 4.0, pretrain_size: int = 224, conv_inplane: int = 64,
                 n_points: int = 4, deform_num_heads: int = 6, init_values: float = 0.0,
                 with_cffn: bool = True, cffn_ratio: float = 0.25, deform_ratio: float = 1.0,
                 add_vit_feature: bool = True, use_extra_extractor: bool = True,
                 segmentation: bool = False) -> None:
        super().__init__()
        dim = embed_dim
        self.segmentation, self.add_vit_feature = segmentation, add_vit_feature
        self.interaction_indexes = [list(pair) for pair in interaction_indexes]
        self.pretrain_grid = pretrain_size // 16
        self.patch_embed = PatchEmbed(dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.pretrain_grid ** 2, dim))
        self.blocks = nn.Sequential(*[Block(dim, num_heads, mlp_ratio, window_size[i])
                                      for i in range(depth)])
        self.level_embed = nn.Parameter(torch.zeros(3, dim))
        self.spm = SpatialPriorModule(conv_inplane, dim)
        last = len(interaction_indexes) - 1
        self.interactions = nn.Sequential(*[
            InteractionBlock(dim, deform_num_heads, n_points, deform_ratio, init_values,
                             with_cffn, cffn_ratio, use_extra_extractor and i == last)
            for i in range(len(interaction_indexes))])
        self.up = nn.ConvTranspose2d(dim, dim, 2, 2)
        for i in range(1, 5):
            setattr(self, f'norm{i}', nn.BatchNorm2d(dim))
        for part in (self.up, self.spm, self.interactions):
            part.apply(self._general_init)
        for module in self.modules():  # the second pass, over the whole model
            if isinstance(module, MSDeformAttn):
                module._reset_parameters()
        nn.init.normal_(self.level_embed)

    @staticmethod
    def _general_init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, image: torch.Tensor) -> List[torch.Tensor]:
        _, _, height, width = image.shape
        levels = [(height // s, width // s) for s in (8, 16, 32)]
        inputs1 = (reference_points(levels[1:2]), levels)  # ViT queries -> prior levels
        inputs2 = (reference_points(levels), levels[1:2])  # prior queries -> ViT map
        c1, c2, c3, c4 = self.spm(image)
        c2, c3, c4 = (c + self.level_embed[i] for i, c in enumerate((c2, c3, c4)))
        c = torch.cat([c2, c3, c4], dim=1)
        x, h, w = self.patch_embed(image)
        dim = x.shape[-1]
        grid = self.pos_embed[:, 1:].reshape(1, self.pretrain_grid, self.pretrain_grid, dim)
        pos = F.interpolate(grid.permute(0, 3, 1, 2), size=(h, w), mode='bicubic',
                            align_corners=False)
        x = x + pos.flatten(2).transpose(1, 2)
        vit_maps = []
        for layer, (first, last) in zip(self.interactions, self.interaction_indexes):
            x, c = layer(x, c, self.blocks[first:last + 1], inputs1, inputs2, h, w)
            vit_maps.append(x.transpose(1, 2).reshape(-1, dim, h, w))
        sizes = [(2 * h, 2 * w), (h, w), (h // 2, w // 2)]
        maps = [t.transpose(1, 2).reshape(-1, dim, *size)
                for t, size in zip(c.split([a * b for a, b in sizes], dim=1), sizes)]
        maps.insert(0, self.up(maps[0]) + c1)
        if self.add_vit_feature:
            sources = vit_maps if self.segmentation else [vit_maps[-1]] * 4
            for level, scale in enumerate((4, 2, 1, 0.5)):
                source = sources[level]
                if scale != 1:
                    source = F.interpolate(source, scale_factor=scale, mode='bilinear',
                                           align_corners=False)
                maps[level] = maps[level] + source
        return [getattr(self, f'norm{i + 1}')(m) for i, m in enumerate(maps)]
