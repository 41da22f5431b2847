"""Shared layers: plain nn.Modules used by every backbone family (no device-specific code)."""
from .attention import (POST_SOFTMAX, PRE_SOFTMAX, Attention, AttentionBase, AttnBias,
                        MapTransform, attention_probs, bias_terms, explicit_attention,
                        final_map, map_attention,
                        scaled_dot_product_attention, sdpa_mask, sum_bias)
from .checkpoint import CheckpointedCall
from .deform_attn import MSDeformAttn, multi_scale_deformable_attention, reference_points
from .drop import DropPath, linear_drop_path_rates
from .init import init_linear_and_norm
from .layer_scale import LayerScale
from .map_transforms import ReAttention, RefinerMap, TalkingHeads
from .mlp import ConvMlp, Mlp
from .patch_embed import ConvStemEmbed, PatchEmbed
from .pos_embed import resize_pos_embed
from .pyramid import LayerNorm2d, SimplePyramid, pyramid_channels
from .rope import RopeEmbedding, apply_rope, rope_coords, rope_periods, rotate_half
from .rel_pos import RelativePositionBias, relative_position_index, resize_rel_pos_table
from .resample import (adaptive_avg_pool2d, adaptive_pool_matrix, interpolation_matrix,
                       resize_grid)
from .sdpa_kernels import (SDPA_KERNELS, OperandForm, SdpaKernel, fused_sdpa_kernel,
                           kernel_for_call)
from .sra import SpatialReductionAttention
from .shapes import Size2, map_to_tokens, pad_to_multiple, to_2tuple, tokens_to_map
from .utils import known_equal, known_zero
from .window import (WindowAttention, WindowGeometry, fit_window, join_windows,
                     shifted_window_mask, split_windows, window_partition, window_reverse)

__all__ = [
    'Attention', 'AttentionBase', 'CheckpointedCall', 'AttnBias', 'MapTransform', 'PRE_SOFTMAX', 'POST_SOFTMAX',
    'bias_terms', 'sum_bias', 'attention_probs', 'final_map',
    'scaled_dot_product_attention', 'sdpa_mask', 'explicit_attention',
    'SDPA_KERNELS', 'SdpaKernel', 'OperandForm', 'fused_sdpa_kernel', 'kernel_for_call',
    'map_attention', 'ReAttention',
    'RefinerMap', 'TalkingHeads', 'WindowAttention', 'WindowGeometry', 'fit_window',
    'split_windows', 'join_windows', 'shifted_window_mask', 'window_partition', 'window_reverse',
    'RelativePositionBias', 'relative_position_index', 'resize_rel_pos_table',
    'SpatialReductionAttention', 'Mlp', 'ConvMlp', 'PatchEmbed', 'ConvStemEmbed',
    'LayerNorm2d', 'SimplePyramid', 'pyramid_channels', 'resize_pos_embed', 'resize_grid',
    'interpolation_matrix', 'adaptive_avg_pool2d', 'adaptive_pool_matrix', 'DropPath',
    'linear_drop_path_rates', 'LayerScale', 'init_linear_and_norm', 'known_zero', 'known_equal',
    'MSDeformAttn', 'multi_scale_deformable_attention', 'reference_points',
    'RopeEmbedding', 'apply_rope', 'rope_coords', 'rope_periods', 'rotate_half',
    'Size2', 'to_2tuple', 'tokens_to_map', 'map_to_tokens', 'pad_to_multiple',
]
