"""Installed-package combinations known to break the peers' own imports, named before they do.

Each :class:`KnownBreak` is data: which installed versions break, why and the fix. ``import
mmvit_ext`` warns once per break found (package metadata only, nothing imported);
``tools/train.py`` and ``tools/test.py`` stop with the same line before building anything.
"""
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, List, Optional, Tuple

from ..torch_compat import parse_release as parse_version

Version = Tuple[int, ...]


def installed_version(name: str) -> Optional[str]:
    """The installed distribution's version, ``None`` if it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class KnownBreak:
    """``package`` up to ``package_upto`` fails to import beside ``other`` from ``other_since``
    when every one of ``also_installed`` is installed too."""

    package: str
    package_upto: Version
    other: str
    other_since: Version
    also_installed: Tuple[str, ...]
    why: str
    fix: str

    def message(self, version: Callable[[str], Optional[str]] = installed_version
                ) -> Optional[str]:
        """The one line naming this break in the installed packages, ``None`` if absent."""
        have, other = version(self.package), version(self.other)
        if have is None or other is None or any(version(n) is None for n in self.also_installed):
            return None
        if parse_version(have) > self.package_upto or parse_version(other) < self.other_since:
            return None
        return (f'mmvit_ext: {self.package} {have} cannot be imported beside {self.other} '
                f'{other}: {self.why}. Fix: {self.fix}')


KNOWN_BREAKS = (
    KnownBreak(
        package='mmpretrain', package_upto=(1, 2, 0), other='transformers', other_since=(4, 56),
        also_installed=('pycocotools',),
        why=("with pycocotools and transformers installed, mmpretrain imports its multimodal "
             "models, which take apply_chunking_to_forward, find_pruneable_heads_and_indices "
             "and prune_linear_layer from transformers.modeling_utils (gone since transformers "
             "4.56) and then subclass None ('TypeError: NoneType takes no arguments'); "
             "mmdet.models imports mmpretrain, so detection configs fail as well"),
        fix="pip install 'transformers<4.56' (or uninstall transformers where nothing needs it)"),
)


def problems(version: Callable[[str], Optional[str]] = installed_version) -> List[str]:
    """One line per known break among the installed packages."""
    return [m for m in (b.message(version) for b in KNOWN_BREAKS) if m is not None]


def warn_problems() -> None:
    """Warn once per known break (``import mmvit_ext`` calls this)."""
    for line in problems():
        warnings.warn(line, RuntimeWarning, stacklevel=2)


def require_working_environment() -> None:
    """Stop with the known breaks' lines, if any (the training and test tools call this)."""
    lines = problems()
    if lines:
        raise SystemExit('\n'.join(lines))


__all__ = ['KNOWN_BREAKS', 'KnownBreak', 'parse_version', 'problems',
           'require_working_environment', 'warn_problems']
