"""The official DINOv3 Mask2Former segmentor (facebookresearch/dinov3, ``dinov3/hub/segmentors.py``:
``FeatureDecoder``) -> mmseg.

* The head (``segmentation_model.1.``, ``dinov3/eval/segmentation/models/heads/``:
  ``pixel_decoder`` = ``MSDeformAttnPixelDecoder``, ``predictor`` =
  ``MultiScaleMaskedTransformerDecoder``) -> mmseg's ``Mask2FormerHead`` keys (mmdet's pixel
  decoder and transformer decoder), which compute the same function (docs/model_zoo.md):
  :func:`convert_official_dinov3_m2f_head`, every tensor renamed, none dropped.
* The whole file (``segmentation_model.0.`` the adapter, ``.1.`` the head) -> an mmseg segmentor
  checkpoint (``backbone.*``, ``decode_head.*``): :func:`convert_official_dinov3_segmentor_model`,
  for ``load_from`` / ``--resume`` / tools/test.py (:class:`~mmvit_ext.engine.OfficialLayoutHook`)
  and tools/convert_checkpoint.py. The released files hold no trunk: the backbone loads it
  from the trunk's own file first (its ``init_cfg``), or the tool merges it (``--trunk``).
"""
import re

from .dinov3_adapter import convert_official_dinov3_adapter
from .io import CheckpointError
from .layouts import StateDict, has_key, register_layout, register_model_layout

_SEGMENTOR = re.compile(r'^segmentation_model\.(\d+)\.')
_OFFICIAL_HEAD = (r'^(predictor\.transformer_(self|cross)_attention_layers\.|'
                  r'pixel_decoder\.encoder\.encoder\.layers\.)')
_OURS_HEAD = r'^transformer_decoder\.layers\.\d+\.cross_attn\.attn\.'
_OURS_PARTS = ('pixel_decoder.input_convs.', 'pixel_decoder.level_encoding.',
               'pixel_decoder.encoder.layers.', 'pixel_decoder.lateral_convs.',
               'pixel_decoder.output_convs.', 'pixel_decoder.mask_feature.',
               'transformer_decoder.', 'decoder_input_projs.', 'cls_embed.', 'mask_embed.',
               'query_feat.', 'query_embed.', 'level_embed.')


def _decoder_layer_rules() -> list:
    """The official decoder's three per-layer lists -> mmdet's one layer list: cross-attention,
    its norm ``norms.0``; self-attention, ``norms.1``; FFN, ``norms.2``."""
    rules = []
    for official, inner, ours, norm in (('cross_attention', 'multihead_attn', 'cross_attn', 0),
                                        ('self_attention', 'self_attn', 'self_attn', 1),
                                        ('ffn', None, None, 2)):
        layer = rf'^predictor\.transformer_{official}_layers\.(\d+)\.'
        target = r'transformer_decoder.layers.\1.'
        if inner is None:  # FFN: linear1 / linear2 -> mmcv FFN's layers.0.0 / layers.1
            rules += [(layer + r'linear1\.', target + 'ffn.layers.0.0.'),
                      (layer + r'linear2\.', target + 'ffn.layers.1.')]
        else:  # nn.MultiheadAttention inside mmcv's MultiheadAttention (``attn``)
            rules.append((layer + inner + r'\.', target + ours + '.attn.'))
        rules.append((layer + r'norm\.', target + f'norms.{norm}.'))
    return rules


# official -> mmseg Mask2FormerHead (mmdet MSDeformAttnPixelDecoder + Mask2FormerTransformerDecoder)
_HEAD_RULES = (
    (r'^pixel_decoder\.input_convs\.(\d+)\.0\.', r'pixel_decoder.input_convs.\1.conv.'),
    (r'^pixel_decoder\.input_convs\.(\d+)\.1\.', r'pixel_decoder.input_convs.\1.gn.'),
    (r'^pixel_decoder\.encoder\.level_encoding$', 'pixel_decoder.level_encoding.weight'),
    (r'^pixel_decoder\.encoder\.encoder\.layers\.', 'pixel_decoder.encoder.layers.'),
    (r'(encoder\.layers\.\d+)\.norm1\.', r'\1.norms.0.'),
    (r'(encoder\.layers\.\d+)\.norm2\.', r'\1.norms.1.'),
    (r'(encoder\.layers\.\d+)\.linear1\.', r'\1.ffn.layers.0.0.'),
    (r'(encoder\.layers\.\d+)\.linear2\.', r'\1.ffn.layers.1.'),
    (r'^pixel_decoder\.(lateral|output)_convs\.(\d+)\.weight$',
     r'pixel_decoder.\1_convs.\2.conv.weight'),
    (r'^pixel_decoder\.(lateral|output)_convs\.(\d+)\.norm\.', r'pixel_decoder.\1_convs.\2.gn.'),
    *_decoder_layer_rules(),
    (r'^predictor\.post_norm\.', 'transformer_decoder.post_norm.'),
    (r'^predictor\.input_proj\.', 'decoder_input_projs.'),
    (r'^predictor\.class_embed\.', 'cls_embed.'),
    (r'^predictor\.mask_embed\.layers\.(\d+)\.',
     lambda m: f'mask_embed.{2 * int(m.group(1))}.'),  # Linear, ReLU, Linear, ReLU, Linear
    (r'^predictor\.(query_feat|query_embed|level_embed)\.', r'\1.'),
)


def is_official_dinov3_m2f_head(state_dict: StateDict) -> bool:
    return has_key(state_dict, _OFFICIAL_HEAD)


def convert_official_dinov3_m2f_head(state_dict: StateDict) -> StateDict:
    """The official head's state dict (``segmentation_model.1.*`` without the prefix) -> mmseg
    ``Mask2FormerHead`` keys; a key the rules do not know raises. Others unchanged."""
    if not is_official_dinov3_m2f_head(state_dict):
        return dict(state_dict)
    out = {}
    for key, value in state_dict.items():
        new = key
        for pattern, repl in _HEAD_RULES:
            new = re.sub(pattern, repl, new)
        if not new.startswith(_OURS_PARTS) or re.search(r'linear\d|norm\d|multihead', new):
            raise CheckpointError(f'official DINOv3 Mask2Former head: no rule for {key!r} '
                                  f'(not the official MSDeformAttnPixelDecoder / '
                                  f'MultiScaleMaskedTransformerDecoder?)')
        out[new] = value
    return out


def _parts(state_dict: StateDict) -> dict:
    """``{index: part}`` of a ``FeatureDecoder`` state dict (``segmentation_model.{i}.*``)."""
    parts: dict = {}
    for key, value in state_dict.items():
        match = _SEGMENTOR.match(key)
        if match is None:
            raise CheckpointError(f'official DINOv3 segmentor: key {key!r} outside '
                                  f'segmentation_model.0 / .1')
        parts.setdefault(int(match.group(1)), {})[key[match.end():]] = value
    if set(parts) != {0, 1}:
        raise CheckpointError(f'official DINOv3 segmentor: expected segmentation_model.0 (the '
                              f'adapter) and .1 (the head), got parts {sorted(parts)}')
    return parts


def is_official_dinov3_segmentor_model(state_dict: StateDict) -> bool:
    """A whole released segmentor: the adapter under ``segmentation_model.0.``, the m2f head
    under ``.1.``."""
    return has_key(state_dict, r'^segmentation_model\.0\.interactions\.') and \
        has_key(state_dict, r'^segmentation_model\.1\.predictor\.')


def convert_official_dinov3_segmentor_model(state_dict: StateDict) -> StateDict:
    """A whole official segmentor -> an mmseg segmentor's keys: ``backbone.`` our adapter (no
    trunk: the released file has none), ``decode_head.`` mmseg's Mask2FormerHead. Every tensor
    lands; others unchanged."""
    if not is_official_dinov3_segmentor_model(state_dict):
        return dict(state_dict)
    parts = _parts(state_dict)
    backbone = convert_official_dinov3_adapter(parts[0])
    head = convert_official_dinov3_m2f_head(parts[1])
    return {**{f'backbone.{k}': v for k, v in backbone.items()},
            **{f'decode_head.{k}': v for k, v in head.items()}}


def _head_part(state_dict: StateDict) -> StateDict:
    """The head of a whole official segmentor, converted (for the head's own ``init_cfg``)."""
    return convert_official_dinov3_m2f_head(_parts(state_dict)[1])


register_model_layout('official DINOv3 segmentor (facebookresearch/dinov3 m2f: adapter + head)',
                      is_official_dinov3_segmentor_model, convert_official_dinov3_segmentor_model)
register_layout('official DINOv3 segmentor (facebookresearch/dinov3 m2f, head part)',
                'dinov3_m2f', r'^segmentation_model\.1\.predictor\.', _head_part)
register_layout('official DINOv3 Mask2Former head (facebookresearch/dinov3)', 'dinov3_m2f',
                _OFFICIAL_HEAD, convert_official_dinov3_m2f_head)
register_layout('mmseg Mask2FormerHead', 'dinov3_m2f', _OURS_HEAD, ours=True)
