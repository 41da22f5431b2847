# Shared detection recipe (Swin / PVTv2 papers): AdamW lr 1e-4, betas (0.9, 0.999), wd 0.05 (PVTv2
# configs set 1e-4), no decay on norms / position tables, 1000-iteration linear warm-up, 12
# epochs with steps at 8 and 11, 16 images per step (8 GPUs x 2); `--auto-scale-lr` rescales lr.
_base_ = ['mmdet::_base_/schedules/schedule_1x.py', 'mmdet::_base_/default_runtime.py']
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.0),
        'relative_position_bias_table': dict(decay_mult=0.0),
        'pos_embed': dict(decay_mult=0.0),
        'cls_token': dict(decay_mult=0.0),
        'norm': dict(decay_mult=0.0),
    }))
auto_scale_lr = dict(enable=False, base_batch_size=16)
