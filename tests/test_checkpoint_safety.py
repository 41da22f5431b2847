"""Training checkpoints load under torch's weights_only default where we load them (our reader,
tools/, TrustedCheckpointHook, trusted_training_state); importing mmvit_ext changes nothing in
torch; crafted pickles are refused."""
import os
import pickle
import subprocess
import sys

import pytest
import torch

from mmvit_ext import torch_compat
from mmvit_ext.converters import CheckpointError, read_checkpoint
from mmvit_ext.utils.safe_checkpoint import trusted_training_state
from toy_runner import make_runner

needs_allowlist = pytest.mark.skipif(not torch_compat.supports('training-state checkpoints'),
                                     reason='torch < 2.4 has no weights-only allowlist')

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


@needs_allowlist
def test_importing_mmvit_ext_leaves_torchs_allowlist_unchanged(trained):
    """A fresh process: ``import mmvit_ext`` adds nothing to the allowlist (torch's own
    distributed-tensor classes register themselves when the peers import them), stock
    ``torch.load`` still refuses mmengine's file, our reader accepts it and leaves the list
    as it found it."""
    work_dir, _ = trained
    code = ('import pickle, torch\n'
            'before = set(torch.serialization.get_safe_globals())\n'
            'import mmvit_ext\n'
            'after = set(torch.serialization.get_safe_globals())\n'
            'ours = [g for g in after - before if not getattr(g, "__module__", "")'
            '.startswith("torch.")]\n'
            'assert not ours, ours\n'
            f'path = {str(work_dir / "epoch_1.pth")!r}\n'
            'try:\n    torch.load(path)\nexcept pickle.UnpicklingError:\n    print("REFUSED")\n'
            'from mmvit_ext.converters import read_checkpoint\n'
            'print("EPOCH", read_checkpoint(path)["meta"]["epoch"])\n'
            'assert set(torch.serialization.get_safe_globals()) == after\n')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ['REFUSED', 'EPOCH', '1'], result.stdout


@needs_allowlist
def test_trusted_block_adds_only_what_it_lacks_and_restores_on_errors(trained):
    work_dir, _ = trained
    from mmvit_ext.utils.safe_checkpoint import training_state_globals
    before = torch.serialization.get_safe_globals()
    with pytest.raises(KeyError):
        with trusted_training_state():
            assert set(torch.serialization.get_safe_globals()) == \
                set(before) | set(training_state_globals())
            assert torch.load(work_dir / 'epoch_1.pth')['meta']['epoch'] == 1
            raise KeyError('the run failed')
    assert set(torch.serialization.get_safe_globals()) == set(before)  # a set: no order
    from collections import Counter
    torch.serialization.add_safe_globals([Counter])  # the user's own entry survives our block
    try:
        with trusted_training_state(), trusted_training_state():  # nested
            assert len(torch.serialization.get_safe_globals()) == \
                len(set(before) | {Counter} | set(training_state_globals()))
        assert set(torch.serialization.get_safe_globals()) == set(before) | {Counter}
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


@needs_allowlist
@pytest.mark.parametrize('how', ['hook', 'block'])
def test_resume_reaches_the_uninterrupted_weights(trained, tmp_path, how):
    """A plain mmengine Runner resumes with TrustedCheckpointHook (the peers' tools) or inside
    trusted_training_state(); afterwards torch's allowlist is as before."""
    work_dir, final = trained
    before = torch.serialization.get_safe_globals()
    with trusted_training_state():
        checkpoint = torch.load(work_dir / 'epoch_1.pth')  # weights_only=True, torch's default
    assert checkpoint['meta']['epoch'] == 1 and 'message_hub' in checkpoint
    hooks = [dict(type='mmvit_ext.TrustedCheckpointHook')] if how == 'hook' else None
    resumed = make_runner(str(tmp_path), max_epochs=2, resume=True, custom_hooks=hooks,
                          load_from=str(work_dir / 'epoch_1.pth'))
    if how == 'hook':
        resumed.train()
    else:
        with trusted_training_state():
            resumed.train()
    assert set(torch.serialization.get_safe_globals()) == set(before)  # a set: no order
    assert resumed.epoch == 2 and resumed.iter == 4
    for key, value in resumed.model.state_dict().items():
        torch.testing.assert_close(value, final[key], atol=1e-6, rtol=0)


@needs_allowlist
def test_resume_without_the_allowlist_is_refused(trained, tmp_path):
    work_dir, _ = trained
    runner = make_runner(str(tmp_path), resume=True, load_from=str(work_dir / 'epoch_1.pth'))
    with pytest.raises(pickle.UnpicklingError):
        runner.train()


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
    with trusted_training_state(), pytest.raises(pickle.UnpicklingError):
        load_checkpoint(torch.nn.Linear(1, 1), str(path))
    runner_dir = tmp_path / 'runner'
    runner = make_runner(str(runner_dir), resume=True, load_from=str(path))
    with trusted_training_state(), pytest.raises(pickle.UnpicklingError):
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
