# EoMT-L (DINOv3 ViT-L/16, LVD-1689M) for COCO panoptic segmentation at 640: the official
# configs/dinov3/coco/panoptic/eomt_large_640.yaml (tue-mps/eomt), the DINOv2 form's recipe
# (./eomt_dinov2_l_640_coco_panoptic.py) with lr 2e-4, the query blocks at the full lr
# (llrd_l2_enabled False: decay_query_blocks=False; layer decay 0.8 below them), warm-up 2000
# (heads) then 3000 (trunk) iterations, masks annealed per query block from 0 / 29564 / 44346 /
# 59128 to 3000 / 44346 / 59128 / 73910 iterations.
# Trunk weights: dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth (dinov3/hub/backbones.py; patch 16
# and 4 storage tokens, the DINOv2 form's arguments, are the preset's own). Published: 56.8 PQ
# (tue-mps/coco_panoptic_eomt_large_640_dinov3), released as deltas to the DINOv3 weights
# (EoMT.load_trunk_deltas; docs/model_zoo.md).
_base_ = './eomt_dinov2_l_640_coco_panoptic.py'

model = dict(backbone=dict(
    arch='dinov3_vitl16', decay_query_blocks=False,
    # the official trunk is transformers' DINOv3ViTModel (pos_embed_rescale 2.0): in training
    # RoPE coordinates rescaled by a log-uniform factor in [1/2, 2], one draw per forward
    rope=dict(rescale_coords=2.0),
    init_cfg=dict(checkpoint='checkpoints/dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth')))
optim_wrapper = dict(optimizer=dict(lr=2e-4))
param_scheduler = [dict(_base_.param_scheduler[0], warmup_iters=(2000, 3000))]
custom_hooks = [dict(_base_.custom_hooks[0], start_iters=[0, 29564, 44346, 59128],
                     end_iters=[3000, 44346, 59128, 73910])]
