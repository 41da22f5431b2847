# The headline model on the built-in demo data (tools/make_demo_data.py): the same Mask R-CNN
# PVTv2-b2 as configs/mask_rcnn_pvtv2_b2.py, trained from scratch (no weights can be downloaded
# here) on 5 synthetic shape classes at 192 px, sized so that a 2-core CPU trains and evaluates
# it in about ten minutes. Seeded; tools/demo.sh adds randomness.deterministic=True on CPU (two
# runs print the same table).
_base_ = '../mask_rcnn_pvtv2_b2.py'

data_root = 'data/demo_shapes/'
metainfo = dict(
    classes=('circle', 'square', 'triangle', 'star', 'hexagon'),
    palette=[(220, 20, 60), (0, 128, 255), (60, 180, 75), (255, 165, 0), (145, 30, 180)])
image_scale = (192, 192)
num_classes = 5

# A CPU budget: fewer proposals and sampled RoIs per image (RoIAlign backward dominates a CPU
# step), torchvision's RoIAlign (same maths as mmcv's, faster on CPU); no drop path in a run
# this short.
roi_layer = dict(type='RoIAlign', sampling_ratio=0, use_torchvision=True)
model = dict(
    backbone=dict(drop_path_rate=0.0, init_cfg=None),
    roi_head=dict(bbox_roi_extractor=dict(roi_layer=dict(roi_layer, output_size=7)),
                  mask_roi_extractor=dict(roi_layer=dict(roi_layer, output_size=14)),
                  bbox_head=dict(num_classes=num_classes),
                  mask_head=dict(num_classes=num_classes)),
    train_cfg=dict(rpn_proposal=dict(nms_pre=1000, max_per_img=300),
                   rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=100)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_train.json', data_prefix=dict(img='train/'),
                 filter_cfg=dict(filter_empty_gt=True, min_size=8), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2, num_workers=1, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_val.json', data_prefix=dict(img='val/'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json', classwise=True)
test_evaluator = val_evaluator

# 128 train images / batch 4 = 32 iterations per epoch
max_epochs = 6
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=40),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=max_epochs, T_max=max_epochs,
         eta_min=1e-5, convert_to_iter_based=True),
]
# from scratch and short: a higher lr than the 1x recipe, annealed to the end
optim_wrapper = dict(optimizer=dict(lr=1e-3), clip_grad=dict(max_norm=5.0, norm_type=2),
                     paramwise_cfg=dict(_delete_=True))
default_hooks = dict(checkpoint=dict(interval=max_epochs, max_keep_ckpts=1),
                     logger=dict(interval=16))
auto_scale_lr = dict(enable=False, base_batch_size=4)
# seeded only: on CUDA mmcv's RoI ops sum gradients with atomicAdd; tools/demo.sh asks
# deterministic=True on CPU, where every kernel is deterministic
randomness = dict(seed=0, deterministic=False)
