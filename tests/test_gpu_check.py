"""tools/gpu_check.sh --device cpu: the GPU check's steps end to end at tiny settings, one table."""
import os
import subprocess
import sys
from pathlib import Path

from mmvit_ext.backbones import family_classes

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_cpu(tmp_path):
    out = tmp_path / 'check.md'
    env = {**os.environ, 'PYTHON': sys.executable, 'OMP_NUM_THREADS': '2'}
    result = subprocess.run(['bash', 'tools/gpu_check.sh', '--device', 'cpu', '--out', str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    table = out.read_text()
    assert table.startswith('# gpu_check (cpu)')
    rows = [line for line in table.splitlines() if line.startswith('| ') and ' ok |' in line]
    assert len(rows) == 4, table  # contract, benchmark, ladder, training: each ok
    assert f'CONTRACT cpu fp32: {len(family_classes())} families ok' in table
    assert 'TRAIN 2 iterations' in table and 'finite' in table
    assert '| ours | fp32 | `False` |' in table and '| mmdet | fp32 | `True` |' in table


def test_gpu_check_without_cuda_says_so_in_one_line():
    env = {**os.environ, 'PYTHON': sys.executable, 'CUDA_VISIBLE_DEVICES': ''}
    result = subprocess.run(['bash', 'tools/gpu_check.sh'], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stdout.count('\n') == 1 and 'no CUDA device' in result.stdout
