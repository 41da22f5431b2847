"""The official DINOv3 Mask2Former head (facebookresearch/dinov3,
``dinov3/eval/segmentation/models/heads/``: ``Mask2FormerHead`` = ``pixel_decoder.py``'s
``MSDeformAttnPixelDecoder`` + ``mask2former_transformer_decoder.py``'s
``MultiScaleMaskedTransformerDecoder``) and its semantic inference (``inference.py``), written from
their semantics on the official key names, none of mmvit_ext's or OpenMMLab's code; the
deformable attention is :mod:`vit_adapter_reference`'s.

The structure is the official one, what ``build_segmentation_decoder(..., decoder_type='m2f')``
hard-codes whatever the widths: 16 heads, FFN 4096, 6 encoder and 9 decoder layers, 100 queries,
GroupNorm(32), post-norm layers, ReLU. As in the official code (``transformer_num_feature_levels =
3``, its input projections for the three coarsest maps only), the deformable encoder takes the
three coarsest adapter maps (strides 32, 16, 8); the finest (stride 4) enters through the FPN
lateral conv; the decoder cross-attends the three encoder outputs in turn, coarsest first.
Eval-mode comparisons only (no dropout; the official dropouts are 0).
"""
import math
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from vit_adapter_reference import MSDeformAttn, reference_points

StateDict = Dict[str, torch.Tensor]
HEADS, FFN, ENC_LAYERS, DEC_LAYERS, QUERIES, LEVELS = 16, 4096, 6, 9, 100, 3


def sine_position(batch: int, height: int, width: int, num_feats: int) -> torch.Tensor:
    """DETR's normalised sine encoding of an unpadded map: (B, 2 * num_feats, H, W), the y half
    first, sin / cos interleaved."""
    ys = torch.arange(1, height + 1, dtype=torch.float32)[:, None].expand(height, width)
    xs = torch.arange(1, width + 1, dtype=torch.float32)[None, :].expand(height, width)
    ys = ys / (height + 1e-6) * 2 * math.pi
    xs = xs / (width + 1e-6) * 2 * math.pi
    dim_t = 10000 ** (2 * (torch.arange(num_feats, dtype=torch.float32) // 2) / num_feats)

    def embed(coord: torch.Tensor) -> torch.Tensor:
        angles = coord[..., None] / dim_t
        return torch.stack((angles[..., 0::2].sin(), angles[..., 1::2].cos()), -1).flatten(2)

    pos = torch.cat((embed(ys), embed(xs)), -1).permute(2, 0, 1)
    return pos[None].expand(batch, -1, -1, -1)


class ConvNorm(nn.Conv2d):
    """detectron2's ``Conv2d`` with ``norm`` (and an optional ReLU): keys ``weight``,
    ``norm.weight``, ``norm.bias``."""

    def __init__(self, cin: int, cout: int, kernel: int, relu: bool) -> None:
        super().__init__(cin, cout, kernel, padding=kernel // 2, bias=False)
        self.norm = nn.GroupNorm(32, cout)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(super().forward(x))
        return F.relu(x) if self.relu else x


class EncoderLayer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.self_attn = MSDeformAttn(dim, LEVELS, HEADS, 4)
        self.norm1 = nn.LayerNorm(dim)
        self.linear1 = nn.Linear(dim, FFN)
        self.linear2 = nn.Linear(FFN, dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, src, pos, ref, shapes):
        src = self.norm1(src + self.self_attn(src + pos, ref, src, shapes))
        return self.norm2(src + self.linear2(F.relu(self.linear1(src))))


class EncoderOnly(nn.Module):
    """``MSDeformAttnTransformerEncoderOnly``: keys ``level_encoding``, ``encoder.layers.*``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.level_encoding = nn.Parameter(torch.randn(LEVELS, dim))
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(EncoderLayer(dim) for _ in range(ENC_LAYERS))


class PixelDecoder(nn.Module):
    def __init__(self, in_channels: int, dim: int) -> None:
        super().__init__()
        self.input_convs = nn.ModuleList(
            nn.Sequential(nn.Conv2d(in_channels, dim, 1), nn.GroupNorm(32, dim))
            for _ in range(LEVELS))
        self.encoder = EncoderOnly(dim)
        self.mask_feature = nn.Conv2d(dim, dim, 1)
        self.lateral_convs = nn.ModuleList([ConvNorm(in_channels, dim, 1, relu=False)])
        self.output_convs = nn.ModuleList([ConvNorm(dim, dim, 3, relu=True)])

    def forward(self, feats: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """feats: the four adapter maps, strides 4..32 -> (mask features, three encoder maps
        coarsest first)."""
        coarse = list(feats[1:])[::-1]  # strides 32, 16, 8
        batch, dim = feats[0].shape[0], self.mask_feature.in_channels
        shapes = [tuple(f.shape[-2:]) for f in coarse]
        srcs, pos = [], []
        for level, (feat, proj) in enumerate(zip(coarse, self.input_convs)):
            srcs.append(proj(feat).flatten(2).transpose(1, 2))
            embed = sine_position(batch, *feat.shape[-2:], dim // 2).flatten(2).transpose(1, 2)
            pos.append(embed + self.encoder.level_encoding[level].view(1, 1, -1))
        src, pos = torch.cat(srcs, 1), torch.cat(pos, 1)
        ref = reference_points(shapes)
        for layer in self.encoder.encoder.layers:
            src = layer(src, pos, ref, shapes)
        outs = [part.transpose(1, 2).reshape(batch, dim, h, w)
                for part, (h, w) in zip(src.split([h * w for h, w in shapes], 1), shapes)]
        lateral = self.lateral_convs[0](feats[0])
        fused = lateral + F.interpolate(outs[-1], size=lateral.shape[-2:], mode='bilinear',
                                        align_corners=False)
        outs.append(self.output_convs[0](fused))
        return self.mask_feature(outs[-1]), outs[:LEVELS]


class AttentionLayer(nn.Module):
    """Self- (``self_attn``) or cross- (``multihead_attn``) attention, post-norm."""

    def __init__(self, dim: int, name: str) -> None:
        super().__init__()
        self.name = name
        setattr(self, name, nn.MultiheadAttention(dim, HEADS))
        self.norm = nn.LayerNorm(dim)

    def forward(self, tgt, memory, query_pos, pos, mask=None):
        attn = getattr(self, self.name)
        out = attn(tgt + query_pos, memory + pos, memory, attn_mask=mask)[0]
        return self.norm(tgt + out)


class FFNLayer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(dim, FFN)
        self.linear2 = nn.Linear(FFN, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(x + self.linear2(F.relu(self.linear1(x))))


class MaskMLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x) if index == 2 else F.relu(layer(x))
        return x


class Predictor(nn.Module):
    """``MultiScaleMaskedTransformerDecoder`` (in_channels == hidden: no input projection)."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.transformer_self_attention_layers = nn.ModuleList(
            AttentionLayer(dim, 'self_attn') for _ in range(DEC_LAYERS))
        self.transformer_cross_attention_layers = nn.ModuleList(
            AttentionLayer(dim, 'multihead_attn') for _ in range(DEC_LAYERS))
        self.transformer_ffn_layers = nn.ModuleList(FFNLayer(dim) for _ in range(DEC_LAYERS))
        self.post_norm = nn.LayerNorm(dim)
        self.query_feat = nn.Embedding(QUERIES, dim)
        self.query_embed = nn.Embedding(QUERIES, dim)
        self.level_embed = nn.Embedding(LEVELS, dim)
        self.class_embed = nn.Linear(dim, num_classes + 1)
        self.mask_embed = MaskMLP(dim)

    def heads(self, output, mask_features, size):
        decoded = self.post_norm(output).transpose(0, 1)  # (B, Q, C)
        masks = torch.einsum('bqc,bchw->bqhw', self.mask_embed(decoded), mask_features)
        small = F.interpolate(masks, size=size, mode='bilinear', align_corners=False)
        attn_mask = small.sigmoid().flatten(2).repeat_interleave(HEADS, dim=0) < 0.5
        return self.class_embed(decoded), masks, attn_mask

    def forward(self, maps: List[torch.Tensor], mask_features: torch.Tensor):
        batch, dim = maps[0].shape[:2]
        srcs, pos = [], []
        for level, feat in enumerate(maps):
            srcs.append((feat.flatten(2) + self.level_embed.weight[level][None, :, None])
                        .permute(2, 0, 1))
            pos.append(sine_position(batch, *feat.shape[-2:], dim // 2).flatten(2)
                       .permute(2, 0, 1))
        query_pos = self.query_embed.weight[:, None].repeat(1, batch, 1)
        output = self.query_feat.weight[:, None].repeat(1, batch, 1)
        logits, masks, attn_mask = self.heads(output, mask_features, maps[0].shape[-2:])
        for index in range(DEC_LAYERS):
            level = index % LEVELS
            attn_mask[attn_mask.all(-1)] = False  # a query masked everywhere sees everything
            output = self.transformer_cross_attention_layers[index](
                output, srcs[level], query_pos, pos[level], attn_mask)
            output = self.transformer_self_attention_layers[index](
                output, output, query_pos, query_pos)
            output = self.transformer_ffn_layers[index](output)
            logits, masks, attn_mask = self.heads(output, mask_features,
                                                  maps[(index + 1) % LEVELS].shape[-2:])
        return logits, masks


class M2FHeadReference(nn.Module):
    """``segmentation_model.1`` of the official segmentor."""

    def __init__(self, in_channels: int, hidden_dim: int, num_classes: int) -> None:
        super().__init__()
        self.pixel_decoder = PixelDecoder(in_channels, hidden_dim)
        self.predictor = Predictor(hidden_dim, num_classes)

    def predict(self, feats: Sequence[torch.Tensor], rescale_to: Tuple[int, int]
                ) -> torch.Tensor:
        """``Mask2FormerHead.predict`` then ``make_inference``'s m2f step: the last layer's masks
        resized (bilinear) to ``rescale_to``; softmax over the classes without the no-object
        column times sigmoid masks, summed over queries -> (B, K, H, W)."""
        mask_features, maps = self.pixel_decoder(feats)
        logits, masks = self.predictor(maps, mask_features)
        masks = F.interpolate(masks, size=rescale_to, mode='bilinear', align_corners=False)
        return torch.einsum('bqc,bqhw->bchw', logits.softmax(-1)[..., :-1], masks.sigmoid())


def official_segmentor_state_dict(adapter: nn.Module, head: nn.Module) -> StateDict:
    """What the released ``dinov3_*_ade20k_m2f_head-*.pth`` holds: ``FeatureDecoder``'s
    ``segmentation_model.0`` (the adapter, no trunk) and ``segmentation_model.1`` (the head)."""
    return {**{f'segmentation_model.0.{k}': v for k, v in adapter.state_dict().items()},
            **{f'segmentation_model.1.{k}': v for k, v in head.state_dict().items()}}
