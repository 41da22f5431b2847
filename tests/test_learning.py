"""Proof of learning: tools/train.py trains a small Mask R-CNN (PVTv2-b0, otherwise the demo
config: 12 epochs x 16 iterations, AdamW lr 1e-3 stepped down at epoch 10) on the demo data and
tools/test.py evaluates the checkpoint it wrote; bbox mAP must be well above an untrained model's.

Calibration on the 2-core CPU, seed 0: the untrained model scores bbox mAP 0.000 (random boxes).
Trained, the score depends on float rounding, not only on the seed: 0.089 (2026-11-22), 0.052
(2026-11-23, the same code, and again with the portable-core code: identical loss curves), 0.038
for the same model with LayerNorm->fc1 / GELU->fc2 unfused (same maths, other rounding). The bar,
0.02, sits under that spread, far above an untrained model, and a model that does not learn
cannot reach it: it needs boxes that overlap the shapes at IoU >= 0.5 for a share of the 68 val
objects. The loss must also fall by a quarter. Takes about 8 minutes.
"""
import json
from pathlib import Path

import torch
from tool_runner import run_tool

from mmvit_ext.datasets import generate_demo_coco

ROOT = Path(__file__).resolve().parents[1]
TRAIN_EPOCHS = 12  # as the demo config
MIN_TRAINED_MAP = 0.02
MIN_GAIN = 0.02


def _small_config(tmp: Path, data_root: Path) -> Path:
    path = tmp / 'small_demo.py'
    path.write_text(f'''
_base_ = {str(ROOT / 'configs/demo/mask_rcnn_pvtv2_b2_demo.py')!r}
data_root = {str(data_root) + '/'!r}
model = dict(backbone=dict(arch='b0'), neck=dict(in_channels=[32, 64, 160, 256]),
             train_cfg=dict(rcnn=dict(sampler=dict(num=64))))
train_dataloader = dict(dataset=dict(data_root=data_root))
val_dataloader = dict(dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json', classwise=False)
test_evaluator = val_evaluator
default_hooks = dict(checkpoint=dict(interval={TRAIN_EPOCHS}))
randomness = dict(seed=0)
''')
    return path


def _bbox_map(test_dir: Path) -> float:
    from mmvit_ext.utils.demo_report import latest_test_metrics
    return latest_test_metrics(test_dir)['coco/bbox_mAP']


def test_training_beats_untrained_and_test_tool_reads_its_checkpoint(tmp_path):
    data_root = tmp_path / 'demo'
    generate_demo_coco(data_root, num_train=64, num_val=16, img_size=(256, 256), seed=0)
    config = _small_config(tmp_path, data_root)
    work = tmp_path / 'work'

    # the untrained model, initialised as training would, saved in mmengine's checkpoint format
    from mmvit_ext.utils import build_model
    torch.manual_seed(0)
    untrained = build_model(config)
    untrained.init_weights()
    untrained_ckpt = tmp_path / 'untrained.pth'
    torch.save({'state_dict': untrained.state_dict(), 'meta': {}}, untrained_ckpt)
    run_tool('tools/test.py', str(config), str(untrained_ckpt),
             '--work-dir', str(tmp_path / 'untrained'))
    untrained_map = _bbox_map(tmp_path / 'untrained')

    run_tool('tools/train.py', str(config), '--work-dir', str(work))
    checkpoint = Path((work / 'last_checkpoint').read_text().strip())
    assert checkpoint.name == f'epoch_{TRAIN_EPOCHS}.pth'
    run_tool('tools/test.py', str(config), str(checkpoint), '--work-dir', str(tmp_path / 'trained'),
             '--out', str(tmp_path / 'preds.pkl'))
    trained_map = _bbox_map(tmp_path / 'trained')
    losses = [json.loads(line)['loss'] for line in
              next(work.glob('*/vis_data/scalars.json')).read_text().splitlines()
              if '"loss"' in line]
    print(f'bbox mAP untrained {untrained_map:.3f} -> trained {trained_map:.3f}; '
          f'loss {losses[0]:.2f} -> {losses[-1]:.2f}')
    assert (tmp_path / 'preds.pkl').stat().st_size > 0
    assert losses[-1] < 0.75 * losses[0]
    assert trained_map >= MIN_TRAINED_MAP
    assert trained_map >= untrained_map + MIN_GAIN
