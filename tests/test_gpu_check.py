"""tools/gpu_check.sh --device cpu: the GPU check's steps end to end at tiny settings, one table
and one tarball of logs; --help, --steps and the no-CUDA line. Then the pure parts of
tools/dev/gpu_check.py (the table, the summaries, the training check, the install) and of
tools/dev/gpu_check_steps.py (the steps' rows)."""
import json
import math
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mmvit_ext.backbones import family_classes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools' / 'dev'))
import gpu_check  # noqa: E402
import gpu_check_steps  # noqa: E402

STEPS = ['probe', 'contract', 'kernels', 'amp-train', 'ddp', 'fsdp', 'bench', 'detector',
         'segmenter', 'ladder', 'compiled']


def _run(*args, env=None, timeout=2400):
    env = {**os.environ, 'PYTHON': sys.executable, 'OMP_NUM_THREADS': os.environ.get('OMP_NUM_THREADS', '2'), **(env or {})}
    return subprocess.run(['bash', 'tools/gpu_check.sh', *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_help_names_the_options_and_steps():
    result = _run('--help')
    assert result.returncode == 0
    for word in ('--install', '--steps', '--device', '--out', *STEPS):
        assert word in result.stdout, word
    listed = re.findall(r'^  ([a-z][a-z-]*) {2,}', result.stdout, re.M)
    assert listed == STEPS  # in the order they run
    bad = _run('--steps', 'probe,nope')
    assert bad.returncode == 2 and 'unknown step nope' in bad.stderr


def test_gpu_check_runs_every_step_on_cpu(tmp_path):
    out = tmp_path / 'check.md'
    result = _run('--device', 'cpu', '--out', str(out), '--steps', ','.join(STEPS))  # opt-in too
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    table = out.read_text()
    assert table.startswith('# gpu_check (cpu)') and f'steps {",".join(STEPS)}' in table
    rows = [line.split(' | ')[0][2:] for line in table.splitlines() if line.startswith('| ')
            and line.split(' | ')[1:2] == ['ok']]
    assert [r.split(' ')[0] for r in rows] == ['probe', 'contract', 'contract', 'contract',
                                              'attention', 'amp-train', 'ddp', 'fsdp', 'bench',
                                              'detector', 'detector', 'segmenter', 'ladder',
                                              'bench']
    assert 'PROBE cpu: 4 ops ok' in table
    # the attention-kernel table of docs/speed.md, measured again in its own process
    assert ('SUMMARY attention kernels cpu: 102 runs, seen explicit, flash, grid_sample; math '
            'fallback: none; float32 under autocast: DINOv3 M2F pixel decoder (mmcv), DINOv3 '
            'adapter extractor (deformable), ViT-Adapter extractor (deformable), ViT-Adapter '
            'injector (deformable); raised: none') in table
    for dtype in ('fp32', 'bf16', 'fp16'):  # a family may fail only where a plain op does
        ok, platform = re.search(rf'CONTRACT cpu {dtype}: (\d+) families ok(?:; limited by the '
                                 r'platform \(plain ops wrong\): \[(.*?)\])?', table).groups()
        limited = platform.split(', ') if platform else []
        assert int(ok) + len(limited) == len(family_classes()), (dtype, ok, limited)
        assert dtype != 'fp32' or not limited
    assert len(re.findall(r'TRAIN 2 iterations, losses \[[-0-9., ]+\]: ok', table)) == 3
    for name in ('Swin-T', 'PVTv2-b2'):
        assert re.search(rf'SUMMARY {name} fp32 b1 64x64 ours=[0-9.]+ img/s mmdet=[0-9.]+ img/s '
                         r'ours/mmdet=[0-9.]+', table), name
    assert re.search(r'SUMMARY configs/mmseg/eomt_dinov3_vitl16_512x512_ade20k.py fp32 b1 64x64 '
                     r'fwd_speedup_vs_mask2former_dinov3_vitl16_adapter_512x512_160k_ade20k=[0-9.]+',
                     table)
    assert '| ours | fp32 | `False` |' in table and '| mmdet | fp32 | `True` |' in table
    with tarfile.open(tmp_path / 'check_logs.tar.gz') as tar:
        names = tar.getnames()
    assert 'logs/check.md' in names and any(n.endswith('probe_ops.log') for n in names)
    # the bench steps' profiles, beside the table
    assert {'logs/profile_bf16/pvtv2_b0/ours_fwdbwd.txt',
            'logs/profile_compiled/pvtv2_b0/ours_fwdbwd.txt'} <= set(names)
    assert re.search(r'SUMMARY pvtv2:b0 bf16 b1 64x64 compiled=aot_eager ', table)


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


def test_install_is_asked_for_and_only_into_a_virtual_environment():
    """Without --install nothing is installed; with it, a Python outside a venv is refused in one
    line before any step."""
    assert not gpu_check.parser().parse_args([]).install
    system = sys.executable if sys.prefix == sys.base_prefix else \
        str(Path(sys.base_prefix) / 'bin' / Path(sys.executable).name)
    result = _run('--device', 'cpu', '--install', env={'PYTHON': system}, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count('\n') == 1 and 'only into a virtual environment' in result.stderr
    assert gpu_check.in_virtualenv(sys.executable) == (sys.prefix != sys.base_prefix)


def test_steps_table_is_the_run_order():
    assert list(gpu_check_steps.STEPS) == STEPS
    assert gpu_check_steps.parse_steps('bench,ladder') == ['bench', 'ladder']
    assert gpu_check_steps.parse_steps('probe, ,contract,') == ['probe', 'contract']
    with pytest.raises(ValueError, match='unknown step nope'):
        gpu_check_steps.parse_steps('probe,nope')


def test_summary_takes_the_last_three_lines_and_escapes_pipes():
    log = 'noise\nPROBE a\nCONTRACT b | c\nother\nSUMMARY d\nGOAL e\n'
    assert gpu_check.summary_of(log, 0, 'x.log') == 'CONTRACT b \\| c SUMMARY d GOAL e'
    assert gpu_check.summary_of('nothing\n', 0, 'x.log') == ''
    failed = gpu_check.summary_of('TRAIN 1\nRuntimeError: a | b\n', 3, 'x.log')
    assert failed == 'FAILED (exit 3, x.log): RuntimeError: a \\| b TRAIN 1'
    last = 'torch.OutOfMemoryError: ' + 'x' * 400
    oom = gpu_check.summary_of(last + '\n', 1, 'y.log')
    assert oom == f'FAILED (exit 1, y.log): {last[:300]} OOM.'


def test_table_renders_rows_status_and_ladder():
    row = gpu_check.table_row('bench bf16 swin:tiny', 0, gpu_check.escape('SUMMARY 1|2'), 12.7)
    assert row == '| bench bf16 swin:tiny | ok | SUMMARY 1\\|2 | 12 |'
    now = (2026, 11, 26, 22, 5, 0, 3, 330, 0)
    text = gpu_check.render_table('cpu', 'cpu | torch 2.11.0', 'probe', 61.2, [row],
                                  'all steps done: every row ok', '| ladder |\n', now)
    assert text.splitlines() == [
        '# gpu_check (cpu): 2026-11-26 22:05 UTC, cpu | torch 2.11.0, steps probe, 61 s', '',
        '| step | result | summary | seconds |', '|---|---|---|---|', row, '',
        'all steps done: every row ok', '', '| ladder |']
    assert gpu_check.table_row('x', 2, 's', 0) == '| x | FAILED | s | 0 |'


def _scalars(work, records):
    run = work / '20261126_220000' / 'vis_data'
    run.mkdir(parents=True)
    (run / 'scalars.json').write_text(''.join(json.dumps(r) + '\n' for r in records))


@pytest.mark.parametrize('losses,ok', [([1.23456, 0.5], True), ([1.0, math.nan], False),
                                       ([1.0, math.inf], False), ([1.0, 2.0, 3.0], False),
                                       ([], False)])
def test_training_check_reads_mmengine_scalars(tmp_path, losses, ok):
    _scalars(tmp_path, [{'lr': 0.1, 'loss': v, 'iter': i} for i, v in enumerate(losses)]
             + [{'coco/bbox_mAP': 0.0}])
    result, line = gpu_check.check_training(tmp_path)
    assert result is ok
    assert line.startswith('TRAIN 2 iterations, losses [') and line.endswith(': ok' if ok else ': FAILED')
    if losses == [1.23456, 0.5]:
        assert line == 'TRAIN 2 iterations, losses [1.235, 0.5]: ok'
    assert gpu_check.check_training(tmp_path / 'missing') == (
        False, 'TRAIN 2 iterations, losses []: FAILED')


def test_training_check_with_a_metric_wants_one_value_of_it(tmp_path):
    """The wheel-set rehearsal's UperNet: two finite losses and one val mIoU."""
    rows = [{'loss': 3.14159, 'iter': 1}, {'loss': 2.5, 'iter': 2}, {'mIoU': 0.5, 'step': 2}]
    _scalars(tmp_path / 'full', rows)
    _scalars(tmp_path / 'no_val', rows[:2])
    assert gpu_check.check_training(tmp_path / 'full', 'mIoU') == (
        True, 'TRAIN 2 iterations, losses [3.142, 2.5], val mIoU [0.5]: ok')
    assert gpu_check.check_training(tmp_path / 'no_val', 'mIoU') == (
        False, 'TRAIN 2 iterations, losses [3.142, 2.5], val mIoU []: FAILED')


def test_rows_of_the_cpu_and_cuda_variants(tmp_path, monkeypatch):
    cpu = gpu_check_steps.Check('cpu', 'py', tmp_path / 'check.md', 'all')
    rows = [row for step in gpu_check_steps.STEPS.values() for row in step.rows(cpu)]
    assert [row.name for row in rows] == [
        'probe ops', 'contract fp32', 'contract bf16', 'contract fp16', 'attention kernels',
        'amp-train bfloat16 Mask R-CNN PVTv2-b2', 'ddp 1 process Mask R-CNN PVTv2-b2',
        'fsdp 1 process bf16 params Mask R-CNN PVTv2-b2', 'bench bf16 pvtv2:b0 b1 64x64',
        'detector Mask R-CNN Swin-T b1 64x64', 'detector Mask R-CNN PVTv2-b2 b1 64x64',
        'segmenter EoMT-S vs adapter-S + M2F inference fp32 b1 64x64', 'ladder Swin-T 96x128',
        'bench compiled pvtv2:b0 b1 64x64']
    assert rows[0].log_name == 'probe_ops.log' and rows[8].log_name == 'bench_bf16_pvtv2_b0_b1_64x64.log'
    assert rows[4].argv == ('py', 'tests/attention_kernels.py', '--device', 'cpu')
    ddp = rows[6]
    assert ddp.argv[:8] == ('py', '-m', 'torch.distributed.run', '--nproc_per_node', '1',
                            '--master_port', '29561', 'tools/train.py')
    assert ddp.work == tmp_path / 'logs' / 'work_ddp' and 'randomness.deterministic=True' in ddp.argv
    assert 'train_dataloader.dataset.pipeline.2.scale=(64,64)' in ddp.argv
    # the CPU variant: fewer RoIs a training step, one step a ladder row; every row still runs
    assert all('model.train_cfg.rcnn.sampler.num=16' in row.argv for row in rows[5:8])
    segmenter = rows[11].argv
    assert segmenter[segmenter.index('--against-options') + 1:][-1] == \
        'model.decode_head.hidden_dims=256' and '--eval' in segmenter
    ladder = rows[12].argv
    assert ladder[ladder.index('--repeat') + 1] == '0'
    monkeypatch.setenv('BENCH_BATCH', '4')
    cuda = gpu_check_steps.Check('cuda', 'py', tmp_path / 'check.md', 'all')
    assert [row.name for row in gpu_check_steps.STEPS['bench'].rows(cuda)] == [
        'bench bf16 swin:tiny b4 800x1344', 'bench bf16 pvtv2:b2 b4 800x1344',
        'bench bf16 vit:b b4 800x1344']
    vit = gpu_check_steps.STEPS['bench'].rows(cuda)[2].argv
    assert vit[vit.index('--set'):][:3] == ('--set', 'use_rel_pos=True', 'final_norm=False')
    compiled = gpu_check_steps.STEPS['compiled'].rows(cuda)[0].argv
    assert compiled[compiled.index('--compile-backend') + 1] == 'inductor' and '--compare' in compiled
    assert rows[-1].argv[rows[-1].argv.index('--compile-backend') + 1] == 'aot_eager'
    assert len(gpu_check_steps.STEPS['amp-train'].rows(cuda)) == 2
    assert not any('sampler' in arg for arg in gpu_check_steps.STEPS['ddp'].rows(cuda)[0].argv)
    monkeypatch.setenv('BENCH_MODELS', 'swin:tiny, vit:b')
    assert [row.name for row in gpu_check_steps.STEPS['compiled'].rows(cuda)] == [
        'bench compiled swin:tiny b4 800x1344', 'bench compiled vit:b b4 800x1344']
    swin = gpu_check_steps.STEPS['detector'].rows(cuda)[0]
    assert swin.name == 'detector Mask R-CNN Swin-T b2 800x1333'
    assert swin.argv[1:] == ('tools/analysis/detector_speed.py', 'configs/mask_rcnn_swin_t_fpn_1x_coco.py',
                             '--device', 'cuda', '--batch', '2', '--size', '800', '1333', '--dtype',
                             'bf16', '--warmup', '2', '--repeat', '5', '--name', 'Swin-T')


def test_install_uses_carried_sets_else_the_mmcv_recipe(tmp_path, monkeypatch):
    calls = []
    # pip install -q ARGS: the ARGS recorded
    monkeypatch.setattr(gpu_check.python_env, 'pip', lambda py, *a: calls.append(a[2:]))
    monkeypatch.setattr(gpu_check.mmcv_build, 'ensure_mmcv',
                        lambda py, pin, cache, log: calls.append(('ensure', pin.spec)) or 'built')
    monkeypatch.setattr(gpu_check, 'ROOT', tmp_path)
    (tmp_path / 'requirements').mkdir()
    (tmp_path / 'requirements' / 'dev.txt').write_text(
        '# build: wheel\ntorch==2.11.0\ntorchvision==0.26.0\nmmcv==2.1.0\nmmdet==3.3.0\n')
    gpu_check.install_stack('py', tmp_path, log=lambda msg: None)
    assert calls == [('ensure', 'mmcv==2.1.0'), ('-r', str(tmp_path / 'requirements.txt'))]
    # the machine's torch stays; mmcv is the build ensure_mmcv just installed
    assert (tmp_path / 'requirements.txt').read_text() == '# build: wheel\nmmcv==2.1.0\nmmdet==3.3.0\n'
    calls.clear()
    (tmp_path / '.whl' / 'core').mkdir(parents=True)
    (tmp_path / '.whl' / 'core' / 'requirements.txt').write_text('mmdet==3.3.0\n')
    gpu_check.install_stack('py', tmp_path, log=lambda msg: None)
    core = tmp_path / '.whl' / 'core'
    assert calls == [('--no-index', '--no-deps', '--find-links', str(core), '-r',
                      str(core / 'requirements.txt'))]
    # --install runs it as the first row, in a process of its own
    row = gpu_check.install_row(gpu_check_steps.Check('cuda', 'py', tmp_path / 'check.md', 'all'))
    assert row.log_name == 'install.log' and row.argv[-2:] == ('py', str(tmp_path / 'logs'))
    assert 'gpu_check.install_stack(' in row.argv[2]


def test_tarball_leaves_out_demo_data_and_checkpoints(tmp_path):
    logs = tmp_path / 'logs'
    (logs / 'demo_shapes').mkdir(parents=True)
    (logs / 'work_ddp').mkdir()
    for name in ('a.log', 'demo_shapes/x.jpg', 'work_ddp/iter_2.pth', 'work_ddp/run.log'):
        (logs / name).write_text('x')
    with tarfile.open(gpu_check.tar_logs(tmp_path / 'check.md')) as tar:
        assert sorted(tar.getnames()) == ['logs', 'logs/a.log', 'logs/work_ddp', 'logs/work_ddp/run.log']
