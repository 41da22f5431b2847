# Mask R-CNN + FPN with ViT-Adapter-S (Chen et al., ICLR 2023) on COCO, 3x multi-scale: a DeiT-S
# trunk (14x14 windows, global attention in blocks 2, 5, 8, 11), interactions after blocks
# [0-2] [3-5] [6-8] [9-11], 6 deformable heads, 4 points, ConvFFN ratio 0.25, deform ratio 1.0,
# drop path 0.2; AdamW lr 1e-4, wd 0.05, no decay on norms / position / level embeddings.
# Published (czczup/ViT-Adapter detection README, DeiT-S, 3x+MS): 48.2 box / 42.8 mask AP.
# Weights: DeiT-S at checkpoints/deit_small_patch16_224-cd65a155.pth (the adapter starts from
# its initialisation, as in the paper).
_base_ = '../_base_/mask_rcnn_ms_3x.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.ViTAdapter',
        arch='deit-s',
        drop_path_rate=0.2,
        conv_inplane=64,
        n_points=4,
        deform_num_heads=6,
        cffn_ratio=0.25,
        deform_ratio=1.0,
        interaction_indexes=[[0, 2], [3, 5], [6, 8], [9, 11]],
        window_size=14,
        global_blocks=(2, 5, 8, 11),
        window_padding='qkv',  # the official windows: q, k, v zero-padded to whole windows
        vit_features='final',  # the official detection form: the last ViT map on every level
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/deit_small_patch16_224-cd65a155.pth')),
    neck=dict(in_channels=[384, 384, 384, 384]))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'level_encoding': dict(decay_mult=0.0)}))
