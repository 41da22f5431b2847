"""Time a backbone (or a whole config's model) on CPU / CUDA, against mmdet's and timm's own.

Forward and forward+backward, fp32 or bf16 / fp16 autocast, median of --repeat runs after
--warmup, models interleaved run by run; peak memory (CUDA max allocated, CPU peak RSS growth);
achieved FLOP/s against a measured matmul peak. --compare builds mmdet's and timm's
implementation with our weights, checks that their outputs match ours, and prints every figure
as a ratio. The last line is a one-line summary for scripts.

Example:
    python tools/analysis/benchmark.py swin:tiny --batch 2 --size 512 512 --compare
    python tools/analysis/benchmark.py pvtv2:b2 --dtype bf16 --compare
    python tools/analysis/benchmark.py --config configs/mask_rcnn_pvtv2_b2.py --compare
    python tools/analysis/benchmark.py --config configs/mmseg/eomt_dinov3_vitl16_512x512_ade20k.py --against configs/mmseg/mask2former_dinov3_vitl16_adapter_512x512_160k_ade20k.py --batch 1 --modes fwd --eval
    python tools/analysis/benchmark.py deepvit:s --batch 1 --size 800 1216 --modes fwd --eval --scaling
    python tools/analysis/benchmark.py refiner:s --against deepvit:s --batch 1 --size 800 1216 --modes fwd --eval
    python tools/analysis/benchmark.py refiner:s --against deepvit:s --batch 1 --size 800 1216 --device meta
    python tools/analysis/benchmark.py deepvit:s --size 800 1216 --set window_size=None --scaling
    python tools/analysis/benchmark.py pvtv2:b2_li --modes fwdbwd --scaling --retain-heap
    python tools/analysis/benchmark.py swin:tiny --dtype bf16 --modes fwdbwd --compare --profile logs/profile
"""
import argparse
import ast
import copy
import re
import sys
from pathlib import Path
from typing import Dict, Optional

import torch
from torch import nn

import mmvit_ext  # noqa: F401
from mmvit_ext.benchmark import (build_peers, check_peers, count_flops, matmul_peak,
                                 peer_families)
from mmvit_ext.benchmark.live_memory import live_peak_bytes
from mmvit_ext.benchmark.measure import DTYPES, measure_interleaved, profile_run
from mmvit_ext.benchmark.train_step import (SegmentorStep,
                                            apply_trained_state, whole_model_step)
from mmvit_ext.backbones import preset_config
from mmvit_ext.registry import MODELS
from mmvit_ext.utils import build_model, retain_freed_memory



def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('backbone', nargs='?', help='FAMILY:ARCH, e.g. swin:tiny, pvtv2:b2_li')
    parser.add_argument('--config', help='benchmark a whole model (a training step) instead')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help="cpu, cuda, or meta: count the peak of live tensors (no timing)")
    parser.add_argument('--dtype', choices=sorted(DTYPES), default='fp32')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--size', type=int, nargs=2, default=(512, 512), metavar=('H', 'W'))
    parser.add_argument('--modes', nargs='+', choices=('fwd', 'fwdbwd'), default=['fwd', 'fwdbwd'])
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--repeat', type=int, default=5)
    parser.add_argument('--compare', action='store_true',
                        help='also run the peer implementations (mmdet, timm) of families that '
                             f'have them: {", ".join(peer_families())}')
    parser.add_argument('--against', nargs='+', default=[], metavar='FAMILY:ARCH',
                        help='other backbones of ours timed in the same run (interleaved), '
                             'printed as ratios, e.g. deepvit:s; with --config, other configs')
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help='settings merged into the --config model (mmengine form)')
    parser.add_argument('--against-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help="settings merged into the --against configs (mmengine's "
                             '--cfg-options form), e.g. model.decode_head.hidden_dims=256')
    parser.add_argument('--set', nargs='+', default=[], metavar='KEY=VALUE',
                        help='backbone arguments (Python literals), e.g. window_size=None')
    parser.add_argument('--eval', action='store_true',
                        help='models in eval mode (inference: BatchNorm statistics, chunked maps; '
                             'a --config model in its trained state, from its hooks)')
    parser.add_argument('--scaling', action='store_true',
                        help='also time ours at twice the pixels (2H x W) and print the ratio')
    parser.add_argument('--peak-size', type=int, default=2048,
                        help='side of the square matmul that measures the peak FLOP/s (CPU '
                             'bf16 matmuls without oneDNN take minutes at 2048)')
    parser.add_argument('--compile', action='store_true',
                        help='time torch.compile(model) (default inductor backend; compiled '
                             'during the warm-up runs, so give --warmup >= 1)')
    parser.add_argument('--compile-backend', default='inductor', metavar='NAME',
                        help='torch.compile backend for --compile (aot_eager: traces, no code '
                             'generation; a quick rehearsal of the compiled path)')
    parser.add_argument('--profile', metavar='DIR',
                        help='after timing, profile one run per model and mode (torch.profiler) '
                             'and write its top ops / kernels by self time to DIR/MODEL_MODE.txt')
    parser.add_argument('--retain-heap', action='store_true',
                        help='CPU: keep freed memory in the process for reuse (glibc; every '
                             'model in the run alike), see mmvit_ext.utils.heap')
    args = parser.parse_args()
    if bool(args.backbone) == bool(args.config):
        parser.error('give either a backbone FAMILY:ARCH or --config')
    if args.cfg_options and not args.config:
        parser.error('--cfg-options sets the --config model: give --config')
    if args.against_options and not (args.against and args.config):
        parser.error('--against-options sets the --against configs: give --config and --against')
    return args


def parse_settings(items) -> dict:
    settings = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep or not all(part.isidentifier() for part in key.split('.')):
            sys.exit(f'error: --set takes KEY=VALUE, got {item!r}')
        try:
            settings[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            settings[key] = value
    return settings


def build_backbone(spec: str, settings: dict) -> nn.Module:
    try:
        return MODELS.build(preset_config(spec, drop_path_rate=0.0, **settings))
    except ValueError as error:
        sys.exit(f'error: {error}')


def build_models(args: argparse.Namespace) -> Dict[str, nn.Module]:
    size = tuple(args.size)
    if args.backbone:
        ours = build_backbone(args.backbone, parse_settings(args.set))
        models = {'ours': ours}
        if args.compare:
            peers = build_peers(ours, size)
            for name, (check, diff) in check_peers(ours, peers, size).items():
                print(f'[check] {name}: outputs match ours at {check[0]}x{check[1]} '
                      f'(max abs diff {diff:.1e})')
            models.update(peers)
        models.update((spec, build_backbone(spec, {})) for spec in args.against)
        return models
    detector = build_whole_model(args.config, args.eval, parse_settings(args.cfg_options))
    models = {'ours': whole_model_step(detector)}
    if args.compare:  # the whole model again with the peer's backbone (network)
        backbone = detector.backbone
        peers = (backbone.benchmark_peers(size) if hasattr(backbone, 'benchmark_peers') else {})
        peers = {name: peer for name, peer in peers.items() if name in ('mmdet', 'transformers')}
        if not peers:
            sys.exit(f'error: no mmdet / transformers peer for {type(backbone).__name__}')
        for name, (check, diff) in check_peers(backbone, peers, size).items():
            print(f'[check] {name}: outputs match ours at {check[0]}x{check[1]} '
                  f'(max abs diff {diff:.1e})')
        for name, peer in peers.items():
            other = copy.deepcopy(detector)
            other.backbone = peer
            models[name] = whole_model_step(other)
    options = parse_settings(args.against_options)
    models.update((Path(path).stem, whole_model_step(build_whole_model(path, args.eval, options)))
                  for path in args.against)
    return models


def build_whole_model(path: str, trained: bool, options: Optional[dict] = None) -> nn.Module:
    """A config's model, initialised, no pretrained files, no drop path; ``options`` merged
    into the config first; ``trained``: in the state its training leaves (the config's hooks)."""
    from mmengine.config import Config
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(dict(options or {}, **{'model.backbone.drop_path_rate': 0.0}))
    model = build_model(cfg, pretrained=False)
    model.init_weights()
    if trained:
        for hook in apply_trained_state(model, cfg.get('custom_hooks', [])):
            print(f'[trained state] {Path(path).stem}: {hook}')
    return model


def count_live_memory(args: argparse.Namespace, models: Dict[str, nn.Module]) -> None:
    """--device meta: the peak of live tensors per model and mode, no timing."""
    x = torch.randn(args.batch, 3, *args.size, device='meta')
    print(f'device meta (live tensors counted, no machine memory), fp32, batch {args.batch}, '
          f'{args.size[0]}x{args.size[1]}\n\n| model | mode | live peak GiB |\n|---|---|---|')
    peaks = {}
    for name, model in models.items():
        model.to('meta').train(not args.eval)
        for mode in args.modes:
            peaks[name, mode] = live_peak_bytes(model, x, backward=mode == 'fwdbwd') / 2 ** 30
            print(f'| {name} | {mode} | {peaks[name, mode]:.2f} |')
    spec = args.backbone or args.config
    ratios = [f'{mode}_live_vs_{name}={peaks["ours", mode] / peaks[name, mode]:.2f}'
              for name in models if name != 'ours' for mode in args.modes]
    print(f'SUMMARY {spec} meta b{args.batch} {args.size[0]}x{args.size[1]} ' + ' '.join(
        [f'{mode}_live_gib={peaks["ours", mode]:.2f}' for mode in args.modes] + ratios))


def write_profiles(out: Path, models: Dict[str, nn.Module], x: torch.Tensor, modes, dtype
                   ) -> None:
    """--profile: one profiled run per model and mode, its top ops / kernels to a file each."""
    out.mkdir(parents=True, exist_ok=True)
    for name, model in models.items():
        for mode in modes:
            path = out / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}_{mode}.txt"
            path.write_text(profile_run(model, x, mode, dtype) + '\n')
            print(f'[profile] {name} {mode}: {path}')


def main() -> None:
    args = parse_args()
    if args.device == 'meta':
        return count_live_memory(args, build_models(args))
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    heap = 'default heap'
    if args.retain_heap:
        setting = retain_freed_memory()
        heap = 'heap retained' if setting else f'default heap (--retain-heap: {setting.reason})'
        print(f'[heap] --retain-heap: {setting.reason}')
    models = build_models(args)
    for model in models.values():  # mmdet's backbones return None from train()
        model.to(device).train(not args.eval)
    eager = models['ours']  # FLOPs are counted on the eager module
    if args.compile:
        if args.warmup < 1:
            sys.exit('error: --compile compiles during the warm-up runs: give --warmup >= 1')
        models = {name: torch.compile(model, backend=args.compile_backend)
                  for name, model in models.items()}
    # a detector's step is its training step; a segmentor's inference is its predict (eval)
    modes = args.modes if not args.config or isinstance(eager, SegmentorStep) else ['fwdbwd']
    x = torch.randn(args.batch, 3, *args.size, device=device)
    flops = {m: count_flops(eager, x, m) for m in modes} if args.backbone else {}
    peak = matmul_peak(device, dtype, size=args.peak_size)
    print(f'device {device}, {args.dtype}, batch {args.batch}, {args.size[0]}x{args.size[1]}; '
          f'matmul peak {peak / 1e9:.0f} GFLOP/s; {heap}')
    results = measure_interleaved(models, x, modes, dtype, args.warmup, args.repeat)
    print('\n| model | mode | median s | peak MB | GFLOP/s | % of peak |\n|---|---|---|---|---|---|')
    for name, res in results.items():
        for mode in modes:
            t = res.median(mode)
            rate = flops.get(mode, 0) / t
            print(f'| {name} | {mode} | {t:.3f} | {res.peak_mem[mode] / 2 ** 20:.0f} | '
                  f'{rate / 1e9:.0f} | {100 * rate / peak:.0f} |' if flops else
                  f'| {name} | {mode} | {t:.3f} | {res.peak_mem[mode] / 2 ** 20:.0f} | - | - |')
    summary = [f'{args.backbone or args.config}', args.dtype,
               f'b{args.batch}', f'{args.size[0]}x{args.size[1]}']
    if args.retain_heap:
        summary.append('retain_heap')
    if args.compile:
        summary.append(f'compiled={args.compile_backend}')
    ours = results['ours']
    for name in (n for n in results if n != 'ours'):
        for mode in modes:
            speedup = results[name].median(mode) / ours.median(mode)
            mem = ours.peak_mem[mode] / max(results[name].peak_mem[mode], 1)
            print(f'ours vs {name} {mode}: {speedup:.2f}x speed, {mem:.2f}x memory')
            summary.append(f'{mode}_speedup_vs_{name}={speedup:.2f} {mode}_mem_vs_{name}={mem:.2f}')
    if args.scaling:
        big = torch.randn(args.batch, 3, 2 * args.size[0], args.size[1], device=device)
        scaled = measure_interleaved({'ours': models['ours']}, big, modes, dtype, args.warmup,
                                     args.repeat)['ours']
        for mode in modes:
            ratio = scaled.median(mode) / ours.median(mode)
            print(f'ours {mode} at {2 * args.size[0]}x{args.size[1]}: {scaled.median(mode):.3f} s, '
                  f'{scaled.peak_mem[mode] / 2 ** 20:.0f} MB; twice the pixels costs {ratio:.2f}x')
            summary.append(f'{mode}_scaling_2x_pixels={ratio:.2f}')
    if args.profile:
        write_profiles(Path(args.profile), models, x, modes, dtype)
    if flops:
        summary.append(' '.join(f'{m}_peak_frac={flops[m] / ours.median(m) / peak:.2f}' for m in modes))
    print('SUMMARY ' + ' '.join(summary))


if __name__ == '__main__':
    main()
