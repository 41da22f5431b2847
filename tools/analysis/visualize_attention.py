"""Draw one block's attention maps, one panel per head, over the image.

For each head it shows the attention that the tokens receive, averaged over all queries (or
only the query at --query Y X, in pixels), upsampled to the image and overlaid on it. Each
family is built with its analysis settings (global attention for the plain ViTs); windowed maps
are drawn window by window.

Example:
    python tools/analysis/visualize_attention.py demo.jpg deepvit:s --block 15 --out attn.png
    python tools/analysis/visualize_attention.py demo.jpg cait:xxs24 --block 3 --query 100 120 \\
        --checkpoint checkpoints/XXS24_224.pth --out attn_q.png
"""
import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mmvit_ext  # noqa: F401,E402
from mmvit_ext.analysis import capture  # noqa: E402
from attention_collapse import MEAN, STD, build  # noqa: E402


def head_maps(attn: torch.Tensor, grid, query=None) -> torch.Tensor:
    """A block's map (1, [windows,] H, N, M) -> per-head (H, gh, gw) attention over the grid.

    Global maps over ``gh*gw`` (+ prefix) tokens are read directly; windowed maps are
    stitched back window by window (each window's columns averaged over its own queries)."""
    gh, gw = grid
    attn = attn[0]
    if attn.dim() == 3:  # (H, N, M) global
        if attn.shape[-1] != attn.shape[-2]:
            raise SystemExit('error: this block attends to spatially reduced keys/values (fewer '
                             'keys than queries), which have no place on the image grid')
        prefix = attn.shape[-1] - gh * gw
        rows = attn[:, prefix:, prefix:] if prefix else attn
        if query is not None:
            received = rows[:, query[0] * gw + query[1]]
        else:
            received = rows.mean(dim=1)
        return received.reshape(-1, gh, gw)
    windows, heads, n, _ = attn.shape
    side = int(math.isqrt(n))
    per_window = attn.mean(dim=2).reshape(windows, heads, side, side)
    cols = math.ceil(gw / side)
    rows = windows // cols
    full = per_window.reshape(rows, cols, heads, side, side).permute(2, 0, 3, 1, 4)
    return full.reshape(heads, rows * side, cols * side)[:, :gh, :gw]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('image')
    parser.add_argument('backbone', help='FAMILY:ARCH, e.g. deepvit:s')
    parser.add_argument('--block', type=int, default=-1, help='block index (negative from end)')
    parser.add_argument('--checkpoint')
    parser.add_argument('--size', type=int, nargs=2, default=(224, 224), metavar=('H', 'W'))
    parser.add_argument('--query', type=int, nargs=2, metavar=('Y', 'X'),
                        help='show the attention of the token at this pixel instead of the mean')
    parser.add_argument('--out', default='attention.png')
    args = parser.parse_args()
    import mmcv
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    if not Path(args.image).is_file():
        raise SystemExit(f'error: image {args.image} does not exist')
    rgb = mmcv.imresize(mmcv.imread(args.image, channel_order='rgb'), tuple(args.size[::-1]))
    model = build(args.backbone, args.checkpoint, {})
    x = ((torch.from_numpy(rgb).permute(2, 0, 1).float() - MEAN) / STD)[None]
    maps, _ = capture(model, x)
    if not -len(maps) <= args.block < len(maps):
        raise SystemExit(f'error: --block {args.block} out of range; the model has '
                         f'{len(maps)} blocks')
    attn = maps[args.block]
    patch = model.attention_blocks()[args.block % len(maps)].stride
    grid = (math.ceil(args.size[0] / patch), math.ceil(args.size[1] / patch))
    query = None
    if args.query:
        query = (min(args.query[0] // patch, grid[0] - 1), min(args.query[1] // patch, grid[1] - 1))
    per_head = head_maps(attn, grid, query)
    heads = per_head.shape[0]
    up = F.interpolate(per_head[None], size=tuple(args.size), mode='bilinear',
                       align_corners=False)[0]
    cols = min(heads, 6)
    rows = math.ceil(heads / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.6 * rows), dpi=100,
                             squeeze=False)
    for h, ax in enumerate(axes.flat):
        ax.axis('off')
        if h < heads:
            heat = up[h].numpy()
            heat = (heat - heat.min()) / max(heat.max() - heat.min(), 1e-12)
            ax.imshow(rgb)
            ax.imshow(heat, cmap='jet', alpha=0.5)
            ax.set_title(f'head {h}', fontsize=9)
    what = f'query at {args.query}' if args.query else 'mean over queries'
    fig.suptitle(f'{args.backbone} block {args.block % len(maps)}: {what}', fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out)
    plt.close(fig)
    print(f'wrote {args.out}: {heads} heads, {grid[0]}x{grid[1]} tokens')


if __name__ == '__main__':
    main()
