# Mask R-CNN + FPN, DeepViT-S (windowed trunk + simple pyramid), COCO 3x multi-scale,
# layer-wise lr decay (ViTDet). Weights: official deepvit_s.pth.tar.
_base_ = ['../_base_/mask_rcnn_ms_3x.py', '../_base_/layer_decay.py']

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.DeepViT', arch='s',
        drop_path_rate=0.1, window_size=14, simple_pyramid=True,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/deepvit_s.pth.tar')),
    neck=dict(in_channels=[99, 198, 396, 396]))
optim_wrapper = _base_.layer_decay_optim_wrapper
