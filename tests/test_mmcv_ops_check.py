"""An mmcv without its compiled ops (built where torch was not importable, as pip's build isolation
does) is named at first contact: one line with the installed distribution and the command that
rebuilds it, a warning at ``import mmvit_ext`` and a stop before anything is built in our tools
when the config reaches mmdet or mmseg."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mmvit_ext import distributions
from mmvit_ext.utils import env_check

ROOT = Path(__file__).resolve().parents[1]
DEMO = 'configs/demo/mask_rcnn_pvtv2_b2_demo.py'


def _spec(folder: Path):
    return lambda name: SimpleNamespace(submodule_search_locations=[str(folder)]) \
        if name == 'mmcv' else None


@pytest.mark.parametrize('dist,version', [('mmcv', '2.1.0'), ('onedl-mmcv', '2.3.6')])
def test_one_line_names_the_distribution_and_the_rebuild(tmp_path, dist, version):
    installed = {dist: version}.get
    line = distributions.missing_ops(_spec(tmp_path), installed)
    assert line is not None and '\n' not in line
    assert f'{dist} {version} has no compiled ops' in line
    assert line.endswith(f'--no-build-isolation --no-cache-dir --force-reinstall --no-deps '
                         f'{dist}=={version}')
    (tmp_path / '_ext.cpython-311-x86_64-linux-gnu.so').touch()
    assert distributions.missing_ops(_spec(tmp_path), installed) is None
    assert distributions.missing_ops(lambda name: None, installed) is None  # no mmcv at all


def test_onedl_mmcv_on_a_newer_torch_is_built_as_cxx20(tmp_path):
    """torch >= 2.14's headers refuse C++17, which onedl-mmcv's setup.py asks: the fix builds its
    source release with the standard raised, as docs/install.md's block and setup_env do."""
    line = distributions.missing_ops(_spec(tmp_path), {'onedl-mmcv': '2.3.6', 'torch': '2.15.0'}.get)
    assert "sed -i \"s/'-std=c++17'/'-std=c++20'/\" mmcv_src/onedl_mmcv-2.3.6/setup.py" in line
    assert line.endswith('--force-reinstall --no-deps ./mmcv_src/onedl_mmcv-2.3.6')
    older = distributions.missing_ops(_spec(tmp_path), {'onedl-mmcv': '2.3.6', 'torch': '2.13.0'}.get)
    assert older.endswith('--no-deps onedl-mmcv==2.3.6') and 'sed' not in older
    page = (ROOT / 'docs' / 'install.md').read_text()
    assert "sed -i \"s/'-std=c++17'/'-std=c++20'/\" mmcv_src/onedl_mmcv-2.3.6/setup.py" in page


def test_build_tools_are_the_pinned_stacks():
    """The fix builds with requirements/dev.txt's "# build:" tools (one source, checked here)."""
    sys.path.insert(0, str(ROOT / 'tools'))
    import mmcv_build
    dev = mmcv_build.pin_from_requirements((ROOT / 'requirements' / 'dev.txt').read_text())
    assert dev.build_tools == distributions.OPS_BUILD_TOOLS


def test_only_runs_reaching_mmdet_or_mmseg_are_stopped(monkeypatch):
    monkeypatch.setattr(env_check, 'missing_ops', lambda version=None: 'mmvit_ext: no ops')
    assert 'mmvit_ext: no ops' in env_check.problems(scopes={'mmdet', 'mmvit_ext'})
    assert 'mmvit_ext: no ops' in env_check.problems(scopes={'mmseg'})
    assert 'mmvit_ext: no ops' not in env_check.problems(scopes={'mmpretrain', 'mmvit_ext'})
    assert env_check.problems() == env_check.problems(scopes={'mmdet'})  # mmdet reaches all


@pytest.fixture(scope='module')
def mmcv_without_ops(tmp_path_factory) -> Path:
    """A folder whose ``mmcv`` is the installed one without its ``_ext`` library: every other
    file linked, as an mmcv built without torch in sight installs it."""
    import mmcv
    real = Path(mmcv.__file__).parent
    site = tmp_path_factory.mktemp('no_ops')
    (site / 'mmcv').mkdir()
    for entry in real.iterdir():
        if not entry.name.startswith('_ext'):
            (site / 'mmcv' / entry.name).symlink_to(entry)
    return site


def _run(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_folder_really_lacks_the_ops(mmcv_without_ops):
    result = _run(mmcv_without_ops, '-c', 'import mmcv.ops')
    assert result.returncode != 0 and "No module named 'mmcv._ext'" in result.stderr


def test_import_warns_and_training_stops_before_the_first_step(mmcv_without_ops, tmp_path):
    result = _run(mmcv_without_ops, '-W', 'always', '-c', 'import mmvit_ext')
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'mmcv 2.1.0 has no compiled ops (mmcv._ext)' in result.stderr
    train = _run(mmcv_without_ops, 'tools/train.py', DEMO, '--work-dir', str(tmp_path / 'work'))
    assert train.returncode == 1, (train.stdout + train.stderr)[-3000:]
    lines = [line for line in train.stderr.splitlines() if 'no compiled ops' in line]
    last = train.stderr.strip().splitlines()[-1]
    assert last.startswith('mmvit_ext: mmcv 2.1.0 has no compiled ops') and last in lines
    assert 'pip install --no-build-isolation --no-cache-dir --force-reinstall --no-deps mmcv==2.1.0' in last
    assert 'Traceback' not in train.stderr and not (tmp_path / 'work').exists()
