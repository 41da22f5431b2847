# Shared Semantic FPN recipe on ADE20K (PVT / PVTv2 papers): 512x512 crops, AdamW lr 1e-4,
# wd 1e-4, no decay on norms, poly schedule (power 0.9), 40k iterations, 16 images per step
# (8 GPUs x 2). A child sets the backbone and `neck.in_channels`.
_base_ = ['mmseg::_base_/models/fpn_r50.py', 'mmseg::_base_/datasets/ade20k.py',
          'mmseg::_base_/default_runtime.py', 'mmseg::_base_/schedules/schedule_40k.py']
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(data_preprocessor=data_preprocessor, pretrained=None,
             decode_head=dict(num_classes=150))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}))
param_scheduler = [
    dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=40000, by_epoch=False),
]
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
auto_scale_lr = dict(enable=False, base_batch_size=16)
