# Shared UperNet recipe on ADE20K (Swin paper): 512x512 crops, AdamW lr 6e-5, wd 0.01, no decay on
# norms / position tables, 1500-iteration warm-up then poly (power 1), 160k iterations,
# 16 images per step (8 GPUs x 2). A child sets the backbone and the heads' in_channels.
_base_ = ['mmseg::_base_/models/upernet_swin.py', 'mmseg::_base_/datasets/ade20k.py',
          'mmseg::_base_/default_runtime.py', 'mmseg::_base_/schedules/schedule_160k.py']
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(data_preprocessor=data_preprocessor, pretrained=None,
             decode_head=dict(num_classes=150), auxiliary_head=dict(num_classes=150))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.0),
        'relative_position_bias_table': dict(decay_mult=0.0),
        'pos_embed': dict(decay_mult=0.0),
        'cls_token': dict(decay_mult=0.0),
        'norm': dict(decay_mult=0.0),
    }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
auto_scale_lr = dict(enable=False, base_batch_size=16)
