# RetinaNet + FPN, COCO 1x (the shared AdamW recipe) on timm's ResNet-18 through
# mmvit_ext.TimmBackbone (docs/timm_backbone.md): any timm model name works the same way.
# Weights: timm's resnet18.a1_in1k (huggingface.co/timm/resnet18.a1_in1k, model.safetensors),
# read from the local file below; nothing is downloaded.
_base_ = '../_base_/retinanet_1x.py'

model = dict(
    backbone=dict(
        _delete_=True, type='mmvit_ext.TimmBackbone', model_name='resnet18',
        out_indices=(1, 2, 3, 4), frozen_stages=1, norm_eval=True,  # as mmdet's ResNet
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/resnet18.a1_in1k.safetensors')),
    neck=dict(in_channels=[64, 128, 256, 512]))
