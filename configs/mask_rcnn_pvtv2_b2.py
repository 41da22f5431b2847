# Mask R-CNN + FPN with our PVTv2-b2 on COCO, 1x: AdamW lr 1e-4, weight decay 1e-4, 12 epochs,
# 16 images per step (8 GPUs x 2). The upstream config behind the published 45.3 / 41.2
# (whai362/PVT detection/configs/mask_rcnn_pvt_v2_b2_fpn_1x_coco.py) uses lr 2e-4: recipe differs.
# Data: COCO 2017 at data/coco/. Weights: the official ImageNet-1k pvt_v2_b2.pth (whai362/PVT
# release v2), placed at checkpoints/pvt_v2_b2.pth; loaded and converted as it is.
_base_ = './_base_/mask_rcnn_1x.py'  # shared 1x recipe: AdamW, no decay on norms, warm-up, 8/11 steps

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
