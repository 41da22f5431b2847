"""Checkpoints of any timm model -> :class:`~mmvit_ext.backbones.TimmBackbone`'s keys.

``TimmBackbone`` holds the timm model as ``timm_model``, so its own keys are ``timm_model.`` +
the keys of that model -- the layout of mmpretrain's ``TIMMBackbone`` and of transformers'
``TimmWrapperModel`` too. A file saved from ``timm.create_model(...)`` (or a timm model's
``model.safetensors`` on the Hugging Face hub) has the bare keys; where timm's ``features_only``
wrapper re-registered a ``Sequential``'s children one level up (``stages.0`` -> ``stages_0``),
the key follows. Which of these applies is a fact of the built instance, so the mapping takes the
instance's own keys; it is pure and idempotent.
"""
from typing import Iterable, Optional, Tuple

from .layouts import StateDict, register_layout

PREFIX = 'timm_model.'
OURS = ('mmvit_ext TimmBackbone (timm_model.*: also mmpretrain TIMMBackbone, transformers '
        'TimmWrapper)')
TIMM = 'timm state dict (timm.create_model(...).state_dict(), Hugging Face hub timm weights)'

register_layout(OURS, 'timm', r'^timm_model\.', ours=True)


def _candidates(key: str) -> Tuple[str, ...]:
    """Where a full-model key sits in a built instance: as is, under ``features_only``'s
    ``body.`` (hooks on the untouched model), with its first two levels joined by ``_``, or
    without the ``model.`` of timm's getter wrapper (mmpretrain ``features_only=True``)."""
    head, dot, rest = key.partition('.')
    second, dot2, tail = rest.partition('.')
    flattened = (f'{head}_{second}{dot2}{tail}',) if dot and dot2 else ()
    unwrapped = (rest,) if head == 'model' and dot else ()
    return (key, f'body.{key}') + flattened + unwrapped


def timm_keys_to_ours(state_dict: StateDict, own_keys: Iterable[str]
                      ) -> Optional[Tuple[StateDict, str]]:
    """``state_dict`` in our keys and the layout's name, or ``None`` when no key of it belongs to
    this instance. Keys with no place in the instance (a classifier, parts ``out_indices`` does
    not build, or foreign ones) keep their name under ``timm_model.``, for the load report."""
    own = set(own_keys)
    if all(k.startswith(PREFIX) for k in state_dict):
        bare, layout = {k[len(PREFIX):]: v for k, v in state_dict.items()}, OURS
    else:
        bare, layout = dict(state_dict), TIMM
    out = {}
    for key, value in bare.items():
        place = next((c for c in _candidates(key) if PREFIX + c in own), key)
        out[PREFIX + place] = value
    if not set(out) & own:
        return None
    return out, layout
