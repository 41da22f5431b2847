"""tools/setup_env.py, tools/mmcv_build.py, tools/python_env.py and tools/dev/stack_tests.py:
the decisions of the set-up (which stack and Python, which mmcv and build tools, the cache key,
the build's environment, the stamp) and the shape of tools/: what a user runs at the top, the
developer machinery in tools/dev/, small bootstraps with one interpreter rule, one helper module.
Nothing here installs, downloads or compiles."""
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / 'tools'), str(ROOT / 'tools' / 'dev')]
import mmcv_build  # noqa: E402
import python_env  # noqa: E402
import setup_env  # noqa: E402
import stack_tests  # noqa: E402

REQS = {stack: (ROOT / path).read_text() for stack, path in setup_env.STACKS.items()}
PIN = mmcv_build.MmcvPin('mmcv', '2.1.0', ('wheel',))


def test_each_stack_names_its_mmcv_build_tools_and_python():
    pinned, oldest, newest = (mmcv_build.pin_from_requirements(REQS[s])
                              for s in ('pinned', 'oldest', 'newest'))
    assert pinned.spec == oldest.spec == 'mmcv==2.1.0'
    # torch >= 2.12 asks setuptools >= 77.0.3; mmcv 2.1.0's setup.py imports pkg_resources (< 82)
    assert pinned.build_tools == ('setuptools>=80,<82', 'wheel', 'packaging>=24.2', 'ninja')
    assert oldest.build_tools == ('setuptools<70', 'wheel', 'ninja')
    assert newest.spec == 'onedl-mmcv==2.3.6' and newest.wheel_prefix == 'onedl_mmcv-2.3.6'
    assert 'setuptools>=80' in newest.build_tools and 'ninja' in newest.build_tools
    assert python_env.wanted_python(REQS['pinned']) == '3.11'
    assert python_env.wanted_python(REQS['oldest']) == '3.9'
    assert python_env.wanted_python(REQS['newest']) == '3.12'
    for stack, text in REQS.items():  # torch first: mmcv's ops compile against these pins
        base = setup_env.base_pins(text)
        assert [re.split(r'[=<>]', b)[0] for b in base] == ['torch', 'torchvision', 'numpy'], stack


def test_a_requirements_file_without_its_mmcv_or_build_tools_is_refused():
    for text in ('torch==2.11.0\n# build: wheel\n', 'torch==2.11.0\nmmcv==2.1.0\n'):
        with pytest.raises(ValueError, match='name its mmcv'):
            mmcv_build.pin_from_requirements(text)


def test_cache_key_names_mmcv_torch_device_and_python():
    pin = mmcv_build.MmcvPin('onedl-mmcv', '2.3.6', ())
    assert mmcv_build.cache_key(pin, '2.11.0', '3.12') == 'onedl-mmcv2.3.6-torch2.11.0-cpu-py312'
    assert (mmcv_build.cache_key(PIN, '2.11.0', '3.12', '12.8', '8.0;9.0+PTX')
            == 'mmcv2.1.0-torch2.11.0-cu12.8-py312-sm8.0_9.0+PTX')
    assert mmcv_build.arch_key(' 8.6 9.0 ') == mmcv_build.arch_key('8.6,9.0') == '8.6_9.0'


def test_build_env_strips_debug_info_and_adds_cuda_only_when_asked():
    cpu = mmcv_build.build_env(jobs=3, base={'PATH': '/bin', 'CPPFLAGS': '-DX'})
    assert cpu['MMCV_WITH_OPS'] == '1' and cpu['MAX_JOBS'] == '3' and cpu['CPPFLAGS'] == '-DX -g0'
    assert 'FORCE_CUDA' not in cpu and cpu['PATH'] == '/bin'
    cuda = mmcv_build.build_env(cuda_root='/opt/cuda', arch='9.0', base={'PATH': '/bin', 'MAX_JOBS': '5'},
                                extra={'CPATH': '/inc'})
    assert cuda['MAX_JOBS'] == '5' and cuda['FORCE_CUDA'] == '1' and cuda['CUDA_HOME'] == '/opt/cuda'
    assert cuda['TORCH_CUDA_ARCH_LIST'] == '9.0' and cuda['PATH'].startswith('/opt/cuda/bin')
    assert cuda['CPATH'] == '/inc'


def test_cuda_home_is_where_nvcc_says_it_lives(tmp_path):
    bindir = tmp_path / 'cuda' / 'bin'
    bindir.mkdir(parents=True)
    nvcc = bindir / 'nvcc'
    nvcc.write_text('#!/bin/sh\n'
                    f'case "$*" in *--dryrun*) echo "#\\$ _HERE_={bindir}" >&2 ;;\n'
                    '  *) echo "Cuda compilation tools, release 13.0, V13.0.1" ;; esac\n')
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    link = tmp_path / 'nvcc-wrapper'
    link.symlink_to(nvcc)
    assert mmcv_build.cuda_home(str(link)) == str(tmp_path / 'cuda')
    assert mmcv_build.nvcc_release(str(nvcc)) == '13.0'
    assert mmcv_build.nvcc_path({'NVCC': str(nvcc)}) == str(nvcc)


def test_probe_and_info_read_this_interpreter():
    info = mmcv_build.torch_info(sys.executable)
    assert info['python'] == '%d.%d' % sys.version_info[:2] and info['device'] in ('cpu', 'cuda')
    assert mmcv_build.probe(sys.executable, 'cpu')  # the pinned stack's mmcv ops run here


def test_ensure_mmcv_does_nothing_where_the_ops_run(tmp_path):
    said = mmcv_build.ensure_mmcv(sys.executable, PIN, tmp_path, log=print)
    assert said == 'mmcv ops already run on cpu' and not any(tmp_path.iterdir())


def test_find_wheel_matches_the_pinned_dist_and_version(tmp_path):
    for name in ('onedl_mmcv-2.3.6-cp312-cp312-linux_x86_64.whl', 'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl'):
        (tmp_path / name).touch()
    assert mmcv_build.MmcvPin('onedl-mmcv', '2.3.6', ()).wheel_in(tmp_path).name.startswith('onedl_mmcv')
    assert PIN.wheel_in(tmp_path).name.startswith('mmcv-2.1.0')
    assert mmcv_build.MmcvPin('mmcv', '2.2.0', ()).wheel_in(tmp_path) is None


def test_stamp_covers_the_requirements_and_the_setup_code():
    stamp = setup_env.stamp_of(ROOT / 'requirements' / 'dev.txt')
    assert stamp != setup_env.stamp_of(ROOT / 'requirements' / 'newest.txt')
    assert set(setup_env.STAMPED) == {'setup.py', 'tools/setup_env.py', 'tools/mmcv_build.py',
                                      'tools/python_env.py'}


def test_find_python_prefers_PYTHON_then_the_asked_version(tmp_path):
    assert python_env.find_python('3.12', env={'PYTHON': '/x/python'}) == '/x/python'
    assert python_env.find_python(None, env={}) in (sys.executable, __import__('shutil').which('python3'))
    said = []
    found = python_env.find_python('2.1', env={'PYENV_ROOT': str(tmp_path), 'PATH': os.environ['PATH']},
                                  log=said.append)
    assert found == __import__('shutil').which('python3') and len(said) == 1
    assert 'Python 2.1' in said[0] and found in said[0]
    here = '%d.%d' % sys.version_info[:2]
    assert python_env.python_version(python_env.find_python(here, env=dict(os.environ, PYTHON=''))) == here


def test_stack_tests_run_the_core_and_the_newest_adds_the_rest():
    oldest, newest = stack_tests.tests_of('oldest'), stack_tests.tests_of('newest')
    assert oldest == list(stack_tests.CORE) and newest[:len(oldest)] == oldest
    assert stack_tests.tests_of('pinned') == []  # CI runs its whole suite
    lines = [n for nodes in stack_tests.INSTALL_LINES.values() for n in nodes]
    assert any(n.endswith('[pinned]') for n in lines) and any(n.endswith('[newest]') for n in lines)
    for node in newest + lines:  # every file named exists
        assert (ROOT / node.split('::')[0]).is_file(), node


# the one interpreter rule, written alike in every tools/*.sh: $PYTHON, else the repository's
# .venv/bin/python if it exists, else python3 (scripts that run before .venv exists use it too)
RULE = ('ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"',
        'PY="${PYTHON:-$([[ -x $ROOT/.venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"',
        'command -v "$PY" >/dev/null || { echo "no python at $PY: run tools/setup_env.sh, or set PYTHON" >&2; exit 2; }')
# README's documented demo commands: a sequence of steps a reader follows in the script itself
DEMOS = ('demo.sh', 'seg_demo.sh')


@pytest.mark.parametrize('script', sorted(p.name for p in (ROOT / 'tools').glob('*.sh')))
def test_shell_only_bootstraps(script):
    """Each bash entry point picks the interpreter by the one rule and execs a Python module that
    exists, in at most 8 lines, comments included; the two demos are the README's commands, steps
    a reader follows, kept whole."""
    text = (ROOT / 'tools' / script).read_text()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith('#')]
    assert [ln for ln in lines if ln in RULE] == list(RULE), script
    assert not [ln for ln in lines if re.search(r'python3|\.venv', ln) and ln not in RULE], script
    if script not in DEMOS:
        assert len(text.splitlines()) <= 8 and lines[-1].startswith('exec "$PY" "$ROOT/tools/'), text
        assert (ROOT / lines[-1].split('"$ROOT/')[1].split('"')[0]).is_file(), lines[-1]


def test_bash_under_tools_and_ci_stays_small():
    scripts = [*sorted((ROOT / 'tools').glob('*.sh')), ROOT / '.ci' / 'run']
    total = sum(len(p.read_text().splitlines()) for p in scripts)
    assert total <= 250, total
    for path in scripts:  # no Python fed to an interpreter through a heredoc
        assert not re.search(r'python\S*"? +- *<<', path.read_text()), path


# top-level tools/*.py: what a user runs plus one helper module (issue #55: at most 1,600 lines);
# the GPU wheel-set builder, the GPU check and the stack-test driver are tools/dev/'s
TOOLS_LINES_NOW = 1151  # a ratchet: lower it as tools/ shrinks


def _tools_lines() -> int:
    return sum(len(p.read_text().splitlines()) for p in (ROOT / 'tools').glob('*.py'))


def test_one_helper_module_for_pip_wheels_caches_and_the_interpreter():
    """pip, wheel files, the cache, the core count, the interpreter and the freshness stamp are
    python_env's alone, in tools/ and tools/dev/; no file there over 500 lines."""
    for path in sorted([*(ROOT / 'tools').glob('*.py'), *(ROOT / 'tools' / 'dev').glob('*.py')]):
        text = path.read_text()
        assert len(text.splitlines()) <= 500, path.name
        if path.name != 'python_env.py':
            assert not re.search(r"'-m', 'pip'|def (pip|find_wheel|cpu_count|find_python|cache_dir|"
                                 r"is_fresh)\b|sched_getaffinity|XDG_CACHE_HOME'\)", text), path.name


def test_tools_lines_do_not_grow():
    """A ratchet: lower TOOLS_LINES_NOW as code goes, never raise it; issue #55's bound holds."""
    assert _tools_lines() <= min(TOOLS_LINES_NOW, 1600), _tools_lines()


def test_help_of_the_bootstraps():
    for script, words in (('setup_env.sh', ('--stack', '--venv', 'pinned', 'oldest', 'newest', 'MAX_JOBS')),
                          ('test_stack.sh', ('oldest', 'newest', '--venv'))):
        run = subprocess.run(['bash', f'tools/{script}', '--help'], cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 0 and all(w in run.stdout for w in words), (script, run.stdout)
    bad = subprocess.run(['bash', 'tools/setup_env.sh', '--stack', 'latest'], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'latest'" in bad.stderr


def test_a_torch_that_needs_cxx20_gets_mmcv_compiled_as_cxx20(tmp_path):
    """torch >= 2.14's ATen.h refuses C++17 and mmcv's setup.py passes -std=c++17 after torch's
    flags: the recipe raises it in the source release it builds (both compilers' spellings)."""
    setup_py = tmp_path / 'setup.py'
    setup_py.write_text("cxx = ['-std=c++17']\nnvcc += ['-std=c++17']\nmsvc = ['/std:c++17']\n"
                        "old = ['-std=c++14']\n")
    assert mmcv_build.raise_cxx_standard(setup_py) == 3
    assert setup_py.read_text() == ("cxx = ['-std=c++20']\nnvcc += ['-std=c++20']\n"
                                    "msvc = ['/std:c++20']\nold = ['-std=c++14']\n")
    assert mmcv_build.raise_cxx_standard(setup_py) == 0  # nothing left to raise
    import torch  # this interpreter's torch: 2.11 (pinned) and 2.1 (oldest) take C++17
    needs = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]) >= (2, 14)
    assert mmcv_build.torch_needs_cxx20(sys.executable) == needs


def _readme_stacks() -> dict:
    """README's tested-stacks table: stack -> (file, 'Python, torch, numpy' cell, packages cell)."""
    rows = re.findall(r'^\| (pinned|newest|oldest) \(`(requirements/\w+\.txt)`\) \| ([^|]+) \| ([^|]+) \|',
                      (ROOT / 'README.md').read_text(), re.M)
    return {stack: (path, versions.strip(), packages.strip()) for stack, path, versions, packages in rows}


def _named_versions(cell: str, onedl: bool) -> dict:
    """``'mmcv 2.1.0 (built), mmdet 3.3'`` -> {'mmcv': '2.1.0', 'mmdet': '3.3'}; ``-mmengine``
    after ``OneDL:`` is ``onedl-mmengine``; mmseg is the mmsegmentation distribution."""
    names = {}
    for name, version in re.findall(r'(-?[a-z][a-z-]*) (\d[\d.]*\d|\d)', cell):
        name = {'mmseg': 'mmsegmentation'}.get(name.lstrip('-'), name.lstrip('-'))
        if onedl and name.startswith('mm'):
            name = f'onedl-{name}'
        names[name] = version
    return names


def test_readme_stacks_table_is_the_requirements_files():
    table = _readme_stacks()
    assert set(table) == set(setup_env.STACKS)
    for stack, (path, versions, packages) in table.items():
        assert path == setup_env.STACKS[stack]
        text = REQS[stack]
        pins = dict(re.findall(r'^([\w.-]+)(?:==|>=)(\S+)', text, re.M))
        python, torch, numpy = (v.strip() for v in versions.split(','))
        assert python == python_env.wanted_python(text), stack
        for name, shown in (('torch', torch), ('numpy', numpy)):
            assert (pins[name] + '.').startswith(shown + '.'), (stack, name, shown, pins[name])
        if packages == 'as pinned':
            packages = table['pinned'][2]
        named = _named_versions(packages, onedl=packages.startswith('OneDL'))
        assert {'mmengine', 'mmdet', 'mmsegmentation', 'mmpretrain'} <= \
            {n.replace('onedl-', '').replace('mmdetection', 'mmdet') for n in named}, named
        for name, shown in named.items():
            assert name in pins, (stack, name)
            assert (pins[name] + '.').startswith(shown + '.'), (stack, name, shown, pins[name])
        pin = mmcv_build.pin_from_requirements(text)
        assert named[pin.dist] == pin.version, stack
