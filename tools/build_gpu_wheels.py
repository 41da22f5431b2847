"""Build, on a CPU machine with nvcc, the offline wheel set for the GPU test machine into .whl/.

The GPU machine runs CPython 3.12 and torch 2.11.0+cu130 and has no package index. This builds:
  - mmcv (pinned in tools/gpu_wheels.txt) compiled with CUDA ops by tools/mmcv_build.py in a cached
    py3.12 build venv, debug info stripped, the wheel cached by (mmcv, torch, CUDA, arch list);
  - the cp312 / py3 wheels of tools/gpu_wheels.txt (what the image lacks), split into sets that
    each fit one carry (.whl/<set>/, with requirements.txt);
  - .whl/requirements.txt (all sets) and .whl/MANIFEST.txt (file, size, sha256, CUDA + arch).
--rehearse installs the sets with --no-index --no-deps into a fresh venv like the GPU image,
checks the imports (tools/gpu_rehearsal.py) and runs tools/gpu_check.sh --device cpu and a
2-iteration UperNet training with it. Run by ``bash tools/build_gpu_wheels.sh``; standard
library only (it runs on the machine's python3).
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_wheel_set as wheel_set  # noqa: E402
import mmcv_build  # noqa: E402
import setup_env  # noqa: E402
from gpu_rehearsal import rehearse  # noqa: E402
from gpu_wheel_set import pip  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / 'tools' / 'gpu_wheels.txt'
GPU_PYTHON = '3.12'  # the GPU image's
BUILD_PINS = ('numpy>=2,<3',)
# what mmengine imports that the image has and torch does not bring: for reading the built mmcv
IMAGE_EXTRAS = ('pyyaml', 'pillow', 'packaging')
PLATFORMS = ('manylinux_2_28_x86_64', 'manylinux2014_x86_64', 'manylinux_2_17_x86_64',
             'manylinux1_x86_64', 'any')
EPILOG = """\
environment:
  PYTHON312             CPython 3.12 for the venvs (default: python3.12 on PATH, else pyenv's)
  TORCH_CUDA_ARCH_LIST  CUDA archs compiled into mmcv (default: 9.0, H100 / H200)
  MAX_JOBS              parallel compile jobs (default: nproc)
  NVCC                  the nvcc to build with (default: nvcc on PATH); CUDA_HOME is its parent dir
  MMVIT_GPU_BUILD_CACHE the cache dir (see --cache)
  XDG_CACHE_HOME        base of the default cache dir"""


class BuildError(RuntimeError):
    """A step that cannot go on; its message is the one line the user sees."""


def log(msg: str) -> None:
    print(f'[build_gpu_wheels {time.strftime("%H:%M:%S")}] {msg}', flush=True)


@dataclass
class Plan:
    """What a run builds and where: settings, toolkit, pins and the cache layout."""

    out: Path
    cache: Path
    arch: str
    jobs: int
    nvcc: Optional[str]
    cuda: str                  # nvcc's release; 'none' without an nvcc
    cuda_root: Optional[str]
    entries: List[wheel_set.Entry]
    rebuild: bool = False

    @property
    def pin(self) -> mmcv_build.MmcvPin:
        build_tools = mmcv_build.pin_from_requirements(
            (ROOT / 'requirements' / 'dev.txt').read_text()).build_tools
        return mmcv_build.MmcvPin('mmcv', wheel_set.pinned(self.entries, 'mmcv'), build_tools)

    @property
    def torch(self) -> str:
        return wheel_set.pinned(self.entries, 'torch')

    @property
    def key(self) -> str:
        """``mmcv2.1.0-torch2.11.0-cu13.0-py312-sm9.0``: the mmcv wheel's cache key."""
        return mmcv_build.cache_key(self.pin, self.torch, GPU_PYTHON, self.cuda, self.arch)

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
        return wheel_set.shipped_sets(self.entries)

    def build_specs(self) -> List[str]:
        """What the build venv holds: the pinned torch, numpy 2 and mmcv's build tools."""
        return [f'torch=={self.torch}', *BUILD_PINS, *self.pin.build_tools]

    def lines(self) -> List[str]:
        """The ``--print-plan`` report."""
        return [f'mmcv {self.pin.version}, torch {self.torch}, '
                f'torchvision {wheel_set.pinned(self.entries, "torchvision")}',
                f'nvcc: {self.nvcc or "none"} (CUDA {self.cuda}), CUDA_HOME: {self.cuda_root or "none"}',
                f'TORCH_CUDA_ARCH_LIST: {self.arch}, MAX_JOBS: {self.jobs}',
                f'cache key: {self.key}',
                f'mmcv cache: {self.mmcv_cache}',
                f'out: {self.out}, sets: {" ".join(self.sets)}']


def default_cache(env: Mapping[str, str]) -> str:
    """$MMVIT_GPU_BUILD_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/mmvit_ext/gpu_build."""
    base = env.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')
    return env.get('MMVIT_GPU_BUILD_CACHE') or os.path.join(base, 'mmvit_ext', 'gpu_build')


def cpu_count() -> int:
    """The cores this process may use (nproc)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


def make_plan(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> Plan:
    """The plan of a run from its options and environment; paths absolute from the caller's cwd."""
    nvcc = mmcv_build.nvcc_path(env)
    usable = bool(nvcc) and os.path.isfile(nvcc) and os.access(nvcc, os.X_OK)
    return Plan(out=Path(os.path.abspath(args.out or ROOT / '.whl')),
                cache=Path(os.path.abspath(args.cache or default_cache(env))),
                arch=env.get('TORCH_CUDA_ARCH_LIST') or '9.0',
                jobs=int(env.get('MAX_JOBS') or cpu_count()),
                nvcc=nvcc or None,
                cuda=mmcv_build.nvcc_release(nvcc) if usable else 'none',
                cuda_root=mmcv_build.cuda_home(nvcc) if usable else None,
                entries=wheel_set.read_list(LIST.read_text()),
                rebuild=args.rebuild)


def find_python312(env: Mapping[str, str] = os.environ) -> str:
    """$PYTHON312, else python3.12 on the PATH, else pyenv's (setup_env's lookup)."""
    try:
        return setup_env.find_python('3.12', {**env, 'PYTHON': env.get('PYTHON312', '')})
    except SystemExit:
        raise BuildError('no CPython 3.12 found (set PYTHON312)') from None


def make_venv(python312: str, venv: Path, specs: Sequence[str]) -> Path:
    """A py3.12 venv with ``specs`` installed, reused while they stay the same; its python."""
    ready, wanted = venv / '.ready', ' '.join(specs)
    if not (ready.is_file() and ready.read_text().strip() == wanted):
        log(f'venv {venv}: {wanted}')
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python312, '-m', 'venv', str(venv)], check=True)
        pip(venv / 'bin' / 'python', 'install', '-q', '--upgrade', 'pip')
        pip(venv / 'bin' / 'python', 'install', '-q', *specs)
        ready.write_text(wanted + '\n')
    return venv / 'bin' / 'python'


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


def build_mmcv(plan: Plan, python312: str) -> None:
    """The stripped CUDA mmcv wheel for ``plan.key``, into ``plan.mmcv_cache``.

    The unstripped wheel is kept per key until its stripped copy is cached, so a failure after
    the (long) compile resumes from it; ``--rebuild`` compiles again."""
    python = make_venv(python312, plan.build_venv, plan.build_specs())
    torch_cuda = str(mmcv_build.torch_info(str(python))['cuda'])
    if torch_cuda.split('.')[0] != plan.cuda.split('.')[0]:
        raise BuildError(f'torch {plan.torch} is built for CUDA {torch_cuda}, nvcc is {plan.cuda}')
    raw = plan.cache / 'mmcv-raw' / plan.key
    if plan.rebuild or mmcv_build.find_wheel(raw, plan.pin) is None:
        log(f'compiling mmcv {plan.pin.version} (CUDA {plan.cuda}, torch CUDA {torch_cuda}, '
            f'arch {plan.arch}, {plan.jobs} jobs)')
        start = time.time()
        cpath = [*nvidia_includes(python), *filter(None, [os.environ.get('CPATH')])]
        env = mmcv_build.build_env(plan.jobs, plan.cuda_root, plan.arch,
                                   extra={'CPATH': os.pathsep.join(cpath)} if cpath else None)
        mmcv_build.build_wheel(str(python), plan.pin, raw, env, log)
        seconds = round(time.time() - start)
        (raw / 'build_seconds').write_text(f'{seconds}\n')
        log(f'mmcv compiled in {seconds} s')
    else:
        seconds_file = raw / 'build_seconds'
        took = seconds_file.read_text().strip() if seconds_file.is_file() else '?'
        log(f'resuming from the compiled, unstripped wheel in {raw} (compiled in {took} s)')
    work = plan.cache / 'mmcv-work'
    stripped = strip_wheel(python, mmcv_build.find_wheel(raw, plan.pin), work)
    shutil.rmtree(plan.mmcv_cache, ignore_errors=True)
    plan.mmcv_cache.mkdir(parents=True)
    shutil.move(str(stripped), str(plan.mmcv_cache / stripped.name))
    if (raw / 'build_seconds').is_file():
        shutil.copy(raw / 'build_seconds', plan.mmcv_cache / 'build_seconds')
    shutil.rmtree(work)
    shutil.rmtree(raw)


def download_set(plan: Plan, python: Path, set_name: str) -> None:
    """The pinned wheels of ``set_name`` (all but mmcv) for cp312 manylinux x86_64, into
    ``out/<set>/``; a source-only pin (onedl-mmpretrain) as a pure-Python wheel built here."""
    entries = [e for e in plan.entries if e.set == set_name and e.name != 'mmcv']
    if not entries:
        return
    platforms = [arg for p in PLATFORMS for arg in ('--platform', p)]
    pip(python, 'download', '-q', '--no-deps', '--only-binary=:all:', '--python-version', GPU_PYTHON,
        '--implementation', 'cp', *platforms, '-d', str(plan.downloads), *(e.spec for e in entries))
    for entry in entries:
        wheel = wheel_set.find_wheel_file(plan.downloads, entry)
        if wheel is None:
            pip(python, 'wheel', '-q', '--no-deps', '-w', str(plan.downloads), entry.spec, check=False)
            wheel = wheel_set.find_wheel_file(plan.downloads, entry, pure_only=True)
        if wheel is None:
            raise BuildError(f'no wheel downloaded or built for {entry.spec}')
        shutil.copy(wheel, plan.out / set_name)


def write_manifest(plan: Plan, python: Path) -> str:
    """The requirements files and MANIFEST.txt, with what mmcv._ext holds (read through mmcv.ops,
    which needs torch: the build venv's)."""
    wheel_set.write_requirements(plan.out, plan.entries, plan.sets)
    ext = subprocess.run([str(python), str(ROOT / 'tools' / 'mmcv_ext_info.py'), '--expect-cuda',
                          plan.cuda, '--expect-arch', plan.arch],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    info = ext.stdout.strip()
    if ext.returncode:
        raise BuildError(info or 'mmcv._ext unreadable')
    now = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    return wheel_set.write_manifest(plan.out, plan.sets, [
        f'GPU wheel set: {now}, built by tools/build_gpu_wheels.py',
        f'{info} (get_compiling_cuda_version; kernels read from the fatbinary)',
        f'built with TORCH_CUDA_ARCH_LIST={plan.arch}, torch {plan.torch}, nvcc {plan.cuda}; '
        f'cache key {plan.key}'])


def build(plan: Plan, python312: str) -> None:
    """mmcv (cached or compiled), every set downloaded into ``plan.out``, the manifest."""
    start = time.time()
    if plan.rebuild or mmcv_build.find_wheel(plan.mmcv_cache, plan.pin) is None:
        build_mmcv(plan, python312)
    else:
        log(f'mmcv: cached wheel for {plan.key}')
    python = make_venv(python312, plan.build_venv, plan.build_specs())
    mmcv_wheel = mmcv_build.find_wheel(plan.mmcv_cache, plan.pin)
    pip(python, 'install', '-q', *IMAGE_EXTRAS)
    shutil.rmtree(plan.out, ignore_errors=True)
    for set_name in plan.sets:
        folder = plan.out / set_name
        folder.mkdir(parents=True)
        download_set(plan, python, set_name)
        if any(e.name == 'mmcv' and e.set == set_name for e in plan.entries):
            shutil.copy(mmcv_wheel, folder)
        # the build venv gets the set too: write_manifest reads the CUDA version through mmcv.ops
        pip(python, 'install', '-q', '--no-index', '--no-deps', '--force-reinstall',
            *sorted(str(p) for p in folder.glob('*.whl')))
    manifest = write_manifest(plan, python)
    log(f'wheel set in {plan.out} ({time.time() - start:.0f} s):')
    print(''.join(line + '\n' for line in manifest.splitlines() if line.startswith('##')), end='')


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
                        help='after building, install the set into a fresh venv simulating the GPU image '
                        '(numpy 2 and the "image" entries of tools/gpu_wheels.txt from PyPI: torch, '
                        'torchvision, timm, opencv, scipy, matplotlib, ...) with --no-index and check it')
    parser.add_argument('--rehearse-only', action='store_true',
                        help='rehearse the set already in --out, build nothing')
    parser.add_argument('--print-plan', action='store_true',
                        help='print the settings and the mmcv cache key, then exit (no download, no build)')
    return parser


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The options; an unknown one is refused with exit status 2, as argparse does."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.print_usage(sys.stderr)
        parser.exit(2, f'build_gpu_wheels: unknown option {unknown[0]}\n')
    return args


def run(args: argparse.Namespace) -> int:
    plan = make_plan(args)
    os.chdir(ROOT)  # tools/gpu_check.sh, tools/train.py and the imports of mmvit_ext run from here
    if args.print_plan:
        print('\n'.join(plan.lines()))
        return 0
    if plan.cuda == 'none':
        raise BuildError('nvcc not found (set NVCC)')
    python312 = find_python312()
    plan.downloads.mkdir(parents=True, exist_ok=True)
    start = time.time()
    if not args.rehearse_only:
        build(plan, python312)
    if args.rehearse or args.rehearse_only:
        image_python = make_venv(python312, plan.image_venv,
                                 [*BUILD_PINS, *wheel_set.specs_of(plan.entries, 'image')])
        if not rehearse(image_python, plan.out, plan.sets, plan.cache / 'rehearse',
                        expect=('--expect-cuda', plan.cuda, '--expect-arch', plan.arch), log=log):
            return 1
    log(f'done in {time.time() - start:.0f} s')
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
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
