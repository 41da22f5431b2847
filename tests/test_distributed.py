"""tools/dist_train.sh with 2 CPU processes (gloo) against one process on the same global batch."""
import json
import sys

import numpy as np
import pytest
import torch
from classifier_runs import classifier_config, run_launch, write_shape_folders

# A CaiT classifier (LayerNorm only, no drop path, no random augmentation): DDP's averaged
# gradients over 2 x 2 images equal the gradient of one process over the same 4 images.
TRAIN = dict(train_cfg='dict(by_epoch=True, max_epochs=2)',
             optim_wrapper="dict(optimizer=dict(type='SGD', lr=0.05, momentum=0.9))")

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
    root = tmp_path_factory.mktemp('dist')
    write_shape_folders(root / 'data', 16)
    (root / 'rank_dump.py').write_text(RANK_DUMP)
    return root


def _run(cmd, root):
    return run_launch(cmd, root, port=29517, timeout=600)


def test_two_gloo_processes_match_one_process(workspace):
    classes = sorted(p.name for p in (workspace / 'data').iterdir())
    for name, batch in (('single', 4), ('dist', 2)):
        (workspace / f'{name}.py').write_text(classifier_config(
            depth=2, num_classes=len(classes), batch=batch, data=workspace / 'data',
            out=workspace / f'out_{name}', hook_module='rank_dump', hook='RankDumpHook',
            **TRAIN))
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
