"""Presets every registered backbone is tested with: the contract suite runs over all of them,
and a registered backbone without an entry here fails the suite."""
from typing import Dict, List

from mmvit_ext.backbones.dinov3 import dinov3_arch_zoo

# A tiny custom arch per family keeps gradient tests fast; presets check the real shapes.
CASES: Dict[str, List[dict]] = {
    'SwinTransformer': [
        dict(arch='tiny'),
        dict(arch='base', window_size=12, pretrain_img_size=384),
        dict(arch='l', window_size=12, pretrain_img_size=384, use_abs_pos_embed=True),
        dict(arch=dict(embed_dims=32, depths=(1, 2, 2, 1), num_heads=(1, 2, 4, 8)), window_size=4),
    ],
    'PyramidVisionTransformerV2': [
        dict(arch='b2'),
        dict(arch='b2_li'),
        dict(arch='b0'),
        dict(arch=dict(embed_dims=(16, 32, 40, 64), depths=(1, 2, 1, 1), num_heads=(1, 2, 5, 8))),
    ],
    'DeepViT': [
        dict(arch='s'),
        dict(arch='16b', window_size=None),
        dict(arch='s', out_indices=(3, 7, 11, 15)),
        dict(arch=dict(embed_dims=32, depth=4, num_heads=2, reattention_blocks=2,
                       conv_stem=(8, 8), transform_scale=True, scale_adjustment=0.5),
             simple_pyramid=False, window_size=2, global_blocks=(3,)),
    ],
    'CaiT': [
        dict(arch='s24'),
        dict(arch='xxs24', window_size=None, simple_pyramid=False, out_indices=(5, 11, 23)),
        dict(arch=dict(embed_dims=32, depth=3, num_heads=2, layer_scale=0.1),
             simple_pyramid=False, window_size=2, global_blocks=(2,)),
    ],
    'RefinedViT': [
        dict(arch='s'),
        dict(arch='s', global_blocks=(0, 1), window_size=7),
        dict(arch=dict(embed_dims=32, depth=4, num_heads=2, conv_stem=(8, 8, 16),
                       mlp_layer_scale=0.1),
             simple_pyramid=False, window_size=2, global_blocks=(2, 3)),
    ],
    'VisionTransformer': [
        dict(arch='b'),
        dict(arch='dinov2_s', out_indices=(2, 5, 8, 11), reg_tokens=4),
        dict(arch='s', out_indices=(3, 5, 7, 11), use_rel_pos=True),
        dict(arch='dinov3-s', out_indices=(2, 5, 8, 11), out_norm=True),
        dict(arch=dict(embed_dims=32, depth=4, num_heads=2, layer_scale=0.1, ffn='swiglu'),
             simple_pyramid=False, use_rel_pos=True, window_size=2, global_blocks=(3,)),
    ],
    # a CNN (forward_intermediates), a model that predates it (timm's features_only wrapper),
    # and a tiny ViT (maps at any size: timm's dynamic size and padding)
    'TimmBackbone': [
        dict(model_name='resnet18', features_only=True),
        dict(model_name='ghostnet_050', features_only=True),
        dict(model_name='vit_tiny_patch16_224', embed_dim=32, depth=3, num_heads=2,
             dynamic_img_size=True, dynamic_img_pad=True, features_only=True),
    ],
    # the official DINOv3 form on a tiny DINOv3 trunk: frozen (its default), and trained
    'DINOv3Adapter': [
        dict(arch=dict(dinov3_arch_zoo()['dinov3_vits16'], embed_dims=32, depth=4, num_heads=2),
             conv_inplane=8, deform_num_heads=2),
        dict(arch=dict(dinov3_arch_zoo()['dinov3_vits16'], embed_dims=32, depth=4, num_heads=2,
                       layer_scale=0.5),
             freeze_trunk=False, conv_inplane=8, deform_num_heads=2),
    ],
    'ConvNeXt': [
        dict(arch='dinov3_convnext_tiny'),
        dict(arch='dinov3_convnext_tiny', out_norm=True),
        dict(arch=dict(embed_dims=(16, 24, 32, 40), depths=(1, 2, 1, 1), layer_scale=0.5)),
    ],
    'ViTAdapter': [
        dict(arch='ti'),
        dict(arch=dict(embed_dims=48, depth=4, num_heads=2), deform_num_heads=2, conv_inplane=8,
             window_size=2, global_blocks=(3,)),
    ],
}

# The smallest case of each family, for gradient / checkpoint / freezing tests.
SMALL = {name: cases[-1] for name, cases in CASES.items()}
# Backbones whose arithmetic is a library's own (TimmBackbone runs timm's model code): the suites
# that test our model code's numerics, export and compilation (test_numerics, test_onnx_export,
# test_compile) take OWN_CODE; the contract, checkpointing and layer-decay suites take SMALL.
LIBRARY_WRAPPERS = {'TimmBackbone'}
OWN_CODE = {name: cfg for name, cfg in SMALL.items() if name not in LIBRARY_WRAPPERS}
# Presets too heavy for the 513x769 size on a 2-core CPU are marked here.
LARGE_SIZE_OK = {('SwinTransformer', 0), ('SwinTransformer', 3), ('PyramidVisionTransformerV2', 1),
                 ('PyramidVisionTransformerV2', 2), ('PyramidVisionTransformerV2', 3),
                 ('DeepViT', 0), ('DeepViT', 3), ('CaiT', 2), ('RefinedViT', 0), ('RefinedViT', 2),
                 ('VisionTransformer', 2), ('VisionTransformer', 4), ('ConvNeXt', 2)}
# A tiny DINOv3 trunk (RoPE from the grid at run time, storage tokens, k-bias mask, out_norm;
# LayerScale 0.5 instead of 1e-5, so that attention moves the outputs): export and compile tests.
TINY_DINOV3 = dict(arch=dict(dinov3_arch_zoo()['dinov3_vits16'], embed_dims=32, depth=4,
                             num_heads=2, layer_scale=0.5),
                   out_indices=(0, 1, 2, 3), out_norm=True)
