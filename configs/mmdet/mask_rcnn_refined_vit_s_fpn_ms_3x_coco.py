# Mask R-CNN + FPN, RefinedViT-S (windowed trunk + simple pyramid), COCO 3x multi-scale,
# layer-wise lr decay (ViTDet). Weights: official refiner_s.pth.tar.
_base_ = ['../_base_/mask_rcnn_ms_3x.py', '../_base_/layer_decay.py']

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.RefinedViT', arch='s',
        drop_path_rate=0.1, window_size=14, simple_pyramid=True,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/refiner_s.pth.tar')),
    neck=dict(in_channels=[96, 192, 384, 384]))
optim_wrapper = _base_.layer_decay_optim_wrapper
