"""Proof of learning: tools/train.py trains a small Mask R-CNN (PVTv2-b0 with 64-channel FPN, RPN
and RoI heads, otherwise the demo config: AdamW lr 1e-3, cosine, seeded) for 8 epochs x 16
iterations on 64 images of the demo data, and tools/test.py evaluates the checkpoint it wrote;
bbox mAP must be well above an untrained model's.

The demo's 256-channel heads were most of a CPU step (FPN, RPN and mask-head convolutions);
at 64 channels 128 iterations cost a third of the CPU time 80 did at 256 (131 s against 392 s of
user + sys at one thread, tool processes included, 2-core machine, 2026-11-28) and learn more:
bbox mAP 0.444 / 0.449 / 0.432 with seeds 0 / 1 / 2 (data and training; loss 3.48 -> 1.10,
3.22 -> 0.97, 3.56 -> 1.13), where 80 iterations at 256 channels reached 0.367 (2026-11-27).
An untrained model scores 0.000 (random boxes). The bar, 0.30, sits 0.13 under the lowest
seed: a pipeline that trains but learns less (a wrong lr, a broken loss, a frozen backbone)
falls under it. The loss must also fall by a quarter.
"""
import json
from pathlib import Path

import torch
from tool_runner import run_tool

from mmvit_ext.datasets import generate_demo_coco

ROOT = Path(__file__).resolve().parents[1]
TRAIN_EPOCHS = 8
MIN_TRAINED_MAP = 0.30  # measured: 0.432-0.449 over three seeds (2026-11-28)
MIN_GAIN = 0.25  # over the untrained model (0.000)
HEAD_CHANNELS = 64  # the demo's 256: the FPN, RPN and mask-head convolutions were most of a step


def _small_config(tmp: Path, data_root: Path, seed: int) -> Path:
    path = tmp / 'small_demo.py'
    c = HEAD_CHANNELS
    path.write_text(f'''
_base_ = {str(ROOT / 'configs/demo/mask_rcnn_pvtv2_b2_demo.py')!r}
data_root = {str(data_root) + '/'!r}
model = dict(
    backbone=dict(arch='b0'),
    neck=dict(in_channels=[32, 64, 160, 256], out_channels={c}),
    rpn_head=dict(in_channels={c}, feat_channels={c}),
    roi_head=dict(bbox_roi_extractor=dict(out_channels={c}),
                  bbox_head=dict(in_channels={c}, fc_out_channels={4 * c}),
                  mask_roi_extractor=dict(out_channels={c}),
                  mask_head=dict(in_channels={c}, conv_out_channels={c})))
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
randomness = dict(seed={seed})
''')
    return path


def _bbox_map(test_dir: Path) -> float:
    from mmvit_ext.utils.demo_report import latest_test_metrics
    return latest_test_metrics(test_dir)['coco/bbox_mAP']


def train_and_evaluate(tmp_path: Path, seed: int = 0) -> dict:
    """Demo data and training seeded with ``seed``; the untrained and trained bbox mAP, the logged
    losses, the checkpoint and the dumped predictions."""
    data_root = tmp_path / 'demo'
    generate_demo_coco(data_root, num_train=64, num_val=16, seed=seed)
    config = _small_config(tmp_path, data_root, seed)
    work = tmp_path / 'work'

    # the untrained model, initialised as training would, saved in mmengine's checkpoint format
    from mmvit_ext.utils import build_model
    torch.manual_seed(seed)
    untrained = build_model(config)
    untrained.init_weights()
    untrained_ckpt = tmp_path / 'untrained.pth'
    torch.save({'state_dict': untrained.state_dict(), 'meta': {}}, untrained_ckpt)
    run_tool('tools/test.py', str(config), str(untrained_ckpt),
             '--work-dir', str(tmp_path / 'untrained'))

    run_tool('tools/train.py', str(config), '--work-dir', str(work))
    checkpoint = Path((work / 'last_checkpoint').read_text().strip())
    run_tool('tools/test.py', str(config), str(checkpoint), '--work-dir', str(tmp_path / 'trained'),
             '--out', str(tmp_path / 'preds.pkl'))
    losses = [json.loads(line)['loss'] for line in
              next(work.glob('*/vis_data/scalars.json')).read_text().splitlines()
              if '"loss"' in line]
    return dict(untrained=_bbox_map(tmp_path / 'untrained'),
                trained=_bbox_map(tmp_path / 'trained'), losses=losses, checkpoint=checkpoint,
                preds=tmp_path / 'preds.pkl')


def test_training_beats_untrained_and_test_tool_reads_its_checkpoint(tmp_path):
    run = train_and_evaluate(tmp_path)
    losses = run['losses']
    print(f"bbox mAP untrained {run['untrained']:.3f} -> trained {run['trained']:.3f}; "
          f'loss {losses[0]:.2f} -> {losses[-1]:.2f}')
    assert run['checkpoint'].name == f'epoch_{TRAIN_EPOCHS}.pth'
    assert run['preds'].stat().st_size > 0
    assert losses[-1] < 0.75 * losses[0]
    assert run['trained'] >= MIN_TRAINED_MAP
    assert run['trained'] >= run['untrained'] + MIN_GAIN
