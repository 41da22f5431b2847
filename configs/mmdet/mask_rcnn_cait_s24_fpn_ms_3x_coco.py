# Mask R-CNN + FPN, CaiT-S24 (windowed trunk + simple pyramid), COCO 3x multi-scale,
# layer-wise lr decay (ViTDet). Weights: official S24_224.pth.
_base_ = ['../_base_/mask_rcnn_ms_3x.py', '../_base_/layer_decay.py']

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.CaiT', arch='s24',
        drop_path_rate=0.1, window_size=14, simple_pyramid=True,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/S24_224.pth')),
    neck=dict(in_channels=[96, 192, 384, 384]))
optim_wrapper = _base_.layer_decay_optim_wrapper
