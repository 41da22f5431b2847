# EoMT-L (DINOv2 with registers, patch 16) on ADE20K, 512x512: the official
# configs/dinov2/ade20k/semantic/eomt_large_512.yaml (recipe: ../_base_/eomt_ade20k_512.py):
# lr 1e-4, layer decay 0.8 over all 24 blocks, warm-up 500 (heads) then 1000 (trunk) iterations,
# 31 epochs of ADE20K (20,210 images, 16 per step, the last batch kept: 1,264 iterations each),
# masks annealed per query block from 6520 / 13040 / 19560 / 26080 to 13040 / 19560 / 26080 /
# 32600 iterations.
# The official trunk is timm's vit_large_patch14_reg4_dinov2 built at img_size 512 with
# patch_size 16 (models/vit.py): timm resamples the patch kernel 14 -> 16 and the position grid
# 37 -> 32 when it loads the DINOv2 weights. For training, save that model's state dict
# (timm.create_model('vit_large_patch14_reg4_dinov2.lvd142m', pretrained=True, img_size=512,
# patch_size=16).state_dict()) as checkpoints/vit_large_patch16_reg4_dinov2_512.pth; the
# published model (58.4 mIoU, tue-mps/ade20k_semantic_eomt_large_512) loads as it is
# (docs/model_zoo.md).
_base_ = '../_base_/eomt_ade20k_512.py'

model = dict(backbone=dict(
    arch='dinov2_l', patch_size=16, reg_tokens=4,
    init_cfg=dict(type='Pretrained',
                  checkpoint='checkpoints/vit_large_patch16_reg4_dinov2_512.pth')))

iters = 31 * 1264
train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=iters // 8)
param_scheduler = [dict(_base_.pop('eomt_lr_schedule'), total_iters=iters)]
custom_hooks = [dict(_base_.pop('eomt_mask_annealing'), start_iters=[6520, 13040, 19560, 26080],
                     end_iters=[13040, 19560, 26080, 32600])]
