"""Build, on a CPU machine with nvcc, the offline wheel set of a machine without a package index
into .whl/: the list and the machine's facts (Python, CUDA archs, platforms, the most a set may
hold) are tools/gpu_wheels.txt's.

  - mmcv, pinned there, compiled with CUDA ops by tools/mmcv_build.py in a cached build venv of
    the machine's Python, debug info stripped, the wheel cached by (mmcv, torch, CUDA, archs);
  - the listed wheels the machine lacks, for its Python and platforms, one folder per set
    (.whl/<set>/, with requirements.txt), each no larger than the list's @max-set-mib;
  - .whl/requirements.txt (all sets) and .whl/MANIFEST.txt (file, size, sha256, CUDA + archs).
--rehearse installs the sets with --no-index --no-deps into a fresh venv like the machine's (its
"image" entries from PyPI), then checks the imports, what mmcv._ext holds, tools/gpu_check.sh
--device cpu and a 2-iteration UperNet training there. Standard library only.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import mmcv_build  # noqa: E402
from gpu_check import check_training  # noqa: E402
from python_env import (Entry, cache_dir, cpu_count, find_python, find_wheel,  # noqa: E402
                        install_wheel_sets, make_venv, mib, pinned, pip, python_version, read_list,
                        read_target, shipped_sets, specs_of, write_manifest, write_requirements)

ROOT = Path(__file__).resolve().parents[2]
LIST = ROOT / 'tools' / 'gpu_wheels.txt'
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
# a check of the rehearsal, run inside its venv: this module's function, mmvit_ext from the checkout
IN_VENV = 'import sys; sys.path.append("tools/dev"); import build_gpu_wheels as b; sys.exit(b.{}(*sys.argv[1:]))'
EXT_INFO = 'tools/dev/mmcv_ext_info.py'
EPILOG = """\
environment:
  TARGET_PYTHON         CPython of the list's @python for the venvs (default: pythonX.Y on PATH,
                        else pyenv's)
  TORCH_CUDA_ARCH_LIST  CUDA archs compiled into mmcv (default: the list's @arch)
  MAX_JOBS              parallel compile jobs (default: nproc)
  NVCC                  the nvcc to build with (default: nvcc on PATH); CUDA_HOME is its parent dir
  MMVIT_GPU_BUILD_CACHE the cache dir (see --cache)
  XDG_CACHE_HOME        base of the default cache dir"""


class BuildError(RuntimeError):
    """A step that cannot go on; its message is the one line the user sees."""


def log(msg: str) -> None:
    print(f'[build_gpu_wheels {time.strftime("%H:%M:%S")}] {msg}', flush=True)


# ---------------------------------------------------------------------------- the plan

@dataclass
class Plan:
    """What a run builds and where: settings, toolkit, the list and the cache layout."""

    out: Path
    cache: Path
    arch: str
    jobs: int
    nvcc: Optional[str]
    cuda: str                  # nvcc's release; 'none' without an nvcc
    cuda_root: Optional[str]
    entries: List[Entry]
    target: Dict[str, List[str]]
    rebuild: bool = False

    @property
    def pin(self) -> mmcv_build.MmcvPin:
        build_tools = mmcv_build.pin_from_requirements(
            (ROOT / 'requirements' / 'dev.txt').read_text()).build_tools
        return mmcv_build.MmcvPin('mmcv', pinned(self.entries, 'mmcv'), build_tools)

    @property
    def python(self) -> str:
        return self.target['python'][0]

    @property
    def torch(self) -> str:
        return pinned(self.entries, 'torch')

    @property
    def key(self) -> str:
        """``mmcv2.1.0-torch2.11.0-cu13.0-py312-sm9.0``: the mmcv wheel's cache key."""
        return mmcv_build.cache_key(self.pin, self.torch, self.python, self.cuda, self.arch)

    @property
    def mmcv_cache(self) -> Path:
        return self.cache / 'mmcv' / self.key

    @property
    def build_venv(self) -> Path:
        return self.cache / 'venv-build'

    @property
    def image_venv(self) -> Path:
        return self.cache / 'venv-gpu-image'

    @property
    def downloads(self) -> Path:
        return self.cache / 'downloads'

    @property
    def sets(self) -> List[str]:
        return shipped_sets(self.entries)

    def build_specs(self) -> List[str]:
        """What the build venv holds: the pinned torch, the list's @build pins, mmcv's build tools."""
        return [f'torch=={self.torch}', *self.target['build'], *self.pin.build_tools]

    def lines(self) -> List[str]:
        """The ``--print-plan`` report."""
        return [f'mmcv {self.pin.version}, torch {self.torch}, '
                f'torchvision {pinned(self.entries, "torchvision")}, Python {self.python}',
                f'nvcc: {self.nvcc or "none"} (CUDA {self.cuda}), CUDA_HOME: {self.cuda_root or "none"}',
                f'TORCH_CUDA_ARCH_LIST: {self.arch}, MAX_JOBS: {self.jobs}',
                f'cache key: {self.key}',
                f'mmcv cache: {self.mmcv_cache}',
                f'out: {self.out}, sets: {" ".join(self.sets)}']


def make_plan(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> Plan:
    """The plan of a run from its options, environment and list; paths absolute from the cwd."""
    nvcc = mmcv_build.nvcc_path(env)
    usable = bool(nvcc) and os.path.isfile(nvcc) and os.access(nvcc, os.X_OK)
    text = LIST.read_text()
    target = read_target(text)
    cache = args.cache or env.get('MMVIT_GPU_BUILD_CACHE') or cache_dir('gpu_build', env)
    return Plan(out=Path(os.path.abspath(args.out or ROOT / '.whl')),
                cache=Path(os.path.abspath(cache)),
                arch=env.get('TORCH_CUDA_ARCH_LIST') or target['arch'][0],
                jobs=int(env.get('MAX_JOBS') or cpu_count()),
                nvcc=nvcc or None,
                cuda=mmcv_build.nvcc_release(nvcc) if usable else 'none',
                cuda_root=mmcv_build.cuda_home(nvcc) if usable else None,
                entries=read_list(text), target=target, rebuild=args.rebuild)


def target_python(version: str, env: Mapping[str, str] = os.environ) -> str:
    """$TARGET_PYTHON, else python``version`` on the PATH, else pyenv's."""
    python = find_python(version, {**env, 'PYTHON': env.get('TARGET_PYTHON', '')}, log=lambda m: None)
    if python_version(python) != version:
        raise BuildError(f'no CPython {version} found (set TARGET_PYTHON)')
    return python


# ---------------------------------------------------------------------------- the build

def nvidia_includes(python: Path) -> List[str]:
    """The include dirs of the nvidia-* packages in ``python``'s venv: the toolkit may lack the
    cuBLAS / cuSPARSE / cuDNN headers that ATen/cuda includes, torch's dependencies carry them."""
    purelib = subprocess.run([str(python), '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                             check=True, capture_output=True, text=True).stdout.strip()
    nvidia = Path(purelib) / 'nvidia'
    found = [*nvidia.glob('*/include'), *nvidia.glob('*/*/include')]
    return sorted(str(p) for p in found if p.is_dir())


def strip_wheel(python: Path, wheel: Path, work: Path) -> Path:
    """A copy of ``wheel`` in ``work/stripped`` with the debug info of its ``mmcv/_ext*.so``
    stripped (``wheel unpack``, ``strip --strip-debug``, ``wheel pack``)."""
    shutil.rmtree(work, ignore_errors=True)
    (work / 'stripped').mkdir(parents=True)
    quiet = dict(check=True, stdout=subprocess.DEVNULL)
    subprocess.run([str(python), '-m', 'wheel', 'unpack', str(wheel), '-d', str(work / 'unpacked')], **quiet)
    unpacked = next((work / 'unpacked').iterdir())
    for lib in sorted(unpacked.glob('mmcv/_ext*.so')):
        before = lib.stat().st_size
        subprocess.run(['strip', '--strip-debug', str(lib)], check=True)
        log(f'strip --strip-debug {lib.name}: {before / 2**20:.0f} MB -> {lib.stat().st_size / 2**20:.0f} MB')
    subprocess.run([str(python), '-m', 'wheel', 'pack', str(unpacked), '-d', str(work / 'stripped')], **quiet)
    return next((work / 'stripped').glob('*.whl'))


def build_mmcv(plan: Plan, python: Path) -> None:
    """The stripped CUDA mmcv wheel for ``plan.key``, into ``plan.mmcv_cache``. The unstripped
    wheel is kept until its stripped copy is cached, so a failure after the compile resumes
    from it; ``--rebuild`` compiles again."""
    torch_cuda = str(mmcv_build.torch_info(str(python))['cuda'])
    if torch_cuda.split('.')[0] != plan.cuda.split('.')[0]:
        raise BuildError(f'torch {plan.torch} is built for CUDA {torch_cuda}, nvcc is {plan.cuda}')
    raw = plan.cache / 'mmcv-raw' / plan.key
    if plan.rebuild or plan.pin.wheel_in(raw) is None:
        log(f'compiling mmcv {plan.pin.version} (CUDA {plan.cuda}, torch CUDA {torch_cuda}, '
            f'arch {plan.arch}, {plan.jobs} jobs)')
        start = time.time()
        cpath = [*nvidia_includes(python), *filter(None, [os.environ.get('CPATH')])]
        env = mmcv_build.build_env(plan.jobs, plan.cuda_root, plan.arch,
                                   extra={'CPATH': os.pathsep.join(cpath)} if cpath else None)
        mmcv_build.build_wheel(str(python), plan.pin, raw, env, log)
        log(f'mmcv compiled in {time.time() - start:.0f} s')
    else:
        log(f'resuming from the compiled, unstripped wheel in {raw}')
    work = plan.cache / 'mmcv-work'
    stripped = strip_wheel(python, plan.pin.wheel_in(raw), work)
    shutil.rmtree(plan.mmcv_cache, ignore_errors=True)
    plan.mmcv_cache.mkdir(parents=True)
    shutil.move(str(stripped), str(plan.mmcv_cache / stripped.name))
    shutil.rmtree(work)
    shutil.rmtree(raw)


def download_set(plan: Plan, python: Path, set_name: str) -> None:
    """The pinned wheels of ``set_name`` (all but mmcv) for the list's Python and platforms, into
    ``out/<set>/``; a source-only pin as a pure-Python wheel built here."""
    entries = [e for e in plan.entries if e.set == set_name and e.name != 'mmcv']
    if not entries:
        return
    platforms = [arg for p in plan.target['platforms'] for arg in ('--platform', p)]
    pip(python, 'download', '-q', '--no-deps', '--only-binary=:all:', '--python-version', plan.python,
        '--implementation', 'cp', *platforms, '-d', str(plan.downloads), *(e.spec for e in entries))
    for entry in entries:
        wheel = find_wheel(plan.downloads, entry.name, entry.version)
        if wheel is None:
            pip(python, 'wheel', '-q', '--no-deps', '-w', str(plan.downloads), entry.spec, check=False)
            wheel = find_wheel(plan.downloads, entry.name, entry.version, pure_only=True)
        if wheel is None:
            raise BuildError(f'no wheel downloaded or built for {entry.spec}')
        shutil.copy(wheel, plan.out / set_name)
    size, most = sum(w.stat().st_size for w in (plan.out / set_name).glob('*.whl')), plan.target['max-set-mib'][0]
    if size > float(most) * 2**20:
        raise BuildError(f'set {set_name} holds {mib(size)}, more than the list\'s @max-set-mib {most}')


def build(plan: Plan, python: Path) -> None:
    """mmcv (cached or compiled), every set downloaded into ``plan.out``, the manifest with what
    mmcv._ext holds (read through mmcv.ops, so the build venv gets each set too)."""
    start = time.time()
    if plan.rebuild or plan.pin.wheel_in(plan.mmcv_cache) is None:
        build_mmcv(plan, python)
    else:
        log(f'mmcv: cached wheel for {plan.key}')
    pip(python, 'install', '-q', *plan.target['read'])
    shutil.rmtree(plan.out, ignore_errors=True)
    for set_name in plan.sets:
        folder = plan.out / set_name
        folder.mkdir(parents=True)
        if any(e.name == 'mmcv' and e.set == set_name for e in plan.entries):
            shutil.copy(plan.pin.wheel_in(plan.mmcv_cache), folder)
        download_set(plan, python, set_name)
        pip(python, 'install', '-q', '--no-index', '--no-deps', '--force-reinstall',
            *sorted(str(p) for p in folder.glob('*.whl')))
    write_requirements(plan.out, plan.entries, plan.sets)
    ext = subprocess.run([str(python), EXT_INFO, '--expect-cuda', plan.cuda,
                          '--expect-arch', plan.arch], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if ext.returncode:
        raise BuildError(ext.stdout.strip() or 'mmcv._ext unreadable')
    now = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    manifest = write_manifest(plan.out, plan.sets, [
        f'wheel set: {now}, built by tools/dev/build_gpu_wheels.py',
        f'{ext.stdout.strip()} (get_compiling_cuda_version; kernels read from the fatbinary)',
        f'built with TORCH_CUDA_ARCH_LIST={plan.arch}, torch {plan.torch}, nvcc {plan.cuda}; '
        f'cache key {plan.key}'])
    log(f'wheel set in {plan.out} ({time.time() - start:.0f} s):')
    print(''.join(line + '\n' for line in manifest.splitlines() if line.startswith('##')), end='')


# ---------------------------------------------------------------------------- the rehearsal

def import_failures(modules: Sequence[str],
                    import_module: Callable[[str], object] = importlib.import_module) -> List[str]:
    """``'module: Error: message'`` for each module that fails to import (every one)."""
    failures = []
    for name in modules:
        try:
            import_module(name)
        except Exception as e:  # any error on import is a failed import here
            failures.append(f'{name}: {type(e).__name__}: {e}')
    return failures


def check_imports() -> int:
    """In the rehearsal venv: its versions, ``REHEARSE imports 10/11 ok`` and a line per failure;
    1 if any module fails."""
    tools = (ROOT / 'tools', ROOT / 'tools' / 'dev')  # no tools/ module shadows a package here
    sys.path[:] = [p for p in sys.path if Path(p or '.').resolve() not in tools]
    import numpy
    import torch
    print(f'REHEARSE python {sys.version.split()[0]}, numpy {numpy.__version__}, '
          f'torch {torch.__version__} (CUDA {torch.version.cuda})')
    failures = import_failures(MODULES)
    print(f'REHEARSE imports {len(MODULES) - len(failures)}/{len(MODULES)} ok', flush=True)
    print(''.join(f'  {failure}\n' for failure in failures), end='', flush=True)
    return 1 if failures else 0


def check_upernet_log(run_dir: str) -> int:
    """check_training of ``run_dir``: two finite losses and one val mIoU, printed."""
    ok, line = check_training(Path(run_dir), 'mIoU')
    print(f'REHEARSE UperNet Swin-T {line}')
    return 0 if ok else 1


def gpu_check_rows(report: str) -> List[str]:
    """The result rows of tools/gpu_check.sh's markdown report (no header, rule or step rows)."""
    return [line for line in report.splitlines()
            if re.match(r'\| [^-s]', line) and not line.startswith('| backbone')]


def rehearse(plan: Plan, python: Path) -> bool:
    """The sets of ``plan.out`` afresh into ``python``'s venv (one like the machine's), then each
    check in its own log: the imports, what mmcv._ext holds, ``tools/gpu_check.sh --device cpu``
    and a 2-iteration UperNet training. True when all pass."""
    logs, py = plan.cache / 'rehearse', str(python)
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    log(f'rehearse: fresh install of the set into {python.parent.parent} (--no-index --no-deps)')
    names = [spec.split('==')[0] for spec in (plan.out / 'requirements.txt').read_text().split()]
    pip(py, 'uninstall', '-q', '-y', *names, check=False)
    install_wheel_sets(py, [plan.out / s for s in plan.sets], log=lambda msg: print(f'REHEARSE {msg}'))
    ade, run_dir, report = logs / 'ade', logs / 'upernet', logs / 'gpu_check.md'
    roots = [f'{part}_dataloader.dataset.data_root={ade}' for part in ('train', 'val', 'test')]
    checks = {
        'imports': [[py, '-c', IN_VENV.format('check_imports')]],
        'mmcv._ext': [[py, EXT_INFO, '--expect-cuda', plan.cuda, '--expect-arch', plan.arch]],
        'gpu_check': [['bash', 'tools/gpu_check.sh', '--device', 'cpu', '--out', str(report)]],
        'upernet': [[py, 'tools/make_ade_demo_data.py', '--out', str(ade), '--num-train', '2',
                     '--num-val', '1', '--size', '128', '128'],
                    [py, 'tools/train.py', SEG_CONFIG, '--work-dir', str(run_dir), '--cfg-options',
                     *SEG_OPTIONS, *roots],
                    [py, '-c', IN_VENV.format('check_upernet_log'), str(run_dir)]]}
    paths = [str(ROOT), *filter(None, [os.environ.get('PYTHONPATH')])]
    env = {**os.environ, 'PYTHON': py, 'PYTHONPATH': os.pathsep.join(paths)}
    ok = True
    for name, commands in checks.items():
        start, path, code = time.time(), logs / f'{name}.log', 0
        with open(path, 'w') as out:
            for argv in commands:
                code = code or subprocess.run(argv, cwd=ROOT, env=env, stdout=out,
                                              stderr=subprocess.STDOUT).returncode
        ok &= code == 0
        lines = [ln for ln in path.read_text().splitlines() if ln.startswith(('REHEARSE', 'mmcv._ext:'))]
        lines += gpu_check_rows(report.read_text()) if name == 'gpu_check' and report.is_file() else []
        print(f'REHEARSE {name}: {"ok" if code == 0 else "FAILED"} ({time.time() - start:.0f} s, {path})')
        print(''.join(f'REHEARSE   {line}\n' for line in lines), end='', flush=True)
    print(f'REHEARSE {"ok" if ok else "FAILED"}', flush=True)
    return ok


# ---------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='bash tools/build_gpu_wheels.sh', description=__doc__.split('\n\n')[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument('--out', metavar='DIR',
                        help='where the wheel set goes (default: .whl at the repo root)')
    parser.add_argument('--cache', metavar='DIR',
                        help='build venvs, downloads and the mmcv wheel cache (default: '
                        '$MMVIT_GPU_BUILD_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/mmvit_ext/gpu_build)')
    parser.add_argument('--rebuild', action='store_true',
                        help='compile mmcv again even if the cached wheel for this key exists')
    parser.add_argument('--rehearse', action='store_true',
                        help='after building, install the set into a fresh venv like the machine '
                        '(the list\'s @build pins and "image" entries from PyPI: torch, torchvision, '
                        'timm, opencv, scipy, matplotlib, ...) with --no-index and check it')
    parser.add_argument('--rehearse-only', action='store_true',
                        help='rehearse the set already in --out, build nothing')
    parser.add_argument('--print-plan', action='store_true',
                        help='print the settings and the mmcv cache key, then exit (no download, no build)')
    return parser


def run(args: argparse.Namespace) -> int:
    plan = make_plan(args)
    os.chdir(ROOT)  # tools/gpu_check.sh, tools/train.py and the imports of mmvit_ext run from here
    if args.print_plan:
        print('\n'.join(plan.lines()))
        return 0
    if plan.cuda == 'none':
        raise BuildError('nvcc not found (set NVCC)')
    python = target_python(plan.python)
    plan.downloads.mkdir(parents=True, exist_ok=True)
    start = time.time()
    if not args.rehearse_only:
        build(plan, make_venv(python, plan.build_venv, plan.build_specs(), log=log))
    if args.rehearse or args.rehearse_only:
        image = make_venv(python, plan.image_venv, [*plan.target['build'], *specs_of(plan.entries, 'image')],
                          log=log)
        if not rehearse(plan, image):
            return 1
    log(f'done in {time.time() - start:.0f} s')
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # our lines and the subprocesses' in order
    try:
        return run(args)
    except (BuildError, RuntimeError, KeyError) as e:
        print(f'build_gpu_wheels: {e}', file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        cmd = shlex.join(map(str, e.cmd)) if isinstance(e.cmd, list) else e.cmd
        print(f'build_gpu_wheels: {cmd} failed (exit {e.returncode})', file=sys.stderr)
        return e.returncode or 1


if __name__ == '__main__':
    sys.exit(main())
