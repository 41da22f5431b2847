"""Proof of learning: tools/train.py trains a small Mask R-CNN (PVTv2-b0, otherwise the demo
config: AdamW lr 1e-3, cosine, seeded and deterministic) for 5 epochs x 16 iterations on 64
images of the demo data, and tools/test.py evaluates the checkpoint it wrote; bbox mAP must be
well above an untrained model's.

This test's 80 iterations reach bbox mAP 0.367 with the current code on the project's 2-core
CPU machine (2026-11-27, 422 s; the same in two runs, loss 3.03 -> 1.27); the code of 2026-11-25
reached 0.505 and 0.468 on two machines of that kind, a spread of 0.04. An untrained model
scores 0.000 (random boxes). The bar, 0.30, sits below the measure by more than that spread: a
pipeline that trains but learns less (a wrong lr, a broken loss, a frozen backbone) falls under
it. The loss must also fall by a quarter.
"""
import json
from pathlib import Path

import torch
from tool_runner import run_tool

from mmvit_ext.datasets import generate_demo_coco

ROOT = Path(__file__).resolve().parents[1]
TRAIN_EPOCHS = 5
MIN_TRAINED_MAP = 0.30  # measured: 0.367 (2026-11-27)
MIN_GAIN = 0.25  # over the untrained model (0.000)


def _small_config(tmp: Path, data_root: Path) -> Path:
    path = tmp / 'small_demo.py'
    path.write_text(f'''
_base_ = {str(ROOT / 'configs/demo/mask_rcnn_pvtv2_b2_demo.py')!r}
data_root = {str(data_root) + '/'!r}
model = dict(backbone=dict(arch='b0'), neck=dict(in_channels=[32, 64, 160, 256]))
train_dataloader = dict(dataset=dict(data_root=data_root))
val_dataloader = dict(dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json', classwise=False)
test_evaluator = val_evaluator
max_epochs = {TRAIN_EPOCHS}
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=40),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=max_epochs, T_max=max_epochs,
         eta_min=1e-5, convert_to_iter_based=True),
]
default_hooks = dict(checkpoint=dict(interval=max_epochs))
''')
    return path


def _bbox_map(test_dir: Path) -> float:
    from mmvit_ext.utils.demo_report import latest_test_metrics
    return latest_test_metrics(test_dir)['coco/bbox_mAP']


def test_training_beats_untrained_and_test_tool_reads_its_checkpoint(tmp_path):
    data_root = tmp_path / 'demo'
    generate_demo_coco(data_root, num_train=64, num_val=16, seed=0)
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
