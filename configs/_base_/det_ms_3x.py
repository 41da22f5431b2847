# Shared 3x multi-scale detection recipe (mmdet's Swin "ms-crop-3x", from DETR / Sparse R-CNN):
# COCO instances, random short side 480-800 or a 384x600 crop, 36 epochs, steps at 27 and 33.
_base_ = ['mmdet::_base_/datasets/coco_instance.py', './det_adamw_1x.py']

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomChoice', transforms=[
        [dict(type='RandomChoiceResize',
              scales=[(480, 1333), (512, 1333), (544, 1333), (576, 1333), (608, 1333),
                      (640, 1333), (672, 1333), (704, 1333), (736, 1333), (768, 1333),
                      (800, 1333)],
              keep_ratio=True)],
        [dict(type='RandomChoiceResize', scales=[(400, 1333), (500, 1333), (600, 1333)],
              keep_ratio=True),
         dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
              allow_negative_crop=True),
         dict(type='RandomChoiceResize',
              scales=[(480, 1333), (512, 1333), (544, 1333), (576, 1333), (608, 1333),
                      (640, 1333), (672, 1333), (704, 1333), (736, 1333), (768, 1333),
                      (800, 1333)],
              keep_ratio=True)],
    ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
         gamma=0.1),
]
