# RetinaNet + FPN with our PVTv2-b2 on COCO, 1x (AdamW lr 1e-4, weight decay 1e-4, 16 images).
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

pretrained = 'checkpoints/pvt_v2_b2.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.PyramidVisionTransformerV2',
        arch='b2',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, weight_decay=1e-4))
auto_scale_lr = dict(enable=False, base_batch_size=16)
