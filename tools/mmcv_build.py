"""mmcv with its compiled ops: the one recipe that builds and installs it, for tools/setup_env.py,
tools/dev/gpu_check.py and tools/dev/build_gpu_wheels.py. A built wheel is kept in
``python_env.cache_dir('mmcv')``, one folder per :func:`cache_key`. Standard library only.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

from python_env import Log, cpu_count, find_wheel, pip

# mmcv's ops run on the device: a CPU-only build imports fine on a GPU machine and fails on the
# first CUDA tensor, so the probe runs nms there
PROBE = ('import sys, torch; from mmcv.ops import nms; d = sys.argv[1]; '
         'b = torch.tensor([[0., 0, 9, 9], [1, 1, 9, 9]], device=d); '
         'nms(b, torch.tensor([.9, .8], device=d), 0.5)')
INFO = ('import json, sys, torch; c = torch.cuda.is_available(); print(json.dumps(dict('
        'python="%d.%d" % sys.version_info[:2], torch=torch.__version__.split("+")[0], '
        'cuda=torch.version.cuda, device="cuda" if c else "cpu", '
        'name=torch.cuda.get_device_name() if c else "cpu", '
        'capability="%d.%d" % torch.cuda.get_device_capability() if c else None)))')
# torch's headers from 2.14 on refuse a C++17 compile; mmcv's setup.py names -std=c++17 for every
# torch >= 1.13 (after torch's own flags, so it wins), which such a build must raise to C++20
CXX20_HEADER = ('import os, torch; print(os.path.join(os.path.dirname(torch.__file__), '
                '"include", "ATen", "ATen.h"))')
CXX20_MARK = 'C++20 or later compatible compiler is required'


@dataclass(frozen=True)
class MmcvPin:
    """Which mmcv a stack builds (``dist==version``) and the tools its build needs."""

    dist: str
    version: str
    build_tools: tuple

    @property
    def spec(self) -> str:
        return f'{self.dist}=={self.version}'

    @property
    def wheel_prefix(self) -> str:
        """The start of its wheels' file names (``onedl_mmcv-2.3.6``)."""
        return f'{self.dist.replace("-", "_")}-{self.version}'

    def wheel_in(self, folder: Path) -> Optional[Path]:
        """Its wheel in ``folder``, if there is one."""
        return find_wheel(folder, self.dist, self.version)


def pin_from_requirements(text: str) -> MmcvPin:
    """The ``(onedl-)mmcv==X`` line and the ``# build: ...`` tools of a requirements file (each
    stack's file names both: they are its facts, read from nowhere else)."""
    pin = re.search(r'^((?:onedl-)?mmcv)==([^\s#]+)', text, re.M)
    tools = re.search(r'^# build: *([^(\n]*)', text, re.M)
    if not pin or not tools:
        raise ValueError('a stack\'s requirements name its mmcv (a "mmcv==X" or "onedl-mmcv==X" '
                         'line) and the tools its build needs (a "# build: ..." line)')
    return MmcvPin(pin.group(1), pin.group(2), tuple(tools.group(1).split()))


def arch_key(arch_list: str) -> str:
    """``'8.0;9.0+PTX'`` / ``' 8.0 9.0 '`` -> ``'8.0_9.0+PTX'``: an arch list as one path part."""
    return '_'.join(p for p in re.split(r'[;, ]+', arch_list) if p)


def cache_key(pin: MmcvPin, torch_version: str, python: str, cuda: Optional[str] = None,
              arch: Optional[str] = None) -> str:
    """``mmcv2.1.0-torch2.11.0-cpu-py311`` or ``mmcv2.1.0-torch2.11.0-cu13.0-py312-sm9.0``."""
    py = 'py' + python.replace('.', '')
    if cuda is None:
        return f'{pin.dist}{pin.version}-torch{torch_version}-cpu-{py}'
    return f'{pin.dist}{pin.version}-torch{torch_version}-cu{cuda}-{py}-sm{arch_key(arch or "")}'


def torch_info(python: str) -> dict:
    """Python, torch, torch's CUDA, the device torch sees, its name and capability, of ``python``."""
    out = subprocess.run([python, '-c', INFO], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe(python: str, device: str) -> bool:
    """Whether mmcv's nms runs on ``device`` in ``python``'s environment."""
    return subprocess.run([python, '-c', PROBE, device], capture_output=True).returncode == 0


def nvcc_path(env: Mapping[str, str] = os.environ) -> Optional[str]:
    """``$NVCC``, else nvcc on the PATH."""
    return env.get('NVCC') or shutil.which('nvcc', path=env.get('PATH'))


def nvcc_release(nvcc: str) -> str:
    """``'13.0'`` from ``nvcc --version``."""
    out = subprocess.run([nvcc, '--version'], capture_output=True, text=True).stdout
    found = re.search(r'release ([0-9.]+),', out)
    if not found:
        raise RuntimeError(f'{nvcc} --version names no release: {out.strip()[:200]}')
    return found.group(1)


def cuda_home(nvcc: str) -> str:
    """The toolkit's root: where nvcc says it lives (``_HERE_`` of ``--dryrun``; it may be a
    wrapper script or a symlink), one folder up."""
    out = subprocess.run([nvcc, '--dryrun', '-x', 'cu', '-c', os.devnull, '-o', os.devnull],
                         capture_output=True, text=True).stderr
    here = re.search(r'^#\$ _HERE_=(.*)$', out, re.M)
    bindir = here.group(1).strip() if here else os.path.dirname(os.path.realpath(nvcc))
    return str(Path(bindir, '..').resolve())


def build_env(jobs: Optional[int] = None, cuda_root: Optional[str] = None,
              arch: Optional[str] = None, base: Mapping[str, str] = os.environ,
              extra: Optional[Mapping[str, str]] = None) -> dict:
    """The environment of an ops build: all cores (or ``jobs``), no debug info (``-g0`` halves
    the compile's CPU time; in CPPFLAGS, which distutils appends to Python's ``-g -O3``), and
    for CUDA the toolkit on the PATH, FORCE_CUDA and the arch list."""
    env = dict(base)
    env.update(MMCV_WITH_OPS='1', MAX_JOBS=str(jobs or base.get('MAX_JOBS') or cpu_count()),
               CPPFLAGS=(base.get('CPPFLAGS', '') + ' -g0').strip())
    if cuda_root:
        env.update(CUDA_HOME=cuda_root, FORCE_CUDA='1', TORCH_CUDA_ARCH_LIST=arch or '',
                   PATH=f'{cuda_root}/bin{os.pathsep}{base.get("PATH", "")}')
    env.update(extra or {})
    return env


def torch_needs_cxx20(python: str) -> bool:
    """Whether ``python``'s torch headers refuse anything older than C++20."""
    out = subprocess.run([python, '-c', CXX20_HEADER], check=True, capture_output=True, text=True)
    header = Path(out.stdout.strip().splitlines()[-1])
    return header.is_file() and CXX20_MARK in header.read_text(errors='replace')


def raise_cxx_standard(setup_py: Path) -> int:
    """``setup_py``'s ``-std=c++17`` (and MSVC's ``/std:c++17``) made C++20; how many it had."""
    text = setup_py.read_text()
    count = text.count("'-std=c++17'") + text.count("'/std:c++17'")
    setup_py.write_text(text.replace("'-std=c++17'", "'-std=c++20'")
                        .replace("'/std:c++17'", "'/std:c++20'"))
    return count


def cxx20_source(python: str, pin: MmcvPin, work: Path, env: Mapping[str, str]) -> Path:
    """``pin``'s source release unpacked in ``work``, its setup.py asking for C++20."""
    pip(python, 'download', '-q', '--no-build-isolation', '--no-deps', '--no-binary', ':all:',
        pin.spec, '-d', str(work), env=env)
    (archive,) = glob.glob(str(work / '*.tar.gz'))
    with tarfile.open(archive) as sdist:
        sdist.extractall(work / 'src', **({'filter': 'data'} if hasattr(tarfile, 'data_filter')
                                          else {}))
    (source,) = (work / 'src').iterdir()
    if not raise_cxx_standard(source / 'setup.py'):
        raise RuntimeError(f'{pin.spec}: torch needs C++20 and its setup.py names no -std=c++17 '
                           'to raise')
    return source


def build_wheel(python: str, pin: MmcvPin, out_dir: Path, env: Mapping[str, str],
                log: Log = print) -> Path:
    """Compile ``pin`` against ``python``'s torch (no build isolation) into ``out_dir``; the
    folder appears whole or not at all. Returns the wheel."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + '.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    log(f'building {pin.spec} with {"CUDA" if env.get("FORCE_CUDA") else "CPU"} ops '
        f'({env["MAX_JOBS"]} jobs) into {out_dir}')
    with tempfile.TemporaryDirectory(prefix='mmcv_src.') as work:
        source = pin.spec
        if torch_needs_cxx20(python):
            source = str(cxx20_source(python, pin, Path(work), env))
            log(f'{pin.spec}: compiled as C++20 (this torch\'s headers need it)')
        pip(python, 'wheel', '-q', '--no-build-isolation', '--no-cache-dir', '--no-deps', source,
            '-w', str(tmp), env=env)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return pin.wheel_in(out_dir)


def ensure_mmcv(python: str, pin: MmcvPin, cache_root: Path, *, base: Sequence[str] = (),
                find_links: Iterable[Path] = (), jobs: Optional[int] = None,
                arch: Optional[str] = None, log: Log = print) -> str:
    """mmcv's ops running on the device that ``python``'s torch sees; says what it took.

    Nothing when they already run; else a carried wheel from ``find_links`` (CUDA); else the
    cached build for :func:`cache_key`; else a build (its tools installed first, CUDA from the
    nvcc on the PATH, archs ``arch`` or the device's). The wheel goes in without dependencies,
    then its dependencies beside ``base`` (the stack's torch / numpy pins, kept).
    """
    info = torch_info(python)
    device = info['device']
    if probe(python, device):
        return f'{pin.dist} ops already run on {device}'
    links = [str(p) for p in find_links if Path(p).is_dir()]
    if device == 'cuda' and links:
        args = [a for link in links for a in ('--find-links', link)]
        try:
            pip(python, 'install', '-q', '--no-index', '--force-reinstall', '--no-deps', *args, pin.spec)
        except subprocess.CalledProcessError:
            log(f'no carried wheel of {pin.spec} in {", ".join(links)}')
        else:
            if probe(python, device):
                return f'{pin.spec} from the carried wheels, ops run on cuda'
    cuda_root = None
    if device == 'cuda':
        nvcc = nvcc_path()
        if not nvcc:
            raise RuntimeError(
                f'{pin.dist} needs CUDA ops here and no CUDA toolkit (nvcc) is on PATH: install '
                f'the toolkit matching torch\'s CUDA ({info["cuda"]}), or carry the wheels of '
                'tools/build_gpu_wheels.sh in .whl/')
        cuda_root = os.environ.get('CUDA_HOME') or cuda_home(nvcc)
        arch = arch or os.environ.get('TORCH_CUDA_ARCH_LIST') or info['capability']
    key = cache_key(pin, info['torch'], info['python'], info['cuda'] if cuda_root else None, arch)
    folder = Path(cache_root) / key
    wheel = pin.wheel_in(folder)
    if wheel is None:
        pip(python, 'install', '-q', *pin.build_tools)
        wheel = build_wheel(python, pin, folder, build_env(jobs, cuda_root, arch), log)
    else:
        log(f'{pin.spec}: the cached build {wheel}')
    pip(python, 'install', '-q', '--no-deps', '--force-reinstall', str(wheel))  # this build, then
    pip(python, 'install', '-q', str(wheel), *base)  # its dependencies
    if not probe(python, device):
        raise RuntimeError(f"{pin.dist}'s nms does not run on {device} after installing {wheel}")
    return f'{pin.spec} ({key}), ops run on {device}'
