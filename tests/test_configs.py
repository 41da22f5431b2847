"""Every shipped config parses, inherits its upstream bases, and builds a working model."""
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / 'configs').rglob('*.py'))


def _scope(cfg: Config) -> str:
    return 'mmseg' if 'decode_head' in cfg.model else 'mmdet'


def test_configs_found():
    assert len(CONFIGS) >= 5


@pytest.mark.parametrize('path', CONFIGS)
def test_config_builds_and_extracts_features(path):
    cfg = Config.fromfile(str(ROOT / path))
    assert cfg.model.backbone.type.startswith('mmvit_ext.')
    cfg.model.backbone.init_cfg = None  # no weights here; loading is tested elsewhere
    scope = _scope(cfg)
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    __import__(f'{scope}.models')
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.build(cfg.model).eval()
    backbone = model.backbone
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
