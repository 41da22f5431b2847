# UperNet, Swin-S, ADE20K 512x512, 160k (Swin paper recipe). Weights: official
# swin_small_patch4_window7_224.pth.
_base_ = '../_base_/upernet_160k.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.SwinTransformer', arch='small', window_size=7,
        drop_path_rate=0.3, out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/swin_small_patch4_window7_224.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
