# UperNet, DINOv3 ConvNeXt-T (distilled from the ViT-7B), ADE20K 512x512, 160k (the Swin UperNet
# recipe, drop path 0.4 as the ConvNeXt paper's UperNet-T; DINOv3 publishes no ConvNeXt
# segmentor). Weights: official dinov3_convnext_tiny_pretrain_lvd1689m-21b726bb.pth
# (facebookresearch/dinov3 `dinov3/hub/backbones.py`).
_base_ = '../_base_/upernet_160k.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.ConvNeXt', arch='dinov3_convnext_tiny',
        drop_path_rate=0.4, out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/dinov3_convnext_tiny_pretrain_lvd1689m-21b726bb.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
