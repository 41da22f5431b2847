"""The Python environments the tools make: which interpreter, pip, wheel files, the cache, the
freshness stamp of a venv, and wheel sets (a wheel list's sets, their requirements and manifest,
their install where there is no package index). Standard library only: it runs before any venv
exists."""
from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

# pip's notes on file:// index entries, on --no-deps installs and on uninstalling what is absent:
# noise here
PIP_NOISE = ('is ignored: it is neither a file nor a directory', 'dependency resolver does not',
             'dependency conflicts', 'which is not installed', 'as it is not installed')
Log = Callable[[str], None]
NOT_SHIPPED = ('image', 'build')  # sets of a list never shipped: the machine's own, the build's
TARGET_KEYS = ('python', 'arch', 'platforms', 'build', 'read', 'max-set-mib')


def python_version(python: str) -> Optional[str]:
    """``'3.11'`` for ``python``, None where it does not run."""
    try:
        out = subprocess.run([python, '-c', 'import sys; print("%d.%d" % sys.version_info[:2])'],
                             capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def wanted_python(requirements: str) -> Optional[str]:
    """The ``# python: X.Y`` a requirements file asks for."""
    for line in requirements.splitlines():
        if line.startswith('# python:'):
            return line.split(':', 1)[1].split()[0]
    return None


def find_python(version: Optional[str], env: Mapping[str, str] = os.environ,
                log: Optional[Log] = None) -> str:
    """The base of a new venv: ``$PYTHON``; else python``version`` on the PATH or under pyenv;
    else python3, said in one line through ``log``."""
    if env.get('PYTHON'):
        return env['PYTHON']
    fallback = shutil.which('python3', path=env.get('PATH')) or sys.executable
    if not version:
        return fallback
    pyenv = subprocess.run(['pyenv', 'root'], capture_output=True, text=True) \
        if shutil.which('pyenv', path=env.get('PATH')) else None
    pyenv_root = pyenv.stdout.strip() if pyenv and pyenv.returncode == 0 else \
        env.get('PYENV_ROOT', os.path.expanduser('~/.pyenv'))
    candidates = [f'python{version}',
                  *sorted(glob.glob(f'{pyenv_root}/versions/{version}*/bin/python{version}'))]
    for candidate in candidates:
        if python_version(candidate) == version:
            return candidate
    (log or print)(f'this stack asks for Python {version}; no python{version} on the PATH or under '
                   f'pyenv, so using {fallback} (Python {python_version(fallback)}) instead')
    return fallback


def cpu_count() -> int:
    """The cores this process may use (nproc): the default of every parallel build."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


def cache_dir(name: str, env: Mapping[str, str] = os.environ) -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/mmvit_ext/NAME``: built wheels and build venvs outlive a
    checkout there (never in pip's cache, where builds for different torches collide)."""
    return Path(env.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')) / 'mmvit_ext' / name


def without_pip_noise(stderr: str) -> str:
    """pip's stderr less the lines of :data:`PIP_NOISE`."""
    return ''.join(line for line in stderr.splitlines(keepends=True)
                   if not any(noise in line for noise in PIP_NOISE))


def pip(python: str, *args: str, check: bool = True, env: Optional[Mapping[str, str]] = None) -> int:
    """``python -m pip ARGS`` without the version check, its stderr less :data:`PIP_NOISE`; its
    exit status (CalledProcessError where ``check`` and it failed)."""
    cmd = [str(python), '-m', 'pip', '--disable-pip-version-check', *args]
    proc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True, env=env)
    sys.stderr.write(without_pip_noise(proc.stderr))
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, ['pip', *args])
    return proc.returncode


def normalize(name: str) -> str:
    """A distribution name as wheel file names spell it, lower-cased (``importlib_metadata``)."""
    return re.sub(r'[-_.]+', '_', name).lower()


def find_wheel(folder: Path, name: str, version: str, pure_only: bool = False) -> Optional[Path]:
    """The wheel of ``name==version`` in ``folder`` (any tag, or only ``py3-none-any``)."""
    for path in sorted(Path(folder).glob('*.whl')):
        parts = path.name[:-len('.whl')].split('-')
        if len(parts) < 5 or normalize(parts[0]) != normalize(name) or parts[1] != version:
            continue
        if not pure_only or parts[-3:] == ['py3', 'none', 'any']:
            return path
    return None


# ---------------------------------------------------------------------------- wheel lists and sets

@dataclass(frozen=True)
class Entry:
    """One ``NAME==VERSION SET`` line of the list."""

    name: str
    version: str
    set: str

    @property
    def spec(self) -> str:
        return f'{self.name}=={self.version}'


def read_list(text: str) -> List[Entry]:
    """The ``NAME==VERSION SET`` lines of a wheel list, in order; comments and ``@`` lines
    skipped, a line without a set gets the set ``''``."""
    entries = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith('#') or '==' not in fields[0]:
            continue
        name, version = fields[0].split('==', 1)
        entries.append(Entry(name, version, fields[1] if len(fields) > 1 else ''))
    return entries


def read_target(text: str) -> Dict[str, List[str]]:
    """The ``@KEY VALUE...`` lines of a wheel list: the facts of the machine it is for (its
    Python, CUDA archs, wheel platforms, build pins, the most MiB a set may hold)."""
    target = {line.split()[0][1:]: line.split()[1:] for line in text.splitlines()
              if line.startswith('@') and line.split()[1:]}
    missing = [key for key in TARGET_KEYS if key not in target]
    if missing:
        raise KeyError(f'the wheel list names no @{" @".join(missing)}')
    return target


def pinned(entries: Sequence[Entry], name: str) -> str:
    """The version the list pins ``name`` to."""
    for entry in entries:
        if entry.name.lower() == name.lower():
            return entry.version
    raise KeyError(f'the wheel list pins no {name}')


def shipped_sets(entries: Sequence[Entry]) -> List[str]:
    """The sets that become .whl/<set>/, in the order they first appear."""
    sets: List[str] = []
    for entry in entries:
        if entry.set and entry.set not in NOT_SHIPPED and entry.set not in sets:
            sets.append(entry.set)
    return sets


def specs_of(entries: Sequence[Entry], set_name: str) -> List[str]:
    """``NAME==VERSION`` of every entry in ``set_name``."""
    return [entry.spec for entry in entries if entry.set == set_name]


def write_requirements(out: Path, entries: Sequence[Entry], sets: Sequence[str]) -> None:
    """``out/<set>/requirements.txt`` for each set and ``out/requirements.txt`` of them all."""
    everything: List[str] = []
    for set_name in sets:
        lines = specs_of(entries, set_name)
        (Path(out) / set_name / 'requirements.txt').write_text(''.join(f'{ln}\n' for ln in lines))
        everything += lines
    (Path(out) / 'requirements.txt').write_text(''.join(f'{ln}\n' for ln in everything))


def mib(size: int) -> str:
    return f'{size} bytes ({size / 1048576:.1f} MiB)'


def write_manifest(out: Path, sets: Sequence[str], notes: Iterable[str]) -> str:
    """``out/MANIFEST.txt``: ``notes`` and the install lines as comments, then each set's wheels
    (``set/file  size  sha256``) with the set's and the overall total. Returns its text."""
    links = ''.join(f' --find-links .whl/{s}' for s in sets)
    lines = [f'# {note}' for note in notes]
    lines += ['# install one set a call: pip install --no-index --no-deps --find-links .whl/SET'
              ' -r .whl/SET/requirements.txt',
              f'# or all: pip install --no-index --no-deps{links} -r .whl/requirements.txt']
    total = 0
    for set_name in sets:
        wheels = sorted((Path(out) / set_name).glob('*.whl'))
        lines.append(f'## set {set_name}')
        lines += [f'{set_name}/{w.name}  {w.stat().st_size}  {hashlib.sha256(w.read_bytes()).hexdigest()}'
                  for w in wheels]
        set_total = sum(w.stat().st_size for w in wheels)
        lines.append(f'## set {set_name} total: {mib(set_total)}')
        total += set_total
    lines.append(f'## total: {mib(total)}')
    text = ''.join(f'{ln}\n' for ln in lines)
    (Path(out) / 'MANIFEST.txt').write_text(text)
    return text


def wheel_sets(root: Path) -> List[Path]:
    """The wheel sets under ``root``: each folder with a requirements.txt naming its wheels."""
    return sorted(path.parent for path in Path(root).glob('*/requirements.txt'))


def install_wheel_sets(python: str, sets: Sequence[Path], log: Log = print) -> None:
    """Each set, one ``pip install --no-index --no-deps`` a set: a set's list is complete."""
    for folder in sets:
        log(f'installing {folder} ({len((folder / "requirements.txt").read_text().split())} wheels)')
        pip(python, 'install', '-q', '--no-index', '--no-deps', '--find-links', str(folder),
            '-r', str(folder / 'requirements.txt'))


def is_fresh(stamp: Path, wanted: str) -> bool:
    """Whether the work ``stamp`` records was done for ``wanted`` (a hash, a list of specs)."""
    return stamp.is_file() and stamp.read_text().strip() == wanted


def make_venv(python: str, venv: Path, specs: Sequence[str], log: Log = print) -> Path:
    """A venv of ``python`` with ``specs`` installed, made anew only when they change; its python."""
    stamp, wanted = venv / '.ready', ' '.join(specs)
    if not is_fresh(stamp, wanted):
        log(f'venv {venv}: {wanted}')
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, '-m', 'venv', str(venv)], check=True)
        pip(venv / 'bin' / 'python', 'install', '-q', '--upgrade', 'pip')
        pip(venv / 'bin' / 'python', 'install', '-q', *specs)
        stamp.write_text(wanted + '\n')
    return venv / 'bin' / 'python'
