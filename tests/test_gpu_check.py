"""tools/gpu_check.sh --device cpu: the GPU check's steps end to end at tiny settings, one table
and one tarball of logs; --help, --steps and the no-CUDA line."""
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from mmvit_ext.backbones import family_classes

ROOT = Path(__file__).resolve().parents[1]
STEPS = ['probe', 'contract', 'amp-train', 'ddp', 'fsdp', 'bench', 'ladder']


def _run(*args, env=None, timeout=1200):
    env = {**os.environ, 'PYTHON': sys.executable, 'OMP_NUM_THREADS': '2', **(env or {})}
    return subprocess.run(['bash', 'tools/gpu_check.sh', *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_help_names_the_options_and_steps():
    result = _run('--help')
    assert result.returncode == 0
    for word in ('--no-install', '--steps', '--device', '--out', *STEPS):
        assert word in result.stdout, word
    listed = re.findall(r'^  ([a-z][a-z-]*) {2,}', result.stdout, re.M)
    assert listed == STEPS  # in the order they run
    bad = _run('--steps', 'probe,nope')
    assert bad.returncode == 2 and 'unknown step nope' in bad.stderr


def test_gpu_check_runs_every_step_on_cpu(tmp_path):
    out = tmp_path / 'check.md'
    result = _run('--device', 'cpu', '--out', str(out))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    table = out.read_text()
    assert table.startswith('# gpu_check (cpu)') and f'steps {",".join(STEPS)}' in table
    rows = [line.split(' | ')[0][2:] for line in table.splitlines() if line.startswith('| ')
            and line.split(' | ')[1:2] == ['ok']]
    assert [r.split(' ')[0] for r in rows] == ['probe', 'contract', 'contract', 'contract',
                                              'amp-train', 'ddp', 'fsdp', 'bench', 'ladder']
    assert 'PROBE cpu: 4 ops ok' in table
    for dtype in ('fp32', 'bf16', 'fp16'):
        assert f'CONTRACT cpu {dtype}: {len(family_classes())} families ok' in table
    assert table.count('TRAIN 2 iterations') == 3 and 'NOT finite' not in table
    assert '| ours | fp32 | `False` |' in table and '| mmdet | fp32 | `True` |' in table
    with tarfile.open(tmp_path / 'check_logs.tar.gz') as tar:
        names = tar.getnames()
    assert 'logs/check.md' in names and any(n.endswith('probe_ops.log') for n in names)


def test_steps_rerun_only_what_is_named(tmp_path):
    out = tmp_path / 'probe.md'
    result = _run('--device', 'cpu', '--out', str(out), '--steps', 'probe')
    assert result.returncode == 0, result.stdout[-2000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith('| ')][1:]
    assert len(rows) == 1 and rows[0].startswith('| probe ops | ok |')


def test_gpu_check_without_cuda_says_so_in_one_line():
    result = _run(env={'CUDA_VISIBLE_DEVICES': ''}, timeout=120)
    assert result.returncode == 1
    assert result.stdout.count('\n') == 1 and 'no CUDA device' in result.stdout
