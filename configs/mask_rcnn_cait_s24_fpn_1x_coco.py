# Mask R-CNN + FPN with our CaiT-S24 on COCO, 1x schedule (12 epochs, 16 images per step).
# The plain-ViT trunk runs 14x14 window attention with global attention in a few blocks and a
# built-in simple feature pyramid (strides 4/8/16/32, ViTDet style), so the stock FPN takes it.
# Weights: the official ImageNet-1k checkpoint at checkpoints/S24_224.pth (auto-detected and converted;
# its position embedding is resized to the input on the fly).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

pretrained = 'checkpoints/S24_224.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.CaiT',
        arch='s24',
        drop_path_rate=0.1,
        window_size=14,
        simple_pyramid=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 384]))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={
        'pos_embed': dict(decay_mult=0.0),
        'cls_token': dict(decay_mult=0.0),
        'norm': dict(decay_mult=0.0),
        'gamma': dict(decay_mult=0.0),
    }))
auto_scale_lr = dict(enable=False, base_batch_size=16)
