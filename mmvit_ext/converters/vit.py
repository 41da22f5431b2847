"""Plain-ViT checkpoints of every common layout -> our VisionTransformer layout.

Ours is timm's ``VisionTransformer`` without a head (``patch_embed.proj``, ``cls_token``,
``pos_embed`` with the class-token slot, ``blocks.{i}.{norm1,attn.qkv,attn.proj,ls1.gamma,norm2,
mlp.fc1,mlp.fc2,ls2.gamma}``, ``norm``, ``fc_norm``, CLIP's ``norm_pre``) with DINOv2's
``register_tokens``. So the
official MAE encoder files (``mae_pretrain_vit_*.pth``) and headless timm files are ours as they
are. Layouts: timm (DeiT, AugReg, MAE fine-tuned, DINOv2 incl. registers), official DINOv2
(facebookresearch/dinov2), official MAE with the decoder, Hugging Face ``ViTModel`` / ``Dinov2Model``
(and their backbone / classifier wrappers), mmpretrain and mmseg ``VisionTransformer``.
Classifier heads, poolers, mask tokens and decoders are dropped.
"""
from typing import Iterable

import torch

from .layouts import (LAYOUTS, StateDict, has_key, merge_qkv, register_init_only,
                      register_layout, rename_keys)

_HEADS = ('head.', 'head_dist.', 'pooler.', 'classifier.', 'mask_token', 'decoder_')
_QKV = r'^blocks\.\d+\.attn\.qkv\.weight$'


def _drop(key: str) -> bool:
    return key.startswith(_HEADS)


def _strip(state_dict: StateDict, prefixes: Iterable[str]) -> StateDict:
    """HF classifier wrappers nest the model under ``vit.`` / ``dinov2.``; their head is
    dropped."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in state_dict):
            return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    return state_dict


# ---- timm ------------------------------------------------------------------------------------
def _other_family(state_dict: StateDict) -> bool:
    """A layout of another family matches (CaiT / DeepViT / Refined-ViT files share
    ``blocks.{i}.attn.qkv`` and timm's ``head``)."""
    return any(lay.matches(state_dict) for lay in LAYOUTS if lay.family != 'vit')


def is_timm_vit(state_dict: StateDict) -> bool:
    """timm keeps our names and adds a head, or (DINOv2 with registers) ``reg_token`` with the
    class token's position folded into it."""
    return has_key(state_dict, _QKV) and (has_key(state_dict, r'^head(_dist)?\.')
                                          or 'reg_token' in state_dict) \
        and 'pos_embed' in state_dict and not _other_family(state_dict)  # DINOv3: no pos_embed


def convert_timm_vit(state_dict: StateDict) -> StateDict:
    """timm ``VisionTransformer`` -> ours: the head dropped; ``reg_token`` -> ``register_tokens``
    with a zero class-token slot put back into ``pos_embed`` (timm's DINOv2-with-registers files
    fold the slot into ``cls_token``, which then carries it). A distilled DeiT's ``dist_token``
    has no counterpart and is refused at loading (the position embedding has two prefix
    slots). Others come back unchanged."""
    if not is_timm_vit(state_dict):
        return dict(state_dict)
    out = {k: v for k, v in state_dict.items() if not _drop(k)}
    if 'reg_token' in out:
        out['register_tokens'] = out.pop('reg_token')
        pos = out['pos_embed']
        out['pos_embed'] = torch.cat([pos.new_zeros(1, 1, pos.shape[-1]), pos], dim=1)
    return out


# ---- official DINOv2 / MAE -------------------------------------------------------------------
def is_official_dinov2(state_dict: StateDict) -> bool:
    """The DINOv2 hub files: a ``mask_token`` beside LayerScale, SwiGLU ``w12`` / ``w3``, or
    training checkpoints' chunked blocks ``blocks.{chunk}.{i}``."""
    if 'storage_tokens' in state_dict or 'rope_embed.periods' in state_dict:
        return False  # DINOv3 (converters/dinov3.py)
    return (('mask_token' in state_dict and has_key(state_dict, r'\.ls1\.gamma$'))
            or has_key(state_dict, r'^blocks\.\d+\.mlp\.w12\.')
            or has_key(state_dict, r'^blocks\.\d+\.\d+\.attn\.qkv\.'))


def convert_official_dinov2(state_dict: StateDict) -> StateDict:
    """facebookresearch/dinov2 -> ours: ``mask_token`` dropped, ``mlp.w12 / w3`` -> ``mlp.fc1 /
    fc2`` (same halves order), chunked ``blocks.{c}.{i}`` -> ``blocks.{i}``. Others unchanged."""
    if not is_official_dinov2(state_dict):
        return dict(state_dict)
    return rename_keys(state_dict, ((r'^blocks\.\d+\.(\d+)\.', r'blocks.\1.'),
                                    (r'\.mlp\.w12\.', '.mlp.fc1.'), (r'\.mlp\.w3\.', '.mlp.fc2.')),
                       drop=_drop)


def convert_official_mae(state_dict: StateDict) -> StateDict:
    """facebookresearch/mae files with the decoder (``mae_visualize_*``): the encoder is ours;
    ``mask_token`` and ``decoder_*`` are dropped. Others unchanged."""
    if not has_key(state_dict, r'^decoder_'):
        return dict(state_dict)
    return {k: v for k, v in state_dict.items() if not _drop(k)}


# ---- Hugging Face ----------------------------------------------------------------------------
_HF_COMMON = (
    (r'^embeddings\.patch_embeddings\.projection\.', 'patch_embed.proj.'),
    (r'^embeddings\.cls_token$', 'cls_token'),
    (r'^embeddings\.register_tokens$', 'register_tokens'),
    (r'^embeddings\.position_embeddings$', 'pos_embed'),
    (r'^encoder\.layer\.', 'blocks.'),
    (r'\.attention\.output\.dense\.', '.attn.proj.'),
    (r'^layernorm\.', 'norm.'),
)
_HF_VIT = _HF_COMMON + (
    (r'\.layernorm_before\.', '.norm1.'),
    (r'\.layernorm_after\.', '.norm2.'),
    (r'\.intermediate\.dense\.', '.mlp.fc1.'),
    (r'\.output\.dense\.', '.mlp.fc2.'),
)
_HF_DINOV2 = _HF_COMMON + (
    (r'\.layer_scale1\.lambda1$', '.ls1.gamma'),
    (r'\.layer_scale2\.lambda1$', '.ls2.gamma'),
    (r'\.mlp\.weights_in\.', '.mlp.fc1.'),
    (r'\.mlp\.weights_out\.', '.mlp.fc2.'),
)
_HF_SIGNATURE = r'^(vit\.|dinov2\.)?encoder\.layer\.\d+\.attention\.attention\.query\.weight$'


def _hf(state_dict: StateDict, rules) -> StateDict:
    state_dict = merge_qkv(state_dict, ('.attention.attention.query.', '.attention.attention.key.',
                                     '.attention.attention.value.'), '.attn.qkv.')
    return rename_keys(state_dict, rules, drop=lambda k: _drop(k) or k.startswith(
        'embeddings.mask_token'))


def convert_hf_vit(state_dict: StateDict) -> StateDict:
    """transformers ``ViTModel`` / ``ViTForImageClassification`` -> ours: query / key / value
    concatenated into ``attn.qkv``, ``layernorm_before / after`` -> ``norm1 / 2``,
    ``intermediate / output.dense`` -> ``mlp.fc1 / fc2``; pooler and classifier dropped."""
    state_dict = _strip(state_dict, ('vit.',))
    if not has_key(state_dict, r'^encoder\.layer\.\d+\.layernorm_before\.'):
        return dict(state_dict)
    return _hf(state_dict, _HF_VIT)


def convert_hf_dinov2(state_dict: StateDict) -> StateDict:
    """transformers ``Dinov2Model`` / ``Dinov2Backbone`` / ``Dinov2ForImageClassification`` ->
    ours: as :func:`convert_hf_vit`, ``layer_scale{1,2}.lambda1`` -> ``ls{1,2}.gamma``, SwiGLU
    ``weights_in / out`` -> ``fc1 / fc2``; mask token and classifier dropped."""
    state_dict = _strip(state_dict, ('dinov2.',))
    if not has_key(state_dict, r'^encoder\.layer\.\d+\.norm1\.'):
        return dict(state_dict)
    return _hf(state_dict, _HF_DINOV2)


# ---- OpenMMLab -------------------------------------------------------------------------------
_OPENMMLAB = (
    (r'^patch_embed\.projection\.', 'patch_embed.proj.'),
    (r'^layers\.(\d+)\.ln1\.', r'blocks.\1.norm1.'),
    (r'^layers\.(\d+)\.ln2\.', r'blocks.\1.norm2.'),
    (r'^layers\.', 'blocks.'),
    (r'\.attn\.attn\.in_proj_', '.attn.qkv.'),          # mmseg: nn.MultiheadAttention
    (r'\.attn\.attn\.out_proj\.', '.attn.proj.'),
    (r'\.attn\.gamma1\.weight$', '.ls1.gamma'),         # mmpretrain LayerScale
    (r'\.ffn\.gamma2\.weight$', '.ls2.gamma'),
    (r'\.ffn\.layers\.0\.0\.', '.mlp.fc1.'),
    (r'\.ffn\.layers\.1\.', '.mlp.fc2.'),
    (r'\.ffn\.w12\.', '.mlp.fc1.'),                     # mmpretrain SwiGLUFFNFused
    (r'\.ffn\.w3\.', '.mlp.fc2.'),
    (r'^ln1\.', 'norm.'),                               # final norm
    (r'^ln2\.', 'fc_norm.'),                            # mmpretrain avg_featmap norm
    (r'^(pre_norm|ln_pre)\.', 'norm_pre.'),             # mmpretrain / mmseg pre_norm (CLIP)
)


def convert_openmmlab_vit(state_dict: StateDict) -> StateDict:
    """mmpretrain / mmseg ``VisionTransformer`` -> ours: ``layers.{i}.ln1 / ln2`` -> ``norm1 /
    norm2``, mmseg's ``attn.attn.in_proj / out_proj`` -> ``attn.qkv / proj`` (same q, k, v
    order), ``ffn.layers.0.0 / 1`` (or SwiGLU ``w12 / w3``) -> ``mlp.fc1 / fc2``, LayerScale
    ``gamma1 / 2.weight`` -> ``ls1 / 2.gamma``, final ``ln1`` -> ``norm``, ``ln2`` ->
    ``fc_norm``, ``pre_norm`` (mmpretrain) / ``ln_pre`` (mmseg) -> ``norm_pre``. An mmpretrain
    model without a class token has no class-token slot in ``pos_embed``: a zero slot is put
    back (ours always has it)."""
    if not has_key(state_dict, r'^layers\.\d+\.(attn\.qkv|attn\.attn\.in_proj_)'):
        return dict(state_dict)
    out = rename_keys(state_dict, _OPENMMLAB, drop=_drop)
    pos = out.get('pos_embed')
    if pos is not None and 'cls_token' not in out:
        out['pos_embed'] = torch.cat([pos.new_zeros(1, 1, pos.shape[-1]), pos], dim=1)
    return out


def is_ours(state_dict: StateDict) -> bool:
    """Our keys, and no other family's or layout's marks (CaiT / DeepViT / Refined-ViT share
    ``blocks.{i}.attn.qkv``)."""
    others = [lay for lay in LAYOUTS if lay.family == 'vit' and not lay.ours]
    return (not _other_family(state_dict) and not any(lay.matches(state_dict) for lay in others)
            and not has_key(state_dict, r'^(head|reg_token|mask_token|decoder_)'))


register_layout('mmvit_ext ViT (= official MAE encoder / headless timm keys)', 'vit', _QKV,
                ours=True, detect=is_ours)
register_layout('timm ViT (timm.models.vision_transformer: DeiT, AugReg, MAE, DINOv2)', 'vit',
                _QKV, convert_timm_vit, detect=is_timm_vit)
register_layout('official DINOv2 (facebookresearch/dinov2)', 'vit',
                r'^(mask_token$|blocks\.\d+\.(\d+\.attn\.qkv|mlp\.w12)\.)', convert_official_dinov2,
                detect=is_official_dinov2)
register_layout('official MAE with decoder (facebookresearch/mae)', 'vit', r'^decoder_blocks\.',
                convert_official_mae)
register_layout('Hugging Face transformers ViT (ViTModel / ViTForImageClassification)', 'vit',
                _HF_SIGNATURE, convert_hf_vit,
                detect=lambda sd: has_key(sd, r'^(vit\.)?encoder\.layer\.\d+\.layernorm_before\.'))
register_layout('Hugging Face transformers DINOv2 (Dinov2Model / Dinov2Backbone)', 'vit',
                _HF_SIGNATURE, convert_hf_dinov2,
                detect=lambda sd: has_key(sd, r'^(dinov2\.)?encoder\.layer\.\d+\.norm1\.'))
register_layout('OpenMMLab ViT (mmpretrain / mmseg VisionTransformer)', 'vit',
                r'^layers\.\d+\.(attn\.qkv|attn\.attn\.in_proj_)', convert_openmmlab_vit)
# the dense pyramid and the mean-pooling norm are in no classifier / dense file respectively
# (and DINOv3's RoPE periods / k-bias mask, which timm's and transformers' files do not hold:
# the official base-100 periods and the k-masked bias, as the official model initialises them)
register_init_only('vit', r'^(pyramid|fc_norm)\.|^rope_embed\.periods$|\.attn\.qkv\.bias_mask$')
