# Mask2Former (mmseg's Mask2FormerHead) over the DINOv3 adapter on ADE20K, 512x512, 160k
# iterations: the official DINOv3_Adapter form (facebookresearch/dinov3,
# dinov3/eval/segmentation/models/backbone/dinov3_adapter.py) over the frozen ViT-7B/16 trunk,
# run without gradients (bf16 on CUDA), extractors fed the normed outputs of blocks 9, 19, 29,
# 39; 16 deformable heads, deform ratio 0.5, drop path 0.3, SyncBN, extractors recomputed in
# backward (with_cp). The head takes the official m2f head's sizes (dinov3/eval/segmentation/
# models/heads/mask2former_head.py: hidden 2048, 16 heads, FFN 4096, 6 pixel-decoder layers,
# 9 decoder layers, 100 queries); only the adapter and the head train (AdamW 1e-4, wd 0.05,
# mmseg's Mask2Former recipe, bf16 AMP).
# Weights: the trunk, dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth (dinov3/hub/backbones.py);
# the adapter of the official segmentor, dinov3_vit7b16_ade20k_m2f_head-bf307cb1.pth
# (dinov3/hub/segmentors.py), loads as the second Pretrained entry (its head is not mmseg's and
# is not loaded).
# Published: 63.0 mIoU (multi-scale) on ADE20K for ViT-7B + M2F, DINOv3 paper (Simeoni et al.,
# arXiv 2508.10104, its comparison with state-of-the-art segmentation systems); that
# run is the official one at 896 px (config-ade20k-m2f-inference.yaml: 896 crops, sliding
# stride 596, five TTA ratios 0.9-1.1), not this 512 px recipe. 896 px here needs
# crop_size = (896, 896) in the pipeline and data_preprocessor, test_cfg mode='slide' with
# crop (896, 896) and stride (596, 596), and about 3x the activation memory of the adapter and
# head per image (56x56 trunk tokens instead of 32x32; the frozen trunk keeps none).
_base_ = 'mmseg::mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py'

num_classes = 150
embed_dims = 4096  # the 7B trunk's width: every adapter level
head_dims = 2048
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.ViTAdapter',
        arch='dinov3_vit7b16',  # builds the DINOv3 form: mmvit_ext.backbones.dinov3_adapter
        interaction_indexes=[9, 19, 29, 39],
        pretrain_size=512,
        conv_inplane=64,
        n_points=4,
        deform_num_heads=16,
        drop_path_rate=0.3,
        with_cffn=True,
        cffn_ratio=0.25,
        deform_ratio=0.5,
        add_vit_feature=True,
        use_extra_extractor=True,
        with_cp=True,
        sync_bn=True,
        init_cfg=[
            dict(type='Pretrained',
                 checkpoint='checkpoints/dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth'),
            dict(type='Pretrained',
                 checkpoint='checkpoints/dinov3_vit7b16_ade20k_m2f_head-bf307cb1.pth'),
        ]),
    decode_head=dict(
        in_channels=[embed_dims] * 4,
        feat_channels=head_dims,
        out_channels=head_dims,
        num_queries=100,
        pixel_decoder=dict(
            encoder=dict(
                num_layers=6,
                layer_cfg=dict(
                    self_attn_cfg=dict(embed_dims=head_dims, num_heads=16),
                    ffn_cfg=dict(embed_dims=head_dims, feedforward_channels=2 * head_dims))),
            positional_encoding=dict(num_feats=head_dims // 2)),
        positional_encoding=dict(num_feats=head_dims // 2),
        transformer_decoder=dict(
            num_layers=9,
            layer_cfg=dict(
                self_attn_cfg=dict(embed_dims=head_dims, num_heads=16),
                cross_attn_cfg=dict(embed_dims=head_dims, num_heads=16),
                ffn_cfg=dict(embed_dims=head_dims, feedforward_channels=2 * head_dims)))))

# the adapter trains from its initialisation, at the head's rate (mmseg's 0.1 is for a
# pretrained backbone; the pretrained trunk here is frozen)
optim_wrapper = dict(
    type='AmpOptimWrapper',
    dtype='bfloat16',
    paramwise_cfg=dict(custom_keys={
        'backbone': dict(lr_mult=1.0, decay_mult=1.0),
        'level_encoding': dict(lr_mult=1.0, decay_mult=0.0),
    }))
