"""The rehearsal of tools/build_gpu_wheels.py: the wheel set in a venv like the GPU image.

:func:`rehearse` (run by build_gpu_wheels.py on the machine's python3) installs the sets with
--no-index --no-deps and runs the checks; two of them run inside the rehearsal venv as

    python tools/gpu_rehearsal.py imports           # every module the GPU check needs imports
    python tools/gpu_rehearsal.py upernet-log DIR   # a 2-iteration UperNet run in DIR went well

Each check prints ``REHEARSE ...`` lines and fails with exit status 1. Standard library only at
import time: numpy and torch are imported by the check that reports their versions.
"""
from __future__ import annotations

import argparse
import glob
import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from gpu_wheel_set import pip

ROOT = Path(__file__).resolve().parents[1]
MODULES = ('cv2', 'mmcv', 'mmcv._ext', 'mmengine', 'mmengine.runner', 'mmdet.models',
           'mmdet.evaluation', 'mmseg.models', 'mmseg.evaluation', 'pycocotools.cocoeval',
           'mmvit_ext')
SEG_CONFIG = 'configs/upernet_swin_t_512x512_160k_ade20k.py'
# 2 iterations of 2 images at 128 x 128, no pretrained backbone, validation once at the end
SEG_OPTIONS = ('model.backbone.init_cfg=None', 'model.data_preprocessor.size=(128,128)',
               'train_dataloader.batch_size=2', 'train_dataloader.num_workers=0',
               'train_dataloader.persistent_workers=False',
               'train_dataloader.dataset.pipeline.2.scale=(512,128)',
               'train_dataloader.dataset.pipeline.3.crop_size=(128,128)', 'train_cfg.max_iters=2',
               'train_cfg.val_interval=100', 'default_hooks.logger.interval=1',
               'default_hooks.checkpoint.interval=100', 'default_hooks.checkpoint.save_last=False')


def import_failures(modules: Sequence[str],
                    import_module: Callable[[str], object] = importlib.import_module) -> List[str]:
    """``'module: Error: message'`` for each module that fails to import (every one, not just
    the first)."""
    failures = []
    for name in modules:
        try:
            import_module(name)
        except Exception as e:  # any error on import is a failed import here
            failures.append(f'{name}: {type(e).__name__}: {e}')
    return failures


def imports_report(modules: Sequence[str], failures: Sequence[str]) -> str:
    """``REHEARSE imports 10/11 ok`` and an indented line per failure."""
    head = f'REHEARSE imports {len(modules) - len(failures)}/{len(modules)} ok'
    return '\n'.join([head, *(f'  {failure}' for failure in failures)])


def check_imports(modules: Sequence[str] = MODULES) -> int:
    """Print the interpreter's versions and the import report; 1 if any module fails."""
    import numpy
    import torch
    print(f'REHEARSE python {sys.version.split()[0]}, numpy {numpy.__version__}, '
          f'torch {torch.__version__} (CUDA {torch.version.cuda})')
    failures = import_failures(modules)
    print(imports_report(modules, failures), flush=True)
    return 1 if failures else 0


def upernet_verdict(rows: Sequence[dict]) -> Tuple[str, bool]:
    """From the rows of mmengine's ``scalars.json``: two finite losses and one val mIoU."""
    losses = [row['loss'] for row in rows if 'loss' in row]
    miou = [row['mIoU'] for row in rows if 'mIoU' in row]
    ok = len(losses) == 2 and all(math.isfinite(v) for v in losses) and len(miou) == 1
    line = (f'REHEARSE UperNet Swin-T 2 iterations, losses {[round(v, 3) for v in losses]}, '
            f'val mIoU {miou}: {"ok" if ok else "FAILED"}')
    return line, ok


def check_upernet_log(run_dir: Path) -> int:
    """Print the verdict on the newest ``*/vis_data/scalars.json`` of ``run_dir``."""
    logs = sorted(glob.glob(f'{run_dir}/*/vis_data/scalars.json'))
    if not logs:
        print(f'REHEARSE UperNet Swin-T 2 iterations: FAILED (no scalars.json in {run_dir})')
        return 1
    with open(logs[-1]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    line, ok = upernet_verdict(rows)
    print(line)
    return 0 if ok else 1


def gpu_check_rows(report: str) -> List[str]:
    """The result rows of tools/gpu_check.sh's markdown report (no header, rule or step rows)."""
    return [line for line in report.splitlines()
            if re.match(r'\| [^-s]', line) and not line.startswith('| backbone')]


def seg_train(python: Path, folder: Path) -> bool:
    """2 iterations (+ mIoU) of UperNet Swin-T with mmseg's loops on generated ADE20K-like data;
    the output in ``folder/log``, its verdict printed."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ade, run_dir = folder / 'ade', folder / 'run'
    paths = [str(ROOT), *filter(None, [os.environ.get('PYTHONPATH')])]
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(paths)}
    roots = [f'{part}_dataloader.dataset.data_root={ade}' for part in ('train', 'val', 'test')]
    steps = [['tools/make_ade_demo_data.py', '--out', str(ade), '--num-train', '2', '--num-val', '1',
              '--size', '128', '128'],
             ['tools/train.py', SEG_CONFIG, '--work-dir', str(run_dir),
              '--cfg-options', *SEG_OPTIONS, *roots],
             [__file__, 'upernet-log', str(run_dir)]]
    ok = True
    with open(folder / 'log', 'w') as out:
        for step in steps:
            ok = subprocess.run([str(python), *step], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT).returncode == 0
            if not ok:
                break
    verdicts = [ln for ln in (folder / 'log').read_text().splitlines() if ln.startswith('REHEARSE')]
    print('\n'.join(verdicts) or f'REHEARSE UperNet Swin-T 2 iterations: FAILED (log: {folder / "log"})')
    return ok


def install_sets(python: Path, out: Path, sets: Sequence[str]) -> None:
    """The sets of ``out`` afresh into ``python``'s venv, one ``pip install --no-index --no-deps``
    a set, as tools/gpu_check.sh installs them on the GPU machine."""
    names = [spec.split('==')[0] for spec in (out / 'requirements.txt').read_text().split()]
    subprocess.run([str(python), '-m', 'pip', 'uninstall', '-q', '-y', *names],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for set_name in sets:
        requirements = out / set_name / 'requirements.txt'
        pip(python, 'install', '-q', '--no-index', '--no-deps', '--find-links', str(out / set_name),
            '-r', str(requirements))
        print(f'REHEARSE install {set_name}: ok ({len(requirements.read_text().splitlines())} wheels)')


def rehearse(python: Path, out: Path, sets: Sequence[str], logs: Path, expect: Sequence[str],
             log: Callable[[str], None] = print) -> bool:
    """Install the sets of ``out`` into ``python``'s venv (one like the GPU image), then check
    the imports, what mmcv._ext holds (``expect``: mmcv_ext_info.py's options),
    ``tools/gpu_check.sh --device cpu`` and a short UperNet training. True when all pass."""
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    log(f'rehearse: fresh install of the set into {Path(python).parent.parent} (--no-index --no-deps)')
    install_sets(python, out, sets)
    with open(logs / 'imports.log', 'w') as errors:
        ok = subprocess.run([str(python), __file__, 'imports'], cwd=ROOT, stderr=errors).returncode == 0
        ext = subprocess.run([str(python), 'tools/mmcv_ext_info.py', *expect], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=errors, text=True)
    print(''.join(f'REHEARSE {line}\n' for line in ext.stdout.splitlines()), end='')
    ok &= ext.returncode == 0
    args = ['--device', 'cpu', '--out', str(logs / 'gpu_check.md')]
    start = time.time()
    with open(logs / 'gpu_check.log', 'w') as out_log:
        checked = subprocess.run(['bash', 'tools/gpu_check.sh', *args], cwd=ROOT, stdout=out_log,
                                 stderr=subprocess.STDOUT, env={**os.environ, 'PYTHON': str(python)})
    verdict = f'ok ({time.time() - start:.0f} s)' if checked.returncode == 0 else \
        f'FAILED (log: {logs / "gpu_check.log"})'
    print(f'REHEARSE gpu_check.sh {" ".join(args)}: {verdict}')
    ok &= checked.returncode == 0
    report = logs / 'gpu_check.md'
    rows = gpu_check_rows(report.read_text()) if report.is_file() else []
    print(''.join(f'REHEARSE   {row}\n' for row in rows), end='', flush=True)
    ok &= seg_train(python, logs / 'upernet')
    print(f'REHEARSE {"ok" if ok else "FAILED"}', flush=True)
    return ok


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = parser.add_subparsers(dest='check', required=True)
    sub.add_parser('imports', help='import every module the GPU check needs')
    upernet = sub.add_parser('upernet-log', help="judge a 2-iteration UperNet run's log")
    upernet.add_argument('run_dir', type=Path)
    args = parser.parse_args(argv)
    # mmvit_ext from the checkout, as on the GPU machine; tools/ (train.py, test.py) off the path
    sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or '.').resolve() != ROOT / 'tools')]
    if args.check == 'imports':
        return check_imports()
    return check_upernet_log(args.run_dir)


if __name__ == '__main__':
    sys.exit(main())
