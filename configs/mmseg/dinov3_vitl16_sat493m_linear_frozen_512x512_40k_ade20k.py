# DINOv3 ViT-L/16 pretrained on SAT-493M (satellite imagery), frozen, with the official linear
# probe: the LVD-1689M ViT-L probe's recipe (./dinov3_vitl16_linear_frozen_512x512_40k_ade20k.py)
# with the SAT-493M model's own normalisation (the DINOv3 README's satellite transform: mean
# 0.430 / 0.411 / 0.296, std 0.213 / 0.156 / 0.143 of [0, 1] RGB; here in mmseg's 0-255 units).
# ADE20K is the dataset this config steps on; for satellite data swap the dataset, keep the model
# and its data_preprocessor. Published: none for this pairing (the paper evaluates the SAT models
# on remote-sensing benchmarks).
# Training-time RoPE: not used (the trunk is frozen, in eval mode: no coordinate draws).
# Weights: the official dinov3_vitl16_pretrain_sat493m-eadcf0ff.pth at checkpoints/ (the file
# name of dinov3/hub/backbones.py; auto-detected layout; its local_cls_norm, a pretraining-only
# norm, is dropped on load).
_base_ = './dinov3_vitl16_linear_frozen_512x512_40k_ade20k.py'

# the SAT-493M normalisation, x 255 (RGB order: the preprocessor converts BGR to RGB first)
sat_mean = [0.430 * 255, 0.411 * 255, 0.296 * 255]
sat_std = [0.213 * 255, 0.156 * 255, 0.143 * 255]
data_preprocessor = dict(mean=sat_mean, std=sat_std)
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(
        arch='dinov3_vitl16_sat493m',
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/dinov3_vitl16_pretrain_sat493m-eadcf0ff.pth')))
