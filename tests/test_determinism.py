"""``randomness.deterministic='cpu'`` (the shipped demo config): bitwise reproducible on CPU,
seeded only on CUDA, said in one line; an explicit ``True`` keeps its meaning everywhere."""
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from mmvit_ext.engine import determinism

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / 'configs' / 'demo' / 'mask_rcnn_pvtv2_b2_demo.py'


def test_the_demo_config_asks_determinism_where_the_device_allows():
    assert Config.fromfile(DEMO).randomness == dict(seed=0, deterministic=determinism.ON_CPU)


def test_cpu_resolves_to_deterministic_silently(capsys):
    cfg = Config.fromfile(DEMO)
    assert determinism.resolve_deterministic(cfg, cuda=False) is True
    assert cfg.randomness.deterministic is True and capsys.readouterr().out == ''


def test_cuda_resolves_to_seeded_with_one_line(capsys, monkeypatch):
    monkeypatch.delenv('CUBLAS_WORKSPACE_CONFIG', raising=False)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    cfg = Config.fromfile(DEMO)
    assert determinism.prepare_cuda_determinism(cfg) is False
    assert cfg.randomness == dict(seed=0, deterministic=False)
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert "deterministic='cpu' on CUDA: seeded, not bitwise reproducible" in line
    assert 'CUBLAS_WORKSPACE_CONFIG' not in __import__('os').environ  # nothing asked of cuBLAS


@pytest.mark.parametrize('cuda', [False, True])
def test_an_explicit_true_keeps_its_meaning(cuda, capsys):
    """A user's own ``deterministic=True`` stays True on CUDA, where DeterminismCheckHook then
    refuses it with the modules named (tests/test_precision.py)."""
    cfg = Config(dict(randomness=dict(seed=1, deterministic=True)))
    assert determinism.resolve_deterministic(cfg, cuda=cuda) is True
    assert cfg.randomness.deterministic is True and capsys.readouterr().out == ''
    assert determinism.resolve_deterministic(Config(dict()), cuda=cuda) is False
