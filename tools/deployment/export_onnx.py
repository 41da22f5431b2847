"""Export a config's backbone or whole model to ONNX and check it against PyTorch.

    python tools/deployment/export_onnx.py CONFIG CHECKPOINT --out FILE.onnx \
        [--part backbone|model] [--shape H W] [--dynamic] [--opset N]

CHECKPOINT may be any layout our loader takes, or ``none`` (random weights). The exporter is
torch's dynamo exporter (see :mod:`mmvit_ext.deploy` for why); ONNX Runtime is compared with
PyTorch at two sizes other than the export shape and the max relative diff is printed.
"""
import argparse

import torch

from mmvit_ext import deploy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('--out', required=True)
    parser.add_argument('--part', choices=('backbone', 'model'), default='backbone')
    parser.add_argument('--shape', type=int, nargs=2, default=None, metavar=('H', 'W'))
    parser.add_argument('--dynamic', action='store_true')
    parser.add_argument('--opset', type=int, default=deploy.DEFAULT_OPSET)
    args = parser.parse_args()
    model = deploy.build_from_config(args.config, args.checkpoint)
    root = deploy.export_root(model, args.part).eval()
    low = deploy.min_size_of(root)
    height, width = args.shape or (low + 32, low + 64)
    example = torch.randn(2, 3, height, width)
    deploy.export_onnx(root, example, args.out, deploy.names_of(root, example),
                       dynamic=args.dynamic, min_size=low, opset=args.opset)
    print(f'[export] {args.out}: onnx.checker passed')
    session = deploy.ort_session(args.out)
    sizes = [(1, height + 16, width + 48), (3, height + 40, width)] if args.dynamic \
        else [(2, height, width)]
    for batch, h, w in sizes:
        diff, _ = deploy.max_relative_diff(root, session, torch.randn(batch, 3, h, w))
        print(f'[check] batch {batch} at {h}x{w}: max relative diff vs PyTorch {diff:.2e}')


if __name__ == '__main__':
    main()
