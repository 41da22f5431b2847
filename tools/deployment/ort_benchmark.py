"""ONNX Runtime (CPU) latency vs PyTorch eager for the same model, input and thread count.

    python tools/deployment/ort_benchmark.py CONFIG [CHECKPOINT] [--part backbone|model] \\
        [--shape H W] [--batch N] [--runs N] [--threads N] [--onnx FILE] [--static]

Exports the model (dynamic shapes unless ``--static``; ``--onnx`` reuses a file exported by
``export_onnx.py``), checks ONNX Runtime against PyTorch at the benchmark input, then times both
(median of ``--runs`` after one warm-up) and prints the ratio ONNX Runtime / eager (< 1: faster).
PyTorch eager is the model as users run it.
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from mmengine.config import DictAction

from mmvit_ext import deploy


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', nargs='?', default='none',
                        help="checkpoint file (default 'none': random weights)")
    parser.add_argument('--part', choices=('backbone', 'model'), default='backbone')
    parser.add_argument('--shape', type=int, nargs=2, default=(512, 512), metavar=('H', 'W'))
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--runs', type=int, default=5)
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    parser.add_argument('--onnx', help='an exported file to time instead of exporting')
    parser.add_argument('--static', action='store_true', help='export at the benchmark shape')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={})
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = deploy.build_from_config(args.config, args.checkpoint, args.cfg_options)
    root = deploy.export_root(model, args.part)
    inputs = torch.randn(args.batch, 3, *args.shape)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.onnx
        if path is None:
            path = Path(tmp) / 'model.onnx'
            low = deploy.min_dynamic_size(root)
            if not args.static and min(args.shape) < low:
                raise SystemExit(f'--shape {args.shape[0]} {args.shape[1]}: a dynamic graph of '
                                 f'this model serves sides >= {low}; use --static')
            example = inputs if args.static else torch.randn(2, 3, *deploy.export_shape(low))
            start = time.perf_counter()
            deploy.export_onnx(root, example, path, dynamic=not args.static, min_size=low)
            print(f'[export] {time.perf_counter() - start:.0f} s')
        session = deploy.ort_session(path, threads=args.threads)
        diff = deploy.max_relative_diff(root, session, inputs)
        feed = {session.get_inputs()[0].name: inputs.numpy()}
        with torch.no_grad():
            eager = deploy.median_latency(lambda: root(inputs), runs=args.runs)
        ort = deploy.median_latency(lambda: session.run(None, feed), runs=args.runs)
    graph = args.onnx or ('static' if args.static else 'dynamic')
    print(f'[benchmark] {Path(args.config).stem} {args.part}, batch {args.batch} at '
          f'{args.shape[0]}x{args.shape[1]}, {args.threads} threads, {graph} graph, '
          f'max relative diff {diff:.1e}')
    print(f'[result] eager {eager * 1e3:.1f} ms, onnxruntime {ort * 1e3:.1f} ms (median of '
          f'{args.runs}): onnxruntime / eager = {ort / eager:.2f}x')
    return 0


if __name__ == '__main__':
    sys.exit(main())
