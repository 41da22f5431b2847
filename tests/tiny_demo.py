"""The demo Mask R-CNN at toy width (PVTv2 of 16-64 channels, one block a stage) for tests that
run tools/train.py: ``CONFIG.format(base=<the demo config>, data=<a generate_demo_coco root>)``."""

CONFIG = """
_base_ = '{base}'
data_root = '{data}/'
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=(16, 32, 40, 64), depths=(1, 1, 1, 1),
                            num_heads=(1, 2, 5, 8)), drop_path_rate=0.2),
    neck=dict(in_channels=[16, 32, 40, 64], out_channels=32),
    rpn_head=dict(in_channels=32, feat_channels=32),
    roi_head=dict(bbox_roi_extractor=dict(out_channels=32),
                  bbox_head=dict(in_channels=32, fc_out_channels=64),
                  mask_roi_extractor=dict(out_channels=32),
                  mask_head=dict(in_channels=32, conv_out_channels=32)),
    train_cfg=dict(rpn_proposal=dict(nms_pre=200, max_per_img=100),
                   rcnn=dict(sampler=dict(num=32))))
train_dataloader = dict(batch_size=2, dataset=dict(data_root=data_root))
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
train_cfg = dict(max_epochs=3, val_interval=100)
default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=-1), logger=dict(interval=1))
randomness = dict(seed=0, deterministic=True)
"""
