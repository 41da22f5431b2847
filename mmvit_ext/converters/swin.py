"""Official microsoft/Swin-Transformer checkpoints -> our SwinTransformer layout."""
import re

from .layouts import StateDict, register_layout

_OFFICIAL_TABLE = re.compile(r'^layers\.\d+\.blocks\.\d+\.attn\.relative_position_bias_table$')


def convert_official_swin(state_dict: StateDict) -> StateDict:
    """Rename official keys; drop the classifier and the saved index / mask buffers.

    ``attn.relative_position_bias_table`` -> ``attn.rel_pos.relative_position_bias_table``; the final
    ``norm`` (on the last stage) -> ``norm{last}``. ``layers.{i}.downsample`` already sits at the
    end of stage i in both layouts. Already-converted dicts come back unchanged.
    """
    if not any(_OFFICIAL_TABLE.match(k) for k in state_dict):
        return dict(state_dict)
    last = max(int(k.split('.')[1]) for k in state_dict if k.startswith('layers.'))
    out = {}
    for key, value in state_dict.items():
        if key.startswith('head.') or key.endswith(('relative_position_index', 'attn_mask')):
            continue
        if key.endswith('attn.relative_position_bias_table'):
            key = key.replace('attn.relative_position_bias_table',
                              'attn.rel_pos.relative_position_bias_table')
        elif key.startswith('norm.'):
            key = f'norm{last}.' + key[len('norm.'):]
        out[key] = value
    return out


register_layout('official Swin (microsoft/Swin-Transformer)', 'swin',
                _OFFICIAL_TABLE.pattern, convert_official_swin)

_V1_TABLE = re.compile(r'^(layers\.\d+\.blocks\.\d+)\.rel_pos\.relative_position_bias_table$')


def convert_mmvit_ext_v1_swin(state_dict: StateDict) -> StateDict:
    """mmvit_ext <= 0.1 Swin kept the bias table beside the attention
    (``blocks.{j}.rel_pos.``); it now lives inside it (``blocks.{j}.attn.rel_pos.``)."""
    return {_V1_TABLE.sub(r'\1.attn.rel_pos.relative_position_bias_table', k): v
            for k, v in state_dict.items()}


register_layout('mmvit_ext 0.1 Swin', 'swin', _V1_TABLE.pattern, convert_mmvit_ext_v1_swin)


def export_official_swin(state_dict: StateDict, num_stages: int = 4) -> StateDict:
    """Inverse of :func:`convert_official_swin` (for peers that read the official layout).

    Only the last output norm has an official counterpart (``norm``); the other output norms
    are dropped."""
    out = {}
    for key, value in state_dict.items():
        if key.startswith('norm'):
            if key.startswith(f'norm{num_stages - 1}.'):
                out['norm.' + key.split('.', 1)[1]] = value
            continue
        out[key.replace('attn.rel_pos.relative_position_bias_table',
                        'attn.relative_position_bias_table')] = value
    return out
