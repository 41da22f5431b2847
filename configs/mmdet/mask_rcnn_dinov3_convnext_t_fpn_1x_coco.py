# Mask R-CNN + FPN, DINOv3 ConvNeXt-T (distilled from the ViT-7B), COCO 1x, the shared AdamW
# recipe (DINOv3 publishes no ConvNeXt detector). The backbone: ../_base_/dinov3_convnext_t.py.
_base_ = ['../_base_/mask_rcnn_1x.py', '../_base_/dinov3_convnext_t.py']

model = dict(backbone=_base_.dinov3_convnext_t, neck=dict(in_channels=[96, 192, 384, 768]))
