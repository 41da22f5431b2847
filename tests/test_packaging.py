"""The package as a user installs it: the wheel carries the configs and they load from the
installed location; metadata, LICENSE, CITATION.cff and CHANGELOG agree; what needs a newer
torch says so in one line."""
import json
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from mmvit_ext import distributions, torch_compat
from mmvit_ext.version import __version__

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = {'openmmlab', 'onedl', 'det', 'seg', 'cls', 'onedl-det', 'onedl-seg', 'onedl-cls',
          'deploy', 'tests', 'all'}
# title fragment -> arXiv id, one per paper the families and weights come from
PAPERS = {
    'Swin Transformer': '2103.14030', 'PVT v2': '2106.13797', 'DeepViT': '2103.11886',
    'Going deeper with Image Transformers': '2103.17239', 'Refiner': '2106.03714',
    'An Image is Worth 16x16 Words': '2010.11929',
    'Training data-efficient image transformers': '2012.12877',
    'Masked Autoencoders': '2111.06377', 'DINOv2': '2304.07193',
    'Exploring Plain Vision Transformer Backbones': '2203.16527',
}
SOURCES = ['setup.py', 'MANIFEST.in', 'README.md', 'LICENSE', 'CITATION.cff', 'CHANGELOG.md',
           'mmvit_ext', 'configs']


def _repo_configs():
    return sorted(str(p.relative_to(ROOT / 'configs')) for p in (ROOT / 'configs').rglob('*.py'))


@pytest.fixture(scope='module')
def wheel(tmp_path_factory) -> Path:
    """``pip wheel`` of a copy of the sources (the checkout stays free of build output)."""
    tmp = tmp_path_factory.mktemp('wheel')
    src = tmp / 'src'
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name,
                            ignore=shutil.ignore_patterns('__pycache__', '*.pyc', '.mim'))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', str(src), '--no-deps',
                    '--no-build-isolation', '-q', '-w', str(tmp / 'dist')], check=True)
    (built,) = (tmp / 'dist').glob('*.whl')
    return built


@pytest.fixture(scope='module')
def metadata(wheel):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith('.dist-info/METADATA'))
        return Parser().parsestr(archive.read(name).decode())


@pytest.fixture(scope='module')
def site(wheel, tmp_path_factory) -> Path:
    """The wheel installed with ``--target`` into a folder of its own."""
    target = tmp_path_factory.mktemp('site')
    subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', '--no-index', '-q',
                    '--target', str(target), str(wheel)], check=True)
    return target


def _run_installed(site: Path, script: str, cwd: Path) -> dict:
    """Run ``script`` with only the installed wheel on the path (no checkout) in ``cwd``; returns
    the JSON object its last output line holds."""
    env = {'PYTHONPATH': str(site), 'PATH': '/usr/bin:/bin', 'HOME': str(cwd)}
    out = subprocess.run([sys.executable, '-c', script], cwd=cwd, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_wheel_carries_every_config_and_the_license(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    shipped = sorted(n[len('mmvit_ext/.mim/configs/'):] for n in names
                     if n.startswith('mmvit_ext/.mim/configs/') and n.endswith('.py'))
    assert shipped == _repo_configs() and len(shipped) > 80
    assert 'mmvit_ext/.mim/model-index.yml' in names
    info = f'mmvit_ext-{__version__}.dist-info'  # setuptools 80 (newest stack): licenses/
    assert {f'{info}/LICENSE', f'{info}/licenses/LICENSE'} & names
    assert {'mmvit_ext/torch_compat.py', 'mmvit_ext/config_files/__main__.py'} <= names


def test_configs_load_with_their_bases_from_the_installed_wheel(site, tmp_path):
    """Installed with ``--target`` (no checkout on the path), a shipped config and a user config
    inheriting ``mmvit_ext::`` resolve their ``_base_`` chains down to mmdet's / mmpretrain's."""
    user_config = tmp_path / 'my_config.py'
    user_config.write_text("_base_ = 'mmvit_ext::mmdet/mask_rcnn_pvtv2_b0_fpn_1x_coco.py'\n"
                           "train_dataloader = dict(batch_size=3)\n")
    script = f"""
import contextlib, io, json, mmvit_ext
from mmengine.config import Config
from mmvit_ext.config_files import config_path, config_root, list_configs
from mmvit_ext.config_files.__main__ import main
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    main(['mask_rcnn_pvtv2_b2.py'])
shipped = Config.fromfile(config_path('mmpretrain/pvtv2_b0_in1k.py'))
mine = Config.fromfile({str(user_config)!r})
print(json.dumps(dict(
    package=mmvit_ext.__file__, root=str(config_root()), count=len(list_configs()),
    cli=printed.getvalue().strip(),
    cls=[shipped.model.type, shipped.model.backbone.arch, shipped.optim_wrapper.optimizer.type],
    det=[mine.model.type, mine.model.backbone.type, mine.model.neck.in_channels,
         mine.train_dataloader.batch_size, mine.train_dataloader.dataset.type])))
"""
    found = _run_installed(site, script, tmp_path)
    assert found['package'].startswith(str(site))
    assert found['root'] == str(site / 'mmvit_ext' / '.mim' / 'configs')
    assert found['cli'] == found['root'] + '/mask_rcnn_pvtv2_b2.py'
    assert found['count'] == len([c for c in _repo_configs() if not c.startswith('_base_')])
    assert found['cls'] == ['ImageClassifier', 'b0', 'AdamW']
    assert found['det'] == ['MaskRCNN', 'mmvit_ext.PyramidVisionTransformerV2',
                            [32, 64, 160, 256], 3, 'CocoDataset']


def test_a_shipped_config_trains_one_step_from_the_installed_wheel(site, tmp_path):
    """The demo Mask R-CNN PVTv2-b2 config, read from the installed wheel (no checkout on the
    path), trains one iteration on demo data it writes, and saves a checkpoint."""
    script = """
import json, mmvit_ext
from mmengine.config import Config
from mmengine.runner import Runner
from mmvit_ext.config_files import config_path
from mmvit_ext.datasets import generate_demo_coco
generate_demo_coco('data/demo_shapes', num_train=4, num_val=2)
cfg = Config.fromfile(config_path('demo/mask_rcnn_pvtv2_b2_demo.py'))
cfg.work_dir = 'work_dirs/one_step'
cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)
cfg.train_dataloader.num_workers = 0
cfg.default_hooks.checkpoint.interval = 1
for key in ('val_dataloader', 'val_cfg', 'val_evaluator', 'test_dataloader', 'test_cfg',
            'test_evaluator'):
    cfg[key] = None
runner = Runner.from_cfg(cfg)
runner.train()
loss = runner.message_hub.get_scalar('train/loss').current()
print(json.dumps(dict(config=cfg.filename, iters=runner.iter, loss=loss,
                      backbone=type(runner.model.backbone).__module__)))
"""
    found = _run_installed(site, script, tmp_path)
    assert found['config'].startswith(str(site / 'mmvit_ext' / '.mim' / 'configs' / 'demo'))
    assert found['backbone'].startswith('mmvit_ext.') and found['iters'] == 1
    assert 0 < found['loss'] < 100
    assert (tmp_path / 'work_dirs' / 'one_step' / 'epoch_1.pth').is_file()


def _requires(metadata, extra=None):
    """The wheel's requirements of the core (``extra=None``) or of one extra."""
    reqs = [Requirement(r) for r in metadata.get_all('Requires-Dist')]
    if extra is None:
        return [r for r in reqs if 'extra ==' not in str(r.marker)]
    return [r for r in reqs if 'extra ==' in str(r.marker) and r.marker.evaluate({'extra': extra})]


def test_metadata_states_floors_without_pinning_torch_or_mmcv(metadata):
    assert metadata['Version'] == __version__
    assert metadata['License'] == 'Apache-2.0'
    assert set(metadata.get_all('Provides-Extra')) == EXTRAS
    core = _requires(metadata)
    floor = '.'.join(map(str, torch_compat.TORCH_FLOOR))
    (torch,) = [r for r in core if r.name == 'torch']
    assert str(torch.specifier) == f'>={floor}'  # no upper bound: pip never upgrades torch
    # nothing that a OneDL fork renames: the extras pick OpenMMLab's or the fork
    renamed = {n for pkg in distributions.PACKAGES for n in (pkg.openmmlab, pkg.onedl)}
    assert not renamed & {r.name for r in core}
    numpy = {str(r.marker): r.specifier for r in core if r.name == 'numpy'}
    assert numpy == {'python_version < "3.10"': SpecifierSet('<2'),
                     'python_version >= "3.10"': SpecifierSet()}  # capped for torch 2.1 only
    (mmcv,) = [r for r in _requires(metadata, 'openmmlab') if r.name == 'mmcv']
    assert '==' not in str(mmcv.specifier) and '<2.2.0' in str(mmcv.specifier)  # mmdet 3.3's
    assert {r.name for r in _requires(metadata, 'onedl')} == {'onedl-mmengine', 'onedl-mmcv'}
    for extra in EXTRAS:  # no extra drags in a torch of its own, none mixes the two kinds
        names = {r.name for r in _requires(metadata, extra)}
        assert not names & {'torch', 'torchvision'}
        kinds = {kind for pkg in distributions.PACKAGES
                 for kind, name in (('openmmlab', pkg.openmmlab), ('onedl', pkg.onedl))
                 if name in names}
        assert len(kinds) <= 1, (extra, names)


def _stack_extras() -> str:
    """The extras that name this environment's stack: OneDL's forks or OpenMMLab's packages."""
    if distributions.installed_version('onedl-mmengine'):
        return 'onedl,onedl-det,onedl-seg,onedl-cls'
    return 'openmmlab,det,seg,cls'


def test_pip_install_of_the_wheel_changes_nothing_the_user_has(wheel, tmp_path):
    """``pip install --dry-run`` of the wheel, with the extras of this stack, resolves against
    what is installed (no index) and would install nothing but mmvit_ext."""
    report = tmp_path / 'report.json'
    extras = _stack_extras()
    run = subprocess.run([sys.executable, '-m', 'pip', 'install', '--dry-run', '--no-index',
                          '--disable-pip-version-check', '-q', '--report', str(report),
                          f'mmvit_ext[{extras}] @ {wheel.as_uri()}'],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr  # no index: anything missing fails the resolution
    names = [canonicalize_name(item['metadata']['name'])
             for item in json.loads(report.read_text())['install']]
    assert names == ['mmvit-ext'], (extras, names)


def test_floors_are_the_oldest_tested_stack(metadata):
    """setup.py's floors (Python, torch) are requirements/oldest.txt's, which
    ``tools/test_stack.sh oldest`` tests (by hand, like the newest); its numpy is inside
    setup.py's bound."""
    oldest = (ROOT / 'requirements' / 'oldest.txt').read_text()
    pins = dict(re.findall(r'^([\w-]+)==(\S+)', oldest, re.M))
    python = re.search(r'^# python: (\d+\.\d+)', oldest, re.M).group(1)
    assert metadata['Requires-Python'] == f'>={python}'
    assert f'Programming Language :: Python :: {python}' in metadata.get_all('Classifier')
    assert torch_compat.torch_version(pins['torch']) == torch_compat.TORCH_FLOOR
    on_oldest = {'python_version': python, 'python_full_version': python + '.0',
                 'extra': 'openmmlab'}
    requires = [r for r in _requires(metadata) + _requires(metadata, 'openmmlab')
                if r.marker is None or r.marker.evaluate(on_oldest)]
    for req in requires:  # every requirement the oldest stack pins, it pins inside the range
        if req.name in pins:
            assert req.specifier.contains(pins[req.name]), (req, pins[req.name])
    assert {'torch', 'numpy', 'mmengine'} <= {r.name for r in requires} & set(pins)
    assert 'tools/test_stack.sh oldest' in (ROOT / 'docs' / 'install.md').read_text()


def test_license_citation_and_changelog_agree_with_the_package():
    assert (ROOT / 'LICENSE').read_text().split()[:4] == ['Apache', 'License', 'Version', '2.0,']
    assert "license='Apache-2.0'" in (ROOT / 'setup.py').read_text()
    cff = yaml.safe_load((ROOT / 'CITATION.cff').read_text())
    assert cff['license'] == 'Apache-2.0' and str(cff['version']) == __version__
    versions = re.findall(r'^## (\S+)', (ROOT / 'CHANGELOG.md').read_text(), re.M)
    assert versions[0] == __version__


def test_citation_is_cff_with_every_paper():
    cff = yaml.safe_load((ROOT / 'CITATION.cff').read_text())
    assert cff['cff-version'] == '1.2.0'
    assert {'message', 'title', 'authors'} <= set(cff) and cff['authors']
    refs = cff['references']
    for fragment, arxiv in PAPERS.items():
        (ref,) = [r for r in refs if fragment in r['title']]
        assert ref['authors'] and all('family-names' in a for a in ref['authors'])
        assert isinstance(ref['year'], int) and 2020 <= ref['year'] <= 2024
        assert ref['url'] == f'https://arxiv.org/abs/{arxiv}'
        assert ref['identifiers'][0]['value'] == f'arXiv:{arxiv}'
        assert ref['type'] in {'article', 'conference-paper'}


@pytest.mark.parametrize('feature', sorted(torch_compat.NEEDS))
def test_an_old_torch_gets_one_line_naming_feature_and_versions(feature):
    minimum = '.'.join(map(str, torch_compat.NEEDS[feature][0]))
    assert torch_compat.NEEDS[feature][0] > torch_compat.TORCH_FLOOR
    with pytest.raises(torch_compat.TorchVersionError) as caught:
        torch_compat.require(feature, version='2.1.2+cu121')
    message = str(caught.value)
    assert '\n' not in message and message.startswith(f'mmvit_ext: {feature}: ')
    assert f'needs torch >= {minimum}' in message and message.endswith('this is torch 2.1.2+cu121')
    assert torch_compat.supports(feature, version=minimum + '.0')
    torch_compat.require(feature, version='2.11.0')  # the tested torch: no error


def test_version_parsing():
    assert torch_compat.torch_version('2.11.0+cpu') == (2, 11)
    assert torch_compat.torch_version('2.4.0a0+git1234') == (2, 4)
    assert not torch_compat.torch_at_least((2, 6), '2.5.1')
    with pytest.raises(ValueError, match='not a torch version'):
        torch_compat.torch_version('nightly')


def test_onnx_export_is_refused_on_an_old_torch_before_any_work(monkeypatch, tmp_path):
    from mmvit_ext.deploy import export
    monkeypatch.setattr(torch_compat, 'supports', lambda feature, version=None: False)
    with pytest.raises(torch_compat.TorchVersionError, match='ONNX export: needs torch >= 2.6'):
        export.export_onnx(None, None, tmp_path / 'x.onnx')
    assert not (tmp_path / 'x.onnx').exists()


def test_install_page_names_shipped_configs_and_real_extras():
    page = (ROOT / 'docs' / 'install.md').read_text()
    names = set(re.findall(r"config_path\('([^']+)'\)", page))
    names |= set(re.findall(r'mmvit_ext\.config_files ([\w/.]+\.py)', page))
    names |= set(re.findall(r"mmvit_ext::([\w/.]+\.py)", page))
    assert len(names) >= 3
    for name in names:
        assert (ROOT / 'configs' / name).is_file(), name
    named = set(re.findall(r'^\| `([\w-]+)` \|', page, re.M))
    assert named == EXTRAS
