# Mask R-CNN + FPN with a ViTDet-style ViT-B (Li et al., 2022) on COCO, 1x schedule: MAE
# ImageNet-1k initialisation, 14x14 windows with global attention in blocks 2, 5, 8, 11,
# decomposed relative positions in every block, no class token, no final norm, drop path 0.1,
# layer-wise lr decay 0.7, the built-in simple pyramid (strides 4/8/16/32) under the stock FPN.
# Published ViTDet ViT-B Mask R-CNN: 51.6 box / 45.9 mask AP (detectron2 ViTDet, 100 epochs of
# large-scale jitter at 1024 px; this config keeps the shared 1x recipe).
# Weights: the official MAE encoder at checkpoints/mae_pretrain_vit_base.pth (auto-detected; its
# 14x14 position embedding is resized to the input on the fly).
_base_ = ['../_base_/mask_rcnn_1x.py', '../_base_/layer_decay.py']

pretrained = 'checkpoints/mae_pretrain_vit_base.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.VisionTransformer',
        arch='mae_b',
        drop_path_rate=0.1,
        window_size=14,
        global_blocks=(2, 5, 8, 11),
        use_rel_pos=True,
        with_cls_token=False,
        final_norm=False,
        simple_pyramid=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[192, 384, 768, 768]))

# ViTDet: layer decay 0.7 over the 12 blocks; no decay on norms, position tables and rel-pos
optim_wrapper = _base_.layer_decay_optim_wrapper
optim_wrapper['paramwise_cfg'].update(layer_decay_rate=0.7)
optim_wrapper['paramwise_cfg']['custom_keys'].update(rel_pos=dict(decay_mult=0.0))
