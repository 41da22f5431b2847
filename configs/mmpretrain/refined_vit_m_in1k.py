# ImageNet-1k classifier, RefinedViT m, the shared 224x224 recipe (drop path 0.1).
_base_ = '../_base_/cls_in1k.py'

model = dict(
    backbone=dict(type='mmvit_ext.RefinedViT', arch='m', out_type='cls_token', drop_path_rate=0.1),
    neck=None, head=dict(in_channels=420))
