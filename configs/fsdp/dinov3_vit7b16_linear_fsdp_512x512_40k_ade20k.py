# The DINOv3 ViT-7B/16 linear probe (configs/mmseg/dinov3_vit7b16_linear_frozen_512x512_40k_ade20k.py,
# same model, data and schedule) under FSDP (docs/big_models.md): mmengine's FlexibleRunner shards
# the frozen 6.7 B-parameter trunk over the GPUs, each of its 40 blocks one FSDP unit
# (mmvit_ext.backbone_block_policy); the trunk's weights are gathered in bf16 (mixed precision),
# the BatchNorm + 1x1 conv head trains in the root unit, gradients reduced in float32. The frozen
# trunk keeps no activations for backward (0 bytes saved, tests/test_dinov3_recipes.py), so no
# checkpointing is needed.
# Published (DINOv3 paper, arXiv 2508.10104, ViT-7B): 55.9 mIoU (official run: float32).
# Training-time RoPE: not used (the trunk is frozen, in eval mode: no coordinate draws).
# Weights: dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth at checkpoints/.
#   bash tools/dist_train.sh configs/fsdp/dinov3_vit7b16_linear_fsdp_512x512_40k_ade20k.py 8
_base_ = ['../mmseg/dinov3_vit7b16_linear_frozen_512x512_40k_ade20k.py',
          '../_base_/fsdp_blocks.py']
