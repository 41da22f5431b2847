# ImageNet-1k classifier, SwinTransformer base, the shared 224x224 recipe (drop path 0.5).
_base_ = '../_base_/cls_in1k.py'

model = dict(
    backbone=dict(type='mmvit_ext.SwinTransformer', arch='base',
                  drop_path_rate=0.5, out_indices=(3,),
                  # our semantics in mmpretrain's scope: a map shorter than the window
                  # shrinks it, as in the official Swin (docs/peer_semantics.md)
                  peer='mmvit_ext'),
    head=dict(in_channels=1024))
