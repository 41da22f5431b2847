# ImageNet-1k classifier, CaiT s36, the shared 224x224 recipe (drop path 0.2).
_base_ = '../_base_/cls_in1k.py'

model = dict(
    backbone=dict(type='mmvit_ext.CaiT', arch='s36', out_type='cls_token', drop_path_rate=0.2),
    neck=None, head=dict(in_channels=384))
