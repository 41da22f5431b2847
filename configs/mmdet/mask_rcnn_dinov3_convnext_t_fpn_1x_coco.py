# Mask R-CNN + FPN, DINOv3 ConvNeXt-T (distilled from the ViT-7B), COCO 1x, the shared AdamW
# recipe with the ConvNeXt paper's drop path 0.4 (DINOv3 publishes no ConvNeXt detector). Weights:
# official dinov3_convnext_tiny_pretrain_lvd1689m-21b726bb.pth (facebookresearch/dinov3
# `dinov3/hub/backbones.py`); the ImageNet mean / std of the base's data_preprocessor is the one
# the LVD-1689M models take.
_base_ = '../_base_/mask_rcnn_1x.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.ConvNeXt', arch='dinov3_convnext_tiny',
        drop_path_rate=0.4, out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/dinov3_convnext_tiny_pretrain_lvd1689m-21b726bb.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
