# EoMT semantic segmentation on ADE20K at 512x512, the official recipe (tue-mps/eomt:
# training/mask_classification_semantic.py, lightning_module.py, main.py,
# datasets/ade20k_semantic.py): 100 queries in the last 4 blocks, Mask2Former's loss on the 5
# predictions (mmdet's pieces: Hungarian matching on 12544 points, class CE x2 with no-object
# 0.1, mask BCE x5 and dice x5 on importance-sampled points), EoMT's optimisation
# (./eomt_schedule.py: AdamW with layer decay, two-stage warm-up + poly, mask annealing, fp16,
# clipping), 16 images per step. Augmentation: scale jitter 0.5-2 of 512 (keep ratio), 512
# crop, flip, photometric distortion (the official set); inference: the official evenly
# overlapping 512 windows along the long side of the image resized to a 512 short side
# (test_cfg mode 'window').
# A config sets: arch / trunk arguments (model.backbone), lr / layer_decay_rate, and the
# run's lengths: param_scheduler and custom_hooks from eomt_lr_schedule / eomt_mask_annealing
# (./eomt_schedule.py; this file leaves them in _base_ for it), warm-up, annealing steps and
# the iteration count.
_base_ = ['mmseg::mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py',
          './eomt_schedule.py']
custom_imports = dict(imports=['mmvit_ext', 'mmvit_ext.models.eomt_seg'],
                      allow_failed_imports=False)

num_classes, num_queries, crop_size = 150, 100, (512, 512)
data_preprocessor = dict(
    type='SegDataPreProcessor', mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True, pad_val=0, seg_pad_val=255, size=crop_size, test_cfg=None)
model = dict(
    _delete_=True,
    type='mmvit_ext.EoMTSegmentor',
    data_preprocessor=data_preprocessor,
    backbone=dict(type='mmvit_ext.EoMT', num_classes=num_classes, num_queries=num_queries,
                  num_blocks=4, img_size=crop_size),
    decode_head=dict(type='mmvit_ext.EoMTSemanticHead', num_classes=num_classes,
                     num_queries=num_queries, no_object_weight=0.1),
    train_cfg=dict(),
    test_cfg=dict(mode='window'))  # windows of the training crop (data_preprocessor.size)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=crop_size, ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(8192, 512), keep_ratio=True),  # the short side to 512
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(batch_size=16, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(batch_size=1, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = _base_.pop('eomt_optim_wrapper')
