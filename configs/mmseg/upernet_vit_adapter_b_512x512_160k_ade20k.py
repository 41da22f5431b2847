# UperNet with ViT-Adapter-B (Chen et al., ICLR 2023) on ADE20K, 512x512, 160k iterations: a
# DeiT-B trunk with global attention in every block, interactions after blocks [0-2] [3-5]
# [6-8] [9-11], 12 deformable heads, 4 points, ConvFFN ratio 0.25, deform ratio 0.5, drop path
# 0.3; AdamW lr 6e-5, wd 0.01, layer-wise lr decay 0.95 over the 12 blocks (the adapter at the
# top rate), poly schedule with 1500 warm-up iterations, 16 images per step.
# Published (czczup/ViT-Adapter segmentation README, DeiT-B): 48.8 mIoU single-scale.
# Weights: DeiT-B at checkpoints/deit_base_patch16_224-b5f2ef4d.pth.
_base_ = ['../_base_/upernet_160k.py', '../_base_/layer_decay.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.ViTAdapter',
        arch='deit-b',
        drop_path_rate=0.3,
        conv_inplane=64,
        n_points=4,
        deform_num_heads=12,
        cffn_ratio=0.25,
        deform_ratio=0.5,
        interaction_indexes=[[0, 2], [3, 5], [6, 8], [9, 11]],
        window_size=None,
        # the official segmentation form: the ViT map after interaction i on level i
        vit_features='per_interaction',
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/deit_base_patch16_224-b5f2ef4d.pth')),
    decode_head=dict(in_channels=[768, 768, 768, 768]),
    auxiliary_head=dict(in_channels=768),
    test_cfg=dict(mode='slide', crop_size=(512, 512), stride=(341, 341)))
optim_wrapper = _base_.layer_decay_optim_wrapper
optim_wrapper['optimizer'].update(lr=6e-5, weight_decay=0.01)
optim_wrapper['paramwise_cfg'].update(layer_decay_rate=0.95)
optim_wrapper['paramwise_cfg']['custom_keys'].update(level_encoding=dict(decay_mult=0.0))
