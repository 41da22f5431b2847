"""The GPU check in one call (run by ``bash tools/gpu_check.sh``).

Installs what is missing from carried wheels, then runs each step of gpu_check_steps.py in its own
process (a failure or an OOM costs only its own row) and writes one markdown table (--out,
rewritten before every row, so a run killed at a time limit keeps the rows it finished) plus one
tarball of every log beside it. --device cpu runs the same steps at tiny settings
(tests/test_gpu_check.py runs it). Standard library only: the steps import torch themselves.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, TextIO, Tuple

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import mmcv_build  # noqa: E402
import python_env  # noqa: E402
from gpu_check_steps import STEPS, Check, Row, parse_steps  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = 'work_dirs/gpu_check/gpu_check.md'


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

def check_training(work: Path, metric: Optional[str] = None) -> Tuple[bool, str]:
    """The newest mmengine run under ``work``: exactly 2 logged losses, all finite (and, with
    ``metric``, one value of it), from its scalars.json; and the TRAIN line that says so."""
    scalars = sorted(Path(work).glob('*/vis_data/scalars.json'))
    records = [json.loads(ln) for ln in scalars[-1].read_text().splitlines() if ln.strip()] \
        if scalars else []
    losses = [r['loss'] for r in records if 'loss' in r]
    ok = len(losses) == 2 and all(math.isfinite(v) for v in losses)
    line = f'TRAIN 2 iterations, losses {[round(v, 3) for v in losses]}'
    if metric:
        values = [r[metric] for r in records if metric in r]
        ok, line = ok and len(values) == 1, f'{line}, val {metric} {values}'
    return ok, f'{line}: {"ok" if ok else "FAILED"}'


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
    ok, line = check_training(row.work)
    print(line, file=log)
    return 0 if ok else 1


def add_row(check: Check, row: Row) -> None:
    """Run ``row`` with its output in its log, then add it to the table (written first)."""
    print(f'[gpu_check] {row.name}: {" ".join(row.argv)}', flush=True)
    write_table(check, f'running: {row.name} (the rows above are done; a table that ends here was '
                       'cut short)')
    log_path, start = check.logs / row.log_name, time.monotonic()
    with open(log_path, 'w') as log:
        try:
            returncode = run_row_command(check, row, log)
        except Exception as error:  # a crash of the check itself costs only this row too
            print(f'{type(error).__name__}: {error}', file=log)
            returncode = 1
    check.failed |= returncode != 0
    summary = summary_of(log_path.read_text(errors='replace'), returncode, row.log_name)
    check.rows.append(table_row(row.name, returncode, summary, time.monotonic() - start))


# ---------------------------------------------------------------------------- install

def requirements_without_torch(text: str) -> str:
    """A requirements file minus its torch / torchvision pins (the machine's own stay)."""
    return ''.join(line for line in text.splitlines(keepends=True)
                   if not re.match(r'(torch|torchvision)==', line))


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


def install_row(check: Check) -> Row:
    """install_stack in a process of its own (pip's output and the build's in its log)."""
    code = ('import pathlib, sys; sys.path.insert(0, "tools/dev"); import gpu_check; '
            'gpu_check.install_stack(sys.argv[1], pathlib.Path(sys.argv[2]))')
    return Row('install', (sys.executable, '-c', code, check.python, str(check.logs)))


# ---------------------------------------------------------------------------- main

def in_virtualenv(python: str) -> bool:
    """Whether ``python`` runs in a virtual environment (its prefix is not its base prefix)."""
    out = subprocess.run([python, '-c', 'import sys; print(sys.prefix != sys.base_prefix)'],
                         capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == 'True'


def torch_info(python: str) -> dict:
    """mmcv_build.torch_info of ``python``, or ``{'device': 'none'}`` where torch fails."""
    try:
        return mmcv_build.torch_info(python)
    except subprocess.CalledProcessError:
        return {'device': 'none'}


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
    info = torch_info(python)
    if args.device == 'cuda' and info['device'] != 'cuda':
        print(f'gpu_check: no CUDA device visible to {python} (torch.cuda.is_available() is False); '
              'nothing checked (--device cpu runs the CPU variant)')
        return 1
    os.environ['PYTHONPATH'] = os.pathsep.join(  # mmvit_ext from this checkout, no install
        p for p in (str(ROOT), os.environ.get('PYTHONPATH')) if p)
    desc = f"{info['name']} | torch {info['torch']} (CUDA {info['cuda']})" if 'name' in info else \
        'torch does not import'
    check = Check(args.device, python, args.out, args.steps, desc=desc)
    check.logs.mkdir(parents=True, exist_ok=True)
    if args.device == 'cuda' and args.install:
        add_row(check, install_row(check))
    for name in steps:
        for row in STEPS[name].rows(check):
            add_row(check, row)
    write_table(check, f'all steps done: {"some rows FAILED" if check.failed else "every row ok"}')
    shutil.copy(check.out, check.logs / check.out.name)
    tar_logs(check.out)
    print(check.out.read_text(), end='')
    return int(check.failed)


if __name__ == '__main__':
    sys.exit(main())
