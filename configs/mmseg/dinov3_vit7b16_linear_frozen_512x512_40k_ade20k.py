# DINOv3 ViT-7B/16 (LVD-1689M), frozen, with the official linear probe on ADE20K at 512x512: the
# ViT-L config's recipe (dinov3/eval/segmentation/configs/config-ade20k-linear-training.yaml,
# the README's "Linear segmentation" command runs it with model.dino_hub=dinov3_vit7b16) on the
# 40-block, 4096-wide trunk. Published (DINOv3 paper, arXiv 2508.10104, ViT-7B): 55.9 mIoU.
# Training-time RoPE: not used (the trunk is frozen, in eval mode: no coordinate draws).
# Weights: the official dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth at checkpoints/ (the file
# name of dinov3/hub/backbones.py; 26.9 GB in float32). Past one GPU's memory:
# configs/fsdp/dinov3_vit7b16_linear_fsdp_512x512_40k_ade20k.py shards the trunk.
_base_ = './dinov3_vitl16_linear_frozen_512x512_40k_ade20k.py'

depth, dims = 40, 4096
model = dict(
    backbone=dict(
        arch='dinov3_vit7b16',
        out_indices=(depth - 1,),
        frozen_stages=depth,
        init_cfg=dict(checkpoint='checkpoints/dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth')),
    decode_head=dict(in_channels=[dims]))
