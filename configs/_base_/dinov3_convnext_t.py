# The DINOv3 ConvNeXt-T backbone of the dense ConvNeXt configs (distilled from the ViT-7B;
# drop path 0.4 as the ConvNeXt paper's T). Weights: official
# dinov3_convnext_tiny_pretrain_lvd1689m-21b726bb.pth (facebookresearch/dinov3
# `dinov3/hub/backbones.py`); the ImageNet mean / std of mmdet's and mmseg's data_preprocessor
# is the one the LVD-1689M models take.
dinov3_convnext_t = dict(
    _delete_=True, type='mmvit_ext.ConvNeXt', arch='dinov3_convnext_tiny', drop_path_rate=0.4,
    out_indices=(0, 1, 2, 3),
    init_cfg=dict(type='Pretrained',
                  checkpoint='checkpoints/dinov3_convnext_tiny_pretrain_lvd1689m-21b726bb.pth'))
