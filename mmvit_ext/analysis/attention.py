"""Attention-collapse statistics (DeepViT, Zhou et al. 2021, Sec. 3; Refiner feature evolution).

``M^{p,q}_{h,t} = cos(A^p_{h,:,t}, A^q_{h,:,t})``: the cosine similarity of the attention that
token t receives (column t of head h's map) in layers p and q. Averaged over heads, tokens,
windows and images it gives the layer x layer similarity ``S[p, q]``. Maps of different shapes
(e.g. Swin stages, windowed vs global blocks) are not comparable and give NaN.
"""
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

import torch
from torch import nn

from .. import flags
from ..backbones.base import AttentionBlock
from ..layers import AttentionBase


def _attention_blocks(model: nn.Module) -> List[AttentionBlock]:
    blocks = getattr(model, 'attention_blocks', None)
    if blocks is None:
        raise ValueError(f'{type(model).__name__} is not an mmvit_ext backbone (it has no '
                         f'attention_blocks() to analyse)')
    return blocks()


def trunk_blocks(model: nn.Module) -> List[nn.Module]:
    """The trunk blocks of a backbone in depth order (its ``attention_blocks()``)."""
    return [entry.block for entry in _attention_blocks(model)]


def attention_modules(model: nn.Module) -> List[AttentionBase]:
    """One attention module per trunk block."""
    return [entry.attention for entry in _attention_blocks(model)]


@torch.no_grad()
def capture(model: nn.Module, images: torch.Tensor):
    """Run ``images`` and return (maps, features): per block, its attention map
    (B, [windows,] H, N, M) and its output tokens (B, N, C). Attention runs on the explicit path
    (``flags.fused_attention(False)``: whole maps) while capturing."""
    maps: List[torch.Tensor] = []
    feats: List[torch.Tensor] = []
    handles = []
    for entry in _attention_blocks(model):
        handles.append(entry.attention.attn_map.register_forward_hook(
            lambda m, i, out: maps.append(out.detach().float())))
        handles.append(entry.block.register_forward_hook(
            lambda m, i, out: feats.append((out[0] if isinstance(out, tuple) else out)
                                           .detach().float())))
    try:
        model.eval()
        with flags.fused_attention(False):
            model(images)
    finally:
        for handle in handles:
            handle.remove()
    return maps, feats


def _columns(attn: torch.Tensor) -> torch.Tensor:
    """(..., H, N, M) -> unit-norm columns (..., H, M, N)."""
    cols = attn.transpose(-2, -1)
    return cols / cols.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def cross_layer_similarity(maps: Sequence[torch.Tensor]) -> torch.Tensor:
    """S[p, q] = mean over images, windows, heads and tokens of M^{p,q}_{h,t}; NaN where the
    maps' shapes differ."""
    cols = [_columns(m) for m in maps]
    n = len(cols)
    sim = torch.full((n, n), float('nan'))
    for p in range(n):
        for q in range(p, n):
            if cols[p].shape == cols[q].shape:
                sim[p, q] = sim[q, p] = (cols[p] * cols[q]).sum(-1).mean()
    return sim


def nearest_layer_similarity(sim: torch.Tensor, k: int) -> torch.Tensor:
    """Per layer p: the mean of S[p, q] over its k nearest other layers (|p - q| smallest,
    earlier first on ties), skipping incomparable ones (DeepViT Fig. 3, left)."""
    n = sim.shape[0]
    out = torch.full((n,), float('nan'))
    for p in range(n):
        others = sorted((q for q in range(n) if q != p), key=lambda q: (abs(p - q), q))
        values = [sim[p, q] for q in others[:k] if not torch.isnan(sim[p, q])]
        if values:
            out[p] = torch.stack(values).mean()
    return out


def similar_block_ratio(sim: torch.Tensor, threshold: float = 0.9) -> torch.Tensor:
    """Per layer p: the fraction of other comparable layers q with S[p, q] >= threshold."""
    n = sim.shape[0]
    out = torch.full((n,), float('nan'))
    for p in range(n):
        values = [sim[p, q] for q in range(n) if q != p and not torch.isnan(sim[p, q])]
        if values:
            out[p] = (torch.stack(values) >= threshold).float().mean()
    return out


def cross_head_similarity(attn: torch.Tensor) -> float:
    """Mean cosine similarity of the same token's attention column between different heads of
    one block (1 for a single head)."""
    cols = _columns(attn)  # (..., H, M, N)
    heads = cols.shape[-3]
    if heads == 1:
        return 1.0
    gram = torch.einsum('...hmn,...gmn->...mhg', cols, cols)  # (..., M, H, H)
    off_diag = gram.sum((-2, -1)) - gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    return float((off_diag / (heads * (heads - 1))).mean())


def feature_evolution(feats: Sequence[torch.Tensor]) -> torch.Tensor:
    """Refiner's feature evolution: per block p >= 1, the mean cosine similarity of each token's
    features after block p-1 and block p (NaN for the first)."""
    out = torch.full((len(feats),), float('nan'))
    for p in range(1, len(feats)):
        if feats[p].shape == feats[p - 1].shape:
            out[p] = torch.cosine_similarity(feats[p], feats[p - 1], dim=-1).mean()
    return out


@dataclass
class CollapseStats:
    """Everything the attention-collapse tool writes, averaged over the images."""
    similarity: torch.Tensor                  # (L, L)
    nearest: torch.Tensor                     # (L,)
    similar_ratio: torch.Tensor               # (L,)
    cross_head: torch.Tensor                  # (L,)
    evolution: torch.Tensor                   # (L,)
    k: int = 2
    threshold: float = 0.9
    num_images: int = 0
    extra: Dict[str, float] = field(default_factory=dict)


def collapse_stats(model: nn.Module, batches: Iterable[torch.Tensor], k: int = 2,
                   threshold: float = 0.9, progress: Optional[callable] = None) -> CollapseStats:
    """Average the statistics over image batches (each (B, 3, H, W), all the same size)."""
    sims, heads, evols, count = [], [], [], 0
    iterator = progress(batches) if progress else batches
    for images in iterator:
        maps, feats = capture(model, images)
        weight = images.shape[0]
        sims.append(cross_layer_similarity(maps) * weight)
        heads.append(torch.tensor([cross_head_similarity(m) for m in maps]) * weight)
        evols.append(feature_evolution(feats) * weight)
        count += weight
    if not count:
        raise ValueError('collapse_stats got no images')
    sim = sum(sims) / count
    return CollapseStats(sim, nearest_layer_similarity(sim, k), similar_block_ratio(sim, threshold),
                         sum(heads) / count, sum(evols) / count, k, threshold, count)
