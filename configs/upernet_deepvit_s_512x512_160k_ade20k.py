# UperNet with our DeepViT-S on ADE20K, 512x512 crops, 160k iterations (AdamW lr 6e-5, wd 0.01,
# poly schedule with a 1500-iteration warm-up). Windowed trunk + simple feature pyramid.
_base_ = [
    'mmseg::_base_/models/upernet_swin.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
]
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

crop_size = (512, 512)
pretrained = 'checkpoints/deepvit_s.pth.tar'
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.DeepViT',
        arch='s',
        drop_path_rate=0.1,
        window_size=14,
        simple_pyramid=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[99, 198, 396, 396], num_classes=150),
    auxiliary_head=dict(in_channels=396, num_classes=150))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={
        'pos_embed': dict(decay_mult=0.0),
        'cls_token': dict(decay_mult=0.0),
        'norm': dict(decay_mult=0.0),
        'gamma': dict(decay_mult=0.0),
    }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
