"""Official DINOv3 adapter checkpoints (facebookresearch/dinov3, ``DINOv3_Adapter``) -> our
:class:`~mmvit_ext.backbones.dinov3_adapter.DINOv3Adapter` layout.

* The adapter's own state dict: the trunk under ``backbone.`` (the official DINOv3 hub keys,
  :func:`~mmvit_ext.converters.dinov3.convert_official_dinov3`), the adapter at the top level
  with ``level_embed`` (ours ``spm.level_encoding``) and the ConvFFN's ``ffn.dwconv.dwconv``
  (ours ``ffn.dwconv``); the other names are ours.
* A segmentor checkpoint (``dinov3/hub/segmentors.py``: ``FeatureDecoder``): the adapter under
  ``segmentation_model.0.``, the Mask2Former head under ``segmentation_model.1.`` (the head's
  own: :mod:`~mmvit_ext.converters.dinov3_m2f`). The released files hold no trunk (the hub loads
  it from the backbone weights), so its trunk keys keep what the model holds: load the trunk's
  file first (a list of two ``Pretrained``). So does an adapter state dict without any trunk
  tensor (that part alone, official names or ours: ``load_from`` of a converted segmentor).
* A DINOv3 trunk checkpoint alone (any layout :class:`VisionTransformer` loads): the adapter
  parts keep their initialisation.
"""
from .dinov3 import convert_official_dinov3
from .layouts import StateDict, has_key, register_init_only, register_layout, rename_keys

_EXTRACTOR = r'^interactions\.\d+\.extractor\.'
_SEGMENTOR = 'segmentation_model.0.'
_TRUNK = 'backbone.'
_ADAPTER_PARTS = r'^(spm\.|interactions\.|up\.|norm[1-4]\.)'
_TRUNK_PARTS = (r'^(patch_embed\.|cls_token$|register_tokens$|rope_embed\.|blocks\.|norm\.|'
                r'cls_norm\.)')
_ANY_TRUNK = r'^(backbone\.)?(patch_embed\.|blocks\.|cls_token$)'  # official or ours


def _extractors_only(state_dict: StateDict) -> bool:
    return has_key(state_dict, _EXTRACTOR) and not has_key(state_dict, r'\.injector\.')


def is_official_dinov3_adapter(state_dict: StateDict) -> bool:
    """Extractors without injectors, with the official ``level_embed``, ConvFFN wrapper or
    ``backbone.`` trunk."""
    return _extractors_only(state_dict) and (
        'level_embed' in state_dict or has_key(state_dict, r'\.ffn\.dwconv\.dwconv\.')
        or has_key(state_dict, r'^backbone\.'))


def convert_official_dinov3_adapter(state_dict: StateDict) -> StateDict:
    """The official ``DINOv3_Adapter`` state dict -> ours (see the module). Others unchanged."""
    if not is_official_dinov3_adapter(state_dict):
        return dict(state_dict)
    trunk = {k[len(_TRUNK):]: v for k, v in state_dict.items() if k.startswith(_TRUNK)}
    adapter = rename_keys({k: v for k, v in state_dict.items() if not k.startswith(_TRUNK)},
                          ((r'\.ffn\.dwconv\.dwconv\.', '.ffn.dwconv.'),
                           (r'^level_embed$', 'spm.level_encoding')))
    return {**convert_official_dinov3(trunk), **adapter}


def is_official_dinov3_segmentor(state_dict: StateDict) -> bool:
    return any(k.startswith(_SEGMENTOR + 'interactions.') for k in state_dict)


def convert_official_dinov3_segmentor(state_dict: StateDict) -> StateDict:
    """An official DINOv3 segmentor checkpoint -> ours: its backbone part
    (``segmentation_model.0.``) converted; the head part is the head's to load. Others
    unchanged."""
    if not is_official_dinov3_segmentor(state_dict):
        return dict(state_dict)
    backbone = {k[len(_SEGMENTOR):]: v for k, v in state_dict.items() if k.startswith(_SEGMENTOR)}
    return convert_official_dinov3_adapter(backbone)


def _has_trunk(state_dict: StateDict) -> bool:
    return has_key(state_dict, _ANY_TRUNK)


register_layout('official DINOv3 segmentor (facebookresearch/dinov3 m2f, backbone part)',
                'dinov3_segmentor', r'^segmentation_model\.0\.interactions\.',
                convert_official_dinov3_segmentor, detect=is_official_dinov3_segmentor)
register_layout('official DINOv3_Adapter (facebookresearch/dinov3)', 'dinov3_adapter',
                _EXTRACTOR, convert_official_dinov3_adapter,
                detect=lambda sd: is_official_dinov3_adapter(sd) and _has_trunk(sd))
register_layout('mmvit_ext DINOv3 adapter', 'dinov3_adapter', _EXTRACTOR, ours=True,
                detect=lambda sd: _extractors_only(sd) and not is_official_dinov3_adapter(sd)
                and _has_trunk(sd))
# a segmentor's adapter without the trunk (its ``segmentation_model.0`` part, official names or
# ours, as load_from / the conversion tool hand it over): the trunk comes from its own file
register_layout('DINOv3 segmentor adapter part (no trunk)', 'dinov3_segmentor', _EXTRACTOR,
                convert_official_dinov3_adapter,
                detect=lambda sd: _extractors_only(sd) and not _has_trunk(sd))
# a trunk checkpoint has none of the adapter; a segmentor checkpoint none of the trunk
register_init_only('dinov3_adapter', _ADAPTER_PARTS, layout_family='vit')
register_init_only('dinov3_adapter', _TRUNK_PARTS, layout_family='dinov3_segmentor')
