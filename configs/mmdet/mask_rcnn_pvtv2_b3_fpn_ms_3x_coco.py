# Mask R-CNN + FPN, PVTv2-b3, COCO 3x multi-scale. Weights: official pvt_v2_b3.pth
# (github.com/whai362/PVT/releases/download/v2).
_base_ = '../_base_/mask_rcnn_ms_3x.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.PyramidVisionTransformerV2', arch='b3', drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pvt_v2_b3.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
optim_wrapper = dict(optimizer=dict(weight_decay=1e-4))  # PVTv2 paper: wd 1e-4
