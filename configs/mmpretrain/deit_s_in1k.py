# ImageNet-1k classifier, DeiT-S/16 (Touvron et al., 2021), the shared DeiT recipe (224x224,
# drop path 0.1). Published: 79.8 top-1 [DeiT].
_base_ = '../_base_/cls_in1k.py'

model = dict(
    backbone=dict(type='mmvit_ext.VisionTransformer', arch='deit-s', out_type='cls_token',
                  drop_path_rate=0.1),
    neck=None, head=dict(in_channels=384))
