"""tools/dist_train.sh with 2 CPU processes (gloo) against one process on the same global batch."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mmvit_ext.datasets.synthetic_shapes import CLASSES, render_scene

ROOT = Path(__file__).resolve().parents[1]

# A CaiT classifier (LayerNorm only, no drop path, no random augmentation): DDP's averaged
# gradients over 2 x 2 images equal the gradient of one process over the same 4 images.
CONFIG = """
_base_ = ['mmpretrain::_base_/default_runtime.py']
custom_imports = dict(imports=['mmvit_ext', 'rank_dump'], allow_failed_imports=False)
model = dict(
    type='ImageClassifier',
    backbone=dict(type='mmvit_ext.CaiT', arch=dict(embed_dims=32, depth=2, num_heads=2),
                  img_size=64, out_type='cls_token', drop_path_rate=0.0),
    neck=None,
    head=dict(type='LinearClsHead', num_classes={num_classes}, in_channels=32,
              loss=dict(type='CrossEntropyLoss')))
data_preprocessor = dict(num_classes={num_classes}, mean=[127.5] * 3, std=[127.5] * 3,
                         to_rgb=True)
pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(
    batch_size={batch}, num_workers=0,
    dataset=dict(type='CustomDataset', data_root='{data}', pipeline=pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False))
train_cfg = dict(by_epoch=True, max_epochs=2)
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.05, momentum=0.9))
param_scheduler = []
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=100))
custom_hooks = [dict(type='RankDumpHook', out_dir='{out}')]
randomness = dict(seed=0)
"""

RANK_DUMP = '''
import json, os
import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class RankDumpHook(Hook):
    """Writes every rank's losses and final weights."""

    def __init__(self, out_dir):
        self.out_dir, self.losses = out_dir, []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.losses.append(float(outputs['loss']))

    def after_run(self, runner):
        rank = get_rank()
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, f'losses_{rank}.json'), 'w') as f:
            json.dump(self.losses, f)
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        torch.save(model.state_dict(), os.path.join(self.out_dir, f'weights_{rank}.pth'))
'''


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    import mmcv
    root = tmp_path_factory.mktemp('dist')
    rng = np.random.default_rng(0)
    for i in range(16):
        image, _, objects = render_scene(rng, (64, 64), max_objects=1)
        folder = root / 'data' / CLASSES[objects[0][0]]
        folder.mkdir(parents=True, exist_ok=True)
        mmcv.imwrite(image[..., ::-1], str(folder / f'{i:02d}.png'))
    (root / 'rank_dump.py').write_text(RANK_DUMP)
    return root


def _run(cmd, root, timeout=600):
    env = {**os.environ, 'PYTHONPATH': f'{root}{os.pathsep}{os.environ.get("PYTHONPATH", "")}',
           'PORT': '29517', 'OMP_NUM_THREADS': '1', 'PYTHON': sys.executable}
    env['PATH'] = f'{Path(sys.executable).parent}{os.pathsep}{env["PATH"]}'
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


def test_two_gloo_processes_match_one_process(workspace):
    classes = sorted(p.name for p in (workspace / 'data').iterdir())
    for name, batch in (('single', 4), ('dist', 2)):
        (workspace / f'{name}.py').write_text(CONFIG.format(
            num_classes=len(classes), batch=batch, data=workspace / 'data',
            out=workspace / f'out_{name}'))
    _run([sys.executable, 'tools/train.py', str(workspace / 'single.py'),
          '--work-dir', str(workspace / 'work_single')], workspace)
    _run(['bash', 'tools/dist_train.sh', str(workspace / 'dist.py'), '2',
          '--work-dir', str(workspace / 'work_dist')], workspace)
    assert "backend='gloo'" in (workspace / 'work_dist/dist.py').read_text()  # the dumped config
    single = torch.load(workspace / 'out_single/weights_0.pth', weights_only=True)
    rank0 = torch.load(workspace / 'out_dist/weights_0.pth', weights_only=True)
    rank1 = torch.load(workspace / 'out_dist/weights_1.pth', weights_only=True)
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0), 'ranks hold different weights'
    weight_diff = max((single[k] - rank0[k]).abs().max().item() for k in single)
    losses_single = json.loads((workspace / 'out_single/losses_0.json').read_text())
    per_rank = [json.loads((workspace / f'out_dist/losses_{r}.json').read_text()) for r in (0, 1)]
    assert len(losses_single) == len(per_rank[0]) == 8  # 2 epochs x 16 images / global batch 4
    global_loss = np.mean(per_rank, axis=0)  # each rank's mean loss over its 2 images
    print(f'2-process vs 1-process: max weight diff {weight_diff:.2g}, max loss diff '
          f'{np.abs(global_loss - losses_single).max():.2g}')
    np.testing.assert_allclose(global_loss, losses_single, rtol=1e-4, atol=1e-5)
    assert weight_diff < 1e-4
