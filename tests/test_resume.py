"""Interrupted training: SIGKILL tools/train.py at several points, --resume, equal final weights."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmvit_ext.datasets.synthetic_shapes import generate_demo_coco
from mmvit_ext.engine import atomic_save_checkpoint, find_resumable_checkpoint
from mmvit_ext.utils.safe_checkpoint import trusted_training_state
from tiny_demo import CONFIG  # tests/ is on the path (conftest)

ROOT = Path(__file__).resolve().parents[1]

# Loaded into the training subprocess: on the N-th file write of mmengine's local backend (how
# a checkpoint reaches the disk), write half of the bytes and SIGKILL the process - a crash in the
# middle of a checkpoint write.
SITECUSTOMIZE = """
import os, signal
_n = int(os.environ.get('KILL_ON_SAVE', '0'))
if _n:
    from mmengine.fileio.backends import local_backend
    _put, _calls = local_backend.LocalBackend.put, [0]
    def _dying_put(self, obj, filepath):
        _calls[0] += 1
        if _calls[0] == _n:
            with open(filepath, 'wb') as out:
                out.write(obj[: len(obj) // 2])
                out.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return _put(self, obj, filepath)
    local_backend.LocalBackend.put = _dying_put
"""


def _train(config, work_dir, *extra, env=None, kill_when=None, timeout=600):
    """Run tools/train.py; with ``kill_when(log_text)`` SIGKILL it, with its data-loader
    workers (its own process group), once that is true. Returns (returncode, log)."""
    cmd = [sys.executable, 'tools/train.py', str(config), '--work-dir', str(work_dir), *extra]
    log_path = Path(f'{work_dir}.{time.time_ns()}.log')
    with open(log_path, 'w') as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        start = time.time()
        while proc.poll() is None:
            if kill_when is not None and kill_when(log_path.read_text()):
                os.killpg(proc.pid, signal.SIGKILL)
                break
            if time.time() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                raise TimeoutError(log_path.read_text()[-3000:])
            time.sleep(0.05)
        proc.wait()
        try:  # workers a crash left behind (the KILL_ON_SAVE case kills the main process only)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, log_path.read_text()


def _weights(path):
    with trusted_training_state():  # mmengine's training state beside the weights
        return torch.load(path, map_location='cpu', weights_only=True)['state_dict']


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp('resume')
    generate_demo_coco(root / 'shapes', num_train=8, num_val=2)
    config = root / 'tiny_demo.py'
    config.write_text(CONFIG.format(base=ROOT / 'configs/demo/mask_rcnn_pvtv2_b2_demo.py',
                                    data=root / 'shapes'))
    site = root / 'site'
    site.mkdir()
    (site / 'sitecustomize.py').write_text(SITECUSTOMIZE)
    code, log = _train(config, root / 'straight')
    assert code == 0, log[-3000:]
    return root, config, site


def test_sigkill_at_three_points_then_resume_gives_the_same_weights(setup):
    root, config, site = setup
    work = root / 'killed'
    # 1) killed in the middle of epoch 2 (epoch 1 saved)
    code, log = _train(config, work, kill_when=lambda text: 'Epoch(train) [2][2/4]' in text)
    assert code == -signal.SIGKILL and (work / 'epoch_1.pth').exists()
    assert not (work / 'epoch_2.pth').exists()
    # 2) resumed, then killed while writing epoch_2.pth
    env = {'KILL_ON_SAVE': '1', 'PYTHONPATH': f'{site}{os.pathsep}{os.environ.get("PYTHONPATH", "")}'}
    code, log = _train(config, work, '--resume', env=env)
    assert code == -signal.SIGKILL, log[-3000:]
    assert 'Auto resumed from the latest complete checkpoint' in log and 'epoch_1.pth' in log
    assert (work / 'epoch_2.pth.tmp').exists() and not (work / 'epoch_2.pth').exists()
    assert (work / 'last_checkpoint').read_text().strip().endswith('epoch_1.pth')
    # 3) resumed, killed in epoch 3, with a damaged last_checkpoint left behind
    code, log = _train(config, work, '--resume',
                       kill_when=lambda text: 'Epoch(train) [3][1/4]' in text)
    assert code == -signal.SIGKILL and (work / 'epoch_2.pth').exists()
    (work / 'last_checkpoint').write_text('')
    code, log = _train(config, work, '--resume')
    assert code == 0, log[-3000:]
    assert 'last_checkpoint names' in log and 'restored the random state' in log
    assert 'latest complete checkpoint' in log and 'epoch_2.pth' in log
    straight, resumed = _weights(root / 'straight/epoch_3.pth'), _weights(work / 'epoch_3.pth')
    assert straight.keys() == resumed.keys()
    max_diff = max((straight[k].float() - resumed[k].float()).abs().max().item() for k in straight)
    print(f'max weight difference after 3 kills and resumes: {max_diff:.3g}')
    assert max_diff == 0.0


def test_resume_without_random_state_differs(setup):
    """The control: the same kill/resume without RandomStateHook's states is not exact."""
    root, config, _ = setup
    work = root / 'no_state'
    code, _ = _train(config, work, kill_when=lambda text: 'Epoch(train) [2][1/4]' in text)
    assert code == -signal.SIGKILL
    with trusted_training_state():
        ckpt = torch.load(work / 'epoch_1.pth', map_location='cpu', weights_only=True)
    del ckpt['meta']['random_state']
    atomic_save_checkpoint(ckpt, str(work / 'epoch_1.pth'))
    code, log = _train(config, work, '--resume')
    assert code == 0 and 'holds no random state' in log
    straight, resumed = _weights(root / 'straight/epoch_3.pth'), _weights(work / 'epoch_3.pth')
    assert max((straight[k].float() - resumed[k].float()).abs().max().item() for k in straight) > 0


def test_find_resumable_checkpoint_skips_truncated_files(tmp_path):
    good = tmp_path / 'epoch_1.pth'
    torch.save({'state_dict': {'w': torch.ones(2)}}, good)
    bad = tmp_path / 'epoch_2.pth'
    bad.write_bytes(good.read_bytes()[:40])
    (tmp_path / 'last_checkpoint').write_text(str(bad))
    assert find_resumable_checkpoint(str(tmp_path)) == str(good)
    (tmp_path / 'last_checkpoint').write_text('')
    assert find_resumable_checkpoint(str(tmp_path)) == str(good)
    good.unlink()
    assert find_resumable_checkpoint(str(tmp_path)) is None
