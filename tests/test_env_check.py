"""mmvit_ext.utils.env_check: installed-package combinations that break the peers' imports."""
import subprocess
import sys
from pathlib import Path

import pytest

from mmvit_ext.utils import env_check

ROOT = Path(__file__).resolve().parents[1]


def fake(versions):
    return lambda name: versions.get(name)


BROKEN = {'mmpretrain': '1.2.0', 'transformers': '5.17.0', 'pycocotools': '2.0.11'}


def test_the_gpu_image_combination_is_named_with_its_fix():
    """mmpretrain 1.2.0 + transformers 5.17 + pycocotools (the GPU image's) is named, once."""
    lines = env_check.problems(fake(BROKEN))
    assert len(lines) == 1
    assert 'mmpretrain 1.2.0 cannot be imported beside transformers 5.17.0' in lines[0]
    assert 'NoneType takes no arguments' in lines[0] and "transformers<4.56" in lines[0]


@pytest.mark.parametrize('change', [
    {'transformers': '4.55.4'},  # the last transformers with the names mmpretrain imports
    {'transformers': None},  # mmpretrain then skips its multimodal models
    {'pycocotools': None},  # likewise
    {'mmpretrain': None},
    {'mmpretrain': '1.2.1'},  # a release after the break's last known one
])
def test_working_combinations_pass(change):
    versions = {k: v for k, v in {**BROKEN, **change}.items() if v is not None}
    assert env_check.problems(fake(versions)) == []


def test_boundaries_and_version_parsing():
    assert env_check.parse_version('4.56.0.dev0') == (4, 56, 0)
    assert env_check.parse_version('2.11.0+cu130') == (2, 11, 0)
    assert env_check.problems(fake({**BROKEN, 'transformers': '4.56.0'}))
    with pytest.raises(ValueError):
        env_check.parse_version('main')


def test_pinned_stack_has_no_known_break_and_train_refuses_one(tmp_path):
    """The pinned stack (transformers 4.46.3 beside mmpretrain 1.2.0) is clean; tools/train.py
    stops with the line before building anything when a break is installed."""
    assert env_check.problems() == []
    shim = tmp_path / 'sitecustomize.py'  # the installed metadata, as a broken environment has it
    shim.write_text('from importlib import metadata\nreal = metadata.version\n'
                    'metadata.version = lambda n: "5.17.0" if n == "transformers" else real(n)\n')
    env = {'PYTHONPATH': f'{tmp_path}:{ROOT}', 'PATH': '/usr/bin:/bin'}
    result = subprocess.run([sys.executable, 'tools/train.py', 'configs/demo/mask_rcnn_pvtv2_b2_demo.py'],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode != 0
    assert 'mmpretrain 1.2.0 cannot be imported beside transformers 5.17.0' in result.stderr
    assert 'Traceback' not in result.stderr
