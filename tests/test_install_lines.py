"""Every install line of README.md and docs/ as a user copies it.

Each fenced shell block holding an install line carries a tag, ``<!-- install: KIND STACK -->``:
``new`` blocks make a new environment of that stack's kind, ``existing`` blocks add mmvit_ext to
one that has its stack. The fast tests check the tags, the torch pins, the build tools and the
``tests`` extra. The real runs (``--install-lines``; ``tools/test_stack.sh pinned|newest`` passes
it) run each block as written, line by line with bash, in a new venv of the stack's Python and a
shell with no pip settings of ours (no constraints, no index or find-links options); the one
exception is a compile cache: the line that builds mmcv finds the wheel an earlier build of the
same mmcv against the same torch and Python made (``tools/setup_env.sh``'s cache, keyed by what
the block itself installed), so a cached run installs what an uncached one builds. Then the demo
detector trains one step with ``mmcv._ext`` present, and the ``existing`` blocks change none of
the packages the environment had. ``--unpinned-torch`` runs the ``new`` blocks with their torch
line as ``pip install torch torchvision`` (the day's index; by hand, every stop: the note names
the torch it got). The same real runs resolve every extra in a new environment
(``pip install --dry-run --report``) and check it against the known breaks.
"""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from mmvit_ext import distributions
from mmvit_ext.utils import env_check

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
import mmcv_build  # noqa: E402
import python_env  # noqa: E402
import setup_env  # noqa: E402

PAGES = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
FENCE = re.compile(r'(?:<!-- install: (\w+) (\w+) -->\n)?```(?:sh|bash)\n(.*?)```', re.S)
INSTALL = re.compile(r'^\s*(?:\S+=\S+ )*(?:pip (?:install|wheel)|python -m build|mim install|uv pip)\b',
                     re.M)
KINDS = ('new', 'existing')
SOURCES = ['setup.py', 'MANIFEST.in', 'README.md', 'LICENSE', 'CITATION.cff', 'CHANGELOG.md',
           'mmvit_ext', 'configs', 'requirements']
install_lines = pytest.mark.install_lines


@dataclass(frozen=True)
class Block:
    page: str
    kind: str
    stack: str
    text: str


def install_blocks() -> List[Block]:
    """The tagged shell blocks of README.md and docs/*.md, in page order."""
    return [Block(page.name, kind, stack, text)
            for page in PAGES for kind, stack, text in FENCE.findall(page.read_text()) if kind]


def blocks_of(kind: str, stack: str) -> List[str]:
    """The distinct texts of one kind of block of one stack, as the pages hold them."""
    return list(dict.fromkeys(b.text for b in install_blocks() if (b.kind, b.stack) == (kind, stack)))


def test_every_install_line_is_in_a_block_the_tests_run():
    untagged = [(page.name, text.splitlines()[0]) for page in PAGES
                for kind, _, text in FENCE.findall(page.read_text())
                if not kind and INSTALL.search(text)]
    assert not untagged, untagged
    found = install_blocks()
    assert all(b.kind in KINDS and b.stack in setup_env.STACKS for b in found), found
    assert {(b.kind, b.stack) for b in found} == {('new', 'pinned'), ('new', 'newest'),
                                                   ('existing', 'pinned')}
    assert {b.page for b in found} == {'README.md', 'install.md'}


def test_new_blocks_run_in_the_working_order_with_the_pinned_build_tools():
    """torch and torchvision pinned to the stack's pair (what its mmcv is built and tested
    against, on any day); the build tools of requirements/dev.txt (the fix line of an mmcv
    without ops names the same); mmcv without build isolation; then the extras of the stack's
    kind."""
    tools = ' '.join(f'"{t}"' if re.search('[<>]', t) else t
                     for t in distributions.OPS_BUILD_TOOLS)
    kinds = {'pinned': ('mmcv==2.1.0', 'openmmlab'),
             'newest': ('./mmcv_src/onedl_mmcv-2.3.6', 'onedl')}  # its source raised to C++20
    for stack, (mmcv, extra) in kinds.items():
        _, text, pins = _stack_facts(stack)
        pin = mmcv_build.pin_from_requirements(text)
        assert pin.wheel_prefix in mmcv.replace('==', '-')
        for block in blocks_of('new', stack):
            lines = block.strip().splitlines()
            assert lines[0] == (f'pip install torch=={pins["torch"]} '
                                f'torchvision=={pins["torchvision"]}'), block
            assert lines[1] == f'pip install {tools} numpy', block
            assert f'pip install --no-build-isolation --no-cache-dir {mmcv}' in lines[2:-1], block
            assert lines[-1].startswith(f'pip install ".[{extra},'), block


def test_the_docs_say_why_torch_is_pinned_and_what_the_newest_breaks():
    """docs/install.md gives the reason for the pins and names the build break of the index's
    newest torch with mmcv 2.1.0 (the unpinned OpenMMLab block, run by hand)."""
    text = (ROOT / 'docs' / 'install.md').read_text()
    assert 'the pair its mmcv is built and tested against' in text
    assert '#error C++20 or later compatible compiler is required to use ATen' in text
    assert re.search(r'\| mmcv 2\.1\.0 built against torch >= 2\.14', text)


def test_unpinned_blocks_differ_from_the_pinned_ones_only_in_the_torch_line():
    for stack in ('pinned', 'newest'):
        for block in blocks_of('new', stack):
            free = _unpinned(block).splitlines()
            assert free[0] == 'pip install torch torchvision'
            assert free[1:] == block.strip().splitlines()[1:]


def _third_party_imports() -> Dict[str, str]:
    """Top-level modules imported anywhere under tests/ (module -> first file), less the
    standard library, the repository's own modules and those that may be absent."""
    local = {p.stem for d in ('tests', 'tools') for p in (ROOT / d).rglob('*.py')} | \
        {'mmvit_ext', 'peer'}
    found: Dict[str, str] = {}
    for path in sorted((ROOT / 'tests').rglob('*.py')):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and \
                not node.level else []
            for name in names:
                top = name.split('.')[0]
                if top not in sys.stdlib_module_names and top not in local:
                    found.setdefault(top, path.name)
    return found


def test_the_tests_extra_holds_what_the_suite_imports():
    """Each module the suite imports comes from the stack (torch, numpy, Pillow, the OpenMMLab
    packages of either kind) or from the ``tests`` extra."""
    requires = [Requirement(r) for r in metadata.requires('mmvit_ext') or []]
    tests_extra = {canonicalize_name(r.name) for r in requires
                   if r.marker is not None and r.marker.evaluate({'extra': 'tests'})}
    stack = {'torch', 'torchvision', 'numpy', 'pillow'} | {
        canonicalize_name(n) for p in distributions.PACKAGES for n in (p.openmmlab, p.onedl)}
    owners = metadata.packages_distributions()
    missing = {}
    for module, where in _third_party_imports().items():
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        assert dists, f'{module} (imported by tests/{where}) is installed by no distribution'
        if not dists & (stack | tests_extra):
            missing[module] = (where, sorted(dists))
    assert not missing, missing
    assert {'onnx', 'vit-pytorch', 'pytest-xdist'} <= tests_extra


# ------------------------------------------------------------------------------- real runs

def _stack_facts(stack: str):
    path = ROOT / setup_env.STACKS[stack]
    text = path.read_text()
    pins = dict(re.findall(r'^([\w.-]+)==(\S+)', text, re.M))
    return path, text, pins


def _new_venv(stack: str, where: Path) -> Path:
    _, text, _ = _stack_facts(stack)
    python = python_env.find_python(python_env.wanted_python(text), log=print)
    subprocess.run([python, '-m', 'venv', str(where)], check=True)
    return where / 'bin' / 'python'


def _env(venv_python: Path) -> dict:
    """A user's shell in that venv: nothing of ours for pip (no ``PIP_*``, no ``PYTHON*``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'PIP_'))}
    env.update(VIRTUAL_ENV=str(venv_python.parent.parent),
               PATH=f'{venv_python.parent}{os.pathsep}{os.environ["PATH"]}')
    return env


MMCV_LINE = re.compile(r'^pip install --no-build-isolation .*\b((?:onedl-)?mmcv)==(\S+)$')


def _compile_cache(python: Path, line: str) -> Optional[Path]:
    """For a line that builds ``mmcv==X`` from the index: the cached wheel folder whose key is
    that mmcv, the torch the block installed and the venv's Python, if one was built."""
    found = MMCV_LINE.match(line)
    if not found:
        return None
    have = _installed(python)
    info = subprocess.run([str(python), '-c', 'import sys; print(*sys.version_info[:2])'],
                          capture_output=True, text=True, check=True).stdout.split()
    pin = mmcv_build.MmcvPin(found.group(1), found.group(2), ())
    key = mmcv_build.cache_key(pin, have['torch'].split('+')[0], '.'.join(info))
    folder = python_env.cache_dir('mmcv') / key
    return folder if pin.wheel_in(folder) else None


def _run_block(block: str, cwd: Path, python: Path) -> None:
    """The block's lines in order, as a user's shell runs them; a line that builds mmcv finds
    its compile cache (see :func:`_compile_cache`)."""
    env = _env(python)
    for line in block.strip().splitlines():
        cache = _compile_cache(python, line)
        _bash(line, cwd, {**env, 'PIP_FIND_LINKS': str(cache)} if cache else env)


def _unpinned(block: str) -> str:
    """The block with its torch line as a new user types it without pins (the day's newest)."""
    return re.sub(r'^pip install torch==\S+ torchvision==\S+$', 'pip install torch torchvision',
                  block.strip(), count=1, flags=re.M)


def _sources(tmp: Path) -> Path:
    """A copy of the checkout's sources: the blocks run from a repository root, and the build
    output stays out of the checkout."""
    src = tmp / 'mmvit_ext_src'
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns('__pycache__', '*.pyc', '.mim'))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    return src


def _bash(block: str, cwd: Path, env: dict) -> None:
    run = subprocess.run(['bash', '-euo', 'pipefail', '-c', block], cwd=cwd, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, f'{block}\n{(run.stdout + run.stderr)[-4000:]}'


def _installed(python: Path) -> Dict[str, str]:
    out = subprocess.run([str(python), '-m', 'pip', 'list', '--format', 'json'],
                         capture_output=True, text=True, check=True).stdout
    return {canonicalize_name(p['name']): p['version'] for p in json.loads(out)}


TRAIN_ONE_STEP = """
import json, mmcv._ext, mmvit_ext
from mmengine.config import Config
from mmengine.runner import Runner
from mmvit_ext.config_files import config_path
from mmvit_ext.datasets import generate_demo_coco
generate_demo_coco('data/demo_shapes', num_train=4, num_val=2)
cfg = Config.fromfile(config_path('demo/mask_rcnn_pvtv2_b2_demo.py'))
mine = Config.fromfile('my_config.py')
cfg.work_dir = 'work_dirs/one_step'
cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)
cfg.train_dataloader.num_workers = 0
for key in ('val_dataloader', 'val_cfg', 'val_evaluator', 'test_dataloader', 'test_cfg',
            'test_evaluator'):
    cfg[key] = None
runner = Runner.from_cfg(cfg)
runner.train()
print(json.dumps(dict(package=mmvit_ext.__file__, ext=mmcv._ext.__file__, iters=runner.iter,
                      config=cfg.filename, loss=runner.message_hub.get_scalar('train/loss').current(),
                      inherited=mine.model.backbone.type)))
"""


def _train_one_step(python: Path, work: Path) -> dict:
    """The demo Mask R-CNN from the installed package's configs, one step, outside any checkout;
    a user config inheriting ``mmvit_ext::`` resolves."""
    work.mkdir()
    (work / 'my_config.py').write_text(
        "_base_ = 'mmvit_ext::mmdet/mask_rcnn_pvtv2_b0_fpn_1x_coco.py'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith('PYTHON')}
    run = subprocess.run([str(python), '-c', TRAIN_ONE_STEP], cwd=work, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    site = str(python.parent.parent)
    assert found['package'].startswith(site) and found['ext'].startswith(site), found
    assert found['config'].startswith(site) and '/.mim/configs/demo/' in found['config']
    assert found['iters'] == 1 and 0 < found['loss'] < 100, found
    assert found['inherited'] == 'mmvit_ext.PyramidVisionTransformerV2'
    return found


def _stacks_with(kind: str) -> List[str]:
    return sorted({b.stack for b in install_blocks() if b.kind == kind})


@install_lines
@pytest.mark.parametrize('stack', _stacks_with('new'))
def test_a_new_environment_as_the_docs_say(stack, tmp_path, request):
    """Each distinct ``new`` block of the stack, in a venv of its own, then the demo step; then,
    in the last of those venvs with mmvit_ext removed, each ``existing`` block of the stack."""
    src, (_, _, pins) = _sources(tmp_path), _stack_facts(stack)
    unpinned = request.config.getoption('--unpinned-torch')
    for i, block in enumerate(blocks_of('new', stack)):
        python = _new_venv(stack, tmp_path / f'venv{i}')
        _run_block(_unpinned(block) if unpinned else block, src, python)
        have = _installed(python)
        print(f'[install lines] {stack} block {i}: torch {have["torch"]}, torchvision '
              f'{have.get("torchvision")}')
        assert unpinned or have['torch'].split('+')[0] == pins['torch'], have['torch']
        _train_one_step(python, tmp_path / f'work{i}')
    if unpinned:
        return
    for j, block in enumerate(blocks_of('existing', stack)):
        subprocess.run([str(python), '-m', 'pip', 'uninstall', '-y', '-q', 'mmvit_ext'], check=True)
        shutil.rmtree(src / 'dist', ignore_errors=True)
        before = _installed(python)
        _run_block(block, src, python)
        after = _installed(python)
        changed = {name: (v, after.get(name)) for name, v in before.items() if after.get(name) != v}
        assert not changed, (block, changed)  # nothing the environment had changed
        assert after.get('mmvit-ext'), block
        _train_one_step(python, tmp_path / f'existing{j}')


def _resolve(python: Path, spec: str, tmp: Path, env: dict) -> Dict[str, str]:
    """What ``pip install --dry-run`` of ``spec`` installs into an empty environment."""
    report = tmp / 'report.json'
    run = subprocess.run([str(python), '-m', 'pip', 'install', '--dry-run', '--ignore-installed',
                          '-q', '--report', str(report), spec], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, (spec, run.stderr[-3000:])
    return {canonicalize_name(item['metadata']['name']): item['metadata']['version']
            for item in json.loads(report.read_text())['install']}


def _extras() -> List[str]:
    requires = metadata.metadata('mmvit_ext').get_all('Provides-Extra') or []
    return sorted(requires) + ['openmmlab,det,seg', 'onedl,onedl-det,onedl-seg']


@install_lines
@pytest.mark.parametrize('extras', _extras())
def test_each_extra_resolves_clear_of_the_known_breaks(extras, tmp_path):
    """In a new venv of the newest stack's Python, no constraints but the build tools that mmcv
    2.1.0's metadata needs (its setup.py imports pkg_resources; the docs' blocks install them
    first): the resolution holds no known break without a mend and no mixed distributions."""
    python = _new_venv('newest', tmp_path / 'venv')
    build = tmp_path / 'build.txt'
    build.write_text('\n'.join(t for t in distributions.OPS_BUILD_TOOLS if 'setuptools' in t))
    env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'PIP_CONSTRAINT'))}
    env['PIP_CONSTRAINT'] = str(build)
    versions = _resolve(python, f'mmvit_ext[{extras}] @ {_sources(tmp_path).as_uri()}', tmp_path, env)
    lookup = lambda name: versions.get(canonicalize_name(name))  # noqa: E731
    breaks = [k.message(lookup) for k in env_check.KNOWN_BREAKS if k.mend is None]
    assert not [b for b in breaks if b], (extras, breaks)
    assert not distributions.mixed_distributions(lookup), extras
    assert 'torch' in versions and 'mmvit-ext' in versions
