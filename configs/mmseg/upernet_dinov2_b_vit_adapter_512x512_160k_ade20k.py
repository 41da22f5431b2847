# UperNet with a DINOv2 ViT-B trunk and ViT-Adapter on ADE20K, 512x512, 160k iterations: the
# DINOv2 weights run at patch 16 (their 14x14 patch kernel resized bicubically on load and the
# 37x37 position grid kept, as the official adapter's DINOv2 configs do), global attention,
# interactions after blocks [0-2] [3-5] [6-8] [9-11], 12 deformable heads, deform ratio 0.5; the
# recipe of the DeiT-B UperNet adapter config (layer decay 0.95, lr 6e-5, wd 0.01).
# No published figure for this combination (the official DINOv2 adapter configs are Mask R-CNN).
# Weights: checkpoints/dinov2_vitb14_pretrain.pth.
_base_ = './upernet_vit_adapter_b_512x512_160k_ade20k.py'

model = dict(
    backbone=dict(
        arch='dinov2_b',
        drop_path_rate=0.3,
        deform_num_heads=12,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/dinov2_vitb14_pretrain.pth')),
    decode_head=dict(in_channels=[768, 768, 768, 768]),
    auxiliary_head=dict(in_channels=768))
