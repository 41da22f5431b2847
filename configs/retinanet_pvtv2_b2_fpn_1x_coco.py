# RetinaNet + FPN with our PVTv2-b2 on COCO, 1x (AdamW lr 1e-4, weight decay 1e-4, 16 images).
_base_ = './_base_/retinanet_1x.py'

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

optim_wrapper = dict(optimizer=dict(weight_decay=1e-4))  # PVTv2 paper: wd 1e-4
