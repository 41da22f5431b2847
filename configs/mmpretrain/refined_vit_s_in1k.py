# ImageNet-1k classifier with our Refined-ViT-S (mmpretrain): the DeepViT-S recipe, backbone swapped.
_base_ = './deepvit_s_in1k.py'

model = dict(backbone=dict(type='mmvit_ext.RefinedViT', arch='s'), head=dict(in_channels=384))
