"""The two distributions of each OpenMMLab package: OpenMMLab's own and the maintained OneDL fork.

Both write the same import package (``mmcv``, ``mmdet`` ...), so ``setup.py`` names neither in its
core requirements: the extras ``openmmlab`` and ``onedl`` pick one. This module reads package
metadata and files only (no mm* import), so ``import mmvit_ext`` can say what to install, and
whether mmcv has its compiled ops, before anything imports mmengine.
"""
import importlib.util
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, List, Optional, Tuple


@dataclass(frozen=True)
class Distributions:
    """One import package and the two distributions that install it."""

    module: str
    openmmlab: str
    onedl: str


PACKAGES: Tuple[Distributions, ...] = (
    Distributions('mmengine', 'mmengine', 'onedl-mmengine'),
    Distributions('mmcv', 'mmcv', 'onedl-mmcv'),
    Distributions('mmdet', 'mmdet', 'onedl-mmdetection'),
    Distributions('mmseg', 'mmsegmentation', 'onedl-mmsegmentation'),
    Distributions('mmpretrain', 'mmpretrain', 'onedl-mmpretrain'),
)
INSTALL_HINT = ('install torch, then mmcv with its ops, then the extra, from a mmvit_ext checkout '
                '(docs/install.md): pip install ".[openmmlab]" (OpenMMLab\'s mmengine + mmcv < 2.2) '
                'or ".[onedl]" (the maintained OneDL forks onedl-mmengine + onedl-mmcv)')
# what building mmcv's ops needs besides torch, both distributions (requirements/dev.txt's
# "# build:" line): setuptools >= 80 (onedl-mmcv; torch asks >= 77.0.3), < 82 (mmcv 2.1.0's
# setup.py imports pkg_resources, which setuptools 82 dropped)
OPS_BUILD_TOOLS = ('setuptools>=80,<82', 'wheel', 'packaging>=24.2', 'ninja')
# the import packages whose models import mmcv.ops, and so need its compiled ops
NEED_OPS = ('mmdet', 'mmseg')


def installed_version(name: str) -> Optional[str]:
    """The installed distribution's version, ``None`` if it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def missing_runtime(find: Callable[[str], object] = importlib.util.find_spec) -> Optional[str]:
    """One line naming the two ways to install mmengine / mmcv when either is missing."""
    missing = [name for name in ('mmengine', 'mmcv') if find(name) is None]
    if not missing:
        return None
    verb = 'is' if len(missing) == 1 else 'are'
    return f"mmvit_ext needs {' and '.join(missing)}, which {verb} not installed: {INSTALL_HINT}"


def ops_fix(dist: str, version: str, torch: Optional[str] = None) -> str:
    """The command that rebuilds ``dist==version`` with its ops against the installed torch (no
    build isolation, so the build sees torch; no pip cache, which holds the build without ops).
    onedl-mmcv's setup.py asks C++17 after torch's flags, which torch >= 2.14's headers refuse:
    there its source release is built with the standard raised to C++20 (docs/install.md)."""
    tools = ' '.join(f'"{t}"' if '<' in t or '>' in t else t for t in OPS_BUILD_TOOLS)
    build = 'pip install --no-build-isolation --no-cache-dir --force-reinstall --no-deps'
    if dist == 'onedl-mmcv' and torch and tuple(map(int, re.findall(r'\d+', torch)[:2])) >= (2, 14):
        src = f'mmcv_src/onedl_mmcv-{version}'
        return (f'pip install {tools} && pip download --no-deps --no-binary :all: '
                f'--no-build-isolation {dist}=={version} -d mmcv_src && tar -xzf {src}.tar.gz '
                f'-C mmcv_src && sed -i "s/\'-std=c++17\'/\'-std=c++20\'/" {src}/setup.py && '
                f'{build} ./{src}')
    return f'pip install {tools} && {build} {dist}=={version}'


def missing_ops(find: Callable[[str], object] = importlib.util.find_spec,
                version: Callable[[str], Optional[str]] = installed_version) -> Optional[str]:
    """One line naming the installed mmcv distribution and the fix when mmcv has no compiled ops
    (no ``mmcv/_ext.*`` file: built where torch was not importable), read from disk, no import."""
    spec = find('mmcv')
    folders = getattr(spec, 'submodule_search_locations', None) or []
    if spec is None or any(next(Path(f).glob('_ext.*'), None) for f in folders):
        return None
    dist = next((name for name in ('mmcv', 'onedl-mmcv', 'mmcv-lite') if version(name)), 'mmcv')
    have = version(dist) or '?'
    if dist == 'mmcv-lite':
        fix = f'pip uninstall -y mmcv-lite, then {ops_fix("mmcv", have)}'
    else:
        fix = ops_fix(dist, have, version('torch'))
    return (f'mmvit_ext: {dist} {have} has no compiled ops (mmcv._ext), which '
            f"{' and '.join(NEED_OPS)} models need (RoIAlign, NMS, deformable ops): it was built "
            f'where torch was not importable. Fix: {fix}')


def mixed_distributions(version: Callable[[str], Optional[str]] = installed_version
                        ) -> List[str]:
    """One line per import package installed by both its OpenMMLab and its OneDL distribution."""
    lines = []
    for pkg in PACKAGES:
        ours, fork = version(pkg.openmmlab), version(pkg.onedl)
        if ours is None or fork is None:
            continue
        lines.append(
            f'mmvit_ext: {pkg.openmmlab} {ours} (OpenMMLab) and {pkg.onedl} {fork} (OneDL) are '
            f'both installed and write the same package `{pkg.module}`, so its files are a mix '
            f'of the two. Fix: pip uninstall -y {pkg.openmmlab} {pkg.onedl}, then install the '
            f'one you use (pip install {pkg.onedl}, or {pkg.openmmlab})')
    return lines


__all__ = ['Distributions', 'INSTALL_HINT', 'NEED_OPS', 'OPS_BUILD_TOOLS', 'PACKAGES',
           'installed_version', 'missing_ops', 'missing_runtime', 'mixed_distributions', 'ops_fix']
