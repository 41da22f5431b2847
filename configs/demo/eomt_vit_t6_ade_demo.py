# EoMT on the built-in ADE20K-format demo set (tools/make_ade_demo_data.py): the segmentation
# demo's data, pipelines, IoUMetric, schedule and run settings (./fpn_pvtv2_b0_ade_demo.py) with
# EoMT in place of Semantic FPN + PVTv2-b0, trained from scratch (no weights can be downloaded
# here). Run: bash tools/seg_demo.sh configs/demo/eomt_vit_t6_ade_demo.py
# - trunk: a plain ViT with a class token, ViT-Ti's width (192, 3 heads) at half its depth (6),
#   patch 16 (an 8 x 8 token grid at 128 px); queries in the last 3 blocks; mask logits at
#   stride 4 (the official two scale blocks);
# - the official loss (mmdet's Mask2Former loss: Hungarian matching, class CE x2 with no-object
#   0.1, mask BCE x5 and dice x5 on importance-sampled points), the point count scaled to the
#   32 x 32 mask logits as the official 12544 is to its 128 x 128;
# - masked attention annealed per query block with the official spacing (block i from
#   (i + 1) / 4 to (i + 2) / 4 of the run, power 0.9), so the last iteration leaves every
#   probability at 0 and evaluation runs the plain pass;
# - AdamW with the official weight decay (0.05) and clipping (0.01); the demo's lr 1e-3 with
#   its linear warm-up + poly decay. No layer decay or two-stage warm-up: both protect a
#   pretrained trunk, and this one starts from random weights.
_base_ = './fpn_pvtv2_b0_ade_demo.py'
custom_imports = dict(imports=['mmvit_ext', 'mmvit_ext.models.eomt_seg'],
                      allow_failed_imports=False)

num_classes, num_queries, crop_size = 10, 20, (128, 128)
data_preprocessor = dict(
    type='SegDataPreProcessor', mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True, pad_val=0, seg_pad_val=255, size=crop_size)
model = dict(
    _delete_=True,
    type='mmvit_ext.EoMTSegmentor',
    data_preprocessor=data_preprocessor,
    backbone=dict(type='mmvit_ext.EoMT',
                  arch=dict(embed_dims=192, depth=6, num_heads=3, patch_size=16),
                  num_classes=num_classes, num_queries=num_queries, num_blocks=3,
                  img_size=crop_size),
    decode_head=dict(type='mmvit_ext.EoMTSemanticHead', num_classes=num_classes,
                     num_queries=num_queries, no_object_weight=0.1,
                     train_cfg=dict(num_points=12544 * 32 * 32 // (128 * 128))),
    train_cfg=dict(),
    test_cfg=dict(mode='window'))  # the official test: windows of the training crop

optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    clip_grad=dict(max_norm=0.01, norm_type=2))
custom_hooks = [dict(type='mmvit_ext.EoMTMaskAnnealingHook',  # over the base's 400 iterations
                     start_iters=[100, 200, 300], end_iters=[200, 300, 400], poly_power=0.9)]
