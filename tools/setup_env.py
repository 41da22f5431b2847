"""Create (or refresh) a venv with one tested stack (run by ``bash tools/setup_env.sh``).

``.venv`` holds the pinned development stack (requirements/dev.txt); ``--stack oldest`` /
``--stack newest`` make ``.venv-oldest`` / ``.venv-newest`` (requirements/oldest.txt / newest.txt).
Idempotent: a stamp holding the hash of the pinned inputs makes a second run take seconds.
Standard library only: it runs before the venv exists.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mmcv_build  # noqa: E402
from python_env import (cache_dir, find_python, is_fresh, pip, python_version,  # noqa: E402
                        wanted_python, wheel_sets)

ROOT = Path(__file__).resolve().parents[1]
STACKS = {'pinned': 'requirements/dev.txt', 'oldest': 'requirements/oldest.txt',
          'newest': 'requirements/newest.txt'}
# what the stamp hashes: a change to any of them sets the venv up again
STAMPED = ('setup.py', 'tools/setup_env.py', 'tools/mmcv_build.py', 'tools/python_env.py')
EPILOG = """\
stacks (each requirements file names its Python, torch, mmcv and build tools):
  pinned  requirements/dev.txt into .venv (default; the README's stack)
  oldest  requirements/oldest.txt into .venv-oldest
  newest  requirements/newest.txt into .venv-newest
mmcv (or onedl-mmcv) is compiled against the stack's torch where its ops do not run, and its
wheel kept in ${XDG_CACHE_HOME:-~/.cache}/mmvit_ext/mmcv/KEY (KEY names mmcv, torch, device and
Python); on a GPU machine the wheels of tools/build_gpu_wheels.sh in .whl/ are used first.
environment: PYTHON (the interpreter for a new venv; default: the requirements file's
"# python: X.Y" line, looked up as pythonX.Y on the PATH or under pyenv, else python3, said in
one line), MAX_JOBS (compile jobs, default: all cores), TORCH_CUDA_ARCH_LIST (CUDA archs,
default: the device's)."""


def log(msg: str) -> None:
    print(f'[setup_env] {msg}', flush=True)


def stamp_of(requirements: Path) -> str:
    digest = hashlib.sha256(requirements.read_bytes())
    for name in STAMPED:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def base_pins(requirements: str) -> List[str]:
    """The stack's torch / torchvision / numpy lines, comments dropped."""
    lines = (line.split('#', 1)[0].strip() for line in requirements.splitlines())
    return [line for line in lines if re.match(r'(torch|torchvision|numpy)\s*([=<>!~;]|$)', line)]


def setup(stack: str, venv: Path) -> None:
    reqs_path = ROOT / STACKS[stack]
    reqs = reqs_path.read_text()
    stamp, want = venv / '.mmvit_ext_stack', stamp_of(reqs_path)
    if is_fresh(stamp, want):
        log(f'.venv is up to date ({venv})')
        return
    python = find_python(wanted_python(reqs), log=log)
    have = python_version(str(venv / 'bin' / 'python'))
    if have and have != python_version(python):  # a venv of another Python is made anew
        shutil.rmtree(venv)
    if not (venv / 'bin' / 'python').exists():
        subprocess.run([python, '-m', 'venv', str(venv)], check=True)
    py, t0 = str(venv / 'bin' / 'python'), time.time()
    pin = mmcv_build.pin_from_requirements(reqs)
    base = base_pins(reqs)
    pip(py, 'install', '-q', *pin.build_tools)
    pip(py, 'install', '-q', *base)
    try:
        log(mmcv_build.ensure_mmcv(py, pin, cache_dir('mmcv'), base=base, log=log,
                                   find_links=(*wheel_sets(ROOT / '.whl'), ROOT / '.whl')))
    except RuntimeError as e:
        raise SystemExit(f'[setup_env] error: {e}')
    pip(py, 'install', '-q', '-r', str(reqs_path))
    pip(py, 'install', '-q', '--no-deps', '--no-build-isolation', '-e', str(ROOT))
    check = ('import torch, mmcv, mmcv._ext, mmvit_ext, mmdet.models, mmseg.models, mmpretrain.models;'
             f' print("[setup_env] {stack} stack OK: torch", torch.__version__, "mmcv", mmcv.__version__)')
    subprocess.run([py, '-c', check], check=True)
    stamp.write_text(want + '\n')
    log(f'done in {time.time() - t0:.0f} s')


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='bash tools/setup_env.sh', description=__doc__.split('\n')[0],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--stack', choices=tuple(STACKS), default='pinned',
                        help='which tested stack (default: pinned)')
    parser.add_argument('--venv', type=Path, help="the venv to create or refresh instead of the stack's default")
    args = parser.parse_args(argv)
    venv = args.venv or ROOT / ('.venv' if args.stack == 'pinned' else f'.venv-{args.stack}')
    os.chdir(ROOT)
    setup(args.stack, venv.absolute())
    return 0


if __name__ == '__main__':
    sys.exit(main())
