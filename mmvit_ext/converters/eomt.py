"""EoMT checkpoints -> our :class:`~mmvit_ext.models.EoMT` keys (``encoder.*`` for the trunk, in
any layout the trunk's own converters read, and the official mask-module names ``q``,
``class_head``, ``mask_head.{0,2,4}``, ``upscale.{i}``). Pure, idempotent, applied by the
network's load pre-hook on every load path:

* official (tue-mps/eomt ``pytorch_model.bin``, the Lightning module's keys): ``network.``
  stripped, ``encoder.backbone.`` -> ``encoder.``; the DINOv2 trunk is timm's (converted by the
  trunk's timm converter); the DINOv3 trunk is transformers' ``DINOv3ViTModel`` renamed by the
  official ``transformers_to_timm`` (``patch_embed`` = ``embeddings``, ``blocks`` = ``layer``),
  put back into transformers' names for the trunk's converter; ``pixel_mean`` / ``pixel_std``,
  ``criterion.empty_weight`` and the RoPE's ``inv_freq`` dropped. The DINOv3 releases hold the
  trunk as deltas to the DINOv3 weights: ``EoMT.load_trunk_deltas``.
* transformers ``EomtForUniversalSegmentation`` (DINOv2 form): ``embeddings.*``, ``layers.{i}``
  with ``attention.{q,k,v,out}_proj``, ``layer_scale{1,2}.lambda1``, ``mlp.fc1/fc2`` or SwiGLU
  ``mlp.weights_in/out``, ``layernorm``, ``query``, ``upscale_block.block.{i}``,
  ``mask_head.fc{1,2,3}``, ``class_predictor``; the position table has no class slot (a zero
  one is put in, as the class token takes no position there). The DINOv3 form
  (``EomtDinov3ForUniversalSegmentation``, ``attention.o_proj``, no k bias): the trunk keys are
  transformers' ``DINOv3ViTModel``'s (``layers`` = ``layer``, ``layernorm`` = ``norm``), left
  for the trunk's converter.
* a bare trunk checkpoint (any layout of the trunk): put under ``encoder.``.
"""
import torch

from .layouts import StateDict, has_key, rename_keys

_HEAD_KEYS = r'^(q\.weight|class_head\.|mask_head\.|upscale\.|attn_mask_probs$)'


def is_official_eomt(state_dict: StateDict) -> bool:
    return has_key(state_dict, r'^(network\.)?encoder\.backbone\.')


def convert_official_eomt(state_dict: StateDict) -> StateDict:
    """tue-mps/eomt -> ours (module docstring). Others unchanged."""
    if not is_official_eomt(state_dict):
        return dict(state_dict)
    out = {k[len('network.'):] if k.startswith('network.') else k: v
           for k, v in state_dict.items()}
    out = rename_keys(out, ((r'^encoder\.backbone\.', 'encoder.'),), drop=lambda k: k in (
        'encoder.pixel_mean', 'encoder.pixel_std') or k.startswith('criterion.'))
    if has_key(out, r'^encoder\.blocks\.\d+\.attention\.q_proj\.'):  # transformers' DINOv3
        out = rename_keys(out, (
            (r'^encoder\.patch_embed\.(cls_token|register_tokens|patch_embeddings\.)',
             r'encoder.embeddings.\1'),
            (r'^encoder\.blocks\.(\d+)\.', r'encoder.layer.\1.'),
        ), drop=lambda k: k.startswith(('encoder.rope_embeddings.',
                                        'encoder.patch_embed.mask_token')))
    return out


def is_hf_eomt(state_dict: StateDict) -> bool:
    return 'class_predictor.weight' in state_dict and has_key(state_dict, r'^layers\.\d+\.')


_HF_HEAD_RULES = (
    (r'^query\.weight$', 'q.weight'),
    (r'^upscale_block\.block\.(\d+)\.layernorm2d\.', r'upscale.\1.norm.'),
    (r'^upscale_block\.block\.(\d+)\.', r'upscale.\1.'),
    (r'^mask_head\.fc1\.', 'mask_head.0.'),
    (r'^mask_head\.fc2\.', 'mask_head.2.'),
    (r'^mask_head\.fc3\.', 'mask_head.4.'),
    (r'^class_predictor\.', 'class_head.'),
)


def convert_hf_eomt(state_dict: StateDict) -> StateDict:
    """transformers ``EomtForUniversalSegmentation`` / ``EomtDinov3ForUniversalSegmentation`` ->
    ours (module docstring). Others unchanged."""
    if not is_hf_eomt(state_dict):
        return dict(state_dict)
    if has_key(state_dict, r'^layers\.\d+\.attention\.o_proj\.'):  # the DINOv3 form
        return rename_keys(dict(state_dict), (
            (r'^embeddings\.', 'encoder.embeddings.'),
            (r'^layers\.(\d+)\.', r'encoder.layer.\1.'),
            (r'^layernorm\.', 'encoder.norm.'),
            *_HF_HEAD_RULES), drop=lambda k: k.startswith('criterion.'))
    out = {}
    for key, tensor in state_dict.items():
        if '.attention.k_proj.' in key or '.attention.v_proj.' in key:
            continue
        if '.attention.q_proj.' in key:
            parts = [state_dict[key.replace('.q_proj.', f'.{p}_proj.')] for p in 'qkv']
            out[key.replace('.attention.q_proj.', '.attn.qkv.')] = torch.cat(parts, dim=0)
            continue
        if key == 'embeddings.position_embeddings.weight':
            out['encoder.pos_embed'] = torch.cat([tensor.new_zeros(1, tensor.shape[1]),
                                                  tensor])[None]
            continue
        out[key] = tensor
    return rename_keys(out, (
        (r'^embeddings\.(cls_token|register_tokens)$', r'encoder.\1'),
        (r'^embeddings\.patch_embeddings\.projection\.', 'encoder.patch_embed.proj.'),
        (r'^layers\.(\d+)\.', r'encoder.blocks.\1.'),
        (r'\.attention\.out_proj\.', '.attn.proj.'),
        (r'\.layer_scale(\d)\.lambda1$', r'.ls\1.gamma'),
        (r'\.mlp\.weights_in\.', '.mlp.fc1.'),
        (r'\.mlp\.weights_out\.', '.mlp.fc2.'),
        (r'^layernorm\.', 'encoder.norm.'),
        *_HF_HEAD_RULES), drop=lambda k: k.startswith('criterion.'))


def convert_eomt(state_dict: StateDict) -> StateDict:
    """Any EoMT layout, or a bare trunk checkpoint, -> our EoMT keys (the trunk's keys left in
    their layout for the trunk's converters). Idempotent."""
    state_dict = convert_hf_eomt(convert_official_eomt(state_dict))
    if any(k.startswith('encoder.') for k in state_dict) or has_key(state_dict, _HEAD_KEYS):
        return state_dict
    return {f'encoder.{k}': v for k, v in state_dict.items()}  # a trunk checkpoint

