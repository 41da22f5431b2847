# Semantic FPN + PVTv2-b0 on the built-in ADE20K-format demo set (tools/make_ade_demo_data.py):
# mmseg's Semantic FPN, our backbone trained from scratch (no weights can be downloaded here),
# 10 texture classes at 128 px, mmseg's IterBasedTrainLoop and IoUMetric, sized so a 2-core CPU
# trains and evaluates it in a few minutes. The data is read in the ADE20K conventions
# (.jpg / .png, reduce_zero_label: label 0 = ignore); the class names are the demo's own, so the
# dataset is mmseg's BaseSegDataset (ADE20KDataset only accepts a subset of its 150 names).
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

data_root = 'data/demo_ade/ADEChallengeData2016'
metainfo = dict(
    classes=('hstripes', 'vstripes', 'dstripes', 'checkers', 'dots', 'crosshatch', 'rings',
             'waves', 'blobs', 'grain'),
    palette=[(230, 60, 50), (40, 110, 230), (250, 200, 40), (30, 30, 30), (60, 190, 80),
             (170, 60, 200), (250, 140, 30), (20, 180, 190), (120, 80, 40), (200, 200, 200)])
num_classes = 10
crop_size = (128, 128)
norm_cfg = dict(type='BN', requires_grad=True)  # one CPU process: plain BatchNorm

data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.PyramidVisionTransformerV2',
        arch='b0',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.0,
        init_cfg=None),
    neck=dict(in_channels=[32, 64, 160, 256], out_channels=64),
    decode_head=dict(in_channels=[64, 64, 64, 64], channels=64, num_classes=num_classes,
                     norm_cfg=norm_cfg))

dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo,
               img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=True)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=crop_size, ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=crop_size, keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=8, num_workers=1, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(**dataset, pipeline=train_pipeline,
                 data_prefix=dict(img_path='images/training',
                                  seg_map_path='annotations/training')))
val_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(**dataset, pipeline=test_pipeline,
                 data_prefix=dict(img_path='images/validation',
                                  seg_map_path='annotations/validation')))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

max_iters = 400
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01),
    clip_grad=dict(max_norm=5.0, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=30, end=max_iters, by_epoch=False),
]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters, max_keep_ckpts=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
env_cfg = dict(cudnn_benchmark=False)
randomness = dict(seed=0)
