"""Export a config's backbone or whole model to ONNX and check it against PyTorch.

    python tools/deployment/export_onnx.py CONFIG CHECKPOINT --out FILE.onnx \\
        [--part backbone|model] [--shape H W] [--dynamic] [--opset N]

CHECKPOINT: a whole-model checkpoint, a backbone checkpoint in any layout our loader takes, or
``none`` (random weights). ``--part model`` exports the tensor forward (mmseg: segmentation
logits; mmdet single-stage: the head's raw outputs). ``onnx.checker`` runs on the file; ONNX
Runtime is then compared with PyTorch -- with ``--dynamic`` at two sizes (and batches) other than
the export's, else at the export shape -- and the max relative diff is printed.
"""
import argparse
import sys

import torch
from mmengine.config import DictAction

from mmvit_ext import deploy


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', help="checkpoint file, or 'none' for random weights")
    parser.add_argument('--out', required=True, help='the .onnx file to write')
    parser.add_argument('--part', choices=('backbone', 'model'), default='backbone')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='export size (default: a little above the smallest dynamic size)')
    parser.add_argument('--dynamic', action='store_true',
                        help='dynamic batch, height and width')
    parser.add_argument('--min-size', type=int,
                        help='smallest side the dynamic graph serves (default: the smallest with '
                        'a fixed window layout; lower exports slower)')
    parser.add_argument('--opset', type=int, default=deploy.DEFAULT_OPSET)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='override config settings, key=value (as in tools/train.py)')
    parser.add_argument('--tolerance', type=float, default=1e-4,
                        help='max relative diff accepted (exit 1 above it)')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    model = deploy.build_from_config(args.config, args.checkpoint, args.cfg_options)
    root = deploy.export_root(model, args.part)
    low = deploy.min_dynamic_size(root)
    if args.min_size is not None:
        floor = deploy.min_dynamic_size(root, fixed_windows=False)
        if args.min_size < floor:
            raise SystemExit(f'--min-size {args.min_size}: the deepest map must be at least 2 '
                             f'pixels, i.e. sides >= {floor}')
        low = args.min_size
    height, width = args.shape or deploy.export_shape(low)
    if args.dynamic and min(height, width) < low:
        raise SystemExit(f'--shape {height} {width}: a dynamic graph of this model serves sides '
                         f'>= {low} (--min-size, mmvit_ext.deploy.min_dynamic_size)')
    deploy.export_onnx(root, torch.randn(2, 3, height, width), args.out, dynamic=args.dynamic,
                       min_size=low, opset=args.opset)
    axes = f'dynamic batch / height / width (sides >= {low})' if args.dynamic else 'static'
    print(f'[export] {args.out}: {args.part}, opset {args.opset}, {axes}; onnx.checker passed')
    session = deploy.ort_session(args.out)
    checks = deploy.check_sizes(height, width, low) if args.dynamic else [(2, height, width)]
    worst = 0.0
    for batch, h, w in checks:
        diff = deploy.max_relative_diff(root, session, torch.randn(batch, 3, h, w))
        worst = max(worst, diff)
        print(f'[check] batch {batch} at {h}x{w}: max relative diff vs PyTorch {diff:.2e}')
    print(f'[result] max relative diff {worst:.2e} (tolerance {args.tolerance:.0e})')
    return 0 if worst <= args.tolerance else 1


if __name__ == '__main__':
    sys.exit(main())
