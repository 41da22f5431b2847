# EoMT's optimisation, shared by every EoMT config: the official defaults (tue-mps/eomt
# training/lightning_module.py configure_optimizers, mask_classification_*.py,
# two_stage_warmup_poly_schedule.py): AdamW lr 1e-4 with weight decay 0.05 on every parameter,
# layer-wise lr decay 0.8 over the trunk's blocks (EoMT.get_layer_depth: the official grouping),
# fp16 mixed precision, gradient clipping at norm 0.01; the two-stage warm-up + poly 0.9 schedule
# (TwoStageWarmupPolyLR: the heads warm up over 500 iterations while the trunk waits, then the
# trunk over 1000); masked attention annealed per query block (EoMTMaskAnnealingHook, poly 0.9).
# Variables, not optim_wrapper / param_scheduler / custom_hooks: a config takes them beside its
# peer's recipe base (whose optim_wrapper and param_scheduler they replace) with _base_.pop, so
# that none stays behind as a key of its own; the schedule and the annealing get the run's
# lengths there:
#   optim_wrapper = _base_.pop('eomt_optim_wrapper')
#   param_scheduler = [dict(_base_.pop('eomt_lr_schedule'), total_iters=iters)]
#   custom_hooks = [dict(_base_.pop('eomt_mask_annealing'), start_iters=[...], end_iters=[...])]
eomt_optim_wrapper = dict(
    _delete_=True,
    type='AmpOptimWrapper',  # float16 autocast with a dynamic loss scale on CUDA: '16-mixed'
    optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05, betas=(0.9, 0.999), eps=1e-8),
    clip_grad=dict(max_norm=0.01, norm_type=2),
    constructor='mmvit_ext.LayerDecayOptimWrapperConstructor',
    # trunk=True marks the groups the two-stage schedule warms up second
    paramwise_cfg=dict(layer_decay_rate=0.8,
                       custom_keys={'backbone.encoder.': dict(lr_mult=1.0, trunk=True)}))
eomt_lr_schedule = dict(type='mmvit_ext.TwoStageWarmupPolyLR', warmup_iters=(500, 1000),
                        poly_power=0.9)
eomt_mask_annealing = dict(type='mmvit_ext.EoMTMaskAnnealingHook', poly_power=0.9)
