"""The wheel list of the GPU machine (tools/gpu_wheels.txt) and the wheel set it becomes in .whl/.

Helpers of tools/build_gpu_wheels.py: reading the list into sets, matching downloaded wheel files
to its pins, writing the requirements files and MANIFEST.txt, running pip without its noise.
Standard library only.
"""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

# sets of the list that are never shipped: what the GPU image has, what only the build needs
NOT_SHIPPED = ('image', 'build')
# pip's notes on this machine's file:// index entries and on --no-deps installs: noise here
PIP_NOISE = ('is ignored: it is neither a file nor a directory', 'dependency resolver does not',
             'dependency conflicts', 'which is not installed')


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
    """The ``NAME==VERSION SET`` lines of a wheel list, in order; comments skipped, a line without
    a set gets the set ``''``."""
    entries = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith('#') or '==' not in fields[0]:
            continue
        name, version = fields[0].split('==', 1)
        entries.append(Entry(name, version, fields[1] if len(fields) > 1 else ''))
    return entries


def pinned(entries: Sequence[Entry], name: str) -> str:
    """The version the list pins ``name`` to."""
    for entry in entries:
        if entry.name.lower() == name.lower():
            return entry.version
    raise KeyError(f'tools/gpu_wheels.txt pins no {name}')


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


def normalize(name: str) -> str:
    """A distribution name as wheel file names spell it, lower-cased (``importlib_metadata``)."""
    return re.sub(r'[-_.]+', '_', name).lower()


def find_wheel_file(folder: Path, entry: Entry, pure_only: bool = False) -> Optional[Path]:
    """The wheel of ``entry`` in ``folder`` (any tag, or only ``py3-none-any``), if there is one."""
    for path in sorted(Path(folder).glob('*.whl')):
        parts = path.name[:-len('.whl')].split('-')
        if len(parts) < 5 or normalize(parts[0]) != normalize(entry.name) or parts[1] != entry.version:
            continue
        if not pure_only or parts[-3:] == ['py3', 'none', 'any']:
            return path
    return None


def write_requirements(out: Path, entries: Sequence[Entry], sets: Sequence[str]) -> None:
    """``out/<set>/requirements.txt`` for each set and ``out/requirements.txt`` of them all."""
    everything: List[str] = []
    for set_name in sets:
        lines = specs_of(entries, set_name)
        (Path(out) / set_name / 'requirements.txt').write_text(''.join(f'{ln}\n' for ln in lines))
        everything += lines
    (Path(out) / 'requirements.txt').write_text(''.join(f'{ln}\n' for ln in everything))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


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
        set_total = 0
        lines.append(f'## set {set_name}')
        for wheel in sorted((Path(out) / set_name).glob('*.whl')):
            size = wheel.stat().st_size
            set_total += size
            lines.append(f'{set_name}/{wheel.name}  {size}  {sha256(wheel)}')
        lines.append(f'## set {set_name} total: {mib(set_total)}')
        total += set_total
    lines.append(f'## total: {mib(total)}')
    text = ''.join(f'{ln}\n' for ln in lines)
    (Path(out) / 'MANIFEST.txt').write_text(text)
    return text


def without_pip_noise(stderr: str) -> str:
    """pip's stderr less the lines of :data:`PIP_NOISE`."""
    return ''.join(line for line in stderr.splitlines(keepends=True)
                   if not any(noise in line for noise in PIP_NOISE))


def pip(python: Path, *args: str, check: bool = True) -> int:
    """``python -m pip ARGS``, its stderr less :data:`PIP_NOISE`; its exit status."""
    proc = subprocess.run([str(python), '-m', 'pip', *args], stderr=subprocess.PIPE, text=True)
    sys.stderr.write(without_pip_noise(proc.stderr))
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, ['pip', *args])
    return proc.returncode
