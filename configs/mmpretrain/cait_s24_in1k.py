# ImageNet-1k classifier with our CaiT-S24 (mmpretrain): the DeepViT-S recipe, backbone swapped.
_base_ = './deepvit_s_in1k.py'

model = dict(backbone=dict(type='mmvit_ext.CaiT', arch='s24'), head=dict(in_channels=384))
