# Mask2Former over the DINOv3 adapter on ADE20K, 512x512, 160k iterations, with the DINOv3
# ViT-L/16 trunk: the recipe of mask2former_dinov3_vit7b16_adapter_512x512_160k_ade20k.py (the
# official DINOv3_Adapter form over the frozen trunk; mmvit_ext.DINOv3Mask2FormerHead with the
# official head's structure: 16 heads, 6 deformable encoder layers over the three coarsest
# maps, 9 decoder layers, 100 queries, GroupNorm(32)) at a width for 1024 channels.
# Interaction indexes by the official rule (dinov3/eval/segmentation/models/__init__.py,
# FOUR_EVEN_INTERVALS: [4, 11, 17, 23] for 24 blocks, else the last block of each quarter):
# [4, 11, 17, 23].
# Head widths: hidden = the trunk's 1024 channels (the official 7B head: 2048 for 4096), FFN
# twice the hidden width as there (4096 for 2048); the official builder would give any trunk
# the 7B's 2048 / 4096 head. No official segmentor is published for this trunk: the adapter and
# the head train from their initialisation (AdamW 1e-4, wd 0.05, mmseg's Mask2Former recipe,
# bf16 AMP); no figure is published for it.
# Weights: the trunk, dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth (facebookresearch/dinov3
# dinov3/hub/backbones.py; by request at ai.meta.com/resources/models-and-libraries/
# dinov3-downloads).
_base_ = './mask2former_dinov3_vit7b16_adapter_512x512_160k_ade20k.py'

embed_dims = 1024
model = dict(
    backbone=dict(
        arch='dinov3_vitl16',
        interaction_indexes=[4, 11, 17, 23],
        init_cfg=[dict(type='Pretrained',
                       checkpoint='checkpoints/dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth')]),
    # every head width from one number (DINOv3Mask2FormerHead: FFN 2x, sine features 1/2)
    decode_head=dict(init_cfg=None, in_channels=[embed_dims] * 4, hidden_dims=embed_dims))
