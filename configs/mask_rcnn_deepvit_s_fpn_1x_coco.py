# Mask R-CNN + FPN with our DeepViT-S on COCO, 1x schedule (12 epochs, 16 images per step),
# layer-wise lr decay (ViTDet).
# The plain-ViT trunk runs 14x14 window attention with global attention in a few blocks and a
# built-in simple feature pyramid (strides 4/8/16/32, ViTDet style), so the stock FPN takes it.
# Weights: the official ImageNet-1k checkpoint at checkpoints/deepvit_s.pth.tar (auto-detected and converted;
# its position embedding is resized to the input on the fly).
_base_ = ['./_base_/mask_rcnn_1x.py', './_base_/layer_decay.py']

pretrained = 'checkpoints/deepvit_s.pth.tar'
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.DeepViT',
        arch='s',
        drop_path_rate=0.1,
        window_size=14,
        simple_pyramid=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[99, 198, 396, 396]))

# layer-wise lr decay 0.75 (ViTDet), AdamW, no decay on norms / position table / class token
optim_wrapper = _base_.layer_decay_optim_wrapper
