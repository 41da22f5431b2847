# EoMT-L (DINOv3 ViT-L/16, LVD-1689M) on ADE20K, 512x512: the official
# configs/dinov3/ade20k/semantic/eomt_large_512.yaml (recipe: ../_base_/eomt_ade20k_512.py):
# lr 2e-4, no layer decay (llrd 1.0), warm-up 2000 (heads) then 3000 (trunk) iterations,
# 16 epochs (1,264 iterations each), masks annealed per query block from 0 / 6520 / 9780 /
# 13040 to 3000 / 9780 / 13040 / 16300 iterations. The official lr_mult 0.1 changes nothing
# there (lightning_module.configure_optimizers applies it in a branch that never runs), so every
# parameter trains at 2e-4 here too.
# Trunk weights: dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth (dinov3/hub/backbones.py).
# Published: 59.5 mIoU (tue-mps/ade_semantic_eomt_large_512_dinov3), released as deltas to
# the DINOv3 weights (docs/model_zoo.md).
_base_ = '../_base_/eomt_ade20k_512.py'

model = dict(backbone=dict(
    arch='dinov3_vitl16',
    # the official trunk is transformers' DINOv3ViTModel (pos_embed_rescale 2.0): in training
    # RoPE coordinates rescaled by a log-uniform factor in [1/2, 2], one draw per forward
    rope=dict(rescale_coords=2.0),
    init_cfg=dict(type='Pretrained',
                  checkpoint='checkpoints/dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth')))

optim_wrapper = dict(optimizer=dict(lr=2e-4), paramwise_cfg=dict(layer_decay_rate=1.0))
iters = 16 * 1264
train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=iters // 8)
param_scheduler = [dict(_base_.pop('eomt_lr_schedule'), warmup_iters=(2000, 3000),
                        total_iters=iters)]
custom_hooks = [dict(_base_.pop('eomt_mask_annealing'), start_iters=[0, 6520, 9780, 13040],
                     end_iters=[3000, 9780, 13040, 16300])]
