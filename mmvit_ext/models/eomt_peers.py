"""transformers' EoMT (``EomtForUniversalSegmentation``, DINOv2 form; ``EomtDinov3...``, DINOv3
form) holding the weights of our :class:`~mmvit_ext.models.EoMT`, for side-by-side runs
(``benchmark.py --config ... --compare``). The peer is built at our widths with its own
initialisation and its weights loaded into ours through our transformers converter, so both
hold the same numbers; it answers ``forward(x, all_blocks, annealed)`` as our network does."""
from typing import Dict, Optional, Tuple

import torch
from torch import nn


class TransformersEoMT(nn.Module):
    """transformers' EoMT model as our network's call: ``(mask_logits, class_logits)`` of the
    last prediction, stacked (P = 1). transformers keeps no per-block predictions in its
    output, so ``all_blocks`` must be false; ``annealed`` zeroes its mask probabilities."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, all_blocks: Optional[bool] = None,
                annealed: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        if all_blocks or (all_blocks is None and self.training):
            raise ValueError("transformers' EoMT returns the last prediction only (no training "
                             'step with per-block losses)')
        if annealed:
            self.model.attn_mask_probs.zero_()
        out = self.model(pixel_values=x)
        return out.masks_queries_logits[None], out.class_queries_logits[None]


def transformers_eomt(ours: nn.Module) -> nn.Module:
    """transformers' EoMT at the widths of ``ours`` (an :class:`~mmvit_ext.models.EoMT`); its
    weights are loaded into ``ours``. DINOv2 form for a learned position table, DINOv3 form for
    a RoPE trunk (transformers >= 5 has both)."""
    import transformers
    encoder = ours.encoder
    if not hasattr(transformers, 'EomtForUniversalSegmentation'):
        raise ValueError(f'transformers {transformers.__version__} has no EoMT (from 4.54 / 5)')
    rope = encoder.arch_settings.get('rope')
    height, width = (g * encoder.patch_size for g in encoder.grid_size)
    if height != width:
        raise ValueError(f"transformers' EoMT takes a square image_size, ours is {height}x{width}")
    common = dict(hidden_size=encoder.embed_dims, num_hidden_layers=encoder.depth,
                  num_attention_heads=encoder.blocks[0].attn.num_heads,
                  patch_size=encoder.patch_size, image_size=height,
                  num_queries=ours.num_queries, num_labels=ours.num_classes,
                  num_blocks=ours.num_blocks, num_register_tokens=ours.num_prefix_tokens - 1,
                  layer_norm_eps=encoder.norm.eps, num_upscale_blocks=len(ours.upscale))
    if rope:
        config = transformers.EomtDinov3Config(
            intermediate_size=encoder.blocks[0].mlp.fc1.out_features,
            rope_parameters=dict(rope_theta=float(rope.get('base', 100.0)), rope_type='default'),
            pos_embed_rescale=rope.get('rescale_coords'), **common)
        model = transformers.EomtDinov3ForUniversalSegmentation(config)
    else:
        config = transformers.EomtConfig(**common)
        model = transformers.EomtForUniversalSegmentation(config)
    model.attn_mask_probs.copy_(ours.attn_mask_probs)
    ours.load_state_dict(model.state_dict())
    return TransformersEoMT(model)


def eomt_peers(ours: nn.Module, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """The peers of our EoMT network: transformers' EoMT with our (reloaded) weights."""
    return {'transformers': transformers_eomt(ours)}
