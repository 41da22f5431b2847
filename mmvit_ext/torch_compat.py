"""What needs a torch newer than our floor: one version check, one message.

The core (every backbone, every load path, training with FPN / UperNet heads) runs on the floor
in ``setup.py`` (:data:`TORCH_FLOOR`); the few APIs that came later are reached through the
helpers below. A feature that cannot run on an older torch is listed in :data:`NEEDS` and is
refused by :func:`require` with one line naming the feature, the torch it needs and the torch
installed, never with an ``AttributeError`` half-way through a forward. Only torch stdlib
imports here: the module is imported by :mod:`mmvit_ext.layers`.
"""
import re
import warnings
from typing import Callable, Dict, Optional, Tuple

import torch

TORCH_FLOOR = (2, 1)  # setup.py's install_requires floor

# feature -> (minimum torch, the APIs that set it). Versions are the releases that first ship
# the APIs; only the pinned stack in requirements/dev.txt is tested.
NEEDS: Dict[str, Tuple[Tuple[int, int], str]] = {
    'ONNX export': ((2, 6), 'torch.onnx.export(dynamo=True), torch.export.Dim, '
                            'torch.compiler.is_exporting'),
    'training-state checkpoints': ((2, 4), 'torch.serialization.add_safe_globals: weights-only '
                                           'loading of mmengine / timm training state'),
}


class TorchVersionError(RuntimeError):
    """A feature asked of a torch older than the one it needs."""


def parse_release(text: str) -> Tuple[int, ...]:
    """The leading numeric release of a version string (``'4.56.0.dev0'`` -> ``(4, 56, 0)``)."""
    match = re.match(r'\d+(\.\d+)*', text.strip())
    if match is None:
        raise ValueError(f'not a version: {text!r}')
    return tuple(int(part) for part in match.group(0).split('.'))


def torch_version(version: Optional[str] = None) -> Tuple[int, int]:
    """(major, minor) of ``version`` (e.g. ``'2.1.2+cu121'``), default the installed torch."""
    text = torch.__version__ if version is None else str(version)
    release = parse_release(text) if re.match(r'\d', text.strip()) else ()
    if len(release) < 2:
        raise ValueError(f'not a torch version: {text!r}')
    return release[0], release[1]


def torch_at_least(minimum: Tuple[int, int], version: Optional[str] = None) -> bool:
    """Whether torch ``version`` (default: installed) is ``minimum`` or newer."""
    return torch_version(version) >= tuple(minimum)


def supports(feature: str, version: Optional[str] = None) -> bool:
    """Whether torch ``version`` (default: installed) runs ``feature`` (a key of :data:`NEEDS`)."""
    return torch_at_least(NEEDS[feature][0], version)


def unsupported_message(feature: str, version: Optional[str] = None) -> str:
    """The one line that says ``feature`` needs a newer torch than ``version``."""
    minimum, apis = NEEDS[feature]
    have = torch.__version__ if version is None else version
    return (f'mmvit_ext: {feature}: needs torch >= {minimum[0]}.{minimum[1]} ({apis}); '
            f'this is torch {have}')


def require(feature: str, version: Optional[str] = None) -> None:
    """Raise :class:`TorchVersionError` with :func:`unsupported_message` unless supported."""
    if not supports(feature, version):
        raise TorchVersionError(unsupported_message(feature, version))


_warned = set()


def warn_once(feature: str) -> None:
    """Warn once per process that ``feature`` is off on this torch (for optional speed-ups)."""
    if feature not in _warned:
        _warned.add(feature)
        warnings.warn(unsupported_message(feature) + '; running without it', stacklevel=3)


def _pick_is_compiling() -> Callable[[], bool]:
    if torch_at_least((2, 3)):
        return torch.compiler.is_compiling
    from torch import _dynamo  # torch < 2.3: the same flag, under its older name
    return _dynamo.is_compiling


def _pick_is_exporting() -> Callable[[], bool]:
    if torch_at_least((2, 6)):
        return torch.compiler.is_exporting
    # older torch: export goes through dynamo, so is_compiling() covers it where we ask both
    return lambda: False


def _pick_statically_known_true() -> Callable[[torch.SymBool], bool]:
    from torch.fx.experimental import symbolic_shapes
    if hasattr(symbolic_shapes, 'statically_known_true'):  # torch >= 2.3
        return symbolic_shapes.statically_known_true

    def concrete_and_true(condition: torch.SymBool) -> bool:
        """Provable without a guard only if already a constant (no simplification before 2.3)."""
        return symbolic_shapes.is_concrete_bool(condition) and bool(condition)
    return concrete_and_true


is_compiling = _pick_is_compiling()
is_exporting = _pick_is_exporting()
statically_known_true = _pick_statically_known_true()

__all__ = ['TORCH_FLOOR', 'NEEDS', 'TorchVersionError', 'parse_release', 'torch_version',
           'torch_at_least', 'supports', 'unsupported_message', 'require', 'warn_once',
           'is_compiling', 'is_exporting', 'statically_known_true']
