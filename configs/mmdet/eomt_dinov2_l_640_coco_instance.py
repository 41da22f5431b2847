# EoMT-L (DINOv2 with registers, patch 16) for COCO instance segmentation at 640: the official
# configs/dinov2/coco/instance/eomt_large_640.yaml (tue-mps/eomt) in mmdet's Mask2Former
# detector (mmvit_ext.models.eomt_det): 200 queries in the last 4 blocks, Mask2Former's loss on
# the 5 predictions, masks annealed per query block from 14782 / 29564 / 44346 / 59128 to
# 29564 / 44346 / 59128 / 73910 iterations, AdamW lr 1e-4 (weight decay 0.05 on every
# parameter), layer decay 0.8 over the 24 blocks, warm-up 500 (heads) then 1000 (trunk)
# iterations then poly 0.9, 12 epochs (7,391 iterations of 16 images each), fp16 AMP, gradient
# clipping at 0.01 (../_base_/eomt_schedule.py); large-scale jitter 0.1-2 of 640 with a 640
# crop and flip; the official instance inference (top 100 query x class scores,
# mask-probability rescoring: mmdet's MaskFormerFusionHead) on the image resized to a 640 long
# side.
# Weights: as configs/mmseg/eomt_dinov2_l_512x512_ade20k.py, the timm DINOv2-L built with patch 16
# (here at 640: vit_large_patch16_reg4_dinov2_640.pth); the published model (45.2 mAP,
# pycocotools) is tue-mps/coco_instance_eomt_large_640 (docs/model_zoo.md).
_base_ = ['mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py', '../_base_/eomt_schedule.py']
custom_imports = dict(imports=['mmvit_ext', 'mmvit_ext.models.eomt_det'],
                      allow_failed_imports=False)

num_things_classes, num_queries, image_size = 80, 200, (640, 640)
data_preprocessor = dict(
    type='DetDataPreprocessor', mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True, pad_size_divisor=32, pad_mask=True, mask_pad_value=0, pad_seg=False)
model = dict(
    _delete_=True,
    type='Mask2Former',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='mmvit_ext.EoMT', arch='dinov2_l', patch_size=16, reg_tokens=4,
        num_classes=num_things_classes, num_queries=num_queries, num_blocks=4,
        img_size=image_size,
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/vit_large_patch16_reg4_dinov2_640.pth')),
    panoptic_head=dict(type='mmvit_ext.EoMTPanopticHead', num_things_classes=num_things_classes,
                       num_stuff_classes=0, num_queries=num_queries, no_object_weight=0.1),
    panoptic_fusion_head=dict(type='MaskFormerFusionHead', num_things_classes=num_things_classes,
                              num_stuff_classes=0, loss_panoptic=None, init_cfg=None),
    train_cfg=dict(),
    test_cfg=dict(panoptic_on=False, semantic_on=False, instance_on=True, max_per_image=100,
                  iou_thr=0.8, filter_low_score=True),
    init_cfg=None)

train_pipeline = [
    dict(type='LoadImageFromFile', to_float32=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), resize_type='Resize',
         keep_ratio=True),
    dict(type='RandomCrop', crop_size=image_size, crop_type='absolute', recompute_bbox=True,
         allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-5, 1e-5), by_mask=True),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', to_float32=True),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                          'scale_factor')),
]
train_dataloader = dict(batch_size=16, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(batch_size=1, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

iters = 12 * 7391
optim_wrapper = _base_.pop('eomt_optim_wrapper')
param_scheduler = [dict(_base_.pop('eomt_lr_schedule'), total_iters=iters)]
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=iters,
                 val_interval=2 * 7391)
custom_hooks = [dict(_base_.pop('eomt_mask_annealing'),
                     start_iters=[14782, 29564, 44346, 59128],
                     end_iters=[29564, 44346, 59128, 73910])]
