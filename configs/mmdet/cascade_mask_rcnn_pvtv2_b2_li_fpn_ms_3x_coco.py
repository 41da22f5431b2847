# Cascade Mask R-CNN + FPN, PVTv2-b2_li, COCO 3x multi-scale (PVTv2 paper Tab. 4). Weights:
# official pvt_v2_b2_li.pth.
_base_ = '../_base_/cascade_mask_rcnn_ms_3x.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.PyramidVisionTransformerV2', arch='b2_li',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pvt_v2_b2_li.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
optim_wrapper = dict(optimizer=dict(weight_decay=1e-4))  # PVTv2 paper: wd 1e-4
