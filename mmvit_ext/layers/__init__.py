"""Shared layers: plain nn.Modules used by every backbone family."""
from .attention import (POST_SOFTMAX, PRE_SOFTMAX, Attention, AttentionBase, MapTransform,
                        multihead_attention)
from .init import init_linear_and_norm
from .drop import DropPath, linear_drop_path_rates
from .layer_scale import LayerScale
from .linear import Linear, get_cpu_gemm, linear, set_cpu_gemm
from .map_transforms import ReAttention, RefinerMap, TalkingHeads
from .mlp import ConvMlp, Mlp
from .patch_embed import ConvStemEmbed, PatchEmbed
from .pyramid import LayerNorm2d, SimplePyramid, pyramid_channels
from .pos_embed import resize_pos_embed
from .sra import SpatialReductionAttention
from .rel_pos import RelativePositionBias, relative_position_index, resize_rel_pos_table
from .utils import to_2tuple
from .window import (WindowLayout, pad_to_windows, shifted_window_mask, window_partition,
                     window_reverse)

__all__ = [
    'ConvStemEmbed', 'LayerNorm2d', 'SimplePyramid', 'pyramid_channels', 'ReAttention',
    'RefinerMap', 'TalkingHeads',
    'Attention', 'AttentionBase', 'init_linear_and_norm', 'MapTransform', 'multihead_attention', 'PRE_SOFTMAX', 'POST_SOFTMAX',
    'DropPath', 'linear_drop_path_rates', 'LayerScale', 'Linear', 'linear', 'get_cpu_gemm',
    'set_cpu_gemm', 'Mlp', 'ConvMlp', 'SpatialReductionAttention', 'PatchEmbed', 'resize_pos_embed',
    'RelativePositionBias', 'relative_position_index', 'resize_rel_pos_table', 'to_2tuple',
    'WindowLayout', 'pad_to_windows', 'shifted_window_mask', 'window_partition', 'window_reverse',
]
