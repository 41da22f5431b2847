"""EoMT's COCO panoptic configs: their values are the official recipes', every EoMT config takes
the shared optimisation (configs/_base_/eomt_schedule.py) without a leftover key, and the
panoptic config's model runs the official panoptic inference end to end."""
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from eomt_reference import official_panoptic
from shipped_configs import load

ROOT = Path(__file__).resolve().parents[1]
PANOPTIC = 'configs/mmdet/eomt_dinov2_l_640_coco_panoptic.py'
PANOPTIC_V3 = 'configs/mmdet/eomt_dinov3_vitl16_640_coco_panoptic.py'
# the published recipes (the demo config trains from random weights with the demo's schedule)
EOMT_CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / 'configs').rglob('eomt_*.py')
                      if not {'_base_', 'demo'} & set(p.parts))


def test_panoptic_configs_hold_the_official_values():
    # tue-mps/eomt configs/dinov2/coco/panoptic/eomt_large_640.yaml: num_q 200, max_epochs 12,
    # attn_mask_annealing_start_steps / _end_steps, stuff_classes [80, ..., 132]; the rest the
    # defaults of training/mask_classification_panoptic.py (lr 1e-4, llrd 0.8, weight_decay
    # 0.05, warmup_steps [500, 1000], poly_power 0.9, mask_thresh 0.8, overlap_thresh 0.8) and
    # datasets/coco_panoptic.py (num_classes 133, img_size (640, 640), batch_size 16,
    # scale_range (0.1, 2.0)), models/eomt.py (num_blocks 4)
    cfg = load(PANOPTIC)
    net, head = cfg.model.backbone, cfg.model.panoptic_head
    assert (net.num_queries, net.num_blocks, net.num_classes) == (200, 4, 133)
    assert (head.num_things_classes, head.num_stuff_classes, head.num_queries) == (80, 53, 200)
    assert cfg.model.panoptic_fusion_head.num_stuff_classes == 53
    test_cfg = cfg.model.test_cfg
    assert (test_cfg.panoptic_on, test_cfg.instance_on) == (True, False)
    assert (test_cfg.object_mask_thr, test_cfg.iou_thr, test_cfg.filter_low_score) == \
        (0.8, 0.8, True)
    optimizer = cfg.optim_wrapper.optimizer
    assert (optimizer.type, optimizer.lr, optimizer.weight_decay) == ('AdamW', 1e-4, 0.05)
    assert cfg.optim_wrapper.paramwise_cfg.layer_decay_rate == 0.8
    assert cfg.model.backbone.get('decay_query_blocks', True)  # llrd_l2_enabled default True
    schedule, = cfg.param_scheduler
    assert (schedule.warmup_iters, schedule.poly_power) == ((500, 1000), 0.9)
    assert schedule.total_iters == cfg.train_cfg.max_iters == 12 * 7391
    annealing, = cfg.custom_hooks
    assert annealing.start_iters == [14782, 29564, 44346, 59128]
    assert annealing.end_iters == [29564, 44346, 59128, 73910]
    assert cfg.train_dataloader.batch_size == 16
    steps = {step.type: step for step in cfg.train_dataloader.dataset.pipeline}
    assert steps['RandomResize'].ratio_range == (0.1, 2.0)
    assert steps['RandomCrop'].crop_size == (640, 640) == tuple(net.img_size)
    assert cfg.train_dataloader.dataset.type == 'CocoPanopticDataset'
    assert cfg.val_evaluator.type == 'CocoPanopticMetric'
    assert cfg.test_evaluator == cfg.val_evaluator

    # configs/dinov3/coco/panoptic/eomt_large_640.yaml: lr 2e-4, llrd_l2_enabled False,
    # warmup_steps [2000, 3000], its annealing steps, backbone_name
    # facebook/dinov3-vitl16-pretrain-lvd1689m; llrd the default 0.8
    v3 = load(PANOPTIC_V3)
    assert (v3.model.backbone.arch, v3.model.backbone.decay_query_blocks) == \
        ('dinov3_vitl16', False)
    assert v3.optim_wrapper.optimizer.lr == 2e-4
    assert v3.optim_wrapper.paramwise_cfg.layer_decay_rate == 0.8
    assert v3.param_scheduler[0].warmup_iters == (2000, 3000)
    assert v3.custom_hooks[0].start_iters == [0, 29564, 44346, 59128]
    assert v3.custom_hooks[0].end_iters == [3000, 44346, 59128, 73910]
    assert v3.train_cfg.max_iters == 12 * 7391 and v3.model.backbone.num_queries == 200


def test_every_eomt_config_takes_the_shared_optimisation_without_leftovers():
    """The pieces of configs/_base_/eomt_schedule.py are taken out of ``_base_``: none stays a
    key of a config; each config has the shared optimiser wrapper and its two parts."""
    assert len(EOMT_CONFIGS) >= 5, EOMT_CONFIGS
    for path in EOMT_CONFIGS:
        cfg = load(path)
        assert not [key for key in cfg if key.startswith('eomt_')], path
        assert cfg.optim_wrapper.constructor == 'mmvit_ext.LayerDecayOptimWrapperConstructor'
        assert cfg.optim_wrapper.clip_grad == dict(max_norm=0.01, norm_type=2), path
        assert [s.type for s in cfg.param_scheduler] == ['mmvit_ext.TwoStageWarmupPolyLR']
        assert [h.type for h in cfg.custom_hooks] == ['mmvit_ext.EoMTMaskAnnealingHook']
        assert cfg.param_scheduler[0].total_iters == cfg.train_cfg.max_iters, path


def _designed_outputs(num_queries: int, num_classes: int, grid=(16, 24)):
    """Network outputs (1, 1, Q, h, w) / (1, 1, Q, K + 1) with a known panoptic answer: on top
    two instances of class 0 (columns 0-11, 12-19) and a class-7 query over columns 12-23 that
    wins only 20-23 (a third of its mask: dropped); below, stuff class 100 from two queries
    (columns 0-11, 12-17: one segment) and a query of score 0.5 alone on 18-23 (dropped); the
    other queries no-object."""
    masks = torch.full((num_queries, *grid), -10.0)
    classes = torch.zeros(num_queries, num_classes + 1)
    classes[:, num_classes] = 20.0
    layout = [(0, 0, 20.0, (slice(0, 8), slice(0, 12)), 10.0),
              (1, 0, 20.0, (slice(0, 8), slice(12, 20)), 10.0),
              (2, 100, 20.0, (slice(8, 16), slice(0, 12)), 10.0),
              (3, 100, 20.0, (slice(8, 16), slice(12, 18)), 10.0),
              (4, 7, 20.0, (slice(0, 8), slice(12, 24)), 5.0),
              (5, 5, 10.0, (slice(8, 16), slice(18, 24)), 10.0)]
    for q, label, logit, region, mask_logit in layout:
        masks[q][region] = mask_logit
        classes[q] = 0.0
        classes[q, label] = logit
    classes[5, 6] = 10.0  # a tie with class 5: score 0.5
    return masks[None, None], classes[None, None]


def test_panoptic_config_model_runs_the_official_panoptic_inference():
    """The config's model (its trunk at a tiny width) on a 64 x 96 image: the real network's
    outputs (logits sharpened), then designed ones through the same model, give the official
    panoptic result (tests/eomt_reference.py) from mmdet's fusion head: the same class per
    pixel and the same segments (mmdet: stuff ``class``, things ``class + instance *
    INSTANCE_OFFSET``)."""
    from mmdet.evaluation.functional import INSTANCE_OFFSET
    from mmdet.structures import DetDataSample
    import mmvit_ext.models.eomt_det  # noqa: F401
    from mmvit_ext.utils import build_model
    cfg = Config.fromfile(str(ROOT / PANOPTIC))
    cfg.model.backbone.update(arch=dict(embed_dims=32, depth=5, num_heads=2), init_cfg=None)
    torch.manual_seed(0)
    model = build_model(cfg, scope='mmdet').eval()
    with torch.no_grad():  # sharp logits: queries pass the 0.8 score, a segment survives
        model.backbone.class_head.weight.mul_(1000)
        model.backbone.mask_head[-1].weight.mul_(1000)
    outputs = []
    model.backbone.register_forward_hook(lambda module, args, out: outputs.append(out))
    image = torch.randint(0, 256, (3, 64, 96), dtype=torch.uint8)
    sample = DetDataSample(metainfo=dict(img_shape=(64, 96), ori_shape=(64, 96),
                                         scale_factor=(1.0, 1.0)))
    num_classes = 133
    stuff = list(range(80, num_classes))
    for designed in (None, _designed_outputs(200, num_classes)):
        if designed is not None:
            model.backbone.register_forward_hook(lambda module, args, out: designed)
        with torch.no_grad():
            result = model.test_step(dict(inputs=[image], data_samples=[sample]))[0]
        ours = result.pred_panoptic_seg.sem_seg[0].long()
        assert ours.shape == (64, 96)
        mask_logits, class_logits = designed if designed is not None else outputs[-1]
        mask_logits = torch.nn.functional.interpolate(mask_logits[-1], size=(64, 96),
                                                      mode='bilinear', align_corners=False)
        ref = official_panoptic(mask_logits[0], class_logits[-1][0], stuff)
        assert torch.equal(ours % INSTANCE_OFFSET, ref[..., 0])
        pairs = set(zip(ours.flatten().tolist(), ref[..., 1].flatten().tolist()))
        assert len(pairs) == len(ours.unique()) == len(ref[..., 1].unique())  # same segments
        assert len(pairs) > 1  # not all unlabelled
    # the designed answer: two class-0 instances, one stuff-100 segment, the rest unlabelled
    at = ours.tolist()
    assert (at[16][24], at[16][64]) == (1 * INSTANCE_OFFSET, 2 * INSTANCE_OFFSET)
    assert at[48][24] == at[40][48] == at[48][64] == 100
    assert at[16][90] == at[48][90] == num_classes
    assert sorted(ours.unique().tolist()) == [100, num_classes, 1 * INSTANCE_OFFSET,
                                              2 * INSTANCE_OFFSET]
