# FSDP on mmengine's FlexibleRunner (docs/big_models.md): every backbone block one unit
# (mmvit_ext.backbone_block_policy), parameters gathered in bf16, gradients reduced in float32
runner_type = 'FlexibleRunner'
strategy = dict(
    type='FSDPStrategy',
    model_wrapper=dict(
        auto_wrap_policy=dict(type='mmvit_ext.backbone_block_policy'),
        mixed_precision=dict(param_dtype='bfloat16', reduce_dtype='float32',
                             buffer_dtype='float32')))
