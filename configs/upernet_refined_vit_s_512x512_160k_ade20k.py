# UperNet with our Refined-ViT-S on ADE20K, 512x512, 160k: the DeepViT-S recipe with the backbone swapped.
_base_ = './upernet_deepvit_s_512x512_160k_ade20k.py'

pretrained = 'checkpoints/refiner_s.pth.tar'

model = dict(
    backbone=dict(type='mmvit_ext.RefinedViT', arch='s',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 384, 384]),
    auxiliary_head=dict(in_channels=384))
