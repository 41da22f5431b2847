"""The GPU check in one call (run by ``bash tools/gpu_check.sh``).

Installs what is missing from carried wheels, then runs each step in its own process (a failure
or an OOM costs only its own row) and writes one markdown table (--out, rewritten before every
row, so a run killed at a time limit keeps the rows it finished) plus one tarball of every log
beside it. --device cpu runs the same steps at tiny settings (tests/test_gpu_check.py runs it).
Standard library only: the steps import torch in their own processes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, TextIO, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mmcv_build  # noqa: E402
import python_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = 'work_dirs/gpu_check/gpu_check.md'
TRAIN_CONFIG = 'configs/demo/mask_rcnn_pvtv2_b2_demo.py'
FSDP_OPTIONS = ('runner_type=FlexibleRunner', 'strategy.type=FSDPStrategy',
                'strategy.model_wrapper.auto_wrap_policy.type=mmvit_ext.backbone_block_policy',
                'strategy.model_wrapper.mixed_precision.param_dtype=bfloat16',
                'strategy.model_wrapper.mixed_precision.reduce_dtype=float32',
                'strategy.model_wrapper.mixed_precision.buffer_dtype=float32')


@dataclass(frozen=True)
class Settings:
    """What differs between the CUDA check and its tiny CPU variant."""

    train_size: int
    deterministic: bool
    train_validates: bool                # the val loop after the epoch (minutes on CPU)
    amp_dtypes: Tuple[str, ...]          # CPU AMP is bf16 only (CpuAmpOptimWrapper)
    bench_models: Tuple[str, ...]
    bench_size: Tuple[int, int]
    bench_batch: int
    bench_args: Tuple[str, ...]          # warmup, repeat and the peers
    compile_backend: str                 # of the compiled bench rows
    detector_batch: int
    detector_size: Tuple[int, int]
    detector_args: Tuple[str, ...]       # dtype, warmup, repeat
    ladder_name: str
    ladder_args: Tuple[str, ...]


def names_in(text: str) -> List[str]:
    """``'a,b c'`` -> ``['a', 'b', 'c']`` (comma- or space-separated names)."""
    return [name for name in re.split(r'[,\s]+', text) if name]


def settings_for(device: str, env: Mapping[str, str] = os.environ) -> Settings:
    if device == 'cuda':
        return Settings(
            train_size=800, deterministic=False, train_validates=True,
            amp_dtypes=('bfloat16', 'float16'),
            bench_models=tuple(names_in(env.get('BENCH_MODELS') or 'swin:tiny,pvtv2:b2,vit:b')),
            bench_size=(800, 1344),
            bench_batch=int(env.get('BENCH_BATCH') or 8),
            bench_args=('--warmup', '2', '--repeat', '5', '--compare'), compile_backend='inductor',
            detector_batch=2, detector_size=(800, 1333),
            detector_args=('--dtype', 'bf16', '--warmup', '2', '--repeat', '5'),
            ladder_name='ladder Swin-L 800x1333',
            ladder_args=('--arch', 'large', '--size', '800', '1333', '--repeat', '3'))
    return Settings(
        train_size=64, deterministic=True, train_validates=False, amp_dtypes=('bfloat16',),
        bench_models=('pvtv2:b0',), bench_size=(64, 64), bench_batch=1,
        bench_args=('--warmup', '1', '--repeat', '1', '--peak-size', '256'),
        compile_backend='aot_eager',  # traces and runs the graphs; inductor's C++ build is minutes
        # fp32: a whole detector under bf16 autocast takes minutes a step on CPU
        detector_batch=1, detector_size=(64, 64),
        detector_args=('--dtype', 'fp32', '--warmup', '0', '--repeat', '1'),
        ladder_name='ladder Swin-T 96x128',
        ladder_args=('--arch', 'tiny', '--size', '96', '128', '--warmup', '0', '--rows',
                     'ours:fp32:False', "ours:fp32:'attn'", 'mmdet:fp32:True'))


@dataclass(frozen=True)
class Row:
    """One row of the table: a command run in its own process, its output in ``log_name``;
    a training row (``work`` set) first makes the demo data and then checks the losses."""

    name: str
    argv: Tuple[str, ...]
    work: Optional[Path] = None

    @property
    def log_name(self) -> str:
        return re.sub(r'[ /:]', '_', self.name) + '.log'


@dataclass
class Check:
    """One run: its options, the rows so far and where they go."""

    device: str
    python: str
    out: Path
    steps: str
    rows: List[str] = field(default_factory=list)
    failed: bool = False
    desc: str = ''
    start: float = field(default_factory=time.monotonic)

    @property
    def settings(self) -> Settings:
        return settings_for(self.device)

    @property
    def logs(self) -> Path:
        return self.out.parent / 'logs'

    @property
    def data(self) -> Path:
        return self.logs / 'demo_shapes'


# ---------------------------------------------------------------------------- the steps

def train_row(check: Check, name: str, work: str, launch: Sequence[str],
              extra: Sequence[str] = (), options: Sequence[str] = ()) -> Row:
    """2 iterations (batch 2) of the demo Mask R-CNN PVTv2-b2 on the demo data; on CUDA, its val."""
    data, size = f'{check.data}/', check.settings.train_size
    argv = (*launch, 'tools/train.py', TRAIN_CONFIG, '--work-dir', str(check.logs / f'work_{work}'),
            *extra, '--cfg-options', f'data_root={data}', f'train_dataloader.dataset.data_root={data}',
            f'val_dataloader.dataset.data_root={data}', f'test_dataloader.dataset.data_root={data}',
            f'val_evaluator.ann_file={data}annotations/instances_val.json',
            f'test_evaluator.ann_file={data}annotations/instances_val.json',
            f'train_dataloader.dataset.pipeline.2.scale=({size},{size})', 'train_cfg.max_epochs=1',
            'train_dataloader.batch_size=2', 'train_dataloader.num_workers=0',
            'default_hooks.logger.interval=1',
            'default_hooks.checkpoint.interval=100', 'default_hooks.checkpoint.save_last=False',
            f'randomness.deterministic={check.settings.deterministic}',
            # mmengine validates after the last epoch (whatever val_interval) unless it comes
            # before val_begin
            *(() if check.settings.train_validates else ('train_cfg.val_begin=2',)), *options)
    return Row(name, argv, check.logs / f'work_{work}')


def torchrun(check: Check, port: int) -> Tuple[str, ...]:
    """One process through torch's launcher (what ``torchrun`` runs), on its own port."""
    return (check.python, '-m', 'torch.distributed.run', '--nproc_per_node', '1',
            '--master_port', str(port))


def probe_rows(check: Check) -> List[Row]:
    return [Row('probe ops', (check.python, 'tools/analysis/ops_probe.py', '--device', check.device,
                              '--dtype', 'bf16'))]


def contract_rows(check: Check) -> List[Row]:
    return [Row(f'contract {dtype}', (check.python, 'tools/analysis/device_check.py', '--device',
                                      check.device, '--dtype', dtype))
            for dtype in ('fp32', 'bf16', 'fp16')]


def amp_train_rows(check: Check) -> List[Row]:
    return [train_row(check, f'amp-train {dtype} Mask R-CNN PVTv2-b2', f'amp_{dtype}', [check.python],
                      ['--amp'], [f'optim_wrapper.dtype={dtype}'])
            for dtype in check.settings.amp_dtypes]


def ddp_rows(check: Check) -> List[Row]:
    return [train_row(check, 'ddp 1 process Mask R-CNN PVTv2-b2', 'ddp', torchrun(check, 29561),
                      ['--launcher', 'pytorch'])]


def fsdp_rows(check: Check) -> List[Row]:
    return [train_row(check, 'fsdp 1 process bf16 params Mask R-CNN PVTv2-b2', 'fsdp',
                      torchrun(check, 29562), ['--launcher', 'pytorch'], FSDP_OPTIONS)]


# the ViTDet ViT-B, whose peers are timm's and mmpretrain's SAM ViT (mmvit_ext/benchmark/peers.py)
BENCH_SETTINGS = {'vit:b': ('--set', 'use_rel_pos=True', 'final_norm=False')}


def bench_rows(check: Check, compiled: bool = False) -> List[Row]:
    s = check.settings
    height, width = s.bench_size
    extra = ('--compile', '--compile-backend', s.compile_backend) if compiled else ()
    kind = 'compiled' if compiled else 'bf16'
    return [Row(f'bench {kind} {model} b{s.bench_batch} {height}x{width}',
                (check.python, 'tools/analysis/benchmark.py', model, '--device', check.device,
                 '--dtype', 'bf16', '--batch', str(s.bench_batch), '--size', str(height), str(width),
                 '--modes', 'fwdbwd', *s.bench_args, *extra, *BENCH_SETTINGS.get(model, ()),
                 '--profile', str(check.logs / f'profile_{kind}' / model.replace(':', '_'))))
            for model in s.bench_models]


DETECTORS = {'Swin-T': 'configs/mask_rcnn_swin_t_fpn_1x_coco.py', 'PVTv2-b2': 'configs/mask_rcnn_pvtv2_b2.py'}


def detector_rows(check: Check) -> List[Row]:
    s = check.settings
    height, width = s.detector_size
    return [Row(f'detector Mask R-CNN {name} b{s.detector_batch} {height}x{width}',
                (check.python, 'tools/analysis/detector_speed.py', config, '--device', check.device,
                 '--batch', str(s.detector_batch), '--size', str(height), str(width),
                 *s.detector_args, '--name', name))
            for name, config in DETECTORS.items()]


def ladder_rows(check: Check) -> List[Row]:
    s = check.settings
    return [Row(s.ladder_name, (check.python, 'tools/analysis/memory_ladder.py', '--device',
                                check.device, *s.ladder_args, '--out', str(check.logs / 'ladder.md')))]


@dataclass(frozen=True)
class Step:
    what: str                              # one line of --help
    rows: Callable[[Check], List[Row]]
    default: bool = True                   # run without --steps


# In the order they run: most value per second first, the OOM-prone next to last, then the opt-in
# compiles (minutes of inductor builds on a GPU).
STEPS: Dict[str, Step] = {
    'probe': Step("mmcv's nms / RoIAlign / mask-target crop run on the device (tools/analysis/ops_probe.py)",
                  probe_rows),
    'contract': Step('the backbone contract on the device, fp32 / bf16 / fp16 (tools/analysis/device_check.py)',
                     contract_rows),
    'amp-train': Step('Mask R-CNN PVTv2-b2, 2 iterations through tools/train.py --amp, bf16 and fp16',
                      amp_train_rows),
    'ddp': Step('the same through torch.distributed.run (1 process) and mmengine\'s DDP wrapper',
                ddp_rows),
    'fsdp': Step("the same through mmengine's FlexibleRunner + FSDPStrategy, bf16 parameters",
                 fsdp_rows),
    'bench': Step('bf16 fwd+bwd, 800x1344, Swin-T, PVTv2-b2 and ViTDet ViT-B against their '
                  'OpenMMLab peer and timm, each profiled (benchmark.py)',
                  bench_rows),
    'detector': Step("Mask R-CNN training step, bf16, b2, 800x1333: Swin-T / PVTv2-b2, ours vs mmdet's",
                     detector_rows),
    'ladder': Step('the Swin-L memory ladder, 800x1333, ours and mmdet at equal dtypes (memory_ladder.py)',
                   ladder_rows),
    'compiled': Step('opt-in: bench again, every side torch.compile-d (9 inductor builds; the '
                     'CPU variant: aot_eager)',
                     partial(bench_rows, compiled=True), default=False),
}


def parse_steps(text: str) -> List[str]:
    """``'bench,ladder'`` -> the named steps; ValueError names an unknown one."""
    names = names_in(text)
    for name in names:
        if name not in STEPS:
            raise ValueError(f'unknown step {name} (steps: {" ".join(STEPS)})')
    return names


# ---------------------------------------------------------------------------- the table

# a row's summary is its log's last lines of these kinds
SUMMARY_LINE = re.compile(r'^(PROBE|CONTRACT|SUMMARY|GOAL|TRAIN)')
OOM = re.compile(r'out of memory|OutOfMemoryError')


def escape(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace('|', '\\|')


def summary_of(log_text: str, returncode: int, log_name: str) -> str:
    """A row's summary: the log's last 3 PROBE / CONTRACT / SUMMARY / GOAL / TRAIN lines; for a
    failure, the exit status, the log's name, its last line and whether it ran out of memory."""
    lines = log_text.splitlines()
    summary = escape(' '.join([line for line in lines if SUMMARY_LINE.match(line)][-3:]))
    if returncode == 0:
        return summary
    if OOM.search(log_text):
        summary = f'OOM. {summary}'
    last = escape(lines[-1][:300] if lines else '')
    return f'FAILED (exit {returncode}, {log_name}): {last} {summary}'.rstrip()


def table_row(name: str, returncode: int, summary: str, seconds: float) -> str:
    return f'| {name} | {"ok" if returncode == 0 else "FAILED"} | {summary} | {int(seconds)} |'


def render_table(device: str, desc: str, steps: str, seconds: float, rows: Sequence[str],
                 status: str, ladder: Optional[str] = None, now: Optional[time.struct_time] = None) -> str:
    """The whole markdown file: a header line, the rows so far, a status line, the ladder."""
    stamp = time.strftime('%Y-%m-%d %H:%M UTC', now or time.gmtime())
    lines = [f'# gpu_check ({device}): {stamp}, {desc}, steps {steps}, {int(seconds)} s', '',
             '| step | result | summary | seconds |', '|---|---|---|---|', *rows, '', status]
    text = '\n'.join(lines) + '\n'
    return text + f'\n{ladder}' if ladder is not None else text


def write_table(check: Check, status: str) -> None:
    ladder = check.logs / 'ladder.md'
    check.out.write_text(render_table(check.device, check.desc, check.steps,
                                      time.monotonic() - check.start, check.rows, status,
                                      ladder.read_text() if ladder.is_file() else None))


# ---------------------------------------------------------------------------- running rows

def check_losses(work: Path) -> Tuple[bool, str]:
    """Exactly 2 logged losses, all finite, in the newest run's mmengine scalars.json; and the
    TRAIN line that says so."""
    scalars = sorted(Path(work).glob('*/vis_data/scalars.json'))
    losses = []
    if scalars:
        losses = [json.loads(line)['loss'] for line in scalars[-1].read_text().splitlines()
                  if '"loss"' in line]
    ok = len(losses) == 2 and all(math.isfinite(v) for v in losses)
    rounded = [round(v, 3) for v in losses]
    return ok, f'TRAIN 2 iterations, losses {rounded}: {"finite" if ok else "NOT finite"}'


def run_command(argv: Sequence[str], log: TextIO) -> int:
    log.flush()
    return subprocess.run(list(argv), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode


def demo_data(check: Check, log: TextIO) -> int:
    """4 training and 2 validation images at the training size, once."""
    if (check.data / 'annotations' / 'instances_val.json').is_file():
        return 0
    size = str(check.settings.train_size)
    return run_command([check.python, 'tools/make_demo_data.py', '--out', str(check.data),
                        '--num-train', '4', '--num-val', '2', '--size', size, size], log)


def run_row_command(check: Check, row: Row, log: TextIO) -> int:
    if row.work is None:
        return run_command(row.argv, log)
    returncode = demo_data(check, log) or run_command(row.argv, log)
    if returncode:
        return returncode
    ok, line = check_losses(row.work)
    print(line, file=log)
    return 0 if ok else 1


def add_row(check: Check, name: str, shown: str, log_name: str, action: Callable[[TextIO], int]) -> None:
    """Run ``action`` with its output in the log, then add its row; the table is written first."""
    print(f'[gpu_check] {name}: {shown}', flush=True)
    write_table(check, f'running: {name} (the rows above are done; a table that ends here was cut short)')
    log_path, start = check.logs / log_name, time.monotonic()
    with open(log_path, 'w') as log:
        try:
            returncode = action(log)
        except Exception as error:  # a crash of the check itself costs only this row too
            print(f'{type(error).__name__}: {error}', file=log)
            returncode = 1
    check.failed |= returncode != 0
    summary = summary_of(log_path.read_text(errors='replace'), returncode, log_name)
    check.rows.append(table_row(name, returncode, summary, time.monotonic() - start))


# ---------------------------------------------------------------------------- install

def requirements_without_torch(text: str) -> str:
    """A requirements file minus its torch / torchvision pins (the machine's own stay)."""
    return ''.join(line for line in text.splitlines(keepends=True)
                   if not re.match(r'(torch|torchvision)==', line))


@contextlib.contextmanager
def output_to(log: TextIO) -> Iterator[None]:
    """This process's stdout and stderr (and so its children's) into ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    log.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def install_stack(python: str, logs: Path, log: Callable[[str], None] = print) -> None:
    """Only what is missing; torch and torchvision are the machine's own. The carried wheel sets
    of tools/build_gpu_wheels.sh; without any, mmcv's ops through mmcv_build (probed, built for
    the device, cached) and the pinned stack from PyPI."""
    sets = python_env.wheel_sets(ROOT / '.whl')
    if sets:
        return python_env.install_wheel_sets(python, sets, log=lambda msg: log(f'[gpu_check] {msg}'))
    dev = (ROOT / 'requirements' / 'dev.txt').read_text()
    cache = python_env.cache_dir('mmcv')
    log(mmcv_build.ensure_mmcv(python, mmcv_build.pin_from_requirements(dev), cache, log=log))
    requirements = logs / 'requirements.txt'
    requirements.write_text(requirements_without_torch(dev))
    python_env.pip(python, 'install', '-q', '-r', str(requirements))


def install_action(check: Check) -> Callable[[TextIO], int]:
    def action(log: TextIO) -> int:
        with output_to(log):
            install_stack(check.python, check.logs, log=lambda msg: print(msg, flush=True))
        return 0
    return action


# ---------------------------------------------------------------------------- main

def cuda_visible(python: str) -> bool:
    return subprocess.run([python, '-c', 'import torch, sys; sys.exit(not torch.cuda.is_available())'],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def in_virtualenv(python: str) -> bool:
    """Whether ``python`` runs in a virtual environment (its prefix is not its base prefix)."""
    out = subprocess.run([python, '-c', 'import sys; print(sys.prefix != sys.base_prefix)'],
                         capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == 'True'


def describe(python: str, device: str) -> str:
    """``'<device name> | torch <version>'``, or the last line of the error."""
    code = (f"import torch; print(torch.cuda.get_device_name() if '{device}' == 'cuda' else 'cpu', "
            "'| torch', torch.__version__)")
    out = subprocess.run([python, '-c', code], capture_output=True, text=True)
    lines = (out.stdout + out.stderr).splitlines()
    return lines[-1] if lines else ''


def tar_logs(out: Path) -> Path:
    """Every log beside ``out`` (its logs/ folder minus demo data and checkpoints) in one tarball."""
    tarball = out.with_name(out.name[:-3] if out.name.endswith('.md') else out.name)
    tarball = tarball.with_name(tarball.name + '_logs.tar.gz')

    def keep(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
        name = Path(info.name).name
        return None if name == 'demo_shapes' or name.endswith('.pth') else info

    with tarfile.open(tarball, 'w:gz') as tar:
        tar.add(out.parent / 'logs', arcname='logs', filter=keep)
    return tarball


def parser() -> argparse.ArgumentParser:
    steps = '\n'.join(f'  {name:<10} {step.what}' for name, step in STEPS.items())
    epilog = f"""steps, in this order (most value per second first, the OOM-prone, then the opt-in ones):
{steps}
--device cpu runs the same steps at tiny settings (tests/test_gpu_check.py runs it).

environment: PYTHON (the interpreter the steps run with; default: this one, which
tools/gpu_check.sh picks as $PYTHON, else .venv/bin/python, else python3); BENCH_BATCH (the
CUDA bench batch, default 8); BENCH_MODELS (the CUDA bench / compiled models, comma-separated,
default swin:tiny,pvtv2:b2,vit:b).
--install (CUDA only; nothing is installed without it, and never into a Python outside a virtual
environment): each wheel set of tools/build_gpu_wheels.sh found in
.whl/SET/ (pip --no-index --no-deps); without any, mmcv with CUDA ops through tools/mmcv_build.py
(probed on the device; built for its archs, TORCH_CUDA_ARCH_LIST and MAX_JOBS honoured, and
cached) and requirements/dev.txt minus torch and torchvision from PyPI."""
    p = argparse.ArgumentParser(prog='bash tools/gpu_check.sh', description=__doc__.split('\n\n')[1],
                                epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', choices=('cuda', 'cpu'), default='cuda',
                   help='cuda (default), or cpu: the same steps at tiny settings')
    p.add_argument('--out', type=Path, default=Path(DEFAULT_OUT),
                   help=f"the table (default {DEFAULT_OUT}); logs in FILE's folder under logs/, all "
                        'of them also in FILE minus .md plus _logs.tar.gz', metavar='FILE')
    p.add_argument('--steps', default=','.join(n for n, step in STEPS.items() if step.default),
                   metavar='LIST',
                   help='only these steps (comma-separated, e.g. --steps bench,ladder to rerun two)')
    p.add_argument('--install', action='store_true',
                   help='first install what the checks need into the virtual environment of PYTHON '
                        '(default: use the environment as it is; never pip into a Python outside a venv)')
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        steps = parse_steps(args.steps)
    except ValueError as error:
        print(f'gpu_check: {error}', file=sys.stderr)
        return 2
    python = os.environ.get('PYTHON') or sys.executable
    os.chdir(ROOT)
    if args.install and not in_virtualenv(python):
        print(f'gpu_check: --install installs only into a virtual environment; {python} is not in '
              'one (python3 -m venv .venv, then PYTHON=.venv/bin/python)', file=sys.stderr)
        return 2
    if args.device == 'cuda' and not cuda_visible(python):
        print(f'gpu_check: no CUDA device visible to {python} (torch.cuda.is_available() is False); '
              'nothing checked (--device cpu runs the CPU variant)')
        return 1
    os.environ['PYTHONPATH'] = os.pathsep.join(  # mmvit_ext from this checkout, no install
        p for p in (str(ROOT), os.environ.get('PYTHONPATH')) if p)
    check = Check(args.device, python, args.out, args.steps, desc=args.device)
    check.logs.mkdir(parents=True, exist_ok=True)
    if args.device == 'cuda' and args.install:
        add_row(check, 'install', 'install_stack', 'install.log', install_action(check))
    check.desc = describe(python, args.device)
    for name in steps:
        for row in STEPS[name].rows(check):
            add_row(check, row.name, ' '.join(row.argv), row.log_name,
                    lambda log, row=row: run_row_command(check, row, log))
    write_table(check, f'all steps done: {"some rows FAILED" if check.failed else "every row ok"}')
    shutil.copy(check.out, check.logs / check.out.name)
    tar_logs(check.out)
    print(check.out.read_text(), end='')
    return int(check.failed)


if __name__ == '__main__':
    sys.exit(main())
