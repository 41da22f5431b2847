"""tools/dev/build_gpu_wheels.py (run by tools/build_gpu_wheels.sh): its help, its plan (cache key,
CUDA_HOME from nvcc), its wheel list and the machine's facts in it, and the pure parts of the build
and the rehearsal (the list's sets, matching downloads, the manifest, the strip step, the import
and training checks).

Nothing here downloads or compiles: the plan is printed before any of that, with a stand-in nvcc.
"""
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / 'tools' / 'build_gpu_wheels.sh'
LIST = ROOT / 'tools' / 'gpu_wheels.txt'
sys.path[:0] = [str(ROOT / 'tools' / 'dev'), str(ROOT / 'tools')]
import build_gpu_wheels  # noqa: E402
import python_env  # noqa: E402


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
                 'TARGET_PYTHON', 'TORCH_CUDA_ARCH_LIST', 'MAX_JOBS', 'NVCC', 'MMVIT_GPU_BUILD_CACHE',
                 'XDG_CACHE_HOME'):
        assert word in result.stdout, word
    # every option the parser accepts is in the help
    parsed = {opt for action in build_gpu_wheels.build_parser()._actions for opt in action.option_strings}
    assert {'--out', '--cache', '--rehearse-only', '-h'} <= parsed
    assert all(opt in result.stdout for opt in parsed), parsed


def test_shell_only_bootstraps():
    """The bash entry point holds no logic: the interpreter rule (tests/test_setup_env.py), then
    exec of the Python module."""
    lines = [ln for ln in SCRIPT.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith('#')]
    assert len(lines) <= 5 and lines[-1].startswith('exec ') and 'build_gpu_wheels.py' in lines[-1], lines


def test_unknown_option_is_refused():
    result = run('--no-such-option')
    assert result.returncode == 2
    assert 'unrecognized arguments: --no-such-option' in result.stderr
    assert run('--rehearse', '--rebui').returncode == 2  # no abbreviations


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
    """tools/dev/mmcv_ext_info.py reads the kernel archs from fatbinary headers: a synthetic one."""
    import struct
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


def test_ext_info_loads_the_extension_without_mmcv_itself():
    """The build venv has no OpenCV, which mmcv's package __init__ imports: the extension is
    loaded on its own (here the suite's CPU build of mmcv)."""
    code = ('import sys; sys.path.insert(0, "tools/dev"); import mmcv_ext_info; '
            'ext = mmcv_ext_info.load_ext(); '
            'print(ext.__name__, callable(ext.get_compiling_cuda_version), "mmcv" in sys.modules)')
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ['mmcv._ext', 'True', 'False']


def test_the_machine_is_the_lists_data_not_code():
    """The target machine's facts (Python, archs, platforms, pins of the build venv, the most a
    set may hold) are the list's ``@`` lines; no tool spells them."""
    target = python_env.read_target(LIST.read_text())
    assert target['python'] == ['3.12'] and target['arch'] == ['9.0'] and target['max-set-mib'] == ['60']
    assert target['build'] == ['numpy>=2,<3'] and 'manylinux_2_28_x86_64' in target['platforms']
    assert not any(e.name.startswith('@') for e in python_env.read_list(LIST.read_text()))
    with pytest.raises(KeyError, match='names no @arch'):
        python_env.read_target('@python 3.12\n@platforms any\n@build x\n@read y\n@max-set-mib 1\n')
    for path in sorted([*(ROOT / 'tools').glob('*.py'), *(ROOT / 'tools' / 'dev').glob('*.py')]):
        text = path.read_text()
        for fact in ("'3.12'", "'9.0'", '2026-11-17', '60 MiB', 'manylinux'):
            assert fact not in text, (path.name, fact)


def test_list_parses_into_sets():
    text = ('# comment mmcv==9 core\n'
            'torch==2.11.0 image\n'
            'mmcv==2.1.0 core\n'
            '\n'
            'ninja==1.11 build\n'
            'big-pkg==1.0 extra   # a trailing comment\n'
            'addict==2.4.0 core\n'
            'loose==0.1\n')
    entries = python_env.read_list(text)
    assert [e.spec for e in entries] == ['torch==2.11.0', 'mmcv==2.1.0', 'ninja==1.11', 'big-pkg==1.0',
                                         'addict==2.4.0', 'loose==0.1']
    assert entries[-1].set == ''
    assert python_env.shipped_sets(entries) == ['core', 'extra']  # first-seen order, no image / build
    assert python_env.specs_of(entries, 'core') == ['mmcv==2.1.0', 'addict==2.4.0']
    assert python_env.pinned(entries, 'Torch') == '2.11.0'
    with pytest.raises(KeyError, match='pins no mmdet'):
        python_env.pinned(entries, 'mmdet')
    real = python_env.read_list(LIST.read_text())
    assert python_env.shipped_sets(real) == ['core']
    core = python_env.specs_of(real, 'core')
    assert len(core) == len(re.findall(r'^\S+==\S+ core$', LIST.read_text(), re.M)) and 'mmcv==2.1.0' in core


def test_downloaded_wheels_are_matched_to_their_pins(tmp_path):
    for name in ('importlib_metadata-10.2.0-py3-none-any.whl', 'importlib_metadata-10.1.0-py3-none-any.whl',
                 'Shapely-2.2.0-cp312-cp312-manylinux_2_28_x86_64.whl', 'mmcv_full-2.1.0-py3-none-any.whl'):
        (tmp_path / name).write_bytes(b'')
    find = python_env.find_wheel
    hit = find(tmp_path, 'importlib-metadata', '10.2.0')
    assert hit.name == 'importlib_metadata-10.2.0-py3-none-any.whl'
    assert find(tmp_path, 'shapely', '2.2.0').name.startswith('Shapely-2.2.0-cp312')
    assert find(tmp_path, 'shapely', '2.2.0', pure_only=True) is None  # a built fallback must be py3-none-any
    assert find(tmp_path, 'mmcv', '2.1.0') is None


def test_requirements_and_manifest_of_dummy_wheels(tmp_path):
    entries = python_env.read_list('a==1 core\nb==2 core\nc==3 extra\ntorch==2 image\n')
    wheels = {'core/a-1-py3-none-any.whl': b'x' * 1000, 'core/b-2-py3-none-any.whl': b'y' * 48576,
              'extra/c-3-py3-none-any.whl': b'z' * 1048576}
    for rel, data in wheels.items():
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    python_env.write_requirements(tmp_path, entries, ['core', 'extra'])
    assert (tmp_path / 'core' / 'requirements.txt').read_text() == 'a==1\nb==2\n'
    assert (tmp_path / 'requirements.txt').read_text() == 'a==1\nb==2\nc==3\n'
    text = python_env.write_manifest(tmp_path, ['core', 'extra'], ['GPU wheel set: test'])
    assert text == (tmp_path / 'MANIFEST.txt').read_text()
    lines = text.splitlines()
    assert lines[0] == '# GPU wheel set: test'
    assert '--find-links .whl/core --find-links .whl/extra -r .whl/requirements.txt' in lines[2]
    for rel, data in wheels.items():
        assert f'{rel}  {len(data)}  {hashlib.sha256(data).hexdigest()}' in lines
    assert '## set core total: 49576 bytes (0.0 MiB)' in lines
    assert '## set extra total: 1048576 bytes (1.0 MiB)' in lines
    assert lines[-1] == '## total: 1098152 bytes (1.0 MiB)'
    assert [ln for ln in lines if ln.startswith('## set')] == [
        '## set core', '## set core total: 49576 bytes (0.0 MiB)',
        '## set extra', '## set extra total: 1048576 bytes (1.0 MiB)']


def test_pip_noise_is_dropped():
    stderr = ('WARNING: Location \'file:///x\' is ignored: it is neither a file nor a directory.\n'
              "ERROR: pip's dependency resolver does not currently take into account ...\n"
              'ERROR: No matching distribution found for mmcv==9\n')
    assert python_env.without_pip_noise(stderr) == 'ERROR: No matching distribution found for mmcv==9\n'


def test_import_check_reports_every_failure():
    def fake_import(name):
        if name == 'mmcv._ext':
            raise ImportError('libcudart.so.13: cannot open shared object file')
        if name == 'mmdet.models':
            raise RuntimeError('transformers 5')
    modules = ('cv2', 'mmcv._ext', 'mmdet.models', 'mmvit_ext')
    failures = build_gpu_wheels.import_failures(modules, fake_import)
    assert failures == ['mmcv._ext: ImportError: libcudart.so.13: cannot open shared object file',
                        'mmdet.models: RuntimeError: transformers 5']
    real = build_gpu_wheels.import_failures(['json', 'no_such_module_here'])
    assert len(real) == 1 and real[0].startswith('no_such_module_here: ModuleNotFoundError')


def test_upernet_check_is_the_training_check_with_its_miou(tmp_path, capsys):
    log = tmp_path / '20261126_000000' / 'vis_data' / 'scalars.json'
    log.parent.mkdir(parents=True)
    rows = [{'loss': 3.14159, 'iter': 1}, {'loss': 2.5, 'iter': 2}, {'mIoU': 0.5, 'step': 2}]
    log.write_text(''.join(f'{__import__("json").dumps(r)}\n' for r in rows))
    assert build_gpu_wheels.check_upernet_log(str(tmp_path)) == 0
    assert capsys.readouterr().out == ('REHEARSE UperNet Swin-T TRAIN 2 iterations, losses '
                                       '[3.142, 2.5], val mIoU [0.5]: ok\n')
    assert build_gpu_wheels.check_upernet_log(str(tmp_path / 'missing')) == 1


def test_gpu_check_report_rows():
    report = ('# GPU check\n| backbone | ms |\n|---|---|\n| step | status |\n| pvt_v2_b0 | 12.5 |\n'
              '| ops | ok |\nplain text\n')
    assert build_gpu_wheels.gpu_check_rows(report) == ['| pvt_v2_b0 | 12.5 |', '| ops | ok |']


@pytest.mark.skipif(not shutil.which('strip'), reason='needs binutils strip')
def test_strip_step_keeps_the_wheel_whole(tmp_path):
    """wheel unpack, strip --strip-debug of mmcv/_ext*.so, wheel pack: same files, a valid RECORD."""
    lib = next(Path(sys.base_prefix).glob('lib/python3*/lib-dynload/*.so'))
    tree = tmp_path / 'src' / 'mmcv-2.1.0'
    (tree / 'mmcv').mkdir(parents=True)
    (tree / 'mmcv' / '__init__.py').write_text('')
    shutil.copy(lib, tree / 'mmcv' / '_ext.cpython-312-x86_64-linux-gnu.so')
    info = tree / 'mmcv-2.1.0.dist-info'
    info.mkdir()
    (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: mmcv\nVersion: 2.1.0\n')
    (info / 'WHEEL').write_text('Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n'
                                'Tag: cp312-cp312-linux_x86_64\n')
    (info / 'RECORD').write_text('')
    python = Path(sys.executable)
    (tmp_path / 'raw').mkdir()
    subprocess.run([str(python), '-m', 'wheel', 'pack', str(tree), '-d', str(tmp_path / 'raw')],
                   check=True, capture_output=True)
    raw = next((tmp_path / 'raw').glob('*.whl'))
    stripped = build_gpu_wheels.strip_wheel(python, raw, tmp_path / 'work')
    assert stripped.name == raw.name == 'mmcv-2.1.0-cp312-cp312-linux_x86_64.whl'
    with zipfile.ZipFile(raw) as before, zipfile.ZipFile(stripped) as after:
        assert sorted(before.namelist()) == sorted(after.namelist())
        so = 'mmcv/_ext.cpython-312-x86_64-linux-gnu.so'
        assert 0 < after.getinfo(so).file_size <= before.getinfo(so).file_size
        assert so in after.read('mmcv-2.1.0.dist-info/RECORD').decode()


def test_plan_from_options_and_environment(tmp_path):
    nvcc = fake_nvcc(tmp_path, release='13.0')
    args = build_gpu_wheels.build_parser().parse_args(['--out', 'rel_out', '--cache', str(tmp_path / 'c'),
                                                        '--rebuild'])
    plan = build_gpu_wheels.make_plan(args, {'NVCC': str(nvcc), 'MAX_JOBS': '5', 'PATH': ''})
    assert plan.out == Path.cwd() / 'rel_out' and plan.rebuild and plan.jobs == 5 and plan.arch == '9.0'
    assert plan.key == 'mmcv2.1.0-torch2.11.0-cu13.0-py312-sm9.0'
    assert plan.build_specs() == ['torch==2.11.0', 'numpy>=2,<3', 'setuptools>=80,<82', 'wheel',
                                  'packaging>=24.2', 'ninja']  # requirements/dev.txt's build line
    assert plan.build_venv == tmp_path / 'c' / 'venv-build' and plan.sets == ['core']
    bare = build_gpu_wheels.make_plan(build_gpu_wheels.build_parser().parse_args([]),
                                      {'XDG_CACHE_HOME': str(tmp_path / 'x'), 'PATH': ''})
    assert bare.cuda == 'none' and bare.cuda_root is None and bare.nvcc is None
    assert bare.cache == tmp_path / 'x' / 'mmvit_ext' / 'gpu_build' and bare.out == ROOT / '.whl'
