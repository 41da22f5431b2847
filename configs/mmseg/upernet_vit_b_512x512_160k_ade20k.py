# UperNet + MultiLevelNeck with ViT-B/16 on ADE20K, 512x512, 160k iterations: mmseg's recipe
# (vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512: blocks 2, 5, 8, 11 through the
# multi-level neck at scales 4 / 2 / 1 / 0.5, global attention, class token in the trunk, no
# final norm, AdamW lr 6e-5). Published: 46.75 mIoU (48.46 ms+flip) [mmseg-vit].
# Weights: timm's vit_base_patch16_224 (AugReg) at checkpoints/vit_base_patch16_224.pth.
_base_ = 'mmseg::vit/vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py'
custom_imports = dict(imports=['mmvit_ext'], allow_failed_imports=False)

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='mmvit_ext.VisionTransformer',
        arch='b',
        img_size=512,
        out_indices=(2, 5, 8, 11),
        with_cls_token=True,
        window_size=None,
        simple_pyramid=False,
        final_norm=False,
        drop_path_rate=0.0,
        patch_bias=True,  # the timm / official weights' (mmseg's default: none)
        norm_cfg=dict(type='LN', eps=1e-6),  # theirs (mmseg's default: 1e-5)
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/vit_base_patch16_224.pth')))
