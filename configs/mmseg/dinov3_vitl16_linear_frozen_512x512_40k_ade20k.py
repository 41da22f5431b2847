# DINOv3 ViT-L/16 (distilled, LVD-1689M), frozen, with the official linear probe on ADE20K at
# 512x512 (dinov3/eval/segmentation/configs/config-ade20k-linear-training.yaml): the last block's
# patch tokens through the trunk's output norm (backbone_out_layers LAST, use_backbone_norm),
# then Dropout2d 0.1, BatchNorm and one 1x1 conv (mmvit_ext.BNLinearHead); AdamW lr 1e-3, wd 1e-3,
# 1500 warm-up iterations then cosine to 0 over 40k, 16 images per step (8 GPUs x 2), mmseg's
# ADE20K augmentation (random scale 0.5-2 of 512 px, 512 crop with cat_max_ratio 0.75, flip,
# photometric distortion: the official set), slide test 512 / stride 341, float32.
# Published (DINOv3 paper, arXiv 2508.10104, ViT-L distilled): 54.9 mIoU.
# Training-time RoPE: not used (the trunk is frozen, in eval mode: no coordinate draws).
# Weights: the official dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth at checkpoints/ (the file
# name of dinov3/hub/backbones.py; auto-detected layout).
_base_ = '../_base_/fpn_40k.py'
custom_imports = dict(imports=['mmvit_ext', 'mmvit_ext.heads'], allow_failed_imports=False)

depth, dims = 24, 1024
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.VisionTransformer',
        arch='dinov3_vitl16',
        out_indices=(depth - 1,),
        simple_pyramid=False,
        out_norm=True,  # the official get_intermediate_layers(norm=True)
        patch_bias=True,  # the official patch projection's (mmseg's default: none)
        # the whole trunk frozen, its output norm too, as the official requires_grad_(False):
        # mmpretrain's frozen_stages=depth (mmseg's leaves the output norm trainable)
        peer='mmpretrain',
        out_type='featmap',
        frozen_stages=depth,
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth')),
    neck=None,
    decode_head=dict(
        _delete_=True,
        type='mmvit_ext.BNLinearHead',
        in_channels=[dims],
        in_index=[0],
        input_transform='resize_concat',
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    test_cfg=dict(mode='slide', crop_size=(512, 512), stride=(341, 341)))

optim_wrapper = dict(optimizer=dict(lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-3),
                     paramwise_cfg=dict(_delete_=True))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=False, begin=1500, end=40000),
]
# mmseg's ADE20K pipeline with the official hue range: dinov3/eval/segmentation/transforms.py
# PhotoMetricDistortion shifts hue by a factor uniform in [-0.5, 0.5] of the hue circle
# (torchvision adjust_hue); mmseg's hue_delta counts OpenCV's uint8 hue units (180 per circle), so
# 90 is the same range (mmseg's default 18 is one fifth of it), drawn in whole 2-degree steps
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=(512, 512), cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion', hue_delta=90),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
