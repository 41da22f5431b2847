# The published evaluation of the official DINOv3 ADE20K segmentor (63.0 mIoU, DINOv3 paper,
# Simeoni et al., arXiv 2508.10104): facebookresearch/dinov3
# dinov3/eval/segmentation/configs/config-ade20k-m2f-inference.yaml with eval.py, inference.py
# and transforms.py: the short side resized to 896 px (PIL bilinear), 896 px crops slid with
# stride 596, each crop's masks resized to the crop, softmax-classes x sigmoid-masks summed over
# the queries; test-time augmentation over five short sides, 896 x 0.9 / 0.95 / 1 / 1.05 / 1.1
# (int(), then below 1 rounded up to a multiple of 32: 832, 864, 896, 940, 985), each image
# and its horizontal flip, the ten predictions resized to the label, softmaxed and averaged.
# Run: tools/test.py this config <checkpoint> --tta, the checkpoint from
# tools/convert_checkpoint.py dinov3_vit7b16_ade20k_m2f_head-bf307cb1.pth <out> --trunk
# dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth (tools/test.py loads no init_cfg).
# Model, weights and training: mask2former_dinov3_vit7b16_adapter_512x512_160k_ade20k.py.
# What differs from the official run: docs/model_zoo.md.
_base_ = './mask2former_dinov3_vit7b16_adapter_512x512_160k_ade20k.py'

crop_size = (896, 896)
# no padding to a multiple of 32 before sliding: the official crops never hold padding
data_preprocessor = dict(size=crop_size, test_cfg=None)
model = dict(
    data_preprocessor=data_preprocessor,
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(596, 596)))

short_side = 896
tta_short_sides = [832, 864, 896, 940, 985]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    # the short side to 896 (the long side bound never binds), PIL's bilinear as the official
    dict(type='Resize', scale=(16 * short_side, short_side), keep_ratio=True, backend='pillow'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
tta_model = dict(type='SegTTAModel')
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale=(16 * side, side), keep_ratio=True, backend='pillow')
             for side in tta_short_sides],
            [dict(type='RandomFlip', prob=0., direction='horizontal'),
             dict(type='RandomFlip', prob=1., direction='horizontal')],
            [dict(type='LoadAnnotations')],
            [dict(type='PackSegInputs')],
        ]),
]
