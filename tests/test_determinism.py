"""``randomness.deterministic`` is a bool in every shipped config, and means to mmengine's runner
what it says; any other value is refused by our tools in one line; the demo asks for determinism
on CPU from its command line (tools/demo.sh), not from its config."""
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.runner import set_random_seed

from mmvit_ext.engine import determinism
from mmvit_ext.errors import ConfigError

from shipped_configs import CONFIGS, ROOT, load

DEMO = 'configs/demo/mask_rcnn_pvtv2_b2_demo.py'


@pytest.fixture
def global_determinism_state():
    """What mmengine's ``set_random_seed`` changes, put back after the test."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.get_rng_state(), np.random.get_state(),
             random.getstate())
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1:3]
    torch.set_rng_state(saved[3])
    np.random.set_state(saved[4])
    random.setstate(saved[5])


@pytest.mark.parametrize('config', CONFIGS)
def test_shipped_randomness_means_what_it_says(config, global_determinism_state):
    """mmengine's runner passes ``randomness`` (default ``dict(seed=None)``) to
    ``set_random_seed``, which reads ``deterministic`` by truth value: a shipped config says a
    bool (or nothing), and the state it leaves is that bool."""
    randomness = dict(load(config).get('randomness', dict(seed=None)))
    wanted = randomness.get('deterministic', False)
    assert isinstance(wanted, bool), f'{config}: randomness.deterministic={wanted!r}'
    assert determinism.deterministic_setting(dict(randomness=randomness)) is wanted
    seed = set_random_seed(**randomness)
    assert torch.are_deterministic_algorithms_enabled() is wanted
    assert torch.backends.cudnn.deterministic is wanted
    if randomness.get('seed') is not None:
        assert seed == randomness['seed']


def test_the_demo_config_is_seeded_only():
    assert load(DEMO).randomness == dict(seed=0, deterministic=False)


@pytest.mark.parametrize('value', ['cpu', 1, None, 'True'])
def test_a_non_bool_is_refused_in_one_line(value):
    cfg = Config(dict(randomness=dict(seed=0, deterministic=value)))
    with pytest.raises(ConfigError) as err:
        determinism.prepare_cuda_determinism(cfg)
    message = str(err.value)
    assert '\n' not in message
    assert message.startswith(f'randomness.deterministic must be True or False, got {value!r}')
    assert '--cfg-options randomness.deterministic=True' in message


@pytest.mark.parametrize('value', [True, False])
def test_a_bool_keeps_its_meaning(value, monkeypatch):
    """``True`` stays True on CUDA too, where DeterminismCheckHook then refuses the modules
    that cannot honour it (tests/test_precision.py); cuBLAS gets its setting there only."""
    monkeypatch.setenv('CUBLAS_WORKSPACE_CONFIG', '')  # restored (or unset) after the test
    monkeypatch.delenv('CUBLAS_WORKSPACE_CONFIG')
    for cuda in (False, True):
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: cuda)
        cfg = Config(dict(randomness=dict(seed=1, deterministic=value)))
        assert determinism.prepare_cuda_determinism(cfg) is value
        assert cfg.randomness == dict(seed=1, deterministic=value)
        set_by_us = value and cuda
        assert ('CUBLAS_WORKSPACE_CONFIG' in os.environ) is set_by_us
    assert determinism.prepare_cuda_determinism(Config(dict())) is False


def test_train_tool_refuses_a_non_bool_in_one_line():
    """Before anything else is checked or built: one ``error:`` line naming the fix."""
    done = subprocess.run([sys.executable, 'tools/train.py', DEMO, '--cfg-options',
                           'randomness.deterministic=cpu'], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"error: {DEMO}: randomness.deterministic must be True or False, got 'cpu' "
                    "(mmengine reads it by truth value); for determinism on CPU only, set False "
                    'in the config and run on CPU with --cfg-options '
                    'randomness.deterministic=True (as tools/demo.sh does)')
    assert 'Traceback' not in done.stderr


def _commands(script: str) -> list:
    """The script's lines with their backslash continuations joined."""
    return (ROOT / script).read_text().replace('\\\n', ' ').splitlines()


def test_the_demo_asks_determinism_on_cpu_only():
    """tools/demo.sh trains and evaluates with ``randomness.deterministic`` True where there is
    no CUDA device (bitwise reproducible) and False where there is one (seeded only)."""
    lines = _commands('tools/demo.sh')
    (probe,) = [line for line in lines if line.startswith('deterministic=')]
    code = re.fullmatch(r'deterministic=\$\("\$PY" -c \'(.*)\'\)', probe).group(1)
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(not torch.cuda.is_available())
    runs = [line for line in lines if re.search(r'tools/(train|test)\.py', line)]
    assert len(runs) == 2
    for line in runs:
        assert line.endswith('--cfg-options randomness.deterministic="$deterministic"'), line
