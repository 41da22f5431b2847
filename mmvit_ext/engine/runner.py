"""Crash-safe checkpoints: atomic writes and a resume that skips a damaged ``last_checkpoint``."""
import glob
import os
import os.path as osp
import re
import zipfile
from contextlib import contextmanager
from typing import Iterator, Optional

import mmengine.runner.runner as mm_runner
from mmengine.logging import print_log
from mmengine.runner import Runner

_mm_save_checkpoint = mm_runner.save_checkpoint


def atomic_save_checkpoint(checkpoint: dict, filename: str, **kwargs) -> None:
    """mmengine's ``save_checkpoint`` into ``filename + '.tmp'``, fsync'ed, then renamed: a
    process killed mid-write leaves the previous file (or none), never a truncated one.
    Remote URIs (``s3://``, ``pavi://`` ...) go to mmengine unchanged."""
    if '://' in str(filename):
        return _mm_save_checkpoint(checkpoint, filename, **kwargs)
    tmp = f'{filename}.tmp'
    _mm_save_checkpoint(checkpoint, tmp, **kwargs)
    with open(tmp, 'rb') as f:
        os.fsync(f.fileno())
    os.replace(tmp, filename)


@contextmanager
def _atomic_saves() -> Iterator[None]:
    mm_runner.save_checkpoint = atomic_save_checkpoint
    try:
        yield
    finally:
        mm_runner.save_checkpoint = _mm_save_checkpoint


def _readable(path: str) -> bool:
    """A complete torch zip checkpoint (a truncated one has no central directory)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def find_resumable_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint named by ``last_checkpoint`` if it is complete, else the newest complete
    ``epoch_N.pth`` / ``iter_N.pth`` in ``work_dir``; ``None`` if there is none."""
    marker = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(marker):
        with open(marker) as f:
            named = f.read().strip()
        if named and osp.isfile(named) and _readable(named):
            return named
        print_log(f'last_checkpoint names {named!r}, which is missing or incomplete; looking '
                  f'for the newest complete checkpoint in {work_dir}', logger='current')
    numbered = []
    for path in glob.glob(osp.join(work_dir, '*.pth')):
        match = re.fullmatch(r'(epoch|iter)_(\d+)\.pth', osp.basename(path))
        if match:
            numbered.append((int(match.group(2)), path))
    for _, path in sorted(numbered, reverse=True):
        if _readable(path):
            return path
    return None


class AtomicSaveRunner(Runner):
    """mmengine's Runner whose checkpoint files are written atomically, and whose auto-resume
    falls back to the newest complete checkpoint when ``last_checkpoint`` is damaged."""

    def save_checkpoint(self, *args, **kwargs) -> None:
        with _atomic_saves():
            super().save_checkpoint(*args, **kwargs)

    def load_or_resume(self) -> None:
        if self._resume and self._load_from is None and not self._has_loaded:
            found = find_resumable_checkpoint(self.work_dir)
            if found is None:
                self.logger.info(f'no complete checkpoint in {self.work_dir}; starting afresh')
                self._resume = False
            else:
                self.logger.info(f'Auto resumed from the latest complete checkpoint {found}')
                self._load_from = found
        super().load_or_resume()


def init_cpu_distributed(launcher: str) -> bool:
    """Start a gloo process group for ``--launcher pytorch`` on a machine without GPUs.

    mmengine 0.10.7's launcher calls ``torch.cuda.set_device`` unconditionally, which fails on
    CPU; it skips its own initialisation when a group already exists. Returns whether it started
    one."""
    import torch
    import torch.distributed as dist
    if launcher != 'pytorch' or torch.cuda.is_available() or dist.is_initialized():
        return False
    dist.init_process_group(backend='gloo')
    return True
