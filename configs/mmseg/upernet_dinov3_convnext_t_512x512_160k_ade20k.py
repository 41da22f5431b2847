# UperNet, DINOv3 ConvNeXt-T (distilled from the ViT-7B), ADE20K 512x512, 160k (the Swin UperNet
# recipe; DINOv3 publishes no ConvNeXt segmentor). The backbone: ../_base_/dinov3_convnext_t.py.
_base_ = ['../_base_/upernet_160k.py', '../_base_/dinov3_convnext_t.py']

model = dict(backbone=_base_.dinov3_convnext_t,
             decode_head=dict(in_channels=[96, 192, 384, 768]),
             auxiliary_head=dict(in_channels=384))
