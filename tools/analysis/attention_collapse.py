"""Attention collapse: how similar are the attention maps of different blocks (DeepViT) and how
fast do token features evolve (Refiner)?

Feeds images (a folder, or the built-in synthetic shapes) through a backbone, captures every
block's attention map and writes to --out:
  similarity.csv          layer x layer similarity S[p, q] (DeepViT's M^{p,q} averaged)
  layers.csv              per layer: similarity to its k nearest layers, similar-block ratio
                          (share of other layers with S >= --threshold), cross-head similarity,
                          feature evolution (token cosine similarity to the previous block)
  similarity_heatmap.png  S as a heatmap
  collapse_curves.png     the per-layer curves (DeepViT Fig. 3 style)
With --compare-plain the same model with its map transforms removed (re-attention / talking
heads off, same weights) is analysed too and drawn dashed. Each family is built with its
analysis settings (global attention for the plain ViTs, unless --set window_size=N); windowed
attention is analysed per window (layers with maps of different shapes, e.g. of different
stages, are not comparable and show as blank).

Example:
    python tools/analysis/attention_collapse.py deepvit:s --compare-plain --out work_dirs/collapse
    python tools/analysis/attention_collapse.py deepvit:s --checkpoint checkpoints/deepvit_s.pth.tar \\
        --images data/coco/val2017 --num-images 64 --out work_dirs/collapse_s
"""
import argparse
import copy
import csv
import sys
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mmvit_ext  # noqa: F401,E402
from mmvit_ext.backbones import preset_config  # noqa: E402
from mmvit_ext.analysis import CollapseStats, attention_modules, collapse_stats  # noqa: E402
from mmvit_ext.datasets.synthetic_shapes import render_scene  # noqa: E402

MEAN = torch.tensor([123.675, 116.28, 103.53]).view(3, 1, 1)
STD = torch.tensor([58.395, 57.12, 57.375]).view(3, 1, 1)


def load_images(folder: str, num: int, size) -> List[torch.Tensor]:
    """Normalised (3, H, W) tensors: from image files in ``folder`` or the synthetic shapes."""
    import mmcv
    if folder:
        paths = sorted(p for p in Path(folder).iterdir()
                       if p.suffix.lower() in ('.jpg', '.jpeg', '.png', '.bmp'))[:num]
        if not paths:
            raise SystemExit(f'error: no .jpg/.png images in {folder}')
        arrays = [mmcv.imresize(mmcv.imread(str(p), channel_order='rgb'), size[::-1])
                  for p in paths]
    else:
        rng = np.random.default_rng(0)
        arrays = [render_scene(rng, tuple(size))[0] for _ in range(num)]
    return [(torch.from_numpy(a).permute(2, 0, 1).float() - MEAN) / STD for a in arrays]


def batches(images: List[torch.Tensor], batch: int) -> Iterator[torch.Tensor]:
    for i in range(0, len(images), batch):
        yield torch.stack(images[i:i + batch])


def build(spec: str, checkpoint: str, settings: dict) -> nn.Module:
    try:
        cfg = preset_config(spec, drop_path_rate=0.0)
    except ValueError as error:
        raise SystemExit(f'error: {error}')
    cfg.update(mmvit_ext.registry.MODELS.get(cfg['type']).analysis_settings)
    cfg.update(settings)
    if checkpoint:
        cfg['init_cfg'] = dict(type='Pretrained', checkpoint=checkpoint)
    model = mmvit_ext.registry.MODELS.build(cfg)
    model.init_weights()
    return model.eval()


def without_transforms(model: nn.Module) -> nn.Module:
    """The same weights with every attention-map transform removed (plain attention)."""
    plain = copy.deepcopy(model)
    removed = 0
    for attn in attention_modules(plain):
        removed += len(attn.map_transforms)
        attn.map_transforms = nn.ModuleList()
    if not removed:
        raise SystemExit(f'error: {type(model).__name__} has no map transforms to remove '
                         f'(--compare-plain works for DeepViT re-attention and CaiT talking heads)')
    return plain


def write_csv(out: Path, stats: CollapseStats, plain: CollapseStats = None) -> None:
    n = stats.similarity.shape[0]
    with open(out / 'similarity.csv', 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['layer'] + [str(q) for q in range(n)])
        for p in range(n):
            writer.writerow([p] + [f'{v:.6f}' for v in stats.similarity[p].tolist()])
    columns = ('nearest', 'similar_ratio', 'cross_head', 'evolution')
    with open(out / 'layers.csv', 'w', newline='') as f:
        writer = csv.writer(f)
        header = ['layer', f'similarity_to_{stats.k}_nearest', 'similar_block_ratio',
                  'cross_head_similarity', 'feature_evolution']
        writer.writerow(header + ([f'plain_{h}' for h in header[1:]] if plain else []))
        for p in range(n):
            row = [p] + [f'{getattr(stats, c)[p].item():.6f}' for c in columns]
            if plain:
                row += [f'{getattr(plain, c)[p].item():.6f}' for c in columns]
            writer.writerow(row)


def y_limits(*curves: torch.Tensor) -> tuple:
    """0 to 1.02, extended below 0 when a curve goes negative (cosine similarities can)."""
    values = torch.cat([c[~torch.isnan(c)] for c in curves])
    low = float(values.min()) if values.numel() else 0.0
    return (0.0 if low >= 0 else float(np.floor((low - 0.02) * 10) / 10), 1.02)


def plot(out: Path, stats: CollapseStats, title: str, plain: CollapseStats = None) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    n = stats.similarity.shape[0]
    fig, ax = plt.subplots(figsize=(5, 4.2), dpi=100)
    image = ax.imshow(stats.similarity.numpy(), vmin=y_limits(stats.similarity.flatten())[0],
                      vmax=1, cmap='viridis')
    ax.set(xlabel='layer q', ylabel='layer p', title=f'{title}: cross-layer similarity')
    fig.colorbar(image, ax=ax, label='cosine similarity S[p, q]')
    fig.tight_layout()
    fig.savefig(out / 'similarity_heatmap.png')
    plt.close(fig)
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6), dpi=100)
    layers = np.arange(n)
    curves = (('nearest', f'similarity to {stats.k} nearest layers', 'mean cosine similarity'),
              ('similar_ratio', f'similar-block ratio (S >= {stats.threshold})',
               'share of other blocks'),
              ('cross_head', 'cross-head similarity', 'mean cosine similarity'),
              ('evolution', 'feature evolution', 'cosine similarity to previous block'))
    for ax, (attr, label, ylabel) in zip(axes, curves):
        values = [getattr(stats, attr)] + ([getattr(plain, attr)] if plain is not None else [])
        ax.plot(layers, values[0].numpy(), 'o-', label=title)
        if plain is not None:
            ax.plot(layers, values[1].numpy(), 's--', label='plain attention')
        ax.axhline(0, color='grey', linewidth=0.6)
        ax.set(xlabel='block', ylabel=ylabel, title=label, ylim=y_limits(*values))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / 'collapse_curves.png')
    plt.close(fig)


def transform_blocks(model: nn.Module) -> List[int]:
    """Blocks whose attention has map transforms (DeepViT re-attention, CaiT talking heads)."""
    return [i for i, attn in enumerate(attention_modules(model)) if len(attn.map_transforms)]


def nearest_means(stats: CollapseStats, blocks: List[int]) -> dict:
    """Mean similarity to the k nearest layers over all blocks, over ``blocks`` and the rest."""
    n = stats.nearest.shape[0]
    rest = [i for i in range(n) if i not in blocks]
    means = dict(all=float(torch.nanmean(stats.nearest)))
    for key, subset in (('transform', blocks), ('other', rest)):
        means[key] = float(torch.nanmean(stats.nearest[subset])) if subset else float('nan')
    return means


def span(blocks: List[int]) -> str:
    """[11, 12, 13] -> '11-13'."""
    if blocks and blocks == list(range(blocks[0], blocks[-1] + 1)):
        return f'{blocks[0]}-{blocks[-1]}' if len(blocks) > 1 else str(blocks[0])
    return ','.join(map(str, blocks))


def summary_line(name: str, stats: CollapseStats, blocks: List[int],
                 note: str = 'map transforms') -> str:
    """The figures the README quotes: the means of :func:`nearest_means`."""
    means = nearest_means(stats, blocks)
    n = stats.nearest.shape[0]
    line = (f'{name}: mean similarity to {stats.k} nearest layers {means["all"]:.3f} over all '
            f'{n} blocks')
    if blocks:
        line += (f', {means["transform"]:.3f} over blocks {span(blocks)} ({note}), '
                 f'{means["other"]:.3f} over the other blocks')
    return line


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('backbone', help='FAMILY:ARCH, e.g. deepvit:s, cait:xxs24, swin:tiny')
    parser.add_argument('--checkpoint', help='official or mmvit_ext weights (default: random)')
    parser.add_argument('--images', help='folder of images (default: built-in synthetic shapes)')
    parser.add_argument('--num-images', type=int, default=8)
    parser.add_argument('--batch', type=int, default=4)
    parser.add_argument('--size', type=int, nargs=2, default=(224, 224), metavar=('H', 'W'))
    parser.add_argument('--k', type=int, default=2, help='nearest layers for the first curve')
    parser.add_argument('--threshold', type=float, default=0.9)
    parser.add_argument('--compare-plain', action='store_true')
    parser.add_argument('--set', nargs='+', default=[], metavar='KEY=VALUE',
                        help='backbone arguments (Python literals), e.g. window_size=14')
    parser.add_argument('--out', default='work_dirs/attention_collapse')
    parser.add_argument('--seed', type=int, default=0, help='seed of the random weights')
    return parser.parse_args(argv)


def measure(args: argparse.Namespace, progress: Optional[Callable] = None
            ) -> Tuple[nn.Module, CollapseStats, Optional[CollapseStats]]:
    """(model, its statistics, those of plain attention or ``None``) for parsed arguments."""
    from benchmark import parse_settings
    torch.manual_seed(args.seed)  # untrained weights: the same figures on every run
    model = build(args.backbone, args.checkpoint, parse_settings(args.set))
    images = load_images(args.images, args.num_images, args.size)
    stats = collapse_stats(model, batches(images, args.batch), args.k, args.threshold, progress)
    plain = (collapse_stats(without_transforms(model), batches(images, args.batch), args.k,
                            args.threshold, progress) if args.compare_plain else None)
    return model, stats, plain


def main() -> None:
    from mmengine.utils import track_iter_progress
    args = parse_args()
    model, stats, plain = measure(
        args, lambda items: track_iter_progress(list(items), file=sys.stderr))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out, stats, plain)
    plot(out, stats, args.backbone, plain)
    blocks = transform_blocks(model)
    print(f'{stats.num_images} images; ' + summary_line(args.backbone, stats, blocks))
    if plain is not None:
        print(summary_line('plain attention', plain, blocks, 'transforms removed'))
    print(f'wrote {out}/similarity.csv, layers.csv, similarity_heatmap.png, collapse_curves.png')


if __name__ == '__main__':
    main()
