# UperNet with our Swin-T on ADE20K, 512x512 crops, 160k iterations: the Swin paper's
# segmentation recipe (AdamW lr 6e-5, wd 0.01, poly schedule, 1500-iter warm-up, drop path 0.3).
_base_ = './_base_/upernet_160k.py'

pretrained = 'checkpoints/swin_tiny_patch4_window7_224.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.SwinTransformer',
        arch='tiny',
        window_size=7,
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
