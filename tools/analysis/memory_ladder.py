"""Peak memory and step time of one detector training step for a ladder of settings: fp32 /
bf16 autocast x our activation-checkpointing settings, against mmdet's own Swin (its
``with_cp``) in the same run, in the same detector, holding the same weights.

One step is the detector's loss forward + backward on a synthetic annotated image (batch
``--batch``); gradients are dropped after it. Peak memory is the growth during that step over the
memory held before it (weights, detector): CUDA ``max_memory_allocated``, or on CPU the peak
resident set (RSS, sampled every ms) of a process in which every block of 64 KB or more is its
own mapping, handed back to the OS when freed (set before the models are built) -- the live
tensors, the same a GPU would hold, without the pages glibc's heap keeps. ``--warmup`` steps run
before the first row of each implementation and dtype; each row then runs one step measured for
memory, and ``--repeat`` timed steps follow over all rows in turn (A B A B ...); the time is
their median (with ``--repeat 0``, the memory step's). Rows print as they finish. bf16 / fp16
autocast covers the whole step on CUDA (mmcv's ops in float32: mmvit_ext.engine.precision), the
backbone and neck on CPU (how the CPU table of docs/big_models.md was measured).

Example (the table of docs/big_models.md):
    python tools/analysis/memory_ladder.py --arch large --size 800 1333
    python tools/analysis/memory_ladder.py --arch large --device cuda --out ladder.md
"""
import argparse
import ast
import contextlib
import copy
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch
from torch import nn

import mmvit_ext  # noqa: F401
from mmvit_ext.benchmark import build_peers
from mmvit_ext.benchmark.measure import DTYPES, PeakMemory, run_once
from mmvit_ext.benchmark.train_step import DetectorTrainStep
from mmvit_ext.registry import MODELS
from mmvit_ext.utils.build import build_model
from mmvit_ext.utils.heap import unmap_freed_blocks

CONFIG = 'configs/mask_rcnn_swin_t_fpn_1x_coco.py'
# (implementation, dtype, with_cp), the reference first; mmdet's Swin takes only bools
LADDER = [
    ('mmdet', 'fp32', True), ('ours', 'fp32', True), ('ours', 'bf16', True),
    ('ours', 'fp32', dict(blocks=True, mlp_chunks=4)),
    ('ours', 'bf16', dict(blocks=True, mlp_chunks=4)),
    ('ours', 'fp32', 'attn'), ('ours', 'bf16', 'attn'), ('ours', 'fp32', 'mlp'),
    ('ours', 'bf16', 'mlp'), ('ours', 'fp32', [True, True, 9, 0]),
    ('ours', 'bf16', [True, True, 9, 0]), ('ours', 'fp32', False), ('ours', 'bf16', False),
    ('mmdet', 'fp32', False), ('mmdet', 'bf16', True),
]
REFERENCE = ('mmdet', 'fp32', 'True')


@dataclass
class Row:
    impl: str
    dtype: str
    with_cp: Any
    peak: int = 0
    times: List[float] = field(default_factory=list)

    @property
    def key(self):
        return (self.impl, self.dtype, repr(self.with_cp))

    @property
    def seconds(self) -> float:
        return statistics.median(self.times)

    def label(self) -> str:
        return f'{self.impl} {self.dtype} with_cp={self.with_cp!r}'


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config', default=CONFIG, help='an mmdet config with our Swin')
    parser.add_argument('--arch', default='large', help='Swin arch (preset or a dict literal)')
    parser.add_argument('--size', type=int, nargs=2, default=(800, 1333), metavar=('H', 'W'))
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--repeat', type=int, default=1,
                        help='timed steps per row after the memory one (0: time the memory step)')
    parser.add_argument('--rows', nargs='+', metavar='IMPL:DTYPE:WITH_CP',
                        help="ladder rows, e.g. ours:bf16:'attn' mmdet:fp32:True "
                             "\"ours:bf16:{'blocks': True, 'mlp_chunks': 4}\" (default: the "
                             "full ladder)")
    parser.add_argument('--out', help='also write the markdown table here')
    return parser.parse_args(argv)


def parse_rows(items: Optional[List[str]]) -> List[Row]:
    if not items:
        return [Row(*r) for r in LADDER]
    rows = []
    for item in items:
        impl, dtype, value = item.split(':', 2)
        if impl not in ('ours', 'mmdet') or dtype not in DTYPES:
            raise SystemExit(f'error: rows are ours|mmdet:fp32|bf16|fp16:WITH_CP, got {item!r}')
        with_cp = ast.literal_eval(value)
        if impl == 'mmdet' and not isinstance(with_cp, bool):
            raise SystemExit(f'error: mmdet Swin takes with_cp=True/False, got {item!r}')
        rows.append(Row(impl, dtype, with_cp))
    return rows


def build_detectors(args: argparse.Namespace, need_mmdet: bool) -> Dict[str, nn.Module]:
    """Our detector with Swin ``--arch``, and the same detector around mmdet's Swin holding our
    weights."""
    from mmengine.config import Config
    cfg = Config.fromfile(args.config)
    arch = ast.literal_eval(args.arch) if args.arch.startswith('{') else args.arch
    backbone = dict(cfg.model.backbone, arch=arch, init_cfg=None, drop_path_rate=0.0,
                    with_cp=False)
    cfg.model.backbone = backbone
    cfg.model.neck.in_channels = list(MODELS.build(backbone).out_channels)
    detector = build_model(cfg, scope='mmdet', pretrained=False)
    detector.init_weights()
    models = {'ours': detector}
    if need_mmdet:
        other = copy.deepcopy(detector)
        other.backbone = build_peers(detector.backbone, tuple(args.size))['mmdet']
        models['mmdet'] = other
    return models


def set_with_cp(detector: nn.Module, impl: str, value: Any) -> None:
    if impl == 'ours':
        detector.backbone.with_cp = value
        return
    for stage in detector.backbone.stages:
        for block in stage.blocks:
            block.with_cp = value


def autocast_features(detector: nn.Module, dtype: torch.dtype) -> None:
    """Autocast ``extract_feat`` (backbone + neck) to ``dtype``, features handed to the heads in
    float32 (CPU: mmcv's NMS has no bf16 kernel); float32: the plain method."""
    detector.__dict__.pop('extract_feat', None)
    if dtype == torch.float32:
        return
    plain = detector.extract_feat
    autocast = torch.autocast(next(detector.parameters()).device.type, dtype=dtype)
    detector.extract_feat = lambda x: tuple(f.float() for f in autocast(plain)(x))


def measure(rows: List[Row], steps: Dict[str, DetectorTrainStep], x: torch.Tensor, warmup: int,
            repeat: int) -> None:
    def step(row: Row) -> float:
        set_with_cp(steps[row.impl].detector, row.impl, row.with_cp)
        cuda = x.device.type == 'cuda'
        if not cuda:
            autocast_features(steps[row.impl].detector, DTYPES[row.dtype])
        start = time.perf_counter()
        # CUDA: the whole step under autocast, as AmpOptimWrapper does
        run_once(steps[row.impl], x, 'fwdbwd', DTYPES[row.dtype] if cuda else torch.float32)
        if cuda:
            torch.cuda.synchronize(x.device)
        return time.perf_counter() - start

    warmed = set()
    for row in rows:
        if (row.impl, row.dtype) not in warmed:  # first touches (buffers, kernels) once
            for _ in range(warmup):
                step(row)
            warmed.add((row.impl, row.dtype))
        with PeakMemory(x.device) as mem:
            seconds = step(row)
        row.peak = mem.peak
        if not repeat:
            row.times.append(seconds)
        print(f'[row] {row.label()}: {row.peak / 2 ** 20:.0f} MB, {seconds:.2f} s', flush=True)
    for _ in range(repeat):
        for row in rows:
            row.times.append(step(row))
            print(f'[time] {row.label()}: {row.times[-1]:.2f} s', flush=True)


def reference(rows: List[Row]) -> Optional[Row]:
    return next((r for r in rows if r.key == REFERENCE), None)


def table(rows: List[Row]) -> List[str]:
    """Markdown rows; ratios against mmdet's fp32 ``with_cp=True`` where it is in the ladder."""
    ref = reference(rows)
    lines = ['| backbone | dtype | with_cp | peak MB | step s | peak vs mmdet cp | '
             'time vs mmdet cp |', '|---|---|---|---|---|---|---|']
    for r in rows:
        ratios = (f'{r.peak / max(ref.peak, 1):.2f}x | {r.seconds / ref.seconds:.2f}x'
                  if ref else '- | -')
        lines.append(f'| {r.impl} | {r.dtype} | `{r.with_cp!r}` | {r.peak / 2 ** 20:.0f} | '
                     f'{r.seconds:.2f} | {ratios} |')
    return lines


def goal(rows: List[Row], max_mem: float = 0.6, max_time: float = 1.25) -> str:
    """The lowest-memory row of ours within ``max_mem`` x mmdet's peak at ``max_time`` x its
    time."""
    ref = reference(rows)
    if ref is None:
        return 'GOAL not checked (no mmdet fp32 with_cp=True row)'
    fits = [r for r in rows if r.impl == 'ours' and r.peak <= max_mem * ref.peak
            and r.seconds <= max_time * ref.seconds]
    if not fits:
        low = min((r for r in rows if r.impl == 'ours'), key=lambda r: r.peak, default=None)
        lowest = (f'; lowest peak: ours {low.dtype} with_cp={low.with_cp!r}, '
                  f'{low.peak / ref.peak:.2f}x at {low.seconds / ref.seconds:.2f}x time'
                  if low else '')
        return f'GOAL not met: no row of ours within {max_mem}x peak at {max_time}x time{lowest}'
    best = min(fits, key=lambda r: r.peak)
    return (f'GOAL met: ours {best.dtype} with_cp={best.with_cp!r}: '
            f'{best.peak / ref.peak:.2f}x peak at {best.seconds / ref.seconds:.2f}x time of '
            f'mmdet fp32 with_cp=True')


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    rows = parse_rows(args.rows)
    device = torch.device(args.device)
    with unmap_freed_blocks() if device.type == 'cpu' else contextlib.nullcontext():
        run(args, rows, device)


def run(args: argparse.Namespace, rows: List[Row], device: torch.device) -> None:
    detectors = build_detectors(args, any(r.impl == 'mmdet' for r in rows))
    steps = {name: DetectorTrainStep(d).to(device).train() for name, d in detectors.items()}
    x = torch.randn(args.batch, 3, *args.size, device=device)
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'
    peak = ('max_memory_allocated' if device.type == 'cuda'
            else 'peak RSS, blocks >= 64 KB unmapped when freed')
    head = (f'Mask R-CNN Swin-{args.arch}, batch {args.batch}, {args.size[0]}x{args.size[1]}, '
            f'one training step (fwd+bwd), {name}; peak = growth of {peak}')
    print(head, flush=True)
    measure(rows, steps, x, args.warmup, args.repeat)
    lines = [head, '', *table(rows), '', goal(rows)]
    print('\n'.join(lines))
    if args.out:
        with open(args.out, 'w') as f:
            f.write('\n'.join(lines) + '\n')


if __name__ == '__main__':
    main()
