# Semantic FPN, PVTv2-b1, ADE20K 512x512, 40k (PVTv2 paper recipe). Weights: official
# pvt_v2_b1.pth.
_base_ = '../_base_/fpn_40k.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.PyramidVisionTransformerV2', arch='b1', drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pvt_v2_b1.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
