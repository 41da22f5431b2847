"""ConvNeXt (Liu et al., 2022) as DINOv3 distils it from its 7B (facebookresearch/dinov3,
``dinov3/models/convnext.py``, hub ``dinov3_convnext_{tiny,small,base,large}``): a four-stage
convolutional pyramid at strides 4 / 8 / 16 / 32.

Stage i: a downsampling (stage 0: 4x4 stride-4 conv then LayerNorm; later stages: LayerNorm
then 2x2 stride-2 conv), then blocks of 7x7 depthwise conv -> LayerNorm -> MLP (4x, GELU) ->
LayerScale (1e-6) -> residual. The four outputs are the official
``get_intermediate_layers(x, n=4, reshape=True, norm=False)``; ``out_norm=True`` gives its
``norm=True``, where only the last map passes the final LayerNorm (the official ``norms`` are
identities for the first three).

Sides that are not multiples of 32 are zero-padded on the bottom / right at every stride (the
image to a multiple of 4, each map to even sides before its downsampling conv), so that level i
has ``ceil(side / stride)`` pixels as every backbone here; the official convolutions floor
instead (dropping the remainder). At multiples of 32 the two are the same function.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..errors import ConfigError
from ..layers import (DropPath, LayerNorm2d, LayerScale, Mlp, init_linear_and_norm,
                      linear_drop_path_rates, pad_to_multiple)
from ..registry import MODELS
from .base import BaseBackbone
from .vocabulary import translate

LN_EPS = 1e-6  # every LayerNorm of the official model


def _convnext(dims: Tuple[int, ...], depths: Tuple[int, ...]) -> dict:
    return dict(embed_dims=dims, depths=depths, layer_scale=1e-6)


# dinov3/models/convnext.py convnext_sizes (the original ConvNeXt's T / S / B / L)
CONVNEXT_ARCHS = {
    ('dinov3_convnext_tiny', 'dinov3-convnext-t', 'convnext_tiny', 'tiny', 't'):
        _convnext((96, 192, 384, 768), (3, 3, 9, 3)),
    ('dinov3_convnext_small', 'dinov3-convnext-s', 'convnext_small', 'small', 's'):
        _convnext((96, 192, 384, 768), (3, 3, 27, 3)),
    ('dinov3_convnext_base', 'dinov3-convnext-b', 'convnext_base', 'base', 'b'):
        _convnext((128, 256, 512, 1024), (3, 3, 27, 3)),
    ('dinov3_convnext_large', 'dinov3-convnext-l', 'convnext_large', 'large', 'l'):
        _convnext((192, 384, 768, 1536), (3, 3, 27, 3)),
}
# DINOv3 README (facebookresearch/dinov3), millions of parameters: the ConvNeXt paper's figures,
# which count a 1000-class head the DINOv3 models do not have (tests/test_convnext.py)
README_PARAMS = {'dinov3_convnext_tiny': 29, 'dinov3_convnext_small': 50,
                 'dinov3_convnext_base': 89, 'dinov3_convnext_large': 198}


class ConvNeXtBlock(nn.Module):
    """7x7 depthwise conv -> LayerNorm -> MLP -> LayerScale -> drop path -> residual, on an
    NCHW map (the norm and MLP run channels-last, as the official block)."""

    def __init__(self, dim: int, layer_scale: float = 1e-6, drop_path: float = 0.0) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=LN_EPS)
        self.mlp = Mlp(dim, 4 * dim)
        self.ls = LayerScale(dim, layer_scale) if layer_scale > 0 else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.ls(self.mlp(self.norm(self.dwconv(x).permute(0, 2, 3, 1))))
        # the permuted branch first: the sum keeps its channels-last layout, which the next
        # block's depthwise conv and channels-last norm read without a copy (as timm's)
        return self.drop_path(branch.permute(0, 3, 1, 2)) + x


class ConvNeXtDownsample(nn.Module):
    """The stem (4x4 stride-4 conv, LayerNorm) or a stage's downsampling (LayerNorm, 2x2
    stride-2 conv); the input zero-padded to a multiple of the stride first (see the module)."""

    def __init__(self, in_dim: int, out_dim: int, stem: bool) -> None:
        super().__init__()
        self.stem = stem
        self.stride = 4 if stem else 2
        if stem:
            self.proj = nn.Conv2d(in_dim, out_dim, kernel_size=4, stride=4)
        self.norm = LayerNorm2d(out_dim if stem else in_dim, eps=LN_EPS)
        if not stem:
            self.proj = nn.Conv2d(in_dim, out_dim, kernel_size=2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stem:
            return self.norm(self.proj(pad_to_multiple(x, (4, 4))))
        return self.proj(pad_to_multiple(self.norm(x), (2, 2)))


class ConvNeXtStage(nn.Module):
    """Downsampling, then ``depth`` blocks."""

    def __init__(self, in_dim: int, dim: int, depth: int, stem: bool, layer_scale: float,
                 drop_paths: Sequence[float]) -> None:
        super().__init__()
        self.downsample = ConvNeXtDownsample(in_dim, dim, stem)
        self.blocks = nn.ModuleList(ConvNeXtBlock(dim, layer_scale, rate) for rate in drop_paths)


@MODELS.register_module()
class ConvNeXt(BaseBackbone):
    """The DINOv3 ConvNeXt: 4 NCHW maps at strides 4/8/16/32.

    Args:
        arch: ``dinov3_convnext_{tiny,small,base,large}`` (aliases ``tiny`` / ``t``,
            ``dinov3-convnext-t``, ``convnext_tiny`` ...) or a dict with ``embed_dims`` and
            ``depths`` (optional ``layer_scale``, the LayerScale init; 0: none).
        out_indices: stages whose maps are returned; stages after the last one are not built.
        out_norm: the final LayerNorm on the last stage's map (official
            ``get_intermediate_layers(norm=True)``); it needs stage 3 among ``out_indices``.
        drop_path_rate: stochastic depth, rising linearly over the blocks (official hub: 0).
        frozen_stages: -1 nothing; 0 the stem; k the stem and stages 0..k-1.
        norm_eval / with_cp / peer / init_cfg: the common contract (:class:`BaseBackbone`).
    """

    family = 'convnext'
    arch_zoo = {name: preset for names, preset in CONVNEXT_ARCHS.items() for name in names}
    default_arch = 'dinov3_convnext_tiny'
    essential_keys = frozenset({'embed_dims', 'depths'})
    optional_keys = frozenset({'layer_scale'})
    peer_drop_in = False  # mmpretrain's ConvNeXt configs use its own options (GRN, ...)

    def __init__(self, arch: Union[str, dict, None] = None, in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = (0, 1, 2, 3), out_norm: bool = False,
                 drop_path_rate: float = 0.0, frozen_stages: int = -1, norm_eval: bool = False,
                 with_cp: Any = False, peer: Optional[str] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None, **peer_args: Any) -> None:
        args, settings = translate(type(self), dict(arch=arch, init_cfg=init_cfg, peer=peer),
                                   peer_args)
        super().__init__(init_cfg=args['init_cfg'])
        self.peer = args['peer']
        self.arch_settings = settings
        dims, depths = tuple(settings['embed_dims']), tuple(settings['depths'])
        if len(dims) != len(depths) or not dims:
            raise ConfigError(f'ConvNeXt: arch embed_dims {dims} and depths {depths} must have '
                              f'one entry per stage')
        if not isinstance(in_channels, int) or in_channels <= 0:
            raise ValueError(f'ConvNeXt: in_channels must be a positive int, got {in_channels!r}')
        num_stages = len(depths)
        self._set_contract(out_indices, dims, [4 * 2 ** i for i in range(num_stages)],
                           frozen_stages, num_stages, norm_eval, with_cp)
        if out_norm and num_stages - 1 not in self.out_indices:
            raise ConfigError(f'ConvNeXt: out_norm normalises the last stage\'s map (stage '
                              f'{num_stages - 1}), which out_indices={self.out_indices} does '
                              f'not return')
        self.in_channels = in_channels
        self.min_input_size = 4
        self.out_norm = bool(out_norm)
        layer_scale = float(settings.get('layer_scale', 1e-6))
        rates = linear_drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i in range(self.out_indices[-1] + 1):  # later stages would get no gradient
            start = sum(depths[:i])
            self.layers.append(ConvNeXtStage(in_channels if i == 0 else dims[i - 1], dims[i],
                                             depths[i], i == 0, layer_scale,
                                             rates[start:start + depths[i]]))
        self.norm = LayerNorm2d(dims[-1], eps=LN_EPS) if self.out_norm else None
        self.apply(self._init_module)
        self._freeze_stages()

    @staticmethod
    def _init_module(module: nn.Module) -> None:
        init_linear_and_norm(module)
        if isinstance(module, nn.Conv2d):  # the official trunc_normal(0.02)
            nn.init.trunc_normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)

    @classmethod
    def infer_arch(cls, state_dict: Dict[str, torch.Tensor]) -> Optional[Dict[str, Any]]:
        """Dims and depths read off the weights; ``out_norm`` when the final norm is there."""
        stages = sorted({int(k.split('.')[1]) for k in state_dict if k.startswith('layers.')})
        if not stages or any(f'layers.{i}.downsample.proj.weight' not in state_dict
                             for i in stages):
            return None
        dims = [state_dict[f'layers.{i}.downsample.proj.weight'].shape[0] for i in stages]
        depths = [len({k.split('.')[3] for k in state_dict if k.startswith(f'layers.{i}.blocks.')})
                  for i in stages]
        arch = dict(embed_dims=dims, depths=depths)
        if not any(k.endswith('.ls.gamma') for k in state_dict):
            arch['layer_scale'] = 0.0
        return dict(arch=arch, out_norm='norm.weight' in state_dict)

    def unbuilt_prefixes(self) -> Tuple[str, ...]:
        unbuilt = tuple(f'layers.{i}.' for i in range(len(self.layers), self.num_outputs))
        return unbuilt + (() if self.out_norm else ('norm.',))

    def layer_depth_groups(self) -> List[Tuple[str, ...]]:
        """The stem is layer 0, then one id per block; a stage's downsampling goes with the
        previous stage's last block (as PVTv2's patch embedding, Swin's patch merging)."""
        groups: List[Tuple[str, ...]] = [('layers.0.downsample',)]
        for i, stage in enumerate(self.layers):
            groups += [(f'layers.{i}.blocks.{j}',) for j in range(len(stage.blocks))]
            groups[-1] += (f'layers.{i + 1}.downsample',)
        return groups

    def frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        return [self.layers[0].downsample, *self.layers[:self.frozen_stages]]

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        outs = []
        for i, stage in enumerate(self.layers):
            x = stage.downsample(x)
            for block in stage.blocks:
                x = self.run_block(block, x)
            if i in self.out_indices:
                outs.append(self.norm(x) if self.norm is not None and
                            i == self.num_outputs - 1 else x)
        return tuple(outs)
