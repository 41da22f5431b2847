"""Swin checkpoints of every common layout -> our SwinTransformer layout.

Ours follows the official one (``layers.{i}.blocks.{j}``, ``layers.{i}.downsample`` at the end of
stage i) with the bias table inside ``attn.rel_pos`` and one output norm per stage (``norm{i}``).
Layouts: official (microsoft/Swin-Transformer), timm (patch merging at the start of the next
stage), OpenMMLab (mmdet / mmseg / mmpretrain: ``stages``, ``w_msa``, ``ffn``, patch merging
through ``nn.Unfold``), Hugging Face transformers (``SwinModel`` / ``SwinBackbone``), and our 0.1.
"""
import math
import re

import torch

from .layouts import (StateDict, has_key, merge_qkv, register_init_only, register_layout,
                      rename_keys, strip_model_prefix)

_TABLE = 'relative_position_bias_table'
_OFFICIAL_TABLE = re.compile(r'^layers\.\d+\.blocks\.\d+\.attn\.relative_position_bias_table$')
_BUFFERS = ('relative_position_index', 'attn_mask')


def _last_stage(state_dict: StateDict, prefix: str = 'layers.') -> int:
    return max(int(k[len(prefix):].split('.')[0]) for k in state_dict if k.startswith(prefix))


def is_timm_swin(state_dict: StateDict) -> bool:
    """timm moved the patch merging to the start of the next stage: ``layers.{i>0}.downsample``
    exists, ``layers.0.downsample`` does not (or the head is ``head.fc``)."""
    merges = {int(k.split('.')[1]) for k in state_dict
              if re.match(r'^layers\.\d+\.downsample\.', k)}
    return (bool(merges) and 0 not in merges) or any(k.startswith('head.fc.') for k in state_dict)


def _official_like(state_dict: StateDict, merge_shift: int) -> StateDict:
    """Shared by official and timm: table into ``attn.rel_pos``, final ``norm`` -> ``norm{last}``,
    classifier and saved index / mask buffers dropped, patch merging moved by ``merge_shift``."""
    last = _last_stage(state_dict)
    out = {}
    for key, value in state_dict.items():
        if key.startswith('head.') or key.endswith(_BUFFERS):
            continue
        if key.endswith('attn.' + _TABLE):
            key = key.replace('attn.' + _TABLE, 'attn.rel_pos.' + _TABLE)
        elif key.startswith('norm.'):
            key = f'norm{last}.' + key[len('norm.'):]
        elif merge_shift and re.match(r'^layers\.\d+\.downsample\.', key):
            stage = int(key.split('.')[1])
            key = f'layers.{stage + merge_shift}.' + key.split('.', 2)[2]
        out[key] = value
    return out


def convert_official_swin(state_dict: StateDict) -> StateDict:
    """Official keys -> ours: ``attn.relative_position_bias_table`` ->
    ``attn.rel_pos.relative_position_bias_table``, final ``norm`` -> ``norm{last}``; classifier
    and saved index / mask buffers dropped. Other layouts come back unchanged."""
    if not has_key(state_dict, _OFFICIAL_TABLE.pattern) or is_timm_swin(state_dict):
        return dict(state_dict)
    return _official_like(state_dict, 0)


def convert_timm_swin(state_dict: StateDict) -> StateDict:
    """timm keys -> ours: as the official ones, and ``layers.{i}.downsample`` ->
    ``layers.{i-1}.downsample`` (same weights, same concat order). Others come back unchanged."""
    if not has_key(state_dict, _OFFICIAL_TABLE.pattern) or not is_timm_swin(state_dict):
        return dict(state_dict)
    return _official_like(state_dict, -1)


# nn.Unfold concatenates the 2x2 neighbourhood channel-major as (0,0),(0,1),(1,0),(1,1); the
# official merge concatenates stage-major as (0,0),(1,0),(0,1),(1,1)
_UNFOLD_TO_OFFICIAL = [0, 2, 1, 3]


def _unfold_to_official(value: torch.Tensor) -> torch.Tensor:
    """Patch-merging weight (out, 4C) or norm (4C,) from Unfold order to the official order."""
    lead = value.shape[:-1]
    channels = value.shape[-1] // 4
    value = value.reshape(*lead, channels, 4).transpose(-1, -2)[..., _UNFOLD_TO_OFFICIAL, :]
    return value.reshape(*lead, 4 * channels)


_OPENMMLAB = (
    (r'^patch_embed\.projection\.', 'patch_embed.proj.'),
    (r'^stages\.', 'layers.'),
    (r'\.attn\.w_msa\.' + _TABLE + '$', '.attn.rel_pos.' + _TABLE),
    (r'\.attn\.w_msa\.', '.attn.'),
    (r'\.ffn\.layers\.0\.0\.', '.mlp.fc1.'),
    (r'\.ffn\.layers\.1\.', '.mlp.fc2.'),
)


def convert_openmmlab_swin(state_dict: StateDict) -> StateDict:
    """mmdet / mmseg / mmpretrain keys -> ours: ``stages`` -> ``layers``, ``attn.w_msa`` ->
    ``attn``, ``ffn.layers.0.0 / 1`` -> ``mlp.fc1 / fc2``, ``patch_embed.projection`` -> ``.proj``; patch
    merging weights reordered from ``nn.Unfold`` order; ``norm{i}`` kept. Others unchanged."""
    if not has_key(state_dict, r'^stages\.\d+\.blocks\.\d+\.attn\.w_msa\.' + _TABLE):
        return dict(state_dict)
    out = rename_keys(state_dict, _OPENMMLAB,
                      drop=lambda k: k.startswith('head.') or k.endswith(_BUFFERS))
    for key in [k for k in out if re.match(r'^layers\.\d+\.downsample\.(reduction|norm)\.', k)]:
        out[key] = _unfold_to_official(out[key])
    return out


_HF = (
    (r'^embeddings\.patch_embeddings\.projection\.', 'patch_embed.proj.'),
    (r'^embeddings\.norm\.', 'patch_embed.norm.'),
    (r'^embeddings\.position_embeddings$', 'absolute_pos_embed'),
    (r'^encoder\.layers\.', 'layers.'),
    (r'\.layernorm_before\.', '.norm1.'),
    (r'\.layernorm_after\.', '.norm2.'),
    (r'\.attention\.self\.' + _TABLE + '$', '.attn.rel_pos.' + _TABLE),
    (r'\.attention\.output\.dense\.', '.attn.proj.'),
    (r'\.intermediate\.dense\.', '.mlp.fc1.'),
    (r'\.output\.dense\.', '.mlp.fc2.'),
    (r'^hidden_states_norms\.stage(\d+)\.', lambda m: f'norm{int(m.group(1)) - 1}.'),
)


def convert_hf_swin(state_dict: StateDict) -> StateDict:
    """transformers ``SwinModel`` / ``SwinBackbone`` keys -> ours: separate query / key / value
    concatenated into ``qkv``; ``layernorm`` -> ``norm{last}``, ``hidden_states_norms.stage{k}``
    -> ``norm{k-1}``; mask token, pooler and classifier dropped, and the unused ``swin.layernorm``
    a transformers 5 ``SwinBackbone`` saves beside its own keys. Others come back unchanged."""
    if has_key(state_dict, r'^swin\.embeddings\.'):  # SwinForImageClassification nests the model
        state_dict = strip_model_prefix(state_dict, 'swin.')
    if not has_key(state_dict, r'^embeddings\.patch_embeddings\.projection\.weight$') \
            or not has_key(state_dict, r'^encoder\.layers\.\d+\.blocks\.'):
        return dict(state_dict)
    last = _last_stage(state_dict, 'encoder.layers.')
    state_dict = merge_qkv(state_dict, ('.attention.self.query.', '.attention.self.key.',
                                        '.attention.self.value.'), '.attn.qkv.')
    state_dict = {(f'norm{last}.' + k[len('layernorm.'):] if k.startswith('layernorm.') else k): v
                  for k, v in state_dict.items()}
    out = rename_keys(state_dict, _HF, drop=lambda k: k.endswith(_BUFFERS) or k.startswith(
        ('classifier.', 'pooler.', 'embeddings.mask_token', 'swin.')))
    pos = out.get('absolute_pos_embed')
    if pos is not None and math.isqrt(pos.shape[1] - 1) ** 2 == pos.shape[1] - 1:
        out['absolute_pos_embed'] = pos[:, 1:]  # HF keeps a class-token slot Swin never uses
    return out


_V1_TABLE = re.compile(r'^(layers\.\d+\.blocks\.\d+)\.rel_pos\.relative_position_bias_table$')


def convert_mmvit_ext_v1_swin(state_dict: StateDict) -> StateDict:
    """mmvit_ext <= 0.1 Swin kept the bias table beside the attention
    (``blocks.{j}.rel_pos.``); it now lives inside it (``blocks.{j}.attn.rel_pos.``)."""
    return {_V1_TABLE.sub(r'\1.attn.rel_pos.relative_position_bias_table', k): v
            for k, v in state_dict.items()}


register_layout('mmvit_ext Swin', 'swin',
                r'^layers\.\d+\.blocks\.\d+\.attn\.rel_pos\.relative_position_bias_table$',
                ours=True)
register_layout('mmvit_ext 0.1 Swin', 'swin', _V1_TABLE.pattern, convert_mmvit_ext_v1_swin)
register_layout('OpenMMLab Swin (mmdet / mmseg / mmpretrain)', 'swin',
                r'^stages\.\d+\.blocks\.\d+\.attn\.w_msa\.' + _TABLE + '$', convert_openmmlab_swin)
register_layout('Hugging Face transformers Swin (SwinModel / SwinBackbone)', 'swin',
                r'^(swin\.)?embeddings\.patch_embeddings\.projection\.weight$', convert_hf_swin,
                # HF ViT / DINOv2 share the patch embedding key; Swin's stages are encoder.layers
                detect=lambda sd: has_key(sd, r'^(swin\.)?encoder\.layers\.\d+\.blocks\.'))
register_layout('timm Swin (timm.models.swin_transformer)', 'swin', _OFFICIAL_TABLE.pattern,
                convert_timm_swin, detect=is_timm_swin)
register_layout('official Swin (microsoft/Swin-Transformer)', 'swin', _OFFICIAL_TABLE.pattern,
                convert_official_swin, detect=lambda sd: not is_timm_swin(sd))
# a classifier has one final norm, a detector one per output it used
register_init_only('swin', r'^norm\d+\.')


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
