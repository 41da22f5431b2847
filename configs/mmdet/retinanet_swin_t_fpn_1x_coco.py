# RetinaNet + FPN, Swin-T, COCO 1x (strides 8-32: out_indices (1, 2, 3), as mmdet). Weights:
# official swin_tiny_patch4_window7_224.pth.
_base_ = '../_base_/retinanet_1x.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.SwinTransformer', arch='tiny', window_size=7,
        drop_path_rate=0.2, out_indices=(1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/swin_tiny_patch4_window7_224.pth')),
    neck=dict(in_channels=[192, 384, 768], start_level=0, num_outs=5))
