# Mask R-CNN + FPN with our CaiT-S24 on COCO, 1x: the DeepViT-S recipe (windowed trunk, simple
# pyramid, AdamW) with the backbone swapped. Weights: the official checkpoint at checkpoints/S24_224.pth.
_base_ = './mask_rcnn_deepvit_s_fpn_1x_coco.py'

pretrained = 'checkpoints/S24_224.pth'

model = dict(
    backbone=dict(type='mmvit_ext.CaiT', arch='s24',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 384]))
