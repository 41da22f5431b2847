# Shared ImageNet-1k recipe (DeiT / Swin / PVTv2 / CaiT papers): 224x224, RandAugment, Mixup 0.8 /
# CutMix 1.0, label smoothing 0.1, AdamW lr 1e-3 for 1024 images (8 GPUs x 128), wd 0.05, no decay
# on norms / biases / position tables / class tokens / layer-scale gammas, cosine over 300 epochs
# with 20 warm-up epochs. A child sets the backbone, the neck (None for class-token models) and
# `head.in_channels`.
_base_ = ['mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
          'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
          'mmpretrain::_base_/default_runtime.py']
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.0),
        dict(type='Constant', layer='LayerNorm', val=1.0, bias=0.0),
    ],
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={
    '.pos_embed': dict(decay_mult=0.0),
    '.cls_token': dict(decay_mult=0.0),
    '.gamma': dict(decay_mult=0.0),
}))
train_dataloader = dict(batch_size=128)
