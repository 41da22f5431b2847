# Mask R-CNN + FPN with our Swin-T, COCO 1x: the Swin paper's detection recipe
# (AdamW lr 1e-4, wd 0.05, no decay on norms / position tables, drop path 0.2, 12 epochs).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

# Official microsoft/Swin-Transformer ImageNet-1k weights, loaded and converted as they are.
pretrained = 'checkpoints/swin_tiny_patch4_window7_224.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.SwinTransformer',
        arch='tiny',
        window_size=7,
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.0),
        'relative_position_bias_table': dict(decay_mult=0.0),
        'norm': dict(decay_mult=0.0),
    }))
# 8 GPUs x 2 images; --auto-scale-lr rescales the lr for other totals.
auto_scale_lr = dict(enable=False, base_batch_size=16)
