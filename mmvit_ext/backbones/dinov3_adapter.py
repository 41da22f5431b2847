"""The DINOv3 adapter (facebookresearch/dinov3,
``dinov3/eval/segmentation/models/backbone/dinov3_adapter.py``, ``DINOv3_Adapter``): the
ViT-Adapter's spatial prior and extractors over a frozen DINOv3 trunk.

What differs from the czczup form (:mod:`.vit_adapter`): no injectors, so the trunk runs
untouched, frozen (``requires_grad=False``, eval mode) and under ``torch.no_grad``, so backward
keeps none of its activations; each interaction is one extractor whose keys are the normed
patch tokens of one trunk block (``get_intermediate_layers(norm=True)`` at the single block
indexes ``interaction_indexes``); the last interaction has two extra extractors; level i adds
the bilinearly resized patch map of interaction i. Four maps at strides 4 / 8 / 16 / 32,
``norm1..4`` (SyncBatchNorm in the official code: ``sync_bn``).

On CUDA the trunk runs under bf16 autocast (``trunk_autocast``), as the official forward does;
its maps then take the dtype of the spatial prior. Inputs are zero-padded to a multiple of 32
and the maps cropped back; at multiples of 32 (the official code takes no others) the outputs
are the official function's.

Keys: ours are the czczup form's (the trunk at the top level, ``spm.level_encoding``); the
official ones (``backbone.*``, ``level_embed``, ``ffn.dwconv.dwconv``, and the
``segmentation_model.0.`` prefix of a segmentor checkpoint) load through
:mod:`mmvit_ext.converters.dinov3_adapter`.
"""
from contextlib import nullcontext
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import tokens_to_map
from ..layers.deform_attn import reference_points
from ..layers.shapes import Size2
from ..registry import MODELS
from .vit import VisionTransformer
from .vit_adapter import DINOV3_FORM, STRIDES, Extractor, SpatialPriorModule, ViTAdapter
from .vocabulary import OURS, ConfigError

TRUNK_AUTOCAST = {'bfloat16': torch.bfloat16, 'float16': torch.float16}


def official_interaction_indexes(depth: int) -> Tuple[int, ...]:
    """The official segmentor's blocks (``FOUR_EVEN_INTERVALS``): the last of every quarter,
    ``[4, 11, 17, 23]`` for 24 blocks (the paper's ViT-L choice)."""
    if depth == 24:
        return (4, 11, 17, 23)
    return tuple(i * (depth // 4) - 1 for i in range(1, 5))


def check_interaction_indexes(indexes: Optional[Sequence], depth: int,
                              add_vit_feature: bool) -> Tuple[int, ...]:
    """Single, increasing block indexes inside the trunk; four with ``add_vit_feature``."""
    if indexes is None:
        if depth < 4:
            raise ConfigError(f'DINOv3Adapter: a trunk of {depth} blocks has no four quarters; '
                              f'pass interaction_indexes')
        return official_interaction_indexes(depth)
    if any(not isinstance(i, int) or isinstance(i, bool) for i in indexes):
        raise ConfigError(f'DINOv3Adapter: interaction_indexes are single block indexes (the '
                          f'official DINOv3_Adapter feeds block i\'s normed output to '
                          f'interaction i), got {list(indexes)}; [first, last] pairs are the '
                          f'czczup ViT-Adapter form, for non-DINOv3 trunks')
    indexes = tuple(indexes)
    if not indexes or any(b <= a for a, b in zip(indexes, indexes[1:])) \
            or indexes[0] < 0 or indexes[-1] >= depth:
        raise ConfigError(f'DINOv3Adapter: interaction_indexes must increase within the '
                          f'trunk\'s blocks 0..{depth - 1}, got {list(indexes)}')
    if add_vit_feature and len(indexes) != 4:
        raise ConfigError(f'DINOv3Adapter: add_vit_feature adds interaction i\'s map to level i, '
                          f'so it needs 4 interaction_indexes, got {len(indexes)}')
    return indexes


class ExtractionBlock(nn.Module):
    """One interaction of the DINOv3 form (official ``InteractionBlockWithCls``): an extractor,
    and two extra ones in the last interaction."""

    def __init__(self, dim: int, num_heads: int, num_points: int, value_ratio: float,
                 with_cffn: bool, cffn_ratio: float, drop: float, drop_path: float,
                 extra_extractors: bool) -> None:
        super().__init__()
        args = (dim, num_heads, num_points, value_ratio, with_cffn, cffn_ratio, drop, drop_path)
        self.extractor = Extractor(*args)
        self.extra_extractors = nn.ModuleList(
            Extractor(*args) for _ in range(2)) if extra_extractors else None


@MODELS.register_module(DINOV3_FORM)
class DINOv3Adapter(ViTAdapter):
    """The official ``DINOv3_Adapter`` form: four maps at strides 4/8/16/32 from a frozen
    DINOv3 trunk. Registered as ``DINOv3Adapter`` (``type='mmvit_ext.DINOv3Adapter'``); also
    built by ``ViTAdapter(arch='dinov3_*')`` (or a custom arch with ``rope``).

    Args (the official names and defaults, those of its ViT-7B segmentor):
        arch: a DINOv3 preset (``'dinov3_vits16'`` ... ``'dinov3_vit7b16'``, aliases) or a
            custom dict with ``rope`` (:class:`VisionTransformer`'s keys).
        interaction_indexes: the trunk blocks whose normed patch tokens feed interactions
            0..n-1, one block each; ``None``: the official segmentor's (the last block of every
            quarter, ``[9, 19, 29, 39]`` for the 7B, ``[4, 11, 17, 23]`` for 24 blocks).
        pretrain_size: the nominal input size (the official argument; a RoPE trunk has no
            position table to resize, so nothing depends on it).
        conv_inplane: SPM stem channels.
        n_points / deform_num_heads / deform_ratio: the extractors' deformable attention
            (samples per head, heads, value channels over ``embed_dims``).
        drop_path_rate: stochastic depth of every extractor's ConvFFN (the trunk has none).
        init_values: the official signature's injector init; this form has no injector, so
            only 0 is accepted.
        with_cffn / cffn_ratio: the extractors' ConvFFN and its hidden ratio.
        add_vit_feature: add interaction i's resized patch map to level i.
        use_extra_extractor: two more extractors in the last interaction.
        with_cp: recompute every extractor in backward (official default on); with
            ``freeze_trunk=False`` the trunk blocks too.
        freeze_trunk: the official frozen trunk, run without gradients; ``False`` trains it
            (stochastic depth none, every block's activations kept).
        trunk_autocast: the trunk's autocast dtype on CUDA (``'bfloat16'``, the official;
            ``'float16'``; ``None``: the ambient precision).
        sync_bn: SyncBatchNorm in the SPM and ``norm1..4`` (the official layers); default
            BatchNorm2d (the same keys, one process).
        frozen_stages: with ``freeze_trunk=False``, the embeddings and the first
            ``frozen_stages`` trunk blocks frozen (the contract's count, as ``ViTAdapter``'s);
            ``None``: the whole trunk with ``freeze_trunk``, else nothing.
        out_indices: which of the four maps to return; the output norms, ``up`` and the SPM's
            stride-4 branch of levels not returned are not built (their checkpoint keys are
            dropped as expected).
    """

    family = 'dinov3_adapter'
    # its own layouts, an official segmentor checkpoint's backbone part, a DINOv3 trunk's
    layout_families = ('dinov3_adapter', 'dinov3_segmentor', 'vit')
    default_arch = 'dinov3_vit7b16'

    def __init__(self, arch: Union[str, dict, None] = None,
                 interaction_indexes: Optional[Sequence[int]] = None, pretrain_size: int = 512,
                 conv_inplane: int = 64, n_points: int = 4, deform_num_heads: int = 16,
                 drop_path_rate: float = 0.3, init_values: float = 0.0, with_cffn: bool = True,
                 cffn_ratio: float = 0.25, deform_ratio: float = 0.5,
                 add_vit_feature: bool = True, use_extra_extractor: bool = True,
                 with_cp: Any = True, freeze_trunk: bool = True,
                 trunk_autocast: Optional[str] = 'bfloat16',
                 out_indices: Union[int, Sequence[int]] = (0, 1, 2, 3), norm_eval: bool = False,
                 drop_rate: float = 0.0, sync_bn: bool = False,
                 frozen_stages: Optional[int] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None, **kwargs: Any) -> None:
        arch = self.default_arch if arch is None else arch
        if not self.resolve_arch(arch).get('rope'):  # unknown names, bad dicts: named there
            raise ConfigError(f'DINOv3Adapter: arch must be a DINOv3 preset or a custom dict '
                              f'with rope, got {arch!r}')
        if init_values:
            raise ConfigError(f'DINOv3Adapter: init_values={init_values} initialises injectors, '
                              f'which the DINOv3 form does not have; leave it 0')
        if trunk_autocast is not None and trunk_autocast not in TRUNK_AUTOCAST:
            raise ConfigError(f'DINOv3Adapter: trunk_autocast must be None or one of '
                              f'{sorted(TRUNK_AUTOCAST)}, got {trunk_autocast!r}')
        for key in ('with_cls_token', 'out_type', 'simple_pyramid', 'patch_size', 'final_norm',
                    'window_size', 'vit_features', 'img_size'):
            if key in kwargs:
                raise ConfigError(f'DINOv3Adapter: {key} is fixed by the DINOv3 form; remove it')
        VisionTransformer.__init__(
            self, arch, out_type='featmap', final_norm=True, out_norm=True,
            simple_pyramid=False, window_size=None, img_size=pretrain_size, out_indices=(-1,),
            drop_rate=drop_rate, drop_path_rate=0.0, peer=OURS, init_cfg=init_cfg, **kwargs)
        dim, depth = self.embed_dims, self.depth
        self.interaction_indexes = check_interaction_indexes(interaction_indexes, depth,
                                                             add_vit_feature)
        self.add_vit_feature, self.vit_features = add_vit_feature, 'per_interaction'
        self.freeze_trunk, self.trunk_autocast = freeze_trunk, trunk_autocast
        self.pretrain_size = pretrain_size
        if freeze_trunk and frozen_stages not in (None, depth):
            raise ConfigError(f'DINOv3Adapter: frozen_stages={frozen_stages!r} with freeze_trunk='
                              f'True, which freezes the whole trunk ({depth} blocks); pass '
                              f'freeze_trunk=False to freeze the first blocks only')
        if frozen_stages is None:
            frozen_stages = depth if freeze_trunk else -1
        self._set_contract(out_indices, [dim] * 4, STRIDES, frozen_stages, depth, norm_eval,
                           with_cp)
        norm = nn.SyncBatchNorm if sync_bn else nn.BatchNorm2d
        with_c1 = 0 in self.out_indices  # levels not returned are not built (DDP)
        self.spm = SpatialPriorModule(conv_inplane, dim, self.in_channels, with_c1, norm)
        last = len(self.interaction_indexes) - 1
        self.interactions = nn.ModuleList(
            ExtractionBlock(dim, deform_num_heads, n_points, deform_ratio, with_cffn,
                            cffn_ratio, drop_rate, drop_path_rate,
                            use_extra_extractor and i == last)
            for i in range(last + 1))
        self.up = nn.ConvTranspose2d(dim, dim, 2, 2) if with_c1 else None
        for level in range(4):
            setattr(self, f'norm{level + 1}', norm(dim) if level in self.out_indices else None)
        self.init_adapter()
        self._freeze_stages()

    # ---- family facts ------------------------------------------------------------------------
    def trunk_modules(self) -> List[nn.Module]:
        """The DINOv3 trunk: embeddings (the RoPE too: a frozen trunk draws no coordinate
        augmentation), blocks and output norms."""
        parts = [self.patch_embed, self.norm_pre, self.rope_embed, *self.blocks, self.norm,
                 self.cls_norm]
        return [m for m in parts if m is not None]

    def frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        if self.freeze_trunk:
            return self.trunk_modules()
        return VisionTransformer.frozen_modules(self)  # the first frozen_stages blocks

    def frozen_parameters(self) -> List[nn.Parameter]:
        if self.frozen_stages < 0:
            return []
        return [p for p in (self.cls_token, self.register_tokens) if p is not None]

    # ---- forward -----------------------------------------------------------------------------
    def trunk_features(self, x: torch.Tensor) -> Tuple[List[torch.Tensor], Size2]:
        """The normed patch tokens (B, h*w, C) of every ``interaction_indexes`` block, and the
        grid; frozen: without gradients."""
        autocast = nullcontext() if self.trunk_autocast is None or not x.is_cuda else \
            torch.autocast('cuda', dtype=TRUNK_AUTOCAST[self.trunk_autocast])
        with autocast, torch.no_grad() if self.freeze_trunk else nullcontext():
            tokens, hw = self.embed_tokens(x)
            feats = []
            for index, block in enumerate(self.blocks[:self.interaction_indexes[-1] + 1]):
                tokens = self.run_block(block, tokens, hw)
                if index in self.interaction_indexes:
                    feats.append(self.output_tokens(index, tokens)[:, -hw[0] * hw[1]:])
        return feats, hw

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        height, width = x.shape[2:]
        x, c1, c, c_sizes = self.spatial_prior(x)
        feats, hw = self.trunk_features(x)
        ref_prior = reference_points(c_sizes, x.device)
        vit_maps = []
        for interaction, feat in zip(self.interactions, feats):
            feat = feat.to(c.dtype)
            for extractor in (interaction.extractor, *(interaction.extra_extractors or ())):
                c = self._call(extractor, c, ref_prior, feat, hw, c_sizes)
            vit_maps.append(tokens_to_map(feat, hw))
        maps = [tokens_to_map(part, size) for part, size in
                zip(c.split([h * w for h, w in c_sizes], dim=1), c_sizes)]
        maps.insert(0, self.up(maps[0]) + c1 if self.up is not None else None)
        outs = []
        for level in self.out_indices:
            out = maps[level]
            if self.add_vit_feature:  # level 2 is at the trunk's stride 16
                vit_map = vit_maps[level]
                if level != 2:  # CPU autocast resizes in float32: back to the map's dtype
                    vit_map = F.interpolate(vit_map, size=out.shape[2:], mode='bilinear',
                                            align_corners=False).to(out.dtype)
                out = out + vit_map
            out = getattr(self, f'norm{level + 1}')(out)
            stride = STRIDES[level]
            outs.append(out[:, :, :(height + stride - 1) // stride, :(width + stride - 1) // stride])
        return tuple(outs)
