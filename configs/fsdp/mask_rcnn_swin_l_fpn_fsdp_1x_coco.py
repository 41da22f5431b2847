# Mask R-CNN + FPN with our Swin-L under FSDP (docs/big_models.md): mmengine's FlexibleRunner
# shards parameters, gradients and AdamW state over the GPUs; every Swin block is one FSDP unit
# (mmvit_ext.backbone_block_policy), parameters computed in bf16, gradients reduced in float32.
# Dialable checkpointing (with_cp) keeps activations down: 'attn' recomputes only the attention
# branch of every block. frozen_stages and layer decay work as without FSDP.
#   bash tools/dist_train.sh configs/fsdp/mask_rcnn_swin_l_fpn_fsdp_1x_coco.py 8
_base_ = ['../mask_rcnn_swin_t_fpn_1x_coco.py', '../_base_/fsdp_blocks.py']

pretrained = 'checkpoints/swin_large_patch4_window7_224_22k.pth'
model = dict(
    backbone=dict(arch='large', drop_path_rate=0.3, frozen_stages=1, with_cp='attn',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[192, 384, 768, 1536]))

optim_wrapper = dict(constructor='mmvit_ext.LayerDecayOptimWrapperConstructor',
                     paramwise_cfg=dict(layer_decay_rate=0.9))
