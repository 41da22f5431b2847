"""Tables keyed by downstream module classes (``'mmdet.models....Class'``), matched in a model.

The classes are named as dotted paths and looked up among the modules already imported: a model
can only hold instances of classes whose modules are imported, so a table may name codebases that
are not installed, or that this run never imports (a segmentation run never imports mmdet)."""
import sys
from typing import Iterable, List, Tuple

from torch import nn


def _resolve(dotted: str):
    module, _, name = dotted.rpartition('.')
    return getattr(sys.modules.get(module), name, None)


def match_modules(model: nn.Module, table: Iterable[Tuple[str, str]]
                  ) -> List[Tuple[str, nn.Module, str]]:
    """``(name, module, value)`` for each module of ``model`` that is an instance of a class in
    ``table`` (``(dotted class, value)`` rows; the first matching row gives the value)."""
    rows = [(cls, value) for cls, value in ((_resolve(p), v) for p, v in table) if cls]
    found = []
    for name, module in model.named_modules():
        value = next((v for cls, v in rows if isinstance(module, cls)), None)
        if value is not None:
            found.append((name, module, value))
    return found


__all__ = ['match_modules']
