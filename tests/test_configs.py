"""Every shipped config parses, inherits its upstream bases, and builds a working model."""
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from mmvit_ext.utils.config_checks import task_scope

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / 'configs').rglob('*.py'))


def test_configs_found():
    assert len(CONFIGS) >= 16


@pytest.mark.parametrize('path', CONFIGS)
def test_config_builds_and_extracts_features(path):
    cfg = Config.fromfile(str(ROOT / path))
    assert cfg.model.backbone.type.startswith('mmvit_ext.')
    cfg.model.backbone.init_cfg = None  # no weights here; loading is tested elsewhere
    scope = task_scope(cfg)
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    __import__(f'{scope}.models')
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.build(cfg.model).eval()
    backbone = model.backbone
    if scope == 'mmpretrain':
        assert cfg.model.head.in_channels == backbone.out_channels[-1]
        with torch.no_grad():
            logits = model(torch.randn(2, 3, 224, 224), mode='tensor')
        assert logits.shape == (2, cfg.model.head.num_classes) and torch.isfinite(logits).all()
        return
    neck_in = cfg.model.neck.in_channels if 'neck' in cfg.model else cfg.model.decode_head.in_channels
    assert list(backbone.out_channels) == list(neck_in)
    with torch.no_grad():
        feats = model.extract_feat(torch.randn(1, 3, 128, 160))
    assert all(torch.isfinite(f).all() for f in feats)
    if scope == 'mmdet':
        stride = backbone.strides[cfg.model.neck.get('start_level', 0)]
        assert len(feats) == cfg.model.neck.num_outs
        assert feats[0].shape[-2:] == (128 // stride, 160 // stride)


def test_recipes_exclude_norms_and_tables_from_weight_decay():
    cfg = Config.fromfile(str(ROOT / 'configs/mask_rcnn_swin_t_fpn_1x_coco.py'))
    keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
    assert keys['norm'].decay_mult == 0 and keys['relative_position_bias_table'].decay_mult == 0
    assert cfg.optim_wrapper.optimizer.type == 'AdamW' and cfg.optim_wrapper.optimizer.lr == 1e-4
    pvt = Config.fromfile(str(ROOT / 'configs/mask_rcnn_pvtv2_b2.py'))
    assert pvt.optim_wrapper.optimizer == dict(type='AdamW', lr=1e-4, weight_decay=1e-4)
    assert pvt.train_cfg.max_epochs == 12 and pvt.auto_scale_lr.base_batch_size == 16
    assert pvt.model.backbone.init_cfg.checkpoint == 'checkpoints/pvt_v2_b2.pth'


PLAIN_VIT_DETECTORS = ['configs/mask_rcnn_deepvit_s_fpn_1x_coco.py',
                       'configs/mask_rcnn_cait_s24_fpn_1x_coco.py',
                       'configs/mask_rcnn_refined_vit_s_fpn_1x_coco.py']


@pytest.mark.parametrize('path', PLAIN_VIT_DETECTORS)
def test_plain_vit_mask_rcnn_trains_one_step_at_512(path):
    """One Mask R-CNN optimisation step at 512x512 on CPU: losses finite, backbone updated."""
    from mmdet.registry import MODELS as DET_MODELS
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    from mmdet.structures.mask import BitmapMasks
    __import__('mmdet.models')
    cfg = Config.fromfile(str(ROOT / path))
    cfg.model.backbone.init_cfg = None
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = DET_MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    images, samples = [], []
    for _ in range(2):
        images.append(torch.rand(3, 512, 512) * 255)
        sample = DetDataSample(metainfo=dict(img_shape=(512, 512), ori_shape=(512, 512),
                                             pad_shape=(512, 512), scale_factor=(1.0, 1.0),
                                             batch_input_shape=(512, 512)))
        masks = torch.zeros(2, 512, 512, dtype=torch.uint8)
        masks[0, 40:200, 60:260] = 1
        masks[1, 300:480, 200:420] = 1
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor([[60., 40., 260., 200.], [200., 300., 420., 480.]]),
            labels=torch.tensor([1, 7]), masks=BitmapMasks(masks.numpy(), 512, 512))
        samples.append(sample)
    data = model.data_preprocessor(dict(inputs=images, data_samples=samples), training=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    before = {k: v.detach().clone() for k, v in model.backbone.named_parameters()}
    losses = model(**data, mode='loss')
    total = sum(v.sum() if isinstance(v, torch.Tensor) else sum(v) for k, v in losses.items()
                if 'loss' in k)
    assert torch.isfinite(total) and total > 0
    assert {'loss_rpn_cls', 'loss_bbox', 'loss_mask'} <= set(losses)
    optimizer.zero_grad()
    total.backward()
    optimizer.step()
    changed = sum(not torch.equal(before[k], v) for k, v in model.backbone.named_parameters())
    assert changed == len(before), f'only {changed} of {len(before)} backbone tensors updated'
