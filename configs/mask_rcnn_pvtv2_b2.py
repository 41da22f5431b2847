# Mask R-CNN + FPN with our PVTv2-b2 on COCO, the PVTv2 paper's 1x recipe:
# AdamW lr 1e-4, weight decay 1e-4, 12 epochs, 16 images per step (8 GPUs x 2).
# Data: COCO 2017 at data/coco/. Weights: the official ImageNet-1k pvt_v2_b2.pth (whai362/PVT
# release v2), placed at checkpoints/pvt_v2_b2.pth; loaded and converted as it is.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
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
# the recipe's total batch; `--auto-scale-lr` rescales lr for another GPU count
auto_scale_lr = dict(enable=False, base_batch_size=16)
