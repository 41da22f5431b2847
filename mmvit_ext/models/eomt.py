"""EoMT (Kerssies et al., CVPR 2025, "Your ViT is Secretly an Image Segmentation Model") on our
plain-ViT trunk: learned queries join the tokens before the last ``num_blocks`` blocks, a small
mask module predicts masks and classes from the queries, and masked attention (annealed away
during training) restricts each query to its predicted mask.

Semantics follow the official ``tue-mps/eomt`` (``models/eomt.py``, ``models/scale_block.py``):

- queries are prepended to the tokens (``[queries, class, registers, patches]``); RoPE (DINOv3)
  rotates the patch tokens only, and its training-time coordinate augmentation is drawn once per
  forward for all blocks (the official ``rope_embeddings(x)`` call; our bare trunk draws per
  block, as the official DINOv3);
- before each of the last ``num_blocks`` blocks and after the last block, the final norm's
  output gives a prediction: class logits ``Linear(num_classes + 1)`` of the queries, mask
  logits ``einsum(mlp(queries), upscale(patches))`` (3-layer GELU MLP; ``log2(patch) - 2``
  scale blocks, at least one: ConvTranspose 2x2 / GELU / depthwise 3x3 / LayerNorm2d);
- the block after a prediction lets query ``q`` attend to patch ``p`` only where the mask
  logits, bilinearly resized to the token grid, are positive; each query's mask is dropped
  (all patches visible) with probability ``1 - attn_mask_probs[block]``.

With every probability 0 the network is the plain ViT pass plus the mask module: no mask is
built (:class:`~mmvit_ext.engine.eomt_hooks.EoMTMaskAnnealingHook` anneals the probabilities).
"""
import math
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import nn

from ..backbones.plain_vit import ViTBlock
from ..converters.eomt import convert_eomt
from ..converters.layouts import StateDict
from ..backbones.vit import VisionTransformer
from ..errors import ConfigError
from ..layers import LayerNorm2d, Size2, WindowAttention, apply_rope
from ..registry import MODELS


class ScaleBlock(nn.Module):
    """2x upsampling of an NCHW map: ConvTranspose 2x2 stride 2, GELU, depthwise 3x3 (no bias),
    LayerNorm2d (the official ``ScaleBlock``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(dim, dim, kernel_size=2, stride=2)
        self.act = nn.GELU()
        self.conv2 = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim, bias=False)
        self.norm = LayerNorm2d(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv2(self.act(self.conv1(x))))


def num_scale_blocks(patch_size: int) -> int:
    """Scale blocks of the official mask module: ``max(1, int(log2(patch)) - 2)`` (patch 16: 2,
    mask logits at stride 4; patch 14: 1, at stride 7)."""
    return max(1, int(math.log2(patch_size)) - 2)


def masked_block(block: ViTBlock, tokens: torch.Tensor, hw: Size2,
                 attn_bias: torch.Tensor) -> torch.Tensor:
    """``block(tokens, hw)`` with an additive attention bias (B, 1, N, N): the block's own
    weights, its attention's qkv (RoPE on the patch tokens where it has one) and fused /
    explicit kernel choice."""
    attn = block.attn
    q, k, v = attn.qkv_heads(block.norm1(tokens))
    rope = getattr(attn, 'rope_source', None)
    if rope is not None:
        sin, cos = rope[0](hw)
        q, k = apply_rope(q, sin, cos), apply_rope(k, sin, cos)
    tokens = tokens + block.drop_path(block.ls1(attn.attend(q, k, v, attn_bias)))
    return tokens + block.drop_path(block.ls2(block.mlp(block.norm2(tokens))))


@MODELS.register_module()
class EoMT(BaseModule):
    """The EoMT network: a plain-ViT trunk (``encoder``, our :class:`VisionTransformer`) with
    queries in its last blocks and the official mask module.

    Args:
        arch: a :class:`VisionTransformer` preset with a class token (``dinov2_l`` with
            ``reg_tokens=4``, ``dinov3_vitl16``, ``deit-b``, ``mae_l`` ...) or a custom dict.
        num_classes: classes, without the no-object class (the class head has one more).
        num_queries: learned queries (100 in the published models).
        num_blocks: the last blocks that carry the queries (4 in the published models).
        masked_attn: predictions before each query block and masked attention there (the
            official ``masked_attn_enabled``); off: queries attend freely, one prediction.
        img_size: the trunk's position-embedding size (the training crop: 512 / 640 / 1280).
        decay_query_blocks: layer-wise lr decay reaches the query blocks too (the official
            ``llrd_l2_enabled=True``); off: they train at the full lr (:meth:`get_layer_depth`).
        **encoder_args: further :class:`VisionTransformer` arguments (``reg_tokens``,
            ``drop_path_rate`` ...).

    ``forward(x)`` returns ``(mask_logits, class_logits)``: (P, B, Q, h, w) and
    (P, B, Q, num_classes + 1), one prediction per query block and one after the last block
    (P = num_blocks + 1) in training or with ``all_blocks=True``, else the last only (P = 1).
    """

    def __init__(self, arch: Union[str, dict], num_classes: int, num_queries: int = 100,
                 num_blocks: int = 4, masked_attn: bool = True,
                 img_size: Union[int, Tuple[int, int]] = 512, drop_path_rate: float = 0.0,
                 decay_query_blocks: bool = True,
                 init_cfg: Optional[Union[dict, List[dict]]] = None, **encoder_args: Any) -> None:
        super().__init__(init_cfg=init_cfg)
        for key in ('out_type', 'out_indices', 'window_size', 'with_cls_token', 'final_norm'):
            if key in encoder_args:
                raise ConfigError(f'EoMT: {key} is set by EoMT (global attention, the class '
                                  f'token in the trunk, the final norm); leave it out')
        self.encoder = VisionTransformer(
            arch, img_size=img_size, out_type='raw', window_size=None, with_cls_token=True,
            final_norm=True, simple_pyramid=False, drop_path_rate=drop_path_rate,
            peer='mmvit_ext', **encoder_args)
        self._check_encoder(num_classes, num_queries, num_blocks)
        dim = self.encoder.embed_dims
        self.num_classes, self.num_queries, self.num_blocks = num_classes, num_queries, num_blocks
        self.masked_attn, self.decay_query_blocks = masked_attn, decay_query_blocks
        self.num_prefix_tokens = 1 + (0 if self.encoder.register_tokens is None
                                      else self.encoder.register_tokens.shape[1])
        self.register_buffer('attn_mask_probs', torch.ones(num_blocks))
        self.q = nn.Embedding(num_queries, dim)
        self.class_head = nn.Linear(dim, num_classes + 1)
        self.mask_head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim),
                                       nn.GELU(), nn.Linear(dim, dim))
        self.upscale = nn.Sequential(*[ScaleBlock(dim)
                                       for _ in range(num_scale_blocks(self.encoder.patch_size))])
        self._register_load_state_dict_pre_hook(self._convert_on_load)

    def benchmark_peers(self, img_size: Tuple[int, int]) -> Dict[str, nn.Module]:
        """transformers' EoMT holding this network's weights (reloaded into it)
        (:mod:`~mmvit_ext.models.eomt_peers`)."""
        from .eomt_peers import eomt_peers
        return eomt_peers(self, img_size)

    def peer_agreement_size(self, peer: str, size: Tuple[int, int]) -> Tuple[int, int]:
        """The peer computes our function at any size it is built for."""
        return size

    def _convert_on_load(self, state_dict: StateDict, prefix: str, *args: Any) -> None:
        """Load pre-hook: the keys under ``prefix`` from any EoMT layout (or a bare trunk
        checkpoint) to ours (:func:`~mmvit_ext.converters.eomt.convert_eomt`); the trunk's own
        hook then converts ``encoder.*``."""
        keys = [k for k in state_dict if k.startswith(prefix)]
        given = {k[len(prefix):]: state_dict.pop(k) for k in keys}
        state_dict.update((prefix + k, v) for k, v in convert_eomt(given).items())

    @torch.no_grad()
    def load_trunk_deltas(self, delta_state: StateDict) -> None:
        """Load an EoMT checkpoint whose trunk parameters are deltas to the pretrained trunk
        this model holds now (the official DINOv3 releases, ``delta_weights=True``): the mask
        module is loaded as it is, the trunk becomes pretrained + delta."""
        pretrained = {k: v.clone() for k, v in self.encoder.named_parameters()}
        self.load_state_dict(delta_state)
        for name, param in self.encoder.named_parameters():
            param.add_(pretrained[name])

    def _check_encoder(self, num_classes: int, num_queries: int, num_blocks: int) -> None:
        encoder = self.encoder
        for name, value in (('num_classes', num_classes), ('num_queries', num_queries),
                            ('num_blocks', num_blocks)):
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f'EoMT: {name} must be a positive int, got {value!r}')
        if num_blocks > encoder.depth:
            raise ConfigError(f'EoMT: num_blocks ({num_blocks}) exceeds the trunk depth '
                              f'({encoder.depth})')
        if encoder.use_rel_pos or encoder.cls_norm is not None or \
                not isinstance(encoder.norm_pre, nn.Identity):
            raise ConfigError('EoMT: the trunk must be a plain ViT with one final norm (no '
                              'use_rel_pos, untie_norms or pre_norm)')
        for block in encoder.blocks:
            attn = getattr(block, 'attn', None)
            if not isinstance(block, ViTBlock) or not isinstance(attn, WindowAttention) or \
                    attn.window_size is not None or block.scale_adjustment != 1:
                raise ConfigError('EoMT: every trunk block must be a plain ViTBlock with global '
                                  'attention')

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """``(layer_id, num_layers)`` for layer-wise lr decay, the official grouping: block ``i``
        at ``i + 1`` of ``depth + 1`` (factor ``decay ** (depth - 1 - i)``), the embeddings with
        block 0, the final norm, queries and mask module at the top (the query blocks too
        without ``decay_query_blocks``)."""
        num_layers = self.encoder.depth + 1
        name = param_name[len(prefix):] if param_name.startswith(prefix) else ''
        if not name.startswith('encoder.'):
            return num_layers - 1, num_layers
        layer_id, _ = self.encoder.get_layer_depth(name, 'encoder.')
        if not self.decay_query_blocks and layer_id > self.encoder.depth - self.num_blocks:
            return num_layers - 1, num_layers
        return min(max(layer_id, 1), num_layers - 1), num_layers

    # ---- the mask module -----------------------------------------------------------------
    def predict(self, tokens: torch.Tensor, hw: Size2) -> Tuple[torch.Tensor, torch.Tensor]:
        """Normed tokens ``[queries, prefix, patches]`` -> mask logits (B, Q, h', w') at the
        upscaled grid and class logits (B, Q, num_classes + 1)."""
        queries = tokens[:, :self.num_queries]
        patches = tokens[:, self.num_queries + self.num_prefix_tokens:]
        grid = patches.transpose(1, 2).reshape(patches.shape[0], -1, hw[0], hw[1])
        mask_logits = torch.einsum('bqc,bchw->bqhw', self.mask_head(queries),
                                   self.upscale(grid))
        return mask_logits, self.class_head(queries)

    def attn_bias(self, mask_logits: torch.Tensor, hw: Size2, num_tokens: int,
                  prob: float) -> torch.Tensor:
        """(B, 1, N, N) additive bias: -inf where a query may not see a patch (its resized mask
        logit is not positive), the query's row cleared with probability ``1 - prob``."""
        b, q = mask_logits.shape[:2]
        logits = F.interpolate(mask_logits, hw, mode='bilinear', align_corners=False)
        blocked = logits.flatten(2) <= 0  # (B, Q, h*w)
        if prob < 1:  # the official draw: a query keeps its mask where rand <= prob
            blocked = blocked & (torch.rand(b, q, device=blocked.device) <= prob)[..., None]
        bias = mask_logits.new_zeros(b, 1, num_tokens, num_tokens)
        start = q + self.num_prefix_tokens
        bias[:, 0, :q, start:] = bias.new_zeros(blocked.shape).masked_fill(blocked, float('-inf'))
        return bias

    def forward(self, x: torch.Tensor, all_blocks: Optional[bool] = None,
                annealed: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        """Images (B, 3, H, W), normalised -> stacked mask and class logits (class docstring).
        ``annealed``: the pass of a trained model, no masks whatever ``attn_mask_probs`` holds
        (0 after annealing); for export and compilation, which cannot branch on the buffer."""
        all_blocks = self.training if all_blocks is None else all_blocks
        rope = getattr(self.encoder, 'rope_embed', None)
        if rope is None or not rope.augments:
            return self._forward(x, all_blocks, annealed)
        if self.encoder._cp_plan.active:
            raise ConfigError('EoMT: with_cp cannot recompute blocks that share one RoPE '
                              'augmentation draw; train without with_cp or without rope '
                              'augmentation')
        with rope.one_draw():  # the official EoMT: one RoPE draw per forward, for every block
            return self._forward(x, all_blocks, annealed)

    def _forward(self, x: torch.Tensor, all_blocks: bool,
                 annealed: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        encoder = self.encoder
        tokens, hw = encoder.embed_tokens(x)
        first = encoder.depth - self.num_blocks
        probs = self.attn_mask_probs.tolist() if self.masked_attn and not annealed \
            else [0.0] * self.num_blocks
        masks, classes = [], []
        for i, block in enumerate(encoder.blocks):
            if i == first:
                queries = self.q.weight[None].expand(tokens.shape[0], -1, -1)
                tokens = torch.cat([queries, tokens], dim=1)
            prob = probs[i - first] if i >= first and self.masked_attn else 0.0
            if i >= first and self.masked_attn and (all_blocks or prob > 0):
                mask_logits, class_logits = self.predict(encoder.norm(tokens), hw)
                if all_blocks:
                    masks.append(mask_logits)
                    classes.append(class_logits)
                if prob > 0:
                    bias = self.attn_bias(mask_logits, hw, tokens.shape[1], prob)
                    tokens = masked_block(block, tokens, hw, bias)
                    continue
                if self.training:  # keep a seeded run's random stream the official one
                    torch.rand(tokens.shape[0], self.num_queries, device=tokens.device)
            tokens = encoder.run_block(block, tokens, hw)
        mask_logits, class_logits = self.predict(encoder.norm(tokens), hw)
        masks.append(mask_logits)
        classes.append(class_logits)
        return torch.stack(masks), torch.stack(classes)


def semantic_scores(mask_logits: torch.Tensor, class_logits: torch.Tensor) -> torch.Tensor:
    """The official per-pixel class scores: ``sum_q sigmoid(mask_q) softmax(class_q)[:K]``."""
    return torch.einsum('bqhw,bqc->bchw', mask_logits.sigmoid(),
                        class_logits.softmax(dim=-1)[..., :-1])


class EoMTSemanticOutputs(nn.Module):
    """A trained EoMT as a semantic export root (``mmvit_ext.deploy.export_onnx``): image
    (B, 3, H, W) -> per-pixel scores (B, num_classes, H, W) of the last prediction, the mask
    logits bilinearly resized to the input (the official semantic inference on one crop)."""

    def __init__(self, net: EoMT) -> None:
        super().__init__()
        if net.masked_attn and bool(net.attn_mask_probs.any()):
            raise ConfigError('EoMTSemanticOutputs: attn_mask_probs must be 0 (a trained, '
                              'annealed network); masked attention is a training-time path')
        self.net = net

    def output_names(self, example: torch.Tensor) -> List[str]:
        return ['seg_logits']

    def forward(self, inputs: torch.Tensor) -> Tuple[torch.Tensor]:
        mask_logits, class_logits = self.net(inputs, all_blocks=False, annealed=True)
        mask_logits = F.interpolate(mask_logits[-1], size=inputs.shape[-2:], mode='bilinear',
                                    align_corners=False)
        return (semantic_scores(mask_logits, class_logits[-1]),)
