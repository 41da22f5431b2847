# Mask R-CNN + FPN with our Refined-ViT-S on COCO, 1x: the DeepViT-S recipe (windowed trunk, simple
# pyramid, AdamW) with the backbone swapped. Weights: the official checkpoint at checkpoints/refiner_s.pth.tar.
_base_ = './mask_rcnn_deepvit_s_fpn_1x_coco.py'

pretrained = 'checkpoints/refiner_s.pth.tar'

model = dict(
    backbone=dict(type='mmvit_ext.RefinedViT', arch='s',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 384]))
