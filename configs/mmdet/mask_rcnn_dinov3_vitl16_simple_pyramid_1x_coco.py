# Mask R-CNN + FPN on COCO, 1x, with a fine-tuned DINOv3 ViT-L/16 (distilled, LVD-1689M) in the
# ViTDet layout (Li et al., 2022): the last block's stride-16 map resampled by the built-in simple
# pyramid (strides 4/8/16/32) under the stock FPN, global RoPE attention in every block (a RoPE
# trunk takes no windows), the class and 4 storage tokens run through the trunk, no final norm,
# drop path 0.4 and layer-wise lr decay 0.8 (ViTDet's ViT-L settings). Training-time RoPE: used,
# rescale_coords=2, the hub model's own setting (dinov3/hub/backbones.py: what the official model
# draws in training mode), a fresh draw per block in training, none at test.
# Published: none for this recipe. DINOv3's own COCO detector is Plain-DETR on the frozen ViT-7B
# (hub name dinov3_vit7b16_de, head weights dinov3_vit7b16_coco2017_detr_head-b0235ff7.pth):
# 66.1 box mAP on val2017 (DINOv3 paper, arXiv 2508.10104): another detector, trunk and schedule.
# Weights: the official dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth at checkpoints/ (the file
# name of dinov3/hub/backbones.py; auto-detected layout).
_base_ = ['../_base_/mask_rcnn_1x.py', '../_base_/layer_decay.py']

pretrained = 'checkpoints/dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth'
dims = 1024
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.VisionTransformer',
        arch='dinov3_vitl16',
        drop_path_rate=0.4,
        window_size=None,
        final_norm=False,
        patch_bias=True,
        simple_pyramid=True,
        rope=dict(rescale_coords=2.0),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[dims // 4, dims // 2, dims, dims]))

# ViTDet ViT-L: layer decay 0.8 over the 24 blocks; no decay on norms, tokens and LayerScale
optim_wrapper = _base_.layer_decay_optim_wrapper
optim_wrapper['paramwise_cfg'].update(layer_decay_rate=0.8)
optim_wrapper['paramwise_cfg']['custom_keys'].update(register_tokens=dict(decay_mult=0.0))
