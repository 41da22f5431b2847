# ImageNet-1k classifier, CaiT m36, the shared 224x224 recipe (drop path 0.3).
_base_ = '../_base_/cls_in1k.py'

model = dict(
    backbone=dict(type='mmvit_ext.CaiT', arch='m36', out_type='cls_token', drop_path_rate=0.3),
    neck=None, head=dict(in_channels=768))
