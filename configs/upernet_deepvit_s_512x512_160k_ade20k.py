# UperNet with our DeepViT-S on ADE20K, 512x512 crops, 160k iterations (AdamW lr 6e-5, wd 0.01,
# poly schedule with a 1500-iteration warm-up). Windowed trunk + simple feature pyramid.
_base_ = './_base_/upernet_160k.py'

pretrained = 'checkpoints/deepvit_s.pth.tar'
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.DeepViT',
        arch='s',
        drop_path_rate=0.1,
        window_size=14,
        simple_pyramid=True,
        # our windowed trunk in mmseg's scope, not mmseg ViT's defaults (docs/peer_semantics.md)
        peer='mmvit_ext',
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[99, 198, 396, 396]),
    auxiliary_head=dict(in_channels=396))
