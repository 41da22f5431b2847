"""EoMT written from the official semantics (tue-mps/eomt ``models/eomt.py``,
``models/scale_block.py``), none of mmvit_ext's code: the official forward run over timm's
DINOv2-with-registers ViT (the DINOv2 form, as ``models/vit.py`` builds it from timm) or over an
official-layout DINOv3 state dict (the DINOv3 form; :mod:`dinov3_reference`'s functions).

The mask module keeps the official names (``q``, ``class_head``, ``mask_head``, ``upscale``), so
a state dict moves between this module and mmvit_ext's ``EoMT`` as it is.
"""
import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from dinov3_reference import _rope, _rot

Prediction = Tuple[List[torch.Tensor], List[torch.Tensor]]


class RefScaleBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(dim, dim, kernel_size=2, stride=2)
        self.act = nn.GELU()
        self.conv2 = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim, bias=False)
        self.norm = nn.LayerNorm(dim, eps=1e-6)  # timm LayerNorm2d: over channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv2(self.act(self.conv1(x)))
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RefMaskModule(nn.Module):
    """The official queries, class head, 3-layer mask MLP and scale blocks."""

    def __init__(self, dim: int, num_classes: int, num_q: int, patch: int) -> None:
        super().__init__()
        self.q = nn.Embedding(num_q, dim)
        self.class_head = nn.Linear(dim, num_classes + 1)
        self.mask_head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim),
                                       nn.GELU(), nn.Linear(dim, dim))
        self.upscale = nn.Sequential(*[RefScaleBlock(dim)
                                       for _ in range(max(1, int(math.log2(patch)) - 2))])
        self.num_q = num_q

    def predict(self, x: torch.Tensor, num_prefix: int, grid: Tuple[int, int]
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        q = x[:, :self.num_q]
        patches = x[:, self.num_q + num_prefix:].transpose(1, 2).reshape(x.shape[0], -1, *grid)
        masks = torch.einsum('bqc, bchw -> bqhw', self.mask_head(q), self.upscale(patches))
        return masks, self.class_head(q)

    def attn_mask(self, n: int, mask_logits: torch.Tensor, num_prefix: int,
                  grid: Tuple[int, int], prob: float) -> torch.Tensor:
        """(B, N, N) boolean, True where attention is allowed (the official ``_attn_mask``)."""
        b = mask_logits.shape[0]
        mask = torch.ones(b, n, n, dtype=torch.bool)
        resized = F.interpolate(mask_logits, grid, mode='bilinear')
        mask[:, :self.num_q, self.num_q + num_prefix:] = resized.flatten(2) > 0
        if prob < 1:
            drop = torch.rand(b, self.num_q) > prob
            mask[:, :self.num_q, self.num_q + num_prefix:][drop] = True
        return mask


def _run(head: RefMaskModule, tokens: torch.Tensor, depth: int, num_blocks: int,
         probs: Sequence[float], num_prefix: int, grid: Tuple[int, int], norm, block_fn,
         masked: bool = True) -> Prediction:
    """The official block loop: queries before block ``depth - num_blocks``, a prediction and a
    mask before each query block, a prediction after the last."""
    masks, classes = [], []
    for i in range(depth):
        mask = None
        if i == depth - num_blocks:
            tokens = torch.cat([head.q.weight[None].expand(tokens.shape[0], -1, -1), tokens], 1)
        if masked and i >= depth - num_blocks:
            mask_logits, class_logits = head.predict(norm(tokens), num_prefix, grid)
            masks.append(mask_logits)
            classes.append(class_logits)
            mask = head.attn_mask(tokens.shape[1], mask_logits, num_prefix, grid,
                                  float(probs[i - depth + num_blocks]))
        tokens = block_fn(i, tokens, mask)
    mask_logits, class_logits = head.predict(norm(tokens), num_prefix, grid)
    return masks + [mask_logits], classes + [class_logits]


def timm_eomt(vit: nn.Module, head: RefMaskModule, x: torch.Tensor, num_blocks: int,
              probs: Sequence[float], masked: bool = True) -> Prediction:
    """The official forward over a timm ``VisionTransformer`` (its ``_attn``, non-RoPE path)."""
    grid = tuple(s // vit.patch_embed.patch_size[0] for s in x.shape[-2:])
    tokens = vit._pos_embed(vit.patch_embed(x))

    def block_fn(i: int, tokens: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        block = vit.blocks[i]
        attn = block.attn
        y = block.norm1(tokens)
        b, n, c = y.shape
        qkv = attn.qkv(y).reshape(b, n, 3, attn.num_heads, attn.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        if mask is not None:
            mask = mask[:, None].expand(-1, attn.num_heads, -1, -1)
        y = F.scaled_dot_product_attention(q, k, v, mask, 0.0)
        y = attn.proj_drop(attn.proj(y.transpose(1, 2).reshape(b, n, c)))
        tokens = tokens + block.ls1(y)
        return tokens + block.ls2(block.mlp(block.norm2(tokens)))

    return _run(head, tokens, len(vit.blocks), num_blocks, probs, vit.num_prefix_tokens, grid,
                vit.norm, block_fn, masked)


def _dinov3_block(sd: dict, p: str, x: torch.Tensor, rope, heads: int, eps: float,
                  mask: Optional[torch.Tensor]) -> torch.Tensor:
    """A DINOv3 block (official layout, MLP FFN): RoPE on the last h*w tokens, the boolean
    mask as SDPA takes it (transformers' DINOv3 attention, the official EoMT's RoPE path)."""
    dim = x.shape[-1]
    b, n, _ = x.shape
    y = F.layer_norm(x, (dim,), sd[p + 'norm1.weight'], sd[p + 'norm1.bias'], eps)
    bias = sd[p + 'attn.qkv.bias'] * sd[p + 'attn.qkv.bias_mask']
    q, k, v = F.linear(y, sd[p + 'attn.qkv.weight'], bias).reshape(
        b, n, 3, heads, dim // heads).permute(2, 0, 3, 1, 4).unbind(0)
    sin, cos = rope
    pre = n - sin.shape[0]
    q = torch.cat([q[:, :, :pre], _rot(q[:, :, pre:], sin, cos)], dim=2)
    k = torch.cat([k[:, :, :pre], _rot(k[:, :, pre:], sin, cos)], dim=2)
    if mask is not None:
        mask = mask[:, None].expand(-1, heads, -1, -1)
    y = F.scaled_dot_product_attention(q, k, v, mask).transpose(1, 2).reshape(b, n, dim)
    x = x + sd[p + 'ls1.gamma'] * F.linear(y, sd[p + 'attn.proj.weight'], sd[p + 'attn.proj.bias'])
    y = F.layer_norm(x, (dim,), sd[p + 'norm2.weight'], sd[p + 'norm2.bias'], eps)
    y = F.linear(F.gelu(F.linear(y, sd[p + 'mlp.fc1.weight'], sd[p + 'mlp.fc1.bias'])),
                 sd[p + 'mlp.fc2.weight'], sd[p + 'mlp.fc2.bias'])
    return x + sd[p + 'ls2.gamma'] * y


def dinov3_eomt(sd: dict, cfg: dict, head: RefMaskModule, x: torch.Tensor, num_blocks: int,
                probs: Sequence[float], patch: int = 16, eps: float = 1e-5) -> Prediction:
    """The official forward over a DINOv3 trunk given as an official-layout state dict."""
    dim, b = cfg['embed_dim'], x.shape[0]
    grid = (x.shape[-2] // patch, x.shape[-1] // patch)
    tokens = F.conv2d(x, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=patch)
    tokens = torch.cat([sd['cls_token'].expand(b, -1, -1), sd['storage_tokens'].expand(b, -1, -1),
                        tokens.flatten(2).transpose(1, 2)], dim=1)
    rope = _rope(sd, *grid)

    def norm(t: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(t, (dim,), sd['norm.weight'], sd['norm.bias'], eps)

    def block_fn(i: int, tokens: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        return _dinov3_block(sd, f'blocks.{i}.', tokens, rope, cfg['num_heads'], eps, mask)

    num_prefix = 1 + sd['storage_tokens'].shape[1]
    return _run(head, tokens, cfg['depth'], num_blocks, probs, num_prefix, grid, norm, block_fn)


# ---- the official loss (training/mask_classification_loss.py: transformers' Mask2FormerLoss) ---
def _sample(x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """(N, 1, H, W) at (N, P, 2) [0, 1] points -> (N, P), bilinear, align_corners=False."""
    return F.grid_sample(x, 2.0 * coords.unsqueeze(2) - 1.0, align_corners=False)[:, 0, :, 0]


def _pair_bce(pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
    pos = F.binary_cross_entropy_with_logits(pred, torch.ones_like(pred), reduction='none')
    neg = F.binary_cross_entropy_with_logits(pred, torch.zeros_like(pred), reduction='none')
    return (pos @ gt.T + neg @ (1 - gt).T) / pred.shape[1]


def _pair_dice(pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
    prob = pred.sigmoid()
    return 1 - (2 * prob @ gt.T + 1) / (prob.sum(-1)[:, None] + gt.sum(-1)[None] + 1)


@torch.no_grad()
def _match(masks: torch.Tensor, classes: torch.Tensor, gt_masks: List[torch.Tensor],
           gt_labels: List[torch.Tensor], num_points: int) -> List[Tuple[torch.Tensor, ...]]:
    from scipy.optimize import linear_sum_assignment
    indices = []
    for i in range(masks.shape[0]):
        coords = torch.rand(1, num_points, 2)
        gt = _sample(gt_masks[i][:, None].float(), coords.repeat(len(gt_masks[i]), 1, 1))
        pred = _sample(masks[i][:, None], coords.repeat(masks.shape[1], 1, 1))
        cost = 5.0 * _pair_bce(pred, gt) - 2.0 * classes[i].softmax(-1)[:, gt_labels[i]] \
            + 5.0 * _pair_dice(pred, gt)
        rows, cols = linear_sum_assignment(cost.numpy())
        indices.append((torch.as_tensor(rows), torch.as_tensor(cols)))
    return indices


def official_loss(masks: torch.Tensor, classes: torch.Tensor, gt_masks: List[torch.Tensor],
                  gt_labels: List[torch.Tensor], num_points: int = 12544,
                  oversample: float = 3.0, importance: float = 0.75,
                  no_object: float = 0.1) -> dict:
    """Unweighted mask BCE, dice and class CE of one prediction, the official way."""
    indices = _match(masks, classes, gt_masks, gt_labels, num_points)
    num_masks = max(float(sum(len(g) for g in gt_labels)), 1.0)
    pred = torch.cat([masks[i][rows] for i, (rows, _) in enumerate(indices)])[:, None]
    gt = torch.cat([gt_masks[i][cols] for i, (_, cols) in enumerate(indices)])[:, None].float()
    with torch.no_grad():
        sampled = int(num_points * oversample)
        coords = torch.rand(pred.shape[0], sampled, 2)
        uncertainty = -_sample(pred, coords).abs()
        top = torch.topk(uncertainty, int(importance * num_points), dim=1)[1]
        coords = torch.gather(coords, 1, top[..., None].expand(-1, -1, 2))
        rest = num_points - int(importance * num_points)
        coords = torch.cat([coords, torch.rand(pred.shape[0], rest, 2)], dim=1)
        labels = _sample(gt, coords)
    logits = _sample(pred, coords)
    bce = F.binary_cross_entropy_with_logits(logits, labels, reduction='none').mean(1).sum()
    prob = logits.sigmoid()
    dice = (1 - (2 * (prob * labels).sum(-1) + 1) / (prob.sum(-1) + labels.sum(-1) + 1)).sum()
    target = torch.full(classes.shape[:2], classes.shape[-1] - 1, dtype=torch.long)
    for i, (rows, cols) in enumerate(indices):
        target[i, rows] = gt_labels[i][cols]
    weight = torch.ones(classes.shape[-1])
    weight[-1] = no_object
    ce = F.cross_entropy(classes.transpose(1, 2), target, weight=weight)
    return dict(mask=bce / num_masks, dice=dice / num_masks, ce=ce)


# ---- the official panoptic inference (training/lightning_module.py to_per_pixel_preds_panoptic)
def official_panoptic(mask_logits: torch.Tensor, class_logits: torch.Tensor,
                      stuff_classes: Sequence[int], mask_thresh: float = 0.8,
                      overlap_thresh: float = 0.8) -> torch.Tensor:
    """One image's mask logits (Q, H, W) at the image's size and class logits (Q, K + 1) ->
    (H, W, 2): the class per pixel (K: none) and its segment (-1: none); queries kept above
    ``mask_thresh``, pixels to the best score x probability, a segment dropped below
    ``overlap_thresh`` of its own mask, the stuff classes one segment each."""
    num_classes = class_logits.shape[-1] - 1
    scores, classes = class_logits.softmax(-1).max(-1)
    preds = torch.full((*mask_logits.shape[-2:], 2), -1, dtype=torch.long)
    preds[..., 0] = num_classes
    keep = classes.ne(num_classes) & (scores > mask_thresh)
    if not keep.any():
        return preds
    masks = mask_logits[keep].sigmoid()
    segments = torch.full(mask_logits.shape[-2:], -1, dtype=torch.long)
    mask_ids = (scores[keep][:, None, None] * masks).argmax(0)
    stuff_segments, found = {}, []
    for k, class_id in enumerate(classes[keep].tolist()):
        own, won = masks[k] >= 0.5, mask_ids == k
        final = own & won
        if not final.any() or won.sum() / own.sum() < overlap_thresh:
            continue
        if class_id in stuff_classes and class_id in stuff_segments:
            segments[final] = stuff_segments[class_id]
            continue
        if class_id in stuff_classes:
            stuff_segments[class_id] = len(found)
        segments[final] = len(found)
        found.append(class_id)
    for segment_id, class_id in enumerate(found):
        preds[..., 0][segments == segment_id] = class_id
        preds[..., 1][segments == segment_id] = segment_id
    return preds
