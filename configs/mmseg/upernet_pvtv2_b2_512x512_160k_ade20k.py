# UperNet, PVTv2-b2, ADE20K 512x512, 160k (the Swin UperNet recipe). Weights: official
# pvt_v2_b2.pth.
_base_ = '../_base_/upernet_160k.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.PyramidVisionTransformerV2', arch='b2', drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pvt_v2_b2.pth')),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))
