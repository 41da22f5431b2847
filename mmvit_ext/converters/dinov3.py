"""DINOv3 ViT checkpoints -> our VisionTransformer layout (a RoPE trunk, see
``backbones/dinov3.py``), for the three layouts in use:

* official (facebookresearch/dinov3 hub ``.pth``): our keys but ``storage_tokens`` (ours:
  ``register_tokens``) and SwiGLU ``mlp.w1 / w2 / w3`` (ours: ``fc1`` = [w1; w2], ``fc2``);
  ``mask_token`` and the pretraining-only ``local_cls_norm`` are dropped; ``rope_embed.periods``
  and ``attn.qkv.bias_mask`` are kept and loaded.
* timm ``vit_*_dinov3`` (``timm.models.eva``): ``reg_token``, ``gamma_1 / 2``, the qkv bias as
  ``attn.q_bias`` / ``v_bias`` (k bias zero), SwiGLU ``fc1_g / fc1_x``; no periods (timm's
  defaults are the official base-100 periods).
* Hugging Face ``DINOv3ViTModel``: ``embeddings.*``, ``layer.{i}.attention.{q,k,v,o}_proj``
  (``model.layer.{i}`` in transformers 5),
  ``layer_scale{1,2}.lambda1``, ``mlp.{gate,up,down}_proj``; a ``k_proj`` bias, where present,
  is computed (an all-ones ``bias_mask``).
"""
import torch

from .layouts import StateDict, has_key, register_layout, rename_keys

_QKV = r'^blocks\.\d+\.attn\.qkv\.weight$'


def _cat_swiglu(state_dict: StateDict, gate: str, value: str) -> StateDict:
    """``mlp.{gate}`` and ``mlp.{value}`` -> ``mlp.fc1`` (gate rows first, as our SwiGLU)."""
    out = {}
    for key, tensor in state_dict.items():
        if f'.mlp.{gate}.' in key:
            other = state_dict[key.replace(f'.mlp.{gate}.', f'.mlp.{value}.')]
            out[key.replace(f'.mlp.{gate}.', '.mlp.fc1.')] = torch.cat([tensor, other], dim=0)
        elif f'.mlp.{value}.' not in key:
            out[key] = tensor
    return out


# ---- official --------------------------------------------------------------------------------
def is_official_dinov3(state_dict: StateDict) -> bool:
    """The hub files: ``storage_tokens``, or a ``mask_token`` beside ``rope_embed.periods``, or
    SwiGLU ``mlp.w1``."""
    return has_key(state_dict, _QKV) and (
        'storage_tokens' in state_dict or has_key(state_dict, r'^local_cls_norm\.')
        or ('mask_token' in state_dict and 'rope_embed.periods' in state_dict)
        or has_key(state_dict, r'^blocks\.\d+\.mlp\.w1\.'))


def convert_official_dinov3(state_dict: StateDict) -> StateDict:
    """facebookresearch/dinov3 -> ours (see the module). Others unchanged."""
    if not is_official_dinov3(state_dict):
        return dict(state_dict)
    out = rename_keys(state_dict, ((r'^storage_tokens$', 'register_tokens'),
                                   (r'\.mlp\.w3\.', '.mlp.fc2.')),
                      drop=lambda k: k == 'mask_token' or k.startswith('local_cls_norm.'))
    return _cat_swiglu(out, 'w1', 'w2')


# ---- timm ------------------------------------------------------------------------------------
def is_timm_dinov3(state_dict: StateDict) -> bool:
    """timm's EVA-based DINOv3: no ``pos_embed``, and EVA's ``gamma_1`` / ``q_bias`` /
    ``reg_token`` / ``fc1_g`` names."""
    return has_key(state_dict, _QKV) and 'pos_embed' not in state_dict and has_key(
        state_dict, r'^(reg_token$|blocks\.\d+\.(gamma_1$|attn\.q_bias$|mlp\.fc1_g\.))')


def convert_timm_dinov3(state_dict: StateDict) -> StateDict:
    """timm ``vit_*_dinov3`` -> ours: ``q_bias`` / ``v_bias`` -> ``qkv.bias`` with a zero k
    part; the head dropped. Others unchanged."""
    if not is_timm_dinov3(state_dict):
        return dict(state_dict)
    out = {}
    for key, tensor in state_dict.items():
        if key.startswith(('head.', 'fc_norm.')) or key.endswith(('.attn.k_bias', '.attn.v_bias')):
            continue
        if key.endswith('.attn.q_bias'):
            value = state_dict[key[:-len('q_bias')] + 'v_bias']
            out[key[:-len('q_bias')] + 'qkv.bias'] = torch.cat(
                [tensor, torch.zeros_like(tensor), value])
            continue
        out[key] = tensor
    out = rename_keys(out, ((r'^reg_token$', 'register_tokens'), (r'\.gamma_1$', '.ls1.gamma'),
                            (r'\.gamma_2$', '.ls2.gamma')))
    return _cat_swiglu(out, 'fc1_g', 'fc1_x')


# ---- Hugging Face ----------------------------------------------------------------------------
_HF_PREFIX = 'dinov3_vit.'
_HF_DETECT = r'^(dinov3_vit\.)?(model\.)?layer\.\d+\.attention\.q_proj\.weight$'
_HF = (
    (r'^embeddings\.cls_token$', 'cls_token'),
    (r'^embeddings\.register_tokens$', 'register_tokens'),
    (r'^embeddings\.patch_embeddings\.', 'patch_embed.proj.'),
    (r'^(?:model\.)?layer\.(\d+)\.', r'blocks.\1.'),  # transformers 5: model.layer.{i}
    (r'\.attention\.o_proj\.', '.attn.proj.'),
    (r'\.layer_scale(\d)\.lambda1$', r'.ls\1.gamma'),
    (r'\.mlp\.down_proj\.', '.mlp.fc2.'),
)


def is_hf_dinov3(state_dict: StateDict) -> bool:
    return has_key(state_dict, _HF_DETECT)


def _hf_qkv(state_dict: StateDict) -> StateDict:
    """``attention.{q,k,v}_proj`` -> ``attn.qkv``; a missing k bias is zero; a present one is
    computed (``bias_mask`` all ones)."""
    out = {}
    for key, tensor in state_dict.items():
        if '.attention.q_proj.' not in key:
            if not ('.attention.k_proj.' in key or '.attention.v_proj.' in key):
                out[key] = tensor
            continue
        parts = [state_dict.get(key.replace('.q_proj.', f'.{p}_proj.')) for p in 'qkv']
        merged = key.replace('.attention.q_proj.', '.attn.qkv.')
        if key.endswith('.bias') and parts[1] is None:
            parts[1] = torch.zeros_like(tensor)
        elif key.endswith('.bias'):
            out[merged + '_mask'] = torch.ones(3 * tensor.shape[0])
        out[merged] = torch.cat(parts, dim=0)
    return out


def convert_hf_dinov3(state_dict: StateDict) -> StateDict:
    """transformers ``DINOv3ViTModel`` -> ours (see the module); ``mask_token`` and the RoPE's
    non-persistent buffers dropped. Others unchanged."""
    if not is_hf_dinov3(state_dict):
        return dict(state_dict)
    if any(k.startswith(_HF_PREFIX) for k in state_dict):
        state_dict = {k[len(_HF_PREFIX):]: v for k, v in state_dict.items()
                      if k.startswith(_HF_PREFIX)}
    out = rename_keys(_hf_qkv(state_dict), _HF, drop=lambda k: k.startswith(
        ('embeddings.mask_token', 'rope_embeddings.')))
    gated = has_key(out, r'\.mlp\.gate_proj\.')
    out = rename_keys(out, ((r'\.mlp\.up_proj\.', '.mlp.fc1.' if not gated else '.mlp.up_proj.'),))
    return _cat_swiglu(out, 'gate_proj', 'up_proj') if gated else out


register_layout('official DINOv3 (facebookresearch/dinov3)', 'vit', _QKV,
                convert_official_dinov3, detect=is_official_dinov3)
register_layout('timm DINOv3 (timm.models.eva vit_*_dinov3)', 'vit', _QKV, convert_timm_dinov3,
                detect=is_timm_dinov3)
register_layout('Hugging Face transformers DINOv3 (DINOv3ViTModel)', 'vit',
                _HF_DETECT, convert_hf_dinov3,
                detect=is_hf_dinov3)
