"""ViT-Adapter (Chen et al., "Vision Transformer Adapter for Dense Predictions", ICLR 2023) over
our plain :class:`~mmvit_ext.backbones.vit.VisionTransformer` trunk.

A convolutional spatial prior module (SPM) gives maps c1..c4 at strides 4/8/16/32. Before each
group of trunk blocks an injector lets the ViT tokens attend (multi-scale deformable attention)
to the prior tokens c2..c4; after it an extractor lets the prior tokens attend to the ViT
tokens, followed by a ConvFFN. The outputs are the prior maps plus the resampled ViT map, at
strides 4/8/16/32, for any input size (the image is zero-padded to a multiple of 32 and the maps
cropped back). Everything is plain PyTorch: the deformable attention is
:func:`~mmvit_ext.layers.deform_attn.multi_scale_deformable_attention` (``grid_sample``).

A DINOv3 trunk (``arch='dinov3_*'``) builds the official DINOv3 form instead
(:class:`~mmvit_ext.backbones.dinov3_adapter.DINOv3Adapter`: frozen trunk, extractors only).

The official repository has two forms of the backbone, chosen here by ``vit_features``: its
detection backbone (``detection/mmdet_custom/models/backbones/vit_adapter.py``) adds the last
block's ViT map to every level (``'final'``); its segmentation backbone
(``segmentation/mmseg_custom/models/backbones/vit_adapter.py``) adds the ViT map after
interaction i to level i (``'per_interaction'``). Windows follow its ``base/vit.py``
(``window_padding='qkv'``, :class:`~mmvit_ext.layers.WindowAttention`).

Key names follow the official repository (czczup/ViT-Adapter: ``spm.*``, ``level_embed`` (ours
``spm.level_encoding``),
``interactions.{i}.injector / extractor / extra_extractors``, ``up``, ``norm1..4``); its
checkpoints load through :mod:`mmvit_ext.converters.vit_adapter`, the trunk's through every
layout :class:`VisionTransformer` loads (DeiT, MAE, DINOv2 ...).
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..converters.layouts import StateDict
from ..layers import ConvMlp, DropPath, Size2, map_to_tokens, pad_to_multiple, tokens_to_map
from ..layers.deform_attn import MSDeformAttn, reference_points
from ..registry import MODELS
from .checkpointing import checkpoint_block
from .vit import VisionTransformer
from .vocabulary import OURS, ConfigError

STRIDES = (4, 8, 16, 32)
# which ViT map each level gets: the last block's (official detection backbone) or the one after
# interaction i for level i (official segmentation backbone)
VIT_FEATURES = ('final', 'per_interaction')
_LN_EPS = 1e-6


class MultiLevelConvMlp(ConvMlp):
    """ConvFFN of the extractor: :class:`ConvMlp` whose depthwise conv runs on each level of
    the concatenated prior tokens (B, sum H*W, C) separately."""

    def forward(self, x: torch.Tensor, sizes: Sequence[Size2]) -> torch.Tensor:
        x = self.fc1(x)
        lengths = [h * w for h, w in sizes]
        maps = [self.dwconv(tokens_to_map(part, size))
                for part, size in zip(x.split(lengths, dim=1), sizes)]
        x = self.act(torch.cat([map_to_tokens(m) for m in maps], dim=1))
        return self.drop(self.fc2(self.drop(x)))


class Injector(nn.Module):
    """ViT tokens attend to the prior tokens: ``x + gamma * attn(norm(x), norm(c))``."""

    def __init__(self, dim: int, num_heads: int, num_points: int, value_ratio: float,
                 init_values: float) -> None:
        super().__init__()
        self.query_norm = nn.LayerNorm(dim, eps=_LN_EPS)
        self.feat_norm = nn.LayerNorm(dim, eps=_LN_EPS)
        self.attn = MSDeformAttn(dim, 3, num_heads, num_points, value_ratio)
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor, ref: torch.Tensor, c: torch.Tensor,
                c_sizes: Sequence[Size2]) -> torch.Tensor:
        attn = self.attn(self.query_norm(x), ref, self.feat_norm(c), c_sizes)
        return x + self.gamma * attn


class Extractor(nn.Module):
    """Prior tokens attend to the ViT tokens, then a ConvFFN (``with_cffn``)."""

    def __init__(self, dim: int, num_heads: int, num_points: int, value_ratio: float,
                 with_cffn: bool, cffn_ratio: float, drop: float, drop_path: float) -> None:
        super().__init__()
        self.query_norm = nn.LayerNorm(dim, eps=_LN_EPS)
        self.feat_norm = nn.LayerNorm(dim, eps=_LN_EPS)
        self.attn = MSDeformAttn(dim, 1, num_heads, num_points, value_ratio)
        self.ffn = MultiLevelConvMlp(dim, int(dim * cffn_ratio), drop=drop) if with_cffn else None
        self.ffn_norm = nn.LayerNorm(dim, eps=_LN_EPS) if with_cffn else None
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, c: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, hw: Size2,
                c_sizes: Sequence[Size2]) -> torch.Tensor:
        c = c + self.attn(self.query_norm(c), ref, self.feat_norm(x), [hw])
        if self.ffn is not None:
            c = c + self.drop_path(self.ffn(self.ffn_norm(c), c_sizes))
        return c


class InteractionBlock(nn.Module):
    """One injector before a group of trunk blocks, one extractor (and, in the last group, two
    extra extractors) after it. The backbone runs the blocks in between."""

    def __init__(self, dim: int, num_heads: int, num_points: int, value_ratio: float,
                 init_values: float, with_cffn: bool, cffn_ratio: float, drop: float,
                 drop_path: float, extra_extractors: bool) -> None:
        super().__init__()
        self.injector = Injector(dim, num_heads, num_points, value_ratio, init_values)
        self.extractor = Extractor(dim, num_heads, num_points, value_ratio, with_cffn,
                                   cffn_ratio, drop, drop_path)
        self.extra_extractors = nn.ModuleList(
            Extractor(dim, num_heads, num_points, value_ratio, with_cffn, cffn_ratio, drop,
                      drop_path)  # the official extra extractors take the same drop path
            for _ in range(2)) if extra_extractors else None


def _conv_bn_relu(cin: int, cout: int, stride: int, norm: type) -> List[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), norm(cout), nn.ReLU(inplace=True)]


class SpatialPriorModule(nn.Module):
    """ResNet-like stem and three stride-2 convs -> c1..c4 (B, dim, H/s, W/s) at s = 4..32
    through 1x1 projections ``fc1..fc4`` (``fc1`` only where the stride-4 output is built)."""

    def __init__(self, inplanes: int, dim: int, in_channels: int = 3, with_c1: bool = True,
                 norm: type = nn.BatchNorm2d) -> None:
        super().__init__()
        self.level_encoding = nn.Parameter(torch.zeros(3, dim))  # added to c2..c4 tokens
        self.stem = nn.Sequential(*_conv_bn_relu(in_channels, inplanes, 2, norm),
                                  *_conv_bn_relu(inplanes, inplanes, 1, norm),
                                  *_conv_bn_relu(inplanes, inplanes, 1, norm),
                                  nn.MaxPool2d(3, 2, 1))
        self.conv2 = nn.Sequential(*_conv_bn_relu(inplanes, 2 * inplanes, 2, norm))
        self.conv3 = nn.Sequential(*_conv_bn_relu(2 * inplanes, 4 * inplanes, 2, norm))
        self.conv4 = nn.Sequential(*_conv_bn_relu(4 * inplanes, 4 * inplanes, 2, norm))
        self.fc1 = nn.Conv2d(inplanes, dim, 1) if with_c1 else None
        self.fc2 = nn.Conv2d(2 * inplanes, dim, 1)
        self.fc3 = nn.Conv2d(4 * inplanes, dim, 1)
        self.fc4 = nn.Conv2d(4 * inplanes, dim, 1)

    def forward(self, x: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        c1 = self.stem(x)
        c2 = self.conv2(c1)
        c3 = self.conv3(c2)
        c4 = self.conv4(c3)
        return (self.fc1(c1) if self.fc1 is not None else None, self.fc2(c2), self.fc3(c3),
                self.fc4(c4))


def _init_adapter_module(module: nn.Module) -> None:
    """The official adapter's general init (its ``_init_weights``): trunc-normal linears, unit
    norms, He-normal convs over fan-out, zero biases. Use with ``apply``."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.LayerNorm, nn.BatchNorm2d, nn.SyncBatchNorm)):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
        nn.init.normal_(module.weight, 0, (2.0 / (fan_out // module.groups)) ** 0.5)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


# the registered name of the official DINOv3 form, which ViTAdapter builds for a RoPE arch
DINOV3_FORM = 'DINOv3Adapter'


def is_dinov3_arch(arch: Any) -> bool:
    """A DINOv3 preset name or a custom arch with RoPE: the trunks of the DINOv3 form."""
    if isinstance(arch, dict):
        return bool(arch.get('rope'))
    zoo = VisionTransformer.arch_zoo
    return isinstance(arch, str) and arch in zoo and bool(zoo[arch].get('rope'))


@MODELS.register_module()
class ViTAdapter(VisionTransformer):
    """ViT-Adapter: four maps at strides 4/8/16/32 from a plain ViT trunk.

    Args:
        arch: the trunk, any :class:`VisionTransformer` preset (``'ti' 's' 'b' 'l'``, DeiT /
            MAE names, ``'dinov2_s'`` ...) or custom dict. Patch 14 presets (DINOv2) run with
            patch 16 as the official adapter does; their checkpoints' patch kernels are resized
            on load and the pretraining grid is kept (518 -> 592 px).
        conv_inplane: SPM stem channels.
        deform_num_heads: heads of the deformable attentions; ``None``: 6 up to 384 channels,
            else ``embed_dims // 64`` (the paper's T/S/B: 6 / 6 / 12).
        n_points: samples per head and level.
        init_values: initial injector ``gamma`` (the official default 0).
        interaction_indexes: ``[first, last]`` trunk blocks of each interaction, contiguous from
            block 0 to the last; ``None``: four equal groups (``[[0, 2], [3, 5], [6, 8], [9,
            11]]`` for 12 blocks).
        with_cffn / cffn_ratio: the extractors' ConvFFN and its hidden ratio.
        deform_ratio: value channels of the deformable attention over ``embed_dims``.
        add_vit_feature: add the resampled ViT map to every output.
        vit_features: which ViT map level i gets (bilinearly resampled to its stride):
            ``'final'`` the last block's, for every level (the official detection backbone,
            ``detection/mmdet_custom/models/backbones/vit_adapter.py``); ``'per_interaction'``
            the one after interaction i (the official segmentation backbone,
            ``segmentation/mmseg_custom/models/backbones/vit_adapter.py``; four interactions).
        use_extra_extractor: two more extractors after the last interaction.
        layer_scale: trunk LayerScale init; ``None``: the preset's, else 1.0 (the official
            adapter's trunk has ``gamma1 / gamma2`` in every block, initialised to ones).
        out_indices: which of the four maps (strides 4, 8, 16, 32) to return.
        frozen_stages: the trunk's (-1 none; 0 embeddings; k the embeddings and k blocks).
        sync_bn: SyncBatchNorm in the SPM and the output norms (the official configs' choice
            on several GPUs); default BatchNorm2d.
        drop_path_rate: the trunk's stochastic depth (linear over its blocks) and, at this full
            rate, the ConvFFN of every extractor, the extra ones too (as the official code).
        with_cp: the trunk's selection (:mod:`~mmvit_ext.backbones.checkpointing`); when it
            selects every trunk block (``True``, ``'attn'``, ``'mlp'``, ``dict(blocks=True,
            ...)``), every injector and extractor is recomputed whole in backward too, as the
            official segmentation backbone's ``with_cp=True`` does; a partial selection (``N``
            blocks, one entry per stage) recomputes the selected trunk blocks only. The SPM,
            ``up`` and the output norms are never recomputed.
        window_padding: ``'qkv'`` (default: the official ``base/vit.py``: q, k, v zero-padded
            to whole 14 x 14 windows after the projection, padded keys unmasked, windows never
            shrunk) or ``'tokens'`` (ViTDet's); see :class:`~mmvit_ext.layers.WindowAttention`.
        **kwargs: the trunk's (:class:`VisionTransformer`): ``window_size`` (default 14, with
            global attention in four evenly spaced blocks, as the official configs),
            ``global_blocks``, ``img_size`` ...
    """

    family = 'vit_adapter'
    layout_families = ('vit_adapter', 'vit')  # its own checkpoints, and any plain-ViT trunk's
    default_arch = 's'
    paper_figures: Dict[str, Any] = {}
    peer_drop_in = False
    analysis_settings = dict(window_size=None)

    def __new__(cls, *args: Any, **kwargs: Any) -> 'ViTAdapter':
        """``ViTAdapter(arch='dinov3_*')`` (or a custom arch with ``rope``) builds the official
        DINOv3 form: the class registered as ``DINOv3Adapter``, found in the registry (this file
        imports nothing of it)."""
        arch = args[0] if args else kwargs.get('arch')
        if cls is ViTAdapter and is_dinov3_arch(arch):
            cls = MODELS.get(DINOV3_FORM)
        return super().__new__(cls)

    def __init__(self, arch: Union[str, dict, None] = None, conv_inplane: int = 64,
                 n_points: int = 4, deform_num_heads: Optional[int] = None,
                 init_values: float = 0.0, interaction_indexes: Optional[Sequence] = None,
                 with_cffn: bool = True, cffn_ratio: float = 0.25, deform_ratio: float = 1.0,
                 add_vit_feature: bool = True, vit_features: str = 'final',
                 use_extra_extractor: bool = True,
                 layer_scale: Optional[float] = None, img_size: Optional[int] = None,
                 out_indices: Union[int, Sequence[int]] = (0, 1, 2, 3), frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: Any = False, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, sync_bn: bool = False,
                 window_padding: str = 'qkv',
                 init_cfg: Optional[Union[dict, List[dict]]] = None, **kwargs: Any) -> None:
        name = type(self).__name__
        if vit_features not in VIT_FEATURES:
            raise ConfigError(f'{name}: vit_features must be one of {VIT_FEATURES}, got '
                              f'{vit_features!r}')
        settings = self.resolve_arch(self.default_arch if arch is None else arch)
        for key in ('with_cls_token', 'out_type', 'simple_pyramid', 'patch_size', 'final_norm'):
            if key in kwargs:
                raise ConfigError(f'{name}: {key} is fixed by the adapter (patch 16 tokens, no '
                                  f'class token, its own outputs); remove it')
        if settings.get('reg_tokens'):
            raise ConfigError(f'{name}: register tokens are not supported (the adapter '
                              f'attends between patch tokens and prior maps)')
        patch = int(settings.get('patch_size', 16))
        if img_size is None:  # keep the pretraining grid at patch 16 (DINOv2: 37 x 37 = 592 px)
            img_size = int(settings.get('img_size', 224)) // patch * 16
        if layer_scale is None:
            layer_scale = settings.get('layer_scale') or 1.0
        super().__init__(arch, patch_size=16, out_type='featmap', with_cls_token=False,
                         final_norm=False, simple_pyramid=False, layer_scale=layer_scale,
                         img_size=img_size, out_indices=(-1,), drop_rate=drop_rate,
                         drop_path_rate=drop_path_rate, window_padding=window_padding,
                         peer=OURS, init_cfg=init_cfg, **kwargs)
        dim, depth = self.embed_dims, self.depth
        self.interaction_indexes = self._check_interactions(interaction_indexes, depth)
        if vit_features == 'per_interaction' and len(self.interaction_indexes) != 4:
            raise ConfigError(f"{name}: vit_features='per_interaction' adds interaction i's ViT "
                              f"map to level i, so it needs 4 interactions, got "
                              f"{len(self.interaction_indexes)} (interaction_indexes)")
        self.vit_features = vit_features
        heads = deform_num_heads or (6 if dim <= 384 else dim // 64)
        self.add_vit_feature = add_vit_feature
        # the contract: four maps; frozen_stages counts the trunk's blocks
        self._set_contract(out_indices, [dim] * 4, STRIDES, frozen_stages, depth, norm_eval,
                           with_cp)
        norm = nn.SyncBatchNorm if sync_bn else nn.BatchNorm2d
        with_c1 = 0 in self.out_indices
        self.spm = SpatialPriorModule(conv_inplane, dim, self.in_channels, with_c1, norm)
        last = len(self.interaction_indexes) - 1
        self.interactions = nn.ModuleList(
            InteractionBlock(dim, heads, n_points, deform_ratio, init_values, with_cffn,
                             cffn_ratio, drop_rate, drop_path_rate,
                             use_extra_extractor and i == last)
            for i in range(len(self.interaction_indexes)))
        self.up = nn.ConvTranspose2d(dim, dim, 2, 2) if with_c1 else None
        for level in range(4):
            setattr(self, f'norm{level + 1}', norm(dim) if level in self.out_indices else None)
        self.init_adapter()
        self._freeze_stages()

    @staticmethod
    def _check_interactions(indexes: Optional[Sequence], depth: int) -> Tuple[Tuple[int, int], ...]:
        if indexes is None:
            if depth < 4:
                raise ConfigError(f'ViTAdapter: a trunk of {depth} blocks is too shallow for '
                                  f'four interactions; pass interaction_indexes')
            bounds = [i * depth // 4 for i in range(5)]
            return tuple((bounds[i], bounds[i + 1] - 1) for i in range(4))
        pairs = tuple(tuple(int(v) for v in pair) for pair in indexes)
        expected = 0
        for pair in pairs:
            if len(pair) != 2 or pair[0] != expected or pair[1] < pair[0]:
                raise ConfigError(f'ViTAdapter: interaction_indexes must be [first, last] block '
                                  f'pairs, contiguous from block 0, got {list(indexes)}')
            expected = pair[1] + 1
        if expected != depth:
            raise ConfigError(f'ViTAdapter: interaction_indexes {list(indexes)} must end at the '
                              f'last block ({depth - 1})')
        return pairs

    def init_adapter(self) -> None:
        """The official init, in its order: the general init of the SPM, the interactions and
        ``up`` (:func:`_init_adapter_module`), then Deformable DETR's init of every deformable
        attention in a second pass (in one pass the general init would re-draw the
        attentions' own linears after them), then a standard-normal level embedding."""
        for part in (self.spm, self.interactions, self.up):
            if part is not None:
                part.apply(_init_adapter_module)
        for module in self.modules():
            if isinstance(module, MSDeformAttn):
                module.reset_parameters()
        nn.init.normal_(self.spm.level_encoding)

    # ---- family facts ------------------------------------------------------------------------
    @classmethod
    def classifier_settings(cls) -> Dict[str, Any]:
        return {}  # no classifier form: the dense outputs

    @classmethod
    def infer_arch(cls, state_dict: StateDict) -> Optional[dict]:
        return None  # the deformable heads are not readable off the weights: pass --arch

    def output_spec(self) -> List[Tuple[int, int]]:
        return [(self.level_channels[i], self.level_strides[i]) for i in self.out_indices]

    @property
    def nondeterministic_cuda_backward(self) -> Optional[str]:
        """Read by :mod:`mmvit_ext.engine.determinism` (the deformable attentions say so
        themselves): ``add_vit_feature`` resizes the ViT maps to every level but the third."""
        if self.add_vit_feature and any(level != 2 for level in self.out_indices):
            return ('add_vit_feature: bilinear resize of the ViT maps, whose CUDA backward torch '
                    'refuses under use_deterministic_algorithms')
        return None

    def unbuilt_prefixes(self) -> Tuple[str, ...]:
        prefixes = super().unbuilt_prefixes()
        prefixes += tuple(f'norm{i + 1}.' for i in range(4) if i not in self.out_indices)
        if self.up is None:
            prefixes += ('up.', 'spm.fc1.')
        return prefixes

    def adapt_state_dict(self, state_dict: StateDict) -> Tuple[StateDict, List[str]]:
        """Also resize a patch-14 kernel (DINOv2) to patch 16, bicubic, as the official
        adapter's ``convert_14to16`` script does."""
        state_dict, resized = super().adapt_state_dict(state_dict)
        kernel = state_dict.get('patch_embed.proj.weight')
        own = self.patch_embed.proj.weight
        if kernel is not None and kernel.shape[:2] == own.shape[:2] and kernel.shape != own.shape:
            state_dict['patch_embed.proj.weight'] = F.interpolate(
                kernel.float(), size=own.shape[2:], mode='bicubic',
                align_corners=False).to(kernel.dtype)
            resized.append('patch_embed.proj.weight')
        return state_dict, resized

    # ---- forward -----------------------------------------------------------------------------
    def recomputes_adapter(self) -> bool:
        """Whether ``with_cp`` recomputes the injectors and extractors: when it selects every
        trunk block (see ``with_cp`` above)."""
        parts = self._cp_plan.parts(self.checkpoint_stages(), type(self).__name__)
        return self._cp_plan.active and all(part is not None for part in parts)

    def _call(self, module: nn.Module, *args: Any) -> Any:
        """An injector / extractor, recomputed in backward where :meth:`recomputes_adapter`."""
        if self.training and torch.is_grad_enabled() and self.recomputes_adapter():
            return checkpoint_block(module, *args)
        return module(*args)

    def spatial_prior(self, x: torch.Tensor
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[Size2]]:
        """The input zero-padded to a multiple of 32 (every level an exact grid), the SPM's
        stride-4 map ``c1``, and its stride 8/16/32 maps as one token sequence with their level
        encodings, and those maps' sizes."""
        x = pad_to_multiple(x, (32, 32))
        c1, *priors = self.spm(x)
        c_sizes = [tuple(p.shape[2:]) for p in priors]
        c = torch.cat([map_to_tokens(p) + self.spm.level_encoding[i]
                       for i, p in enumerate(priors)], dim=1)
        return x, c1, c, c_sizes

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        height, width = x.shape[2:]
        x, c1, c, c_sizes = self.spatial_prior(x)
        tokens, hw = self.embed_tokens(x)
        ref_vit = reference_points([hw], x.device)
        ref_prior = reference_points(c_sizes, x.device)
        vit_maps = []  # per interaction
        for interaction, (first, last) in zip(self.interactions, self.interaction_indexes):
            tokens = self._call(interaction.injector, tokens, ref_vit, c, c_sizes)
            for block in self.blocks[first:last + 1]:
                tokens = self.run_block(block, tokens, hw)
            extractors = [interaction.extractor, *(interaction.extra_extractors or ())]
            for extractor in extractors:
                c = self._call(extractor, c, ref_prior, tokens, hw, c_sizes)
            if self.vit_features == 'per_interaction':
                vit_maps.append(tokens_to_map(tokens, hw))
        if self.vit_features == 'final':
            vit_maps = [tokens_to_map(tokens, hw)] * 4
        maps = [tokens_to_map(part, size) for part, size in
                zip(c.split([h * w for h, w in c_sizes], dim=1), c_sizes)]
        if self.up is not None:
            maps.insert(0, self.up(maps[0]) + c1)
        else:
            maps.insert(0, None)
        outs = []
        for level in self.out_indices:
            out = maps[level]
            if self.add_vit_feature:  # level 2 is at the ViT's stride 16
                vit_map = vit_maps[level]
                out = out + (vit_map if level == 2 else F.interpolate(
                    vit_map, size=out.shape[2:], mode='bilinear', align_corners=False))
            out = getattr(self, f'norm{level + 1}')(out)
            stride = STRIDES[level]
            outs.append(out[:, :, :(height + stride - 1) // stride, :(width + stride - 1) // stride])
        return tuple(outs)
