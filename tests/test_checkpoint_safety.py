"""Training checkpoints load under torch's weights_only default; crafted pickles are refused."""
import os
import pickle
import subprocess
import sys

import pytest
import torch

import mmvit_ext  # noqa: F401  (installs the allowlist)
from mmvit_ext.converters import CheckpointError, read_checkpoint
from toy_runner import make_runner

TESTS = os.path.dirname(__file__)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp('toy')
    runner = make_runner(str(work_dir), max_epochs=2)
    runner.train()
    return work_dir, {k: v.clone() for k, v in runner.model.state_dict().items()}


def test_stock_torch_load_refuses_mmengine_checkpoint_without_allowlist(trained):
    """The problem being fixed: without mmvit_ext, torch 2.11 cannot read mmengine's file."""
    work_dir, _ = trained
    code = ('import torch, mmengine, pickle, sys\n'
            f'try:\n    torch.load({str(work_dir / "epoch_1.pth")!r})\n'
            'except pickle.UnpicklingError as e:\n    print("REFUSED", str(e)[:300]); sys.exit(0)\n'
            'sys.exit(1)\n')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert result.returncode == 0 and 'REFUSED' in result.stdout, result.stdout + result.stderr


def test_resume_reaches_the_uninterrupted_weights(trained, tmp_path):
    work_dir, final = trained
    checkpoint = torch.load(work_dir / 'epoch_1.pth')  # weights_only=True, torch's default
    assert checkpoint['meta']['epoch'] == 1 and 'message_hub' in checkpoint
    resumed = make_runner(str(tmp_path), max_epochs=2, resume=True,
                          load_from=str(work_dir / 'epoch_1.pth'))
    resumed.train()
    assert resumed.epoch == 2 and resumed.iter == 4
    for key, value in resumed.model.state_dict().items():
        torch.testing.assert_close(value, final[key], atol=1e-6, rtol=0)


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))


class _GetattrExploit:
    """Tries to reach past the restricted getattr stand-in."""

    def __reduce__(self):
        from mmengine.logging.history_buffer import HistoryBuffer
        return (getattr, (HistoryBuffer, '__init__'))


@pytest.mark.parametrize('payload', ['os.system', 'getattr'])
def test_crafted_checkpoint_executes_nothing(payload, tmp_path):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'evil.pth'
    obj = _Exploit(marker) if payload == 'os.system' else _GetattrExploit()
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': obj}, path)
    with pytest.raises(CheckpointError, match='refused to load'):
        read_checkpoint(path)
    from mmengine.runner.checkpoint import load_checkpoint
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(torch.nn.Linear(1, 1), str(path))
    runner_dir = tmp_path / 'runner'
    runner = make_runner(str(runner_dir), resume=True, load_from=str(path))
    with pytest.raises(pickle.UnpicklingError):
        runner.train()
    assert not marker.exists()


def test_empty_and_truncated_files_are_named(tmp_path, trained):
    work_dir, _ = trained
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    with pytest.raises(CheckpointError, match=r'empty \(0 bytes\).*empty.pth'):
        read_checkpoint(empty)
    truncated = tmp_path / 'truncated.pth'
    data = (work_dir / 'epoch_2.pth').read_bytes()
    truncated.write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match='truncated.*truncated.pth'):
        read_checkpoint(truncated)
    with pytest.raises(CheckpointError, match='not found'):
        read_checkpoint(tmp_path / 'missing.pth')
    bad_st = tmp_path / 'bad.safetensors'
    bad_st.write_bytes(b'\x10\x00\x00\x00\x00\x00\x00\x00{"a": 1}')
    with pytest.raises(CheckpointError, match='bad.safetensors'):
        read_checkpoint(bad_st)
