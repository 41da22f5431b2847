# ImageNet-1k classifier with our Refined-ViT-S (mmpretrain), DeiT/Swin-style recipe: 224x224, batch
# 1024 (8 GPUs x 128), AdamW lr 1e-3, wd 0.05, cosine, 300 epochs, Mixup/CutMix, label smoothing.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(type='mmvit_ext.RefinedViT', arch='s', out_type='cls_token', drop_path_rate=0.1),
    neck=None,
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=384,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.0),
        dict(type='Constant', layer='LayerNorm', val=1.0, bias=0.0),
    ],
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))
train_dataloader = dict(batch_size=128)
