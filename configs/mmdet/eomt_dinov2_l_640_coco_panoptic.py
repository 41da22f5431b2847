# EoMT-L (DINOv2 with registers, patch 16) for COCO panoptic segmentation at 640: the official
# configs/dinov2/coco/panoptic/eomt_large_640.yaml (tue-mps/eomt), whose recipe is the COCO
# instance one (./eomt_dinov2_l_640_coco_instance.py: the network with 200 queries in the last
# 4 blocks, the same annealing steps, lr, layer decay, warm-up, 12 epochs, large-scale jitter
# and 640 crop) on COCO panoptic: 133 classes, the 80 things then the 53 stuff classes (the
# official stuff_classes 80-132), every segment a target, validation every epoch
# (training/mask_classification_panoptic.py). mmdet's data as its own
# mask2former_r50_8xb2-lsj-50e_coco-panoptic.py gives it: CocoPanopticDataset,
# LoadPanopticAnnotations (the segment map padded with 255), CocoPanopticMetric. Inference: the
# official panoptic one (mask_thresh 0.8, overlap_thresh 0.8: queries kept above score 0.8,
# segments dropped below 0.8 of their mask, stuff merged per class) is mmdet's
# MaskFormerFusionHead with object_mask_thr=0.8, iou_thr=0.8, filter_low_score=True. Needs
# panopticapi, as mmdet's panoptic configs do (its loading and metric import it):
# pip install git+https://github.com/cocodataset/panopticapi.git
# Weights: the instance config's trunk; the published model (56.0 PQ) is
# tue-mps/coco_panoptic_eomt_large_640 (docs/model_zoo.md).
_base_ = './eomt_dinov2_l_640_coco_instance.py'

num_stuff_classes = 53
num_classes = 80 + num_stuff_classes
dataset_type = 'CocoPanopticDataset'
# padded to a multiple of 32 as the instance config (mmdet's 1024 pad left out here too)
data_preprocessor = dict(pad_seg=True, seg_pad_value=255, batch_augments=None)
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(num_classes=num_classes),
    panoptic_head=dict(num_stuff_classes=num_stuff_classes),
    panoptic_fusion_head=dict(num_stuff_classes=num_stuff_classes),
    test_cfg=dict(panoptic_on=True, instance_on=False, object_mask_thr=0.8))

# the instance pipelines with the panoptic annotations (thing masks and the segment map); a crop
# left with stuff only is kept (the official filter drops a crop with no segment at all)
train_pipeline = [
    dict(step, type='LoadPanopticAnnotations', with_seg=True) if step.type == 'LoadAnnotations'
    else dict(step, keep_empty=False) if step.type == 'FilterAnnotations' else step
    for step in _base_.train_pipeline]
test_pipeline = [
    dict(step, type='LoadPanopticAnnotations', with_seg=True) if step.type == 'LoadAnnotations'
    else step for step in _base_.test_pipeline]
train_dataloader = dict(dataset=dict(
    type=dataset_type, ann_file='annotations/panoptic_train2017.json',
    data_prefix=dict(img='train2017/', seg='annotations/panoptic_train2017/'),
    pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(
    type=dataset_type, ann_file='annotations/panoptic_val2017.json',
    data_prefix=dict(img='val2017/', seg='annotations/panoptic_val2017/'),
    pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(
    _delete_=True, type='CocoPanopticMetric',
    ann_file='data/coco/annotations/panoptic_val2017.json',
    seg_prefix='data/coco/annotations/panoptic_val2017/', backend_args=None)
test_evaluator = val_evaluator
train_cfg = dict(val_interval=7391)  # every epoch
