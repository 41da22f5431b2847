"""Every Python block of README.md and docs/ runs, in the scope it is written for.

Each ```python block carries a tag, ``<!-- snippet: SCOPE -->`` (``mmdet`` / ``mmseg`` /
``mmpretrain`` / ``mmvit_ext``). A block of Python statements runs as written with that scope
as the default scope. A config (or a piece of one: ``backbone = dict(...)``, or the
``backbone=dict(...), neck=dict(...)`` arguments of a model) is read by mmengine as a config file
and each part it holds is built in the scope: the model or the backbone (and its neck, run on
an image), the optimizer wrapper, the hooks, the FSDP wrap policy. Models are built on the meta
device (a 7B costs nothing); a backbone's pretrained file, where named, is checked to fit: the
trunk tensors of the same preset built in our default scope load without a miss or an
unexpected tensor (the check that catches a preset losing its patch bias under mmseg). Two
blocks go as far as they can without what only a user has (and a config's ``mmvit_ext::`` base
is read from the checkout's ``configs/``, the installed form being tested from the wheel): the training run from Python (no
COCO here) builds its runner and stops before ``train()``; the sketch of a new family defines
and registers the class in a registry of its own.
"""
import copy
import re
from pathlib import Path
from typing import List, Tuple

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope, Registry

import mmvit_ext  # noqa: F401
from mmvit_ext.utils import build_model

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
BLOCK = re.compile(r'(?:<!-- snippet: (\w+) -->\n)?```python\n(.*?)```', re.S)
SCOPES = ('mmdet', 'mmseg', 'mmpretrain', 'mmvit_ext')
STOPS_BEFORE = {'Runner.from_cfg(cfg).train()': 'Runner.from_cfg(cfg)'}  # no COCO here


def _blocks() -> List[Tuple[str, str, str]]:
    return [(page.name, scope, text) for page in PAGES
            for scope, text in BLOCK.findall(page.read_text())]


def _is_config(text: str) -> bool:
    code = [line for line in text.splitlines() if line.strip() and not line.startswith('#')]
    return all(not re.match(r'(import|from|class|@|[\w.]+\()', line) for line in code)


def test_every_python_block_is_tagged_with_its_scope():
    found = _blocks()
    assert len(found) >= 18
    untagged = [(page, text.splitlines()[0]) for page, scope, text in found if not scope]
    assert not untagged, untagged
    assert {scope for _, scope, _ in found} <= set(SCOPES)


def _as_config(text: str, tmp: Path) -> Config:
    # ``mmvit_ext::`` resolves in an installed package (.mim; tested from the wheel in
    # test_packaging / test_install_lines); from this checkout, the same file by its path
    from mmvit_ext.config_files import PREFIX, config_root
    text = text.replace(f"'{PREFIX}", f"'{config_root()}/")
    if re.match(r'\s*backbone=dict\(', text):  # a model's arguments
        text = 'model = dict(\n' + text + ')\n'
    path = tmp / 'snippet.py'
    path.write_text(text)
    return Config.fromfile(str(path))


def _fits(backbone: dict, scope: str, model: torch.nn.Module) -> None:
    """The trunk tensors of the same preset, built in our default scope, load into ``model``."""
    from mmvit_ext.converters.loading import prepare_state_dict
    cfg = {k: v for k, v in backbone.items() if k not in ('init_cfg', 'sync_bn')}
    with torch.device('meta'):
        ours = build_model(cfg, scope='mmvit_ext')
    state = {k: v for k, v in ours.state_dict().items() if not k.startswith('pyramid.')}
    _, report = prepare_state_dict(model, state, source=f'{scope} snippet', strict=True)
    assert not report.unexpected, report.summary()


def _run_config(cfg: Config, scope: str) -> List[str]:
    built = []
    if 'model' in cfg and 'type' in cfg.model:
        with torch.device('meta'):
            build_model(cfg, scope=scope, pretrained=False)
        built.append('model')
    backbone = cfg.model.get('backbone') if 'model' in cfg else cfg.get('backbone')
    if backbone is not None and 'type' not in cfg.get('model', {}):
        backbone = copy.deepcopy(dict(backbone))
        backbone.pop('_delete_', None)
        with torch.device('meta'):
            model = build_model({**backbone, 'init_cfg': None}, scope=scope)
        built.append('backbone')
        init = backbone.get('init_cfg')
        if isinstance(init, dict) and init.get('checkpoint') and \
                type(model).__name__ == 'VisionTransformer':
            _fits(backbone, scope, model)
            built.append('checkpoint fits')
        neck = cfg.model.get('neck') if 'model' in cfg else cfg.get('neck')
        if neck is not None and 'type' in neck:
            assert list(neck['in_channels']) == list(model.out_channels), (neck, model.out_channels)
            built.append('neck channels')
    if 'optim_wrapper' in cfg:
        from mmengine.optim import build_optim_wrapper
        from mmvit_ext.backbones import VisionTransformer
        tiny = VisionTransformer(arch=dict(embed_dims=32, depth=2, num_heads=2), img_size=32)
        with DefaultScope.overwrite_default_scope(scope):
            build_optim_wrapper(tiny, cfg.optim_wrapper)
        built.append('optim_wrapper')
    if 'custom_hooks' in cfg:
        from mmengine.registry import HOOKS
        with DefaultScope.overwrite_default_scope(scope):
            for hook in cfg.custom_hooks:
                HOOKS.build(hook)
        built.append('hooks')
    if 'strategy' in cfg:
        from mmengine.registry import FUNCTIONS
        policy = cfg.strategy['model_wrapper']['auto_wrap_policy']['type']
        assert FUNCTIONS.get(policy) is not None, policy
        built.append('wrap policy')
    return built


@pytest.mark.parametrize('page,scope,text', _blocks(),
                         ids=[f'{p}:{i}' for i, (p, _, _) in enumerate(_blocks())])
def test_python_block_runs_in_its_scope(page, scope, text, tmp_path, monkeypatch):
    if _is_config(text):
        assert _run_config(_as_config(text, tmp_path), scope), text
        return
    if page == 'adding_a_family.md':  # a sketch: its class, registered in a registry of its own
        from mmvit_ext.backbones.base import BaseBackbone
        from mmvit_ext.backbones.vocabulary import GELU, Vocabulary, translate
        namespace = dict(MODELS=Registry('snippet'), BaseBackbone=BaseBackbone, GELU=GELU,
                         Vocabulary=Vocabulary, translate=translate)
        exec(compile(text, page, 'exec'), namespace)
        assert namespace['MODELS'].get('MyNet') is namespace['MyNet']
        assert namespace['MyNet'].resolve_arch('tiny')['depths'] == (1, 2)
        return
    for whole, stop in STOPS_BEFORE.items():
        text = text.replace(whole, stop)
    monkeypatch.chdir(tmp_path)
    with DefaultScope.overwrite_default_scope(scope):
        exec(compile(text, page, 'exec'), {'__name__': 'snippet'})
