# Semantic FPN, PVTv2-b2_li, ADE20K 512x512, 40k (PVTv2 paper recipe). Weights: official
# pvt_v2_b2_li.pth.
_base_ = '../_base_/fpn_40k.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.PyramidVisionTransformerV2', arch='b2_li',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pvt_v2_b2_li.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
