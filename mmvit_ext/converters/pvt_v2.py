"""PVTv2 checkpoints of every common layout -> our PyramidVisionTransformerV2 layout.

Ours: ``layers.{i}.patch_embed``, ``layers.{i}.blocks.{j}`` (``attn.q / kv / proj / sr / norm``,
``mlp.fc1 / dwconv / fc2``), ``layers.{i}.norm``. Layouts: official (whai362/PVT), timm (stage 0's
patch embedding at the top, the others as ``stages.{i}.downsample``), mmdet (``layers.{i}.0/1/2``,
q and kv fused in ``nn.MultiheadAttention``, 1x1-conv FFN; mmseg's MiT / SegFormer shares it) and
Hugging Face transformers (``PvtV2Model`` / ``PvtV2Backbone``).
"""
import re

from .layouts import (StateDict, has_key, merge_qkv, register_layout, rename_keys,
                      strip_model_prefix)

_OFFICIAL = re.compile(r'^(patch_embed|block|norm)(\d)\.(.*)$')


def convert_official_pvtv2(state_dict: StateDict) -> StateDict:
    """``patch_embed{n}.`` / ``block{n}.{j}.`` / ``norm{n}.`` -> ``layers.{n-1}.patch_embed.`` /
    ``.blocks.{j}.`` / ``.norm.``; ``mlp.dwconv.dwconv`` -> ``mlp.dwconv``; the head is dropped.
    Other layouts come back unchanged."""
    if not any(k.startswith('block1.') for k in state_dict):
        return dict(state_dict)
    out = {}
    for key, value in state_dict.items():
        if key.startswith('head.'):
            continue
        match = _OFFICIAL.match(key)
        if match:
            part, stage, rest = match.groups()
            part = 'blocks' if part == 'block' else part
            key = f'layers.{int(stage) - 1}.{part}.{rest}'
        out[key.replace('.mlp.dwconv.dwconv.', '.mlp.dwconv.')] = value
    return out


_TIMM = (
    (r'^patch_embed\.', 'layers.0.patch_embed.'),
    (r'^stages\.(\d+)\.downsample\.', r'layers.\1.patch_embed.'),
    (r'^stages\.(\d+)\.(blocks|norm)\.', r'layers.\1.\2.'),
)


def convert_timm_pvtv2(state_dict: StateDict) -> StateDict:
    """timm keys -> ours: ``patch_embed`` -> ``layers.0.patch_embed``, ``stages.{i}.downsample``
    -> ``layers.{i}.patch_embed``, ``stages.{i}.blocks / norm`` -> ``layers.{i}.*``; the head is
    dropped. Other layouts come back unchanged."""
    if not has_key(state_dict, r'^stages\.\d+\.blocks\.\d+\.attn\.q\.weight$'):
        return dict(state_dict)
    return rename_keys(state_dict, _TIMM, drop=lambda k: k.startswith('head.'))


_MMDET = (
    (r'^layers\.(\d+)\.0\.projection\.', r'layers.\1.patch_embed.proj.'),
    (r'^layers\.(\d+)\.0\.norm\.', r'layers.\1.patch_embed.norm.'),
    (r'^layers\.(\d+)\.1\.(\d+)\.', r'layers.\1.blocks.\2.'),
    (r'^layers\.(\d+)\.2\.', r'layers.\1.norm.'),
    (r'\.attn\.attn\.out_proj\.', '.attn.proj.'),
    (r'\.ffn\.layers\.0\.', '.mlp.fc1.'),
    (r'\.ffn\.layers\.1\.', '.mlp.dwconv.'),
    (r'\.ffn\.layers\.4\.', '.mlp.fc2.'),
)


def convert_mmdet_pvtv2(state_dict: StateDict) -> StateDict:
    """mmdet PVTv2 (and mmseg MiT) keys -> ours: ``layers.{i}.0 / 1.{j} / 2`` -> ``patch_embed /
    blocks.{j} / norm``; ``attn.attn.in_proj_*`` split into ``attn.q`` and ``attn.kv``;
    ``out_proj`` -> ``proj``; the 1x1-conv FFN ``ffn.layers.0/1/4`` -> ``mlp.fc1/dwconv/fc2``
    (weights squeezed to linear). Other layouts come back unchanged."""
    if not has_key(state_dict, r'^layers\.\d+\.1\.\d+\.attn\.attn\.in_proj_weight$'):
        return dict(state_dict)
    out = {}
    for key, value in rename_keys(state_dict, _MMDET).items():
        fused = re.match(r'^(.*)\.attn\.attn\.in_proj_(weight|bias)$', key)
        if fused:
            dim = value.shape[0] // 3
            out[f'{fused.group(1)}.attn.q.{fused.group(2)}'] = value[:dim]
            out[f'{fused.group(1)}.attn.kv.{fused.group(2)}'] = value[dim:]
            continue
        if re.search(r'\.mlp\.fc[12]\.weight$', key) and value.dim() == 4:
            value = value.flatten(1)  # (out, in, 1, 1) -> (out, in)
        out[key] = value
    return out


_HF = (
    (r'^encoder\.layers\.(\d+)\.patch_embedding\.layer_norm\.', r'layers.\1.patch_embed.norm.'),
    (r'^encoder\.layers\.(\d+)\.patch_embedding\.', r'layers.\1.patch_embed.'),
    (r'^encoder\.layers\.(\d+)\.layer_norm\.', r'layers.\1.norm.'),
    (r'^encoder\.layers\.', 'layers.'),
    (r'\.layer_norm_1\.', '.norm1.'),
    (r'\.layer_norm_2\.', '.norm2.'),
    (r'\.attention\.query\.', '.attn.q.'),
    (r'\.attention\.proj\.', '.attn.proj.'),
    (r'\.attention\.spatial_reduction\.', '.attn.sr.'),
    (r'\.attention\.layer_norm\.', '.attn.norm.'),
    (r'\.mlp\.dense1\.', '.mlp.fc1.'),
    (r'\.mlp\.dwconv\.dwconv\.', '.mlp.dwconv.'),
    (r'\.mlp\.dense2\.', '.mlp.fc2.'),
)


def convert_hf_pvtv2(state_dict: StateDict) -> StateDict:
    """transformers ``PvtV2Model`` / ``PvtV2Backbone`` keys -> ours: separate ``key`` / ``value``
    concatenated into ``attn.kv``; ``layer_norm_1/2`` -> ``norm1/2``, ``dense1/2`` -> ``fc1/2``,
    ``spatial_reduction`` -> ``sr``; the classifier is dropped. Others come back unchanged."""
    state_dict = strip_model_prefix(state_dict, 'pvt_v2.')
    if not has_key(state_dict, r'^encoder\.layers\.\d+\.patch_embedding\.proj\.weight$'):
        return dict(state_dict)
    state_dict = merge_qkv(state_dict, ('.attention.key.', '.attention.value.'), '.attn.kv.')
    return rename_keys(state_dict, _HF, drop=lambda k: k.startswith('classifier.'))


register_layout('mmvit_ext PVTv2', 'pvtv2', r'^layers\.\d+\.blocks\.\d+\.attn\.q\.weight$',
                ours=True)
register_layout('official PVTv2 (whai362/PVT)', 'pvtv2', r'^block1\.0\.attn\.q\.weight$',
                convert_official_pvtv2)
register_layout('timm PVTv2 (timm.models.pvt_v2)', 'pvtv2',
                r'^stages\.\d+\.blocks\.\d+\.attn\.q\.weight$', convert_timm_pvtv2)
register_layout('mmdet PVTv2 / mmseg MiT', 'pvtv2',
                r'^layers\.\d+\.1\.\d+\.attn\.attn\.in_proj_weight$', convert_mmdet_pvtv2)
register_layout('Hugging Face transformers PVTv2 (PvtV2Model / PvtV2Backbone)', 'pvtv2',
                r'^(pvt_v2\.)?encoder\.layers\.\d+\.patch_embedding\.proj\.weight$',
                convert_hf_pvtv2)


_OURS = re.compile(r'^layers\.(\d+)\.(patch_embed|blocks|norm)\.(.*)$')


def export_official_pvtv2(state_dict: StateDict) -> StateDict:
    """Inverse of :func:`convert_official_pvtv2` (for peers that read the official layout)."""
    out = {}
    for key, value in state_dict.items():
        match = _OURS.match(key)
        if match:
            stage, part, rest = match.groups()
            part = 'block' if part == 'blocks' else part
            key = f'{part}{int(stage) + 1}.{rest}'
        out[key.replace('.mlp.dwconv.', '.mlp.dwconv.dwconv.')] = value
    return out
