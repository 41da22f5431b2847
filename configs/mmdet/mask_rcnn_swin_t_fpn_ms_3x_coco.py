# Mask R-CNN + FPN, Swin-T, COCO 3x multi-scale. Weights: official swin_tiny_patch4_window7_224.pth
# (github.com/SwinTransformer/storage/releases/download/v1.0.0).
_base_ = '../_base_/mask_rcnn_ms_3x.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.SwinTransformer', arch='tiny', window_size=7,
        drop_path_rate=0.2, out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/swin_tiny_patch4_window7_224.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
