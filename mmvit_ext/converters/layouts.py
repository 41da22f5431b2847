"""Known checkpoint layouts: which family a state dict belongs to, and its converter.

A converter is a pure, idempotent function ``state_dict -> state_dict`` (ours). Layouts without a
converter are recognised only so that loading one into the wrong backbone names what it is.
"""
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

StateDict = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class Layout:
    name: str                 # e.g. 'official Swin (microsoft/Swin-Transformer)'
    family: str               # backbone family that can load it, e.g. 'swin'
    signature: 're.Pattern'   # a key that only this layout has
    convert: Optional[Callable[[StateDict], StateDict]] = None

    def matches(self, state_dict: StateDict) -> bool:
        return any(self.signature.search(k) for k in state_dict)


LAYOUTS: List[Layout] = []


def register_layout(name: str, family: str, signature: str,
                    convert: Optional[Callable[[StateDict], StateDict]] = None) -> None:
    LAYOUTS.append(Layout(name, family, re.compile(signature), convert))


def detect_layouts(state_dict: StateDict) -> List[Layout]:
    """Every known layout whose signature key appears in the state dict."""
    return [layout for layout in LAYOUTS if layout.matches(state_dict)]


# Layouts recognised for error messages; their families register converters in their own modules.
register_layout('Swin in mmdet/mmseg layout', 'swin',
                r'^stages\.\d+\.blocks\.\d+\.attn\.w_msa\.relative_position_bias_table$')
