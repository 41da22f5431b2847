"""mmvit_ext.utils.env_check: installed-package combinations that break the peers' imports."""
import dataclasses
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from mmvit_ext.utils import env_check, transformers_compat

ROOT = Path(__file__).resolve().parents[1]
FORK_BREAK = next(b for b in env_check.KNOWN_BREAKS if b.package == 'onedl-mmpretrain')


def fake(versions):
    return lambda name: versions.get(name)


@pytest.fixture(autouse=True)
def unmended(monkeypatch):
    """Fake versions are judged as if nothing were mended in this process (on the newest stack
    ``import mmvit_ext`` has mended the fork's break for the real packages)."""
    monkeypatch.setattr(env_check, '_MENDED', set())


BROKEN = {'mmpretrain': '1.2.0', 'transformers': '5.17.0', 'pycocotools': '2.0.11'}


def test_the_gpu_image_combination_is_named_with_its_fix():
    """mmpretrain 1.2.0 + transformers 5.17 + pycocotools (the GPU image's) is named, once."""
    lines = env_check.problems(fake(BROKEN))
    assert len(lines) == 1
    assert 'mmpretrain 1.2.0 cannot be imported beside transformers 5.17.0' in lines[0]
    assert 'NoneType takes no arguments' in lines[0] and "transformers<4.56" in lines[0]
    # every fix: the maintained fork, an older transformers, no mmpretrain, the override
    assert "onedl-mmpretrain>=1.3.6" in lines[0] and 'uninstall it' in lines[0]
    assert f'{env_check.IGNORE_ENV}=1' in lines[0] and '\n' not in lines[0]


def test_only_runs_that_reach_mmpretrain_are_refused():
    """mmdet imports mmpretrain, mmseg does not: the break applies to the scopes it fails."""
    versions = fake(BROKEN)
    assert env_check.problems(versions, scopes={'mmseg', 'mmvit_ext'}) == []
    assert len(env_check.problems(versions, scopes={'mmdet'})) == 1
    assert len(env_check.problems(versions, scopes={'mmpretrain'})) == 1
    seg = Config.fromfile(ROOT / 'configs' / 'upernet_swin_t_512x512_160k_ade20k.py')
    det = Config.fromfile(ROOT / 'configs' / 'mask_rcnn_pvtv2_b2.py')
    assert 'mmdet' not in env_check.config_scopes(seg) and 'mmseg' in env_check.config_scopes(seg)
    assert 'mmdet' in env_check.config_scopes(det)
    # an mmseg config that imports mmpretrain's backbones (mmseg's ConvNeXt UperNet does)
    convnext = Config(dict(default_scope='mmseg', custom_imports=dict(imports='mmpretrain.models')))
    assert env_check.config_scopes(convnext) == {'mmseg', 'mmpretrain'}


def test_a_seg_run_goes_on_and_the_override_warns(monkeypatch):
    monkeypatch.setattr(env_check, 'installed_version', fake(BROKEN))
    seg = Config.fromfile(ROOT / 'configs' / 'upernet_swin_t_512x512_160k_ade20k.py')
    det = Config.fromfile(ROOT / 'configs' / 'mask_rcnn_pvtv2_b2.py')
    env_check.require_working_environment(seg)  # never imports mmpretrain: not refused
    with pytest.raises(SystemExit, match='cannot be imported beside transformers 5.17.0'):
        env_check.require_working_environment(det)
    monkeypatch.setenv(env_check.IGNORE_ENV, '1')
    with pytest.warns(RuntimeWarning, match='going on: MMVIT_EXT_IGNORE_KNOWN_BREAKS is set'):
        env_check.require_working_environment(det)


def test_both_distributions_of_one_package_are_named_with_the_fix():
    lines = env_check.problems(fake({'mmcv': '2.1.0', 'onedl-mmcv': '2.3.6',
                                     'onedl-mmdetection': '3.5.1'}))
    assert len(lines) == 1 and '\n' not in lines[0]
    assert 'mmcv 2.1.0 (OpenMMLab) and onedl-mmcv 2.3.6 (OneDL)' in lines[0]
    assert 'pip uninstall -y mmcv onedl-mmcv' in lines[0]


def test_import_without_mmengine_names_both_extras():
    """``import mmvit_ext`` where mmengine is not installed: one line naming both extras."""
    script = "import sys; sys.modules['mmengine'] = None; import mmvit_ext"
    result = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith('ImportError: mmvit_ext needs mmengine, which is not installed')
    assert '".[openmmlab]"' in last and '".[onedl]"' in last and 'docs/install.md' in last
    assert 'mmvit_ext[' not in last  # not on a package index: no install by name


@pytest.mark.parametrize('change', [
    {'transformers': '4.55.4'},  # the last transformers with the names mmpretrain imports
    {'transformers': None},  # mmpretrain then skips its multimodal models
    {'pycocotools': None},  # likewise
    {'mmpretrain': None},
    {'mmpretrain': '1.2.1'},  # a release after the break's last known one
    {'mmpretrain': None, 'onedl-mmpretrain': '1.3.6', 'transformers': '4.57.6'},  # the fork
])
def test_working_combinations_pass(change):
    versions = {k: v for k, v in {**BROKEN, **change}.items() if v is not None}
    assert env_check.problems(fake(versions)) == []


def test_the_fork_breaks_from_transformers_5():
    """onedl-mmpretrain 1.3.6 takes find_pruneable_heads_and_indices from pytorch_utils, which
    transformers 5.0 dropped (read from the 4.57.6 and 5.0.0 wheels; checked importing)."""
    fork = {'onedl-mmpretrain': '1.3.6', 'pycocotools': '2.0.11'}
    assert env_check.problems(fake({**fork, 'transformers': '4.57.6'})) == []
    (line,) = env_check.problems(fake({**fork, 'transformers': '5.0.0'}))
    assert 'onedl-mmpretrain 1.3.6 cannot be imported beside transformers 5.0.0' in line
    assert 'import mmvit_ext before mmdet / mmpretrain' in line
    assert "transformers<5" in line and 'uninstall it' in line


def test_the_fork_break_is_mended_only_where_installed(monkeypatch):
    """``mend_breaks`` runs a break's mend once, only where its versions are installed; a mended
    break is no longer named."""
    calls = []
    counted = dataclasses.replace(FORK_BREAK, mend=lambda: calls.append(1) or True)
    monkeypatch.setattr(env_check, 'KNOWN_BREAKS', (counted,))
    fork = {'onedl-mmpretrain': '1.3.6', 'pycocotools': '2.0.11', 'transformers': '5.24.0'}
    for clean in ({**fork, 'transformers': '4.57.6'}, {**fork, 'onedl-mmpretrain': '1.3.7'},
                  {**fork, 'pycocotools': None}):
        assert env_check.mend_breaks(fake(clean)) == [] and calls == []
    assert len(env_check.problems(fake(fork))) == 1
    assert env_check.mend_breaks(fake(fork)) == [counted] and calls == [1]
    assert env_check.problems(fake(fork)) == []
    assert env_check.mend_breaks(fake(fork)) == [counted] and calls == [1]  # once


def test_a_mend_that_fails_leaves_the_break_named(monkeypatch):
    failing = dataclasses.replace(FORK_BREAK, mend=lambda: False)
    monkeypatch.setattr(env_check, 'KNOWN_BREAKS', (failing,))
    fork = {'onedl-mmpretrain': '1.3.6', 'pycocotools': '2.0.11', 'transformers': '5.24.0'}
    assert env_check.mend_breaks(fake(fork)) == []
    assert len(env_check.problems(fake(fork))) == 1


@pytest.mark.parametrize('heads,n_heads,head_size,pruned,to_prune,kept', [
    ([1, 3], 4, 2, set(), {1, 3}, [0, 1, 4, 5]),
    ([], 3, 2, set(), set(), [0, 1, 2, 3, 4, 5]),
    # head 0 went before: the layer holds heads 1, 2, 3 in blocks 0, 1, 2; head 2 is block 1
    ([0, 2], 3, 2, {0}, {2}, [0, 1, 4, 5]),
    ([2, 5], 4, 3, {1, 4}, {2, 5}, [0, 1, 2, 6, 7, 8]),  # heads 0, 2, 3, 5 left: blocks 1, 3 go
])
def test_the_supplied_helper_keeps_the_rows_of_the_other_heads(heads, n_heads, head_size,
                                                               pruned, to_prune, kept):
    got_heads, got_kept = transformers_compat.find_pruneable_heads_and_indices(
        heads, n_heads, head_size, pruned)
    assert got_heads == to_prune and got_kept.dtype == torch.int64
    assert got_kept.tolist() == kept
    pytorch_utils = pytest.importorskip('transformers.pytorch_utils')
    theirs = pytorch_utils.__dict__.get(transformers_compat.HELPER)
    if theirs is not None and theirs is not transformers_compat.find_pruneable_heads_and_indices:
        ref_heads, ref_kept = theirs(heads, n_heads, head_size, set(pruned))  # transformers 4's
        assert ref_heads == got_heads and ref_kept.tolist() == kept


def test_the_names_are_supplied_only_where_missing():
    lacking = [types.ModuleType(name) for name in ('pytorch_utils', 'modeling_utils')]
    config = types.ModuleType('configuration_utils')
    config.PretrainedConfig = alias = type('PreTrainedConfig', (), {})
    assert transformers_compat.supply_missing(*lacking, config)
    assert lacking[0].find_pruneable_heads_and_indices is \
        transformers_compat.find_pruneable_heads_and_indices
    assert lacking[1].PretrainedConfig is alias
    own = [types.ModuleType(name) for name in ('pytorch_utils', 'modeling_utils')]
    own[0].find_pruneable_heads_and_indices = theirs = lambda *args: None
    own[1].PretrainedConfig = their_config = type('PretrainedConfig', (), {})
    assert transformers_compat.supply_missing(*own, config)
    assert own[0].find_pruneable_heads_and_indices is theirs
    assert own[1].PretrainedConfig is their_config
    assert not transformers_compat.supply_missing(types.ModuleType('p'), types.ModuleType('m'),
                                                  types.ModuleType('c'))  # no alias to give


@pytest.mark.skipif(FORK_BREAK.message() is None,
                    reason='onedl-mmpretrain <= 1.3.6 beside transformers >= 5 (the newest stack)')
def test_the_newest_stack_imports_the_peers_after_mmvit_ext_only():
    """With the fork's break installed, mmdet / mmpretrain import after mmvit_ext (BLIP's
    attention then prunes heads with the supplied helper), and still fail before it."""
    after = ("import mmvit_ext, mmdet.models, mmpretrain.models, torch\n"
             "from transformers import pytorch_utils, modeling_utils, BertConfig\n"
             "from transformers import PreTrainedConfig\n"
             "assert modeling_utils.PretrainedConfig is PreTrainedConfig\n"
             "from mmpretrain.models.multimodal.blip import language_model as lm\n"
             "from mmvit_ext.utils.env_check import problems\n"
             "ours = mmvit_ext.utils.transformers_compat.find_pruneable_heads_and_indices\n"
             "assert pytorch_utils.find_pruneable_heads_and_indices is ours\n"
             "assert lm.find_pruneable_heads_and_indices is ours and problems() == []\n"
             "attn = lm.BertAttention(BertConfig(hidden_size=8, num_attention_heads=4))\n"
             "attn.prune_heads([1, 3])\n"
             "print(tuple(attn.self.query.weight.shape), tuple(attn.output.dense.weight.shape),"
             " attn.self.num_attention_heads)\n")
    result = subprocess.run([sys.executable, '-c', after], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-5:] == ['(4,', '8)', '(8,', '4)', '2']
    assert 'cannot be imported beside' not in result.stderr
    before = subprocess.run([sys.executable, '-c', 'import mmdet.models'], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert before.returncode != 0 and 'NoneType takes no arguments' in before.stderr


def test_boundaries_and_version_parsing():
    assert env_check.parse_version('4.56.0.dev0') == (4, 56, 0)
    assert env_check.parse_version('2.11.0+cu130') == (2, 11, 0)
    assert env_check.problems(fake({**BROKEN, 'transformers': '4.56.0'}))
    with pytest.raises(ValueError):
        env_check.parse_version('main')


def test_tested_stack_has_no_known_break_and_train_refuses_one(tmp_path, monkeypatch):
    """A tested stack (pinned: transformers 4.46.3 beside mmpretrain 1.2.0; newest: 5.24 beside
    onedl-mmpretrain 1.3.6, mended by ``import mmvit_ext``) is clean; tools/train.py stops with
    the line before building anything when an unmended break is installed."""
    monkeypatch.setattr(env_check, '_MENDED', set(env_check.mend_breaks()))
    assert env_check.problems() == []
    shim = tmp_path / 'sitecustomize.py'  # the installed metadata, as a broken environment has it
    shim.write_text('from importlib import metadata\nreal = metadata.version\n'
                    'broken = {"transformers": "5.17.0", "mmpretrain": "1.2.0"}\n'
                    'metadata.version = lambda n: broken.get(n) or real(n)\n')
    env = {'PYTHONPATH': f'{tmp_path}:{ROOT}', 'PATH': '/usr/bin:/bin'}
    result = subprocess.run([sys.executable, 'tools/train.py', 'configs/demo/mask_rcnn_pvtv2_b2_demo.py'],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode != 0
    assert re.search(r'mmpretrain \S+ cannot be imported beside transformers 5\.17\.0', result.stderr)
    assert 'Traceback' not in result.stderr
