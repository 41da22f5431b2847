"""Known checkpoint layouts: which family a state dict belongs to, and its converter.

A converter is a pure, idempotent function ``state_dict -> state_dict`` (ours); our own layouts
are registered too (``ours=True``, identity converter) so that every checkpoint gets a name.
Detection looks at key names only: a layout matches when its ``signature`` regex finds a key
and its optional ``detect`` predicate agrees (for layouts that share key names, e.g. official and
timm Swin, which differ in where the patch merging sits).
"""
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

StateDict = Dict[str, torch.Tensor]
Converter = Callable[[StateDict], StateDict]


@dataclass(frozen=True)
class Layout:
    name: str                 # e.g. 'official Swin (microsoft/Swin-Transformer)'
    family: str               # backbone family that can load it, e.g. 'swin'
    signature: 're.Pattern'   # a key that this layout has
    convert: Optional[Converter] = None
    detect: Optional[Callable[[StateDict], bool]] = None
    ours: bool = False        # an mmvit_ext layout: nothing to convert

    def matches(self, state_dict: StateDict) -> bool:
        if not any(self.signature.search(k) for k in state_dict):
            return False
        return self.detect is None or self.detect(state_dict)


LAYOUTS: List[Layout] = []
# family -> regex of our keys that checkpoints of other layouts may lack by design (output norms a
# classifier never had, the dense pyramid): kept at their initialisation and reported as expected
INIT_ONLY: Dict[str, 're.Pattern'] = {}


def register_layout(name: str, family: str, signature: str, convert: Optional[Converter] = None,
                    detect: Optional[Callable[[StateDict], bool]] = None,
                    ours: bool = False) -> None:
    """Add a layout; detection tries layouts in registration order."""
    LAYOUTS.append(Layout(name, family, re.compile(signature),
                          (lambda sd: dict(sd)) if ours else convert, detect, ours))


def register_init_only(family: str, pattern: str, layout_family: Optional[str] = None) -> None:
    """Keys of ``family`` that checkpoints may lack; with ``layout_family``, only checkpoints of
    that family's layouts (a trunk checkpoint of a family built on another's trunk)."""
    INIT_ONLY[family if layout_family is None else f'{family}<-{layout_family}'] = \
        re.compile(pattern)


@dataclass(frozen=True)
class ModelLayout:
    """A whole model's checkpoint in another codebase's module tree (e.g. the official DINOv3
    segmentor's ``segmentation_model.0`` / ``.1``): converted to an OpenMMLab model's top-level
    names (``backbone.``, ``decode_head.``) before the model loads it."""
    name: str
    detect: Callable[[StateDict], bool]
    convert: Converter


MODEL_LAYOUTS: List[ModelLayout] = []


def register_model_layout(name: str, detect: Callable[[StateDict], bool],
                          convert: Converter) -> None:
    MODEL_LAYOUTS.append(ModelLayout(name, detect, convert))


def convert_model_layout(state_dict: StateDict) -> Tuple[StateDict, Optional[str]]:
    """A whole-model checkpoint of a known foreign layout in OpenMMLab names, with the layout's
    name; any other unchanged, with ``None``."""
    layout = next((lay for lay in MODEL_LAYOUTS if lay.detect(state_dict)), None)
    return (state_dict, None) if layout is None else (layout.convert(state_dict), layout.name)


def detect_layouts(state_dict: StateDict) -> List[Layout]:
    """Every known layout that matches the state dict (any family)."""
    return [layout for layout in LAYOUTS if layout.matches(state_dict)]


def detect_layout(state_dict: StateDict, family: str) -> Optional[Layout]:
    """The first registered layout of ``family`` that matches, or ``None``."""
    return next((lay for lay in LAYOUTS if lay.family == family and lay.matches(state_dict)),
                None)


def rename_keys(state_dict: StateDict, rules, drop: Callable[[str], bool] = lambda k: False
                ) -> StateDict:
    """Apply ``(pattern, replacement)`` regex rules to every key, in order; skip dropped keys."""
    out = {}
    for key, value in state_dict.items():
        if drop(key):
            continue
        for pattern, repl in rules:
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out


def has_key(state_dict: StateDict, pattern: str) -> bool:
    regex = re.compile(pattern)
    return any(regex.search(k) for k in state_dict)


def strip_model_prefix(state_dict: StateDict, prefix: str) -> StateDict:
    """``SwinForImageClassification`` / ``PvtV2ForImageClassification`` nest the model under
    ``swin.`` / ``pvt_v2.``; the classifier is dropped."""
    if not any(k.startswith(prefix) for k in state_dict):
        return state_dict
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def merge_qkv(state_dict: StateDict, parts: Sequence[str], merged: str) -> StateDict:
    """Concatenate separate projections (``parts``: key infixes in order) into one ``merged``."""
    out = {}
    for key, value in state_dict.items():
        if parts[0] in key:
            out[key.replace(parts[0], merged)] = torch.cat(
                [state_dict[key.replace(parts[0], part)] for part in parts], dim=0)
        elif not any(part in key for part in parts[1:]):
            out[key] = value
    return out
