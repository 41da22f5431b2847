"""The two distributions of each OpenMMLab package: OpenMMLab's own and the maintained OneDL fork.

Both write the same import package (``mmcv``, ``mmdet`` ...), so ``setup.py`` names neither in its
core requirements: the extras ``mmvit_ext[openmmlab]`` and ``mmvit_ext[onedl]`` pick one. This
module reads package metadata only (no mm* import), so ``import mmvit_ext`` can say which to
install before anything imports mmengine.
"""
import importlib.util
from dataclasses import dataclass
from importlib import metadata
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
INSTALL_HINT = ("pip install 'mmvit_ext[openmmlab]' (OpenMMLab's mmengine + mmcv < 2.2) or "
                "'mmvit_ext[onedl]' (the maintained OneDL forks onedl-mmengine + onedl-mmcv)")


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


__all__ = ['Distributions', 'INSTALL_HINT', 'PACKAGES', 'installed_version', 'missing_runtime',
           'mixed_distributions']
