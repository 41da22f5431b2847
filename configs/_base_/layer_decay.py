# Layer-wise lr decay for the plain-ViT detectors (ViTDet, Li et al. 2022: 0.7-0.8; here 0.75):
# block i of n gets lr * rate ** (n + 1 - i). A variable, not `optim_wrapper`, so that a config
# can take it beside a recipe base (`optim_wrapper = _base_.layer_decay_optim_wrapper`).
layer_decay_optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='mmvit_ext.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    paramwise_cfg=dict(
        layer_decay_rate=0.75,
        norm_decay_mult=0.0,
        custom_keys={
            'pos_embed': dict(decay_mult=0.0),
            'cls_token': dict(decay_mult=0.0),
            'gamma': dict(decay_mult=0.0),
        }))
