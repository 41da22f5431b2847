# Mask2Former over the DINOv3 adapter on ADE20K, 512x512, 160k iterations: the official ADE20K
# segmentor of facebookresearch/dinov3 (dinov3/hub/segmentors.py: DINOv3_Adapter over the frozen
# ViT-7B/16 trunk + the m2f head of dinov3/eval/segmentation/models/heads/), here in mmseg.
# Backbone: the official DINOv3_Adapter form, the trunk run without gradients (bf16 on CUDA),
# extractors fed the normed outputs of blocks 9, 19, 29, 39; 16 deformable heads, deform ratio
# 0.5, drop path 0.3, SyncBN, extractors recomputed in backward (with_cp).
# Head: mmvit_ext.DINOv3Mask2FormerHead = mmseg's Mask2FormerHead (mmdet's
# MSDeformAttnPixelDecoder + Mask2FormerTransformerDecoder, unchanged) at the official m2f
# head's structure (mask2former_head.py: hidden 2048, 16 heads, FFN 4096, 6 deformable encoder
# layers over the three coarsest adapter maps, the finest through the FPN lateral conv as in the
# official pixel_decoder.py, 9 decoder layers, 100 queries, GroupNorm(32)), which computes the
# official head's function (docs/model_zoo.md); ours adds the official checkpoint layout on
# every load path and the official per-crop resize in slide inference.
# Weights, both loaded whole: the trunk, dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth
# (dinov3/hub/backbones.py); the official segmentor, dinov3_vit7b16_ade20k_m2f_head-bf307cb1.pth
# (dinov3/hub/segmentors.py: segmentation_model.0 = the adapter, .1 = the head, no trunk): its
# adapter as the backbone's second Pretrained entry, its head as the head's init_cfg. As
# load_from (or tools/test.py's checkpoint) it converts too (ModelLayoutHook below); for
# tools/test.py, which loads no init_cfg, merge the trunk first: tools/convert_checkpoint.py
# <segmentor file> <out> --trunk <trunk file>.
# Training: only the adapter and the head (AdamW 1e-4, wd 0.05, mmseg's Mask2Former recipe,
# bf16 AMP), at 512 px; the official head was trained by the DINOv3 authors with their recipe.
# Published: 63.0 mIoU on ADE20K (DINOv3 paper, Simeoni et al., arXiv 2508.10104) with the
# official evaluation: 896 px crops, sliding stride 596, five TTA scales 0.9-1.1 and flips
# (config-ade20k-m2f-inference.yaml); that evaluation is
# mask2former_dinov3_vit7b16_adapter_896_slide_tta_ade20k.py.
_base_ = 'mmseg::mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py'
custom_imports = dict(imports=['mmdet.models', 'mmvit_ext', 'mmvit_ext.heads'],
                      allow_failed_imports=False)
segmentor_checkpoint = 'checkpoints/dinov3_vit7b16_ade20k_m2f_head-bf307cb1.pth'

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
            dict(type='Pretrained', checkpoint=segmentor_checkpoint),
        ]),
    decode_head=dict(
        type='mmvit_ext.DINOv3Mask2FormerHead',
        init_cfg=dict(type='Pretrained', checkpoint=segmentor_checkpoint),
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
# load_from / tools/test.py with the official segmentor file: converted before loading
custom_hooks = [dict(type='mmvit_ext.ModelLayoutHook')]
