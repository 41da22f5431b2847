"""tools/{dist,slurm}_{train,test}.sh (tools/launch.py): usage on missing arguments, the venv's
python, torchrun's and srun's form."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {'dist_train.sh': 2, 'dist_test.sh': 3, 'slurm_train.sh': 4, 'slurm_test.sh': 4}


def _bash(script, *args, env=None):
    return subprocess.run(['bash', str(ROOT / 'tools' / script), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize('script,needed', SCRIPTS.items())
def test_missing_arguments_print_usage_and_fail(script, needed):
    result = _bash(script, *['x'] * (needed - 1))
    assert result.returncode == 2 and result.stderr.startswith('usage: ')
    assert result.stdout == ''


def _fake_bin(tmp_path: Path, name: str) -> Path:
    """An executable that records its command line (one argument a line) and exits 0."""
    record = tmp_path / f'{name}.args'
    fake = tmp_path / 'bin' / name
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$0" "$@" > {record}\n')
    fake.chmod(0o755)
    return record


def test_slurm_scripts_call_srun_in_the_openmmlab_form(tmp_path):
    record = _fake_bin(tmp_path, 'srun')
    env = {**os.environ, 'PATH': f'{tmp_path / "bin"}:{os.environ["PATH"]}', 'GPUS': '16',
           'GPUS_PER_NODE': '4', 'SRUN_ARGS': '--quotatype=auto'}
    env.pop('PYTHON', None)
    venv_python = ROOT / '.venv/bin/python'
    if not venv_python.exists():  # a worktree without its own venv: the override is used
        env['PYTHON'] = sys.executable
    for script, tool, fourth in (('slurm_train.sh', 'train.py', 'work_dirs/x'),
                                 ('slurm_test.sh', 'test.py', 'x.pth')):
        result = _bash(script, 'gpu', 'job', 'configs/mask_rcnn_pvtv2_b2.py', fourth, '--amp',
                       env=env)
        assert result.returncode == 0, result.stderr
        args = record.read_text().splitlines()
        assert args[:7] == [str(tmp_path / 'bin/srun'), '-p', 'gpu', '--job-name=job',
                            '--gres=gpu:4', '--ntasks=16', '--ntasks-per-node=4']
        python = env.get('PYTHON', str(venv_python))
        at = args.index(python)
        assert args[at - 1] == '--quotatype=auto' and '--kill-on-bad-exit=1' in args[:at]
        assert args[at + 1:at + 4] == ['-u', str(ROOT / 'tools' / tool),
                                       'configs/mask_rcnn_pvtv2_b2.py']
        assert '--launcher=slurm' in args and args[-1] == '--amp'
        assert (f'--work-dir={fourth}' if tool == 'train.py' else fourth) in args


def test_dist_scripts_run_the_venv_python_or_say_how_to_get_it(tmp_path):
    env = {**os.environ, 'PYTHON': str(tmp_path / 'missing/python')}
    result = _bash('dist_train.sh', 'configs/mask_rcnn_pvtv2_b2.py', '2', env=env)
    assert result.returncode == 2 and 'tools/setup_env.sh' in result.stderr
    # a stand-in torch.distributed.run that records the interpreter's whole command line
    record = tmp_path / 'run.args'
    (tmp_path / 'torch' / 'distributed').mkdir(parents=True)
    (tmp_path / 'torch' / '__init__.py').write_text('')
    (tmp_path / 'torch' / 'distributed' / '__init__.py').write_text('')
    (tmp_path / 'torch' / 'distributed' / 'run.py').write_text(
        f'import sys; open({str(record)!r}, "w").write("\\n".join(sys.orig_argv))\n')
    env.update(PYTHON=sys.executable, PYTHONPATH=str(tmp_path))
    assert _bash('dist_test.sh', 'c.py', 'w.pth', '2', env=env).returncode == 0
    args = record.read_text().splitlines()
    assert args[1:3] == ['-m', 'torch.distributed.run'] and '--nproc_per_node=2' in args
    assert args[-5:] == [str(ROOT / 'tools/test.py'), 'c.py', 'w.pth', '--launcher', 'pytorch']
    text = (ROOT / 'tools/dist_test.sh').read_text()
    assert '$ROOT/.venv/bin/python' in text  # the default when PYTHON is not set
