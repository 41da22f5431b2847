"""tools/build_gpu_wheels.sh: its help, its plan (cache key, CUDA_HOME from nvcc) and its wheel list.

Nothing here downloads or compiles: the plan is printed before any of that, with a stand-in nvcc.
"""
import os
import re
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / 'tools' / 'build_gpu_wheels.sh'
LIST = ROOT / 'tools' / 'gpu_wheels.txt'


def run(*args, env=None):
    return subprocess.run(['bash', str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def pins(path):
    """NAME -> (VERSION, rest of the line) for each 'NAME==VERSION ...' line."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r'([A-Za-z0-9_.-]+)==([^\s#]+)\s*(\S*)', line)
        if m:
            out[m.group(1).lower()] = (m.group(2), m.group(3))
    return out


def fake_nvcc(tmp_path, release='12.8'):
    """A stand-in nvcc in <tmp>/cuda/bin that answers --version and --dryrun like the real one."""
    bindir = tmp_path / 'cuda' / 'bin'
    bindir.mkdir(parents=True)
    nvcc = bindir / 'nvcc'
    nvcc.write_text('#!/bin/sh\n'
                    f'case "$*" in *--dryrun*) echo "#\\$ _HERE_={bindir}" >&2 ;;\n'
                    f'  *) echo "Cuda compilation tools, release {release}, V{release}.1" ;; esac\n')
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return nvcc


def test_help_names_every_option_and_env_var():
    result = run('--help')
    assert result.returncode == 0, result.stderr
    for word in ('--out', '--cache', '--rebuild', '--rehearse', '--rehearse-only', '--print-plan',
                 'PYTHON312', 'TORCH_CUDA_ARCH_LIST', 'MAX_JOBS', 'NVCC', 'MMVIT_GPU_BUILD_CACHE',
                 'XDG_CACHE_HOME'):
        assert word in result.stdout, word
    # every option the parser accepts is in the help
    parsed = set(re.findall(r'^\s+(--[a-z-]+)\)', SCRIPT.read_text(), re.M))
    assert parsed and all(opt in result.stdout for opt in parsed), parsed


def test_unknown_option_is_refused():
    result = run('--no-such-option')
    assert result.returncode == 2
    assert 'unknown option --no-such-option' in result.stderr


def test_plan_keys_the_cache_by_versions_cuda_and_arch(tmp_path):
    nvcc = fake_nvcc(tmp_path)
    result = run('--print-plan', '--cache', str(tmp_path / 'c'), '--out', str(tmp_path / 'w'),
                 env={'NVCC': str(nvcc), 'TORCH_CUDA_ARCH_LIST': '8.0;9.0+PTX', 'MAX_JOBS': '3'})
    assert result.returncode == 0, result.stderr
    key = 'mmcv2.1.0-torch2.11.0-cu12.8-py312-sm8.0_9.0+PTX'
    assert f'cache key: {key}' in result.stdout
    assert f'mmcv cache: {tmp_path}/c/mmcv/{key}' in result.stdout
    assert f'CUDA_HOME: {tmp_path}/cuda\n' in result.stdout  # nvcc's own directory, one up
    assert 'MAX_JOBS: 3' in result.stdout
    assert 'sets: core\n' in result.stdout  # one set, one carry
    assert not (tmp_path / 'c').exists()  # the plan builds nothing


def test_plan_defaults_and_arch_spellings(tmp_path):
    nvcc = fake_nvcc(tmp_path, release='13.0')
    env = {'NVCC': str(nvcc), 'MMVIT_GPU_BUILD_CACHE': str(tmp_path / 'c')}
    env_default = {k: v for k, v in os.environ.items() if k not in ('TORCH_CUDA_ARCH_LIST', 'MAX_JOBS')}
    result = subprocess.run(['bash', str(SCRIPT), '--print-plan'], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env={**env_default, **env})
    assert 'cache key: mmcv2.1.0-torch2.11.0-cu13.0-py312-sm9.0\n' in result.stdout
    assert f'MAX_JOBS: {len(os.sched_getaffinity(0))}\n' in result.stdout  # nproc
    assert str(tmp_path / 'c' / 'mmcv') in result.stdout  # MMVIT_GPU_BUILD_CACHE is the cache
    spaced = run('--print-plan', env={**env, 'TORCH_CUDA_ARCH_LIST': ' 8.6 9.0 '})
    assert 'cache key: mmcv2.1.0-torch2.11.0-cu13.0-py312-sm8.6_9.0\n' in spaced.stdout


def test_wheel_list_matches_the_pinned_stack():
    wheels, dev = pins(LIST), pins(ROOT / 'requirements' / 'dev.txt')
    for name in ('torch', 'torchvision', 'mmengine', 'mmdet', 'mmsegmentation'):
        assert wheels[name][0] == dev[name][0], name
    # the image's transformers 5 breaks every mmpretrain's import (and so mmdet.models'): none ships
    assert not {'mmpretrain', 'onedl-mmpretrain'} & set(wheels)
    assert wheels['torch'][1] == wheels['torchvision'][1] == 'image'  # the image's, never shipped
    assert wheels['mmcv'] == ('2.1.0', 'core')
    shipped = {n: s for n, (_, s) in wheels.items() if s != 'image'}
    assert set(shipped.values()) == {'core'}
    # each module the imports need comes from exactly one listed distribution: the image's or ours
    for name in ('opencv-python-headless', 'scipy', 'matplotlib', 'regex'):
        assert wheels[name][1] == 'image', name
    for name in ('shapely', 'pycocotools', 'wcwidth'):
        assert name in shipped, name
    lines = [ln.split()[0].lower() for ln in LIST.read_text().splitlines() if '==' in ln and not ln.startswith('#')]
    assert len(lines) == len(set(lines))


def test_fatbin_archs_and_arch_list_parsing():
    """tools/mmcv_ext_info.py reads the kernel archs from fatbinary headers: a synthetic one."""
    import struct
    import sys
    sys.path.insert(0, str(ROOT / 'tools'))
    from mmcv_ext_info import cuda_launchers, expected_archs, fatbin_archs

    def entry(kind, arch, payload=b'\0' * 16):
        header = struct.pack('<HHIQ', kind, 0x101, 64, len(payload)) + b'\0' * 12
        header += struct.pack('<I', arch)
        return header + b'\0' * (64 - len(header)) + payload

    entries = entry(2, 90) + entry(2, 90) + entry(1, 90) + entry(2, 80)
    blob = b'junk' + struct.pack('<IHHQ', 0xBA55ED50, 1, 16, len(entries)) + entries + b'tail'
    assert fatbin_archs(blob) == {'sm_90': 2, 'ptx_90': 1, 'sm_80': 1}
    assert fatbin_archs(b'no fatbinary here') == {}
    assert expected_archs('9.0') == {'sm_90'}
    assert expected_archs('8.0;9.0+PTX') == {'sm_80', 'sm_90', 'ptx_90'}
    assert expected_archs(' 8.6 9.0 ') == {'sm_86', 'sm_90'}
    assert cuda_launchers(b'\0NMSCUDAKernelLauncher\0RoIAlignForwardCUDAKernelLauncher\0'
                          b'NMSCUDAKernelLauncher\0nms_cpu\0') == 2
