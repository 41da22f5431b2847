"""Installed-package combinations known to break the peers' own imports, named before they do.

Each :class:`KnownBreak` is data: which installed versions break, which import packages then fail,
why and the fixes. ``import mmvit_ext`` warns once per break found (package metadata only, nothing
imported); ``tools/train.py`` and ``tools/test.py`` stop with the same line before building
anything, when the run's config reaches a failing package (a segmentation run that never imports
mmpretrain goes on). An environment holding both the OpenMMLab and the OneDL distribution of one
package (:mod:`mmvit_ext.distributions`) is named the same way, and so is an mmcv without its
compiled ops, for the runs that reach mmdet or mmseg (whose models import ``mmcv.ops``). A user whose installed packages
are patched sets ``MMVIT_EXT_IGNORE_KNOWN_BREAKS=1``: the tools then warn instead of stopping.

A break with a ``mend`` (a helper the peers import that mmvit_ext can supply) is mended by
``import mmvit_ext`` (:func:`mend_breaks`) and then no longer named.
"""
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Set, Tuple

from ..distributions import NEED_OPS, installed_version, missing_ops, mixed_distributions
from ..torch_compat import parse_release as parse_version
from .transformers_compat import mend_onedl_mmpretrain

Version = Tuple[int, ...]
IGNORE_ENV = 'MMVIT_EXT_IGNORE_KNOWN_BREAKS'


@dataclass(frozen=True)
class KnownBreak:
    """``package`` up to ``package_upto`` fails to import beside ``other`` from ``other_since``
    when every one of ``also_installed`` is installed too."""

    package: str
    package_upto: Version
    other: str
    other_since: Version
    also_installed: Tuple[str, ...]
    fails: Tuple[str, ...]  # the import packages (config scopes) whose import then fails
    why: str
    fix: str
    # what ``import mmvit_ext`` does about it: supplies what is missing, True once it has
    mend: Optional[Callable[[], bool]] = None

    def message(self, version: Callable[[str], Optional[str]] = installed_version
                ) -> Optional[str]:
        """The one line naming this break in the installed packages, ``None`` if absent."""
        have, other = version(self.package), version(self.other)
        if have is None or other is None or any(version(n) is None for n in self.also_installed):
            return None
        if parse_version(have) > self.package_upto or parse_version(other) < self.other_since:
            return None
        return (f'mmvit_ext: {self.package} {have} cannot be imported beside {self.other} '
                f'{other}: {self.why}. Fix, any of: {self.fix} (a patched install: set '
                f'{IGNORE_ENV}=1)')


_NO_MMPRETRAIN = ("where only detection / segmentation is needed, uninstall it (mmdet imports "
                  "mmpretrain only for re-id, under except ImportError)")
KNOWN_BREAKS = (
    KnownBreak(
        package='mmpretrain', package_upto=(1, 2, 0), other='transformers', other_since=(4, 56),
        also_installed=('pycocotools',), fails=('mmpretrain', 'mmdet'),
        why=("with pycocotools and transformers installed, mmpretrain imports its multimodal "
             "models, which take apply_chunking_to_forward, find_pruneable_heads_and_indices "
             "and prune_linear_layer from transformers.modeling_utils (gone since transformers "
             "4.56) and then subclass None ('TypeError: NoneType takes no arguments'); "
             "mmdet.models imports mmpretrain, so detection configs fail as well"),
        fix=("pip uninstall -y mmpretrain && pip install 'onedl-mmpretrain>=1.3.6' "
             "'transformers<5' (the maintained fork, which takes them from "
             "transformers.pytorch_utils); pip install 'transformers<4.56'; or, "
             + _NO_MMPRETRAIN)),
    KnownBreak(
        package='onedl-mmpretrain', package_upto=(1, 3, 6), other='transformers',
        other_since=(5,), also_installed=('pycocotools',), fails=('mmpretrain', 'mmdet'),
        why=("with pycocotools and transformers installed, mmpretrain imports its multimodal "
             "models, which take find_pruneable_heads_and_indices from "
             "transformers.pytorch_utils (gone since transformers 5.0) and then subclass None "
             "('TypeError: NoneType takes no arguments'), and PretrainedConfig from "
             "transformers.modeling_utils (renamed PreTrainedConfig in 5.0); mmdet.models "
             "imports mmpretrain, so detection configs fail as well"),
        fix=("import mmvit_ext before mmdet / mmpretrain (it supplies both names; configs do "
             "through custom_imports); pip install 'transformers<5'; or, " + _NO_MMPRETRAIN),
        mend=mend_onedl_mmpretrain),
)
_MENDED: Set[KnownBreak] = set()  # the breaks mended in this process


def mend_breaks(version: Callable[[str], Optional[str]] = installed_version) -> List[KnownBreak]:
    """Mend each installed break that has a mend (``import mmvit_ext`` calls this before the
    peers are imported); the breaks mended."""
    for known in KNOWN_BREAKS:
        if known.mend is not None and known not in _MENDED and known.message(version) and \
                known.mend():
            _MENDED.add(known)
    return [known for known in KNOWN_BREAKS if known in _MENDED]


def problems(version: Optional[Callable[[str], Optional[str]]] = None,
             scopes: Optional[Iterable[str]] = None) -> List[str]:
    """One line per known break among the installed packages that is not mended in this process
    and per package installed by both of its distributions; with ``scopes`` (the packages a run
    reaches), only the breaks that fail one of them."""
    version = version or installed_version
    wanted = None if scopes is None else set(scopes)
    found = [b.message(version) for b in KNOWN_BREAKS
             if b not in _MENDED and (wanted is None or wanted & set(b.fails))]
    if wanted is None or wanted & set(NEED_OPS):
        found.append(missing_ops(version=version))
    return [m for m in found if m is not None] + mixed_distributions(version)


def config_scopes(cfg: Any) -> Set[str]:
    """The OpenMMLab packages a config reaches: its ``default_scope``, its ``custom_imports`` and
    the scope of every ``type='scope.Name'`` in it (a detection config reaches mmdet, which
    imports mmpretrain)."""
    found: Set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            kind = node.get('type')
            if isinstance(kind, str) and '.' in kind:
                found.add(kind.split('.', 1)[0])
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    scope = cfg.get('default_scope')
    if scope:
        found.add(scope)
    imports = (cfg.get('custom_imports') or {}).get('imports') or []
    found.update(name.split('.', 1)[0] for name in ([imports] if isinstance(imports, str)
                                                    else imports))
    walk(dict(cfg))
    return found


def warn_problems() -> None:
    """Warn once per known break (``import mmvit_ext`` calls this)."""
    for line in problems():
        warnings.warn(line, RuntimeWarning, stacklevel=2)


def require_working_environment(cfg: Any = None) -> None:
    """Stop with the lines of the breaks the run with config ``cfg`` reaches (every break when
    ``cfg`` is None); warn instead where ``MMVIT_EXT_IGNORE_KNOWN_BREAKS=1`` is set."""
    lines = problems(scopes=None if cfg is None else config_scopes(cfg))
    if not lines:
        return
    if os.environ.get(IGNORE_ENV, '') not in ('', '0'):
        for line in lines:
            warnings.warn(f'{line} [going on: {IGNORE_ENV} is set]', RuntimeWarning,
                          stacklevel=2)
        return
    raise SystemExit('\n'.join(lines))


__all__ = ['IGNORE_ENV', 'KNOWN_BREAKS', 'KnownBreak', 'config_scopes', 'installed_version',
           'mend_breaks', 'parse_version', 'problems', 'require_working_environment',
           'warn_problems']
