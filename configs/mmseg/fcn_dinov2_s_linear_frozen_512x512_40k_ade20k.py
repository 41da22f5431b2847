# Frozen DINOv2 ViT-S/14 with a linear head on ADE20K, 512x512, 40k iterations (the DINOv2
# paper's linear evaluation: the backbone frozen, the patch tokens of the last four blocks
# upsampled, concatenated and classified per pixel by one 1x1 conv). 512 px pads to 518, the
# 37x37 pretraining grid. Published (DINOv2 paper, ViT-S/14): 44.3 mIoU linear (last block),
# 47.2 "+ms" (last four blocks, 640 px, multi-scale test); this config: four blocks, single scale.
# Weights: the official dinov2_vits14_pretrain.pth at checkpoints/ (auto-detected).
_base_ = '../_base_/fpn_40k.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.VisionTransformer',
        arch='dinov2_s',
        out_indices=(8, 9, 10, 11),
        with_cls_token=True,
        window_size=None,
        simple_pyramid=False,
        final_norm=False,
        frozen_stages=12,
        patch_bias=True,  # the timm / official weights' (mmseg's default: none)
        norm_cfg=dict(type='LN', eps=1e-6),  # theirs (mmseg's default: 1e-5)
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/dinov2_vits14_pretrain.pth')),
    neck=None,
    decode_head=dict(
        _delete_=True,
        type='FCNHead',
        in_channels=[384, 384, 384, 384],
        in_index=[0, 1, 2, 3],
        input_transform='resize_concat',
        channels=1536,
        num_convs=0,
        concat_input=False,
        dropout_ratio=0.0,
        num_classes=150,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)))
optim_wrapper = dict(optimizer=dict(lr=1e-3))
