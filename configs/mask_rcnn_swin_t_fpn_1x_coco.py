# Mask R-CNN + FPN with our Swin-T, COCO 1x: the Swin paper's detection recipe
# (AdamW lr 1e-4, wd 0.05, no decay on norms / position tables, drop path 0.2, 12 epochs).
_base_ = './_base_/mask_rcnn_1x.py'

# Official microsoft/Swin-Transformer ImageNet-1k weights, loaded and converted as they are.
pretrained = 'checkpoints/swin_tiny_patch4_window7_224.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.SwinTransformer',
        arch='tiny',
        window_size=7,
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))
