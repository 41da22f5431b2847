"""EoMT's training pieces against the official code's semantics: the loss (mmdet's Mask2Former
loss in EoMTSemanticHead vs the official transformers-based loss, tests/eomt_reference.py), the
mask annealing hook, the two-stage warm-up + poly schedule, the layer-decay grouping, and the
official inference windows."""
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import mmvit_ext  # noqa: F401
from eomt_reference import official_loss
from mmvit_ext.engine.eomt_hooks import (EoMTMaskAnnealingHook, TwoStageWarmupPolyLR,
                                         mask_probability)
from mmvit_ext.errors import ConfigError
from mmvit_ext.models import EoMT

TINY = dict(embed_dims=32, depth=3, num_heads=2)


def _semantic_batch(batch: int, size: int = 64):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    gen = torch.Generator().manual_seed(3)
    samples, gt_masks, gt_labels = [], [], []
    for _ in range(batch):
        blocks = torch.randint(0, 4, (1, 1, 4, 4), generator=gen).float()
        seg = torch.nn.functional.interpolate(blocks, size=(size, size)).long()[0]
        seg[:, :8] = 255  # ignored rows
        sample = SegDataSample(metainfo=dict(img_shape=(size, size), pad_shape=(size, size)))
        sample.gt_sem_seg = PixelData(data=seg)
        samples.append(sample)
        labels = torch.tensor([c for c in seg.unique().tolist() if c != 255])
        gt_labels.append(labels)
        gt_masks.append(torch.stack([seg[0] == c for c in labels]))
    return samples, gt_masks, gt_labels


def test_loss_is_the_official_one():
    """Every block's class CE x2, mask BCE x5 and dice x5 equal the official loss with the same
    random points (Hungarian matching on sampled points, importance sampling, no-object 0.1)."""
    from mmvit_ext.models.eomt_seg import EoMTSemanticHead
    head = EoMTSemanticHead(num_classes=4, num_queries=6, train_cfg=dict(num_points=300))
    masks = torch.randn(2, 2, 6, 16, 16) * 3
    classes = torch.randn(2, 2, 6, 5)
    samples, gt_masks, gt_labels = _semantic_batch(2)
    torch.manual_seed(11)
    losses = head.loss((masks, classes), samples, None)
    torch.manual_seed(11)
    for p, prefix in enumerate(('d0.', '')):
        ref = official_loss(masks[p], classes[p], gt_masks, gt_labels, num_points=300)
        for key, weight, name in (('loss_cls', 2.0, 'ce'), ('loss_mask', 5.0, 'mask'),
                                  ('loss_dice', 5.0, 'dice')):
            ours = losses[prefix + key].item()
            print(f'{prefix}{key}: ours {ours:.6f} official {weight * ref[name].item():.6f}')
            assert ours == pytest.approx(weight * ref[name].item(), rel=1e-5, abs=1e-6)


def test_annealing_hook_sets_the_official_probabilities():
    model = nn.Sequential(EoMT(TINY, 3, 4, num_blocks=2, img_size=32))
    hook = EoMTMaskAnnealingHook(start_iters=[0, 10], end_iters=[20, 30], poly_power=0.9)
    runner = SimpleNamespace(model=model, iter=0)
    hook.before_train(runner)
    assert model[0].attn_mask_probs.tolist() == [1.0, 1.0]
    for it, expected in ((4, [(1 - 5 / 20) ** 0.9, 1.0]),
                         (19, [0.0, 0.5 ** 0.9]), (29, [0.0, 0.0])):
        runner.iter = it  # after iteration it: step it + 1 (Lightning's global_step)
        hook.after_train_iter(runner, it)
        assert model[0].attn_mask_probs.tolist() == pytest.approx(expected)
    assert mask_probability(5, 10, 20) == 1.0 and mask_probability(20, 10, 20) == 0.0
    with pytest.raises(ConfigError, match='one entry'):
        EoMTMaskAnnealingHook([0, 1], [5])
    with pytest.raises(ConfigError, match='3 schedules for 2'):
        EoMTMaskAnnealingHook([0, 1, 2], [5, 6, 7]).before_train(runner)


def _official_lr(step: int, base: float, trunk: bool, warmup, total: int, power: float) -> float:
    """training/two_stage_warmup_poly_schedule.py's get_lr, one group."""
    non_vit, vit = warmup
    if not trunk:
        if non_vit > 0 and step < non_vit:
            return base * (step / non_vit)
        return base * (1 - max(0, step - non_vit) / max(1, total - non_vit)) ** power
    if step < non_vit:
        return 0.0
    if step < non_vit + vit:
        return base * ((step - non_vit) / vit)
    return base * (1 - max(0, step - non_vit - vit) / max(1, total - non_vit - vit)) ** power


def test_two_stage_schedule_is_the_official_one():
    heads, trunk = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([dict(params=[heads], lr=1e-3),
                                   dict(params=[trunk], lr=5e-4, trunk=True)])
    scheduler = TwoStageWarmupPolyLR(optimizer, warmup_iters=(3, 4), total_iters=20)
    for step in range(20):
        lrs = [g['lr'] for g in optimizer.param_groups]
        assert lrs == pytest.approx([_official_lr(step, 1e-3, False, (3, 4), 20, 0.9),
                                     _official_lr(step, 5e-4, True, (3, 4), 20, 0.9)])
        optimizer.step()
        scheduler.step()


def test_layer_decay_follows_the_official_grouping():
    """lr of block i: lr * decay ** (depth - 1 - i); embeddings with block 0; the final norm,
    queries and mask module at lr; the trunk's groups marked for the second warm-up."""
    from mmengine.optim import build_optim_wrapper
    model = nn.Module()
    model.backbone = EoMT(dict(TINY, depth=4), 3, 4, num_blocks=2, img_size=32)
    wrapper = build_optim_wrapper(model, dict(
        type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.05),
        constructor='mmvit_ext.LayerDecayOptimWrapperConstructor',
        paramwise_cfg=dict(layer_decay_rate=0.5,
                           custom_keys={'backbone.encoder.': dict(lr_mult=1.0, trunk=True)})))
    lr_of = {id(p): (g['lr'], g.get('trunk', False)) for g in wrapper.param_groups
             for p in g['params']}
    net = model.backbone
    assert lr_of[id(net.encoder.blocks[3].mlp.fc1.weight)] == (1.0, True)
    assert lr_of[id(net.encoder.blocks[1].attn.qkv.weight)] == (0.25, True)
    assert lr_of[id(net.encoder.patch_embed.proj.weight)] == (0.125, True)
    assert lr_of[id(net.encoder.blocks[0].norm1.weight)] == (0.125, True)
    assert lr_of[id(net.encoder.norm.weight)] == (1.0, True)
    assert lr_of[id(net.q.weight)] == (1.0, False)
    assert lr_of[id(net.upscale[0].conv1.weight)] == (1.0, False)
    # llrd_l2_enabled=False: the query blocks (2, 3) at lr, the others decayed as before
    net.decay_query_blocks = False
    assert [net.get_layer_depth(f'encoder.blocks.{i}.mlp.fc1.weight') for i in range(4)] == \
        [(1, 5), (2, 5), (4, 5), (4, 5)]


def test_official_inference_windows():
    from mmvit_ext.models.eomt_seg import window_origins
    # lightning_module.window_imgs_semantic: ceil(L / crop) crops, the overlap spread evenly
    assert window_origins(512, 512) == [0]
    assert window_origins(683, 512) == [0, 171]
    assert window_origins(1100, 512) == [0, 294, 588]


def test_segmentor_window_inference_averages_the_official_crops():
    """mode 'window': a 32 x 56 input is one 32 x 32 crop at 0 and one at 24 (the official
    starts); the scores are the crops' per-pixel scores, averaged where they overlap."""
    import mmvit_ext.models.eomt_seg  # noqa: F401
    from mmvit_ext.utils import build_model
    seg = build_model(dict(
        type='mmvit_ext.EoMTSegmentor',
        data_preprocessor=dict(type='SegDataPreProcessor', size=(32, 32)),
        backbone=dict(type='mmvit_ext.EoMT', arch=TINY, num_classes=3, num_queries=4,
                      num_blocks=2, img_size=32),
        decode_head=dict(type='mmvit_ext.EoMTSemanticHead', num_classes=3, num_queries=4),
        test_cfg=dict(mode='window')), scope='mmseg').eval()
    seg.backbone.attn_mask_probs.zero_()
    x = torch.randn(1, 3, 32, 56)
    meta = [dict(img_shape=(32, 56), ori_shape=(32, 56), pad_shape=(32, 56))]
    with torch.no_grad():
        scores = seg.inference(x, meta)
        crop_meta = [dict(img_shape=(32, 32), pad_shape=(32, 32))]
        left = seg.encode_decode(x[..., :32], crop_meta)
        right = seg.encode_decode(x[..., 24:], crop_meta)
    expected = torch.zeros(1, 3, 32, 56)
    expected[..., :32] += left
    expected[..., 24:] += right
    expected[..., 24:32] /= 2
    assert scores.shape == (1, 3, 32, 56)
    assert torch.allclose(scores, expected, atol=1e-6)


def test_mmdet_panoptic_model_trains_and_predicts():
    """mmdet's Mask2Former detector around the network: the panoptic loss (things from
    instances, stuff from the semantic map) on every prediction, and panoptic + instance
    results from MaskFormerFusionHead with the official thresholds."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.config import ConfigDict
    from mmengine.structures import InstanceData, PixelData
    import mmvit_ext.models.eomt_det  # noqa: F401
    from mmvit_ext.utils import build_model
    test_cfg = dict(panoptic_on=True, semantic_on=False, instance_on=True, max_per_image=10,
                    object_mask_thr=0.8, iou_thr=0.8, filter_low_score=True)
    model = build_model(ConfigDict(
        type='Mask2Former', data_preprocessor=dict(type='DetDataPreprocessor'),
        backbone=dict(type='mmvit_ext.EoMT', arch=TINY, num_classes=5, num_queries=6,
                      num_blocks=2, img_size=32),
        panoptic_head=dict(type='mmvit_ext.EoMTPanopticHead', num_things_classes=3,
                           num_stuff_classes=2, num_queries=6, train_cfg=dict(num_points=64)),
        panoptic_fusion_head=dict(type='MaskFormerFusionHead', num_things_classes=3,
                                  num_stuff_classes=2),
        train_cfg=dict(num_points=64), test_cfg=test_cfg), scope='mmdet')
    sample = DetDataSample(metainfo=dict(img_shape=(32, 48), ori_shape=(32, 48),
                                         pad_shape=(32, 48), batch_input_shape=(32, 48)))
    masks = torch.zeros(2, 32, 48, dtype=torch.uint8)
    masks[0, 4:12, 4:20], masks[1, 16:28, 20:40] = 1, 1
    sample.gt_instances = InstanceData(labels=torch.tensor([0, 2]),
                                       masks=BitmapMasks(masks.numpy(), 32, 48),
                                       bboxes=torch.tensor([[4., 4, 20, 12], [20, 16, 40, 28]]))
    sem = torch.full((1, 32, 48), 255, dtype=torch.long)
    sem[:, :, 40:] = 3  # stuff class 3 (the first stuff class)
    sample.gt_sem_seg = PixelData(sem_seg=sem)
    x = torch.randn(1, 3, 32, 48)
    model.train()
    losses = model.loss(x, [sample])
    assert {'loss_cls', 'loss_mask', 'loss_dice', 'd0.loss_cls', 'd1.loss_dice'} <= set(losses)
    assert all(torch.isfinite(v) for v in losses.values())
    model.eval()
    with torch.no_grad():
        result = model.predict(x, [sample])[0]
    assert result.pred_panoptic_seg.sem_seg.shape == (1, 32, 48)
    assert result.pred_instances.masks.shape[1:] == (32, 48)
