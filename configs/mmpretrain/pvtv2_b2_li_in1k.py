# ImageNet-1k classifier, PyramidVisionTransformerV2 b2_li, the shared 224x224 recipe (drop path
# 0.1).
_base_ = '../_base_/cls_in1k.py'

model = dict(
    backbone=dict(type='mmvit_ext.PyramidVisionTransformerV2', arch='b2_li',
                  drop_path_rate=0.1, out_indices=(3,)),
    head=dict(in_channels=512))
