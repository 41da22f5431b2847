"""What a newcomer reaches for first works as written: the README stays short, every link in the
README and docs/ resolves, every command in their ``bash`` blocks names scripts and configs
that exist and passes its tool's argument parser, and the README's minimal config builds."""
import argparse
import glob
import re
import runpy
import shlex
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
# placeholders in commands -> a value the parser accepts (existence is not the parser's job)
PLACEHOLDERS = {'CONFIG': 'configs/mask_rcnn_pvtv2_b2.py', 'IMAGE': 'demo.png', 'D': 'work_dirs/x',
                'PATH': 'work_dirs/x/epoch_1.pth', 'PARTITION': 'p', 'JOB': 'j'}
LINK = re.compile(r'\]\(([^)\s]+)\)')


def _relative(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _links() -> Iterator[Tuple[str, str]]:
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if not target.startswith(('http://', 'https://', 'mailto:', '#')):
                yield _relative(page), target


def _commands() -> Iterator[Tuple[str, str]]:
    """Every command line of every ``bash`` block (continuations joined, comments dropped)."""
    for page in PAGES:
        for block in re.findall(r'```bash\n(.*?)```', page.read_text(), re.S):
            for line in block.replace('\\\n', ' ').splitlines():
                line = line.split(' #')[0].strip()
                if line and not line.startswith('#'):
                    for part in line.split(' && '):
                        yield _relative(page), part.strip()


def _argv(words: List[str]) -> List[str]:
    """The command's arguments with ``[optional]`` brackets opened and placeholders filled."""
    text = ' '.join(words).replace('[', ' ').replace(']', ' ')
    argv = []
    for word in shlex.split(text):
        if word == '...':  # 'k=v ...': more of the same
            continue
        if re.fullmatch(r'[A-Z][A-Z0-9_]*', word):
            word = PLACEHOLDERS.get(word, 'checkpoints/x.pth')
        argv.extend(sorted(glob.glob(word, root_dir=ROOT)) if '*' in word else [word])
    return argv


class _Parsed(Exception):
    pass


def _parses(script: str, argv: List[str]) -> None:
    """Run ``script`` as ``__main__`` until its ArgumentParser has parsed ``argv``."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(parser, args=None, namespace=None):
        raise _Parsed(original(parser, args, namespace))

    saved = sys.argv
    sys.argv = [script, *argv]
    argparse.ArgumentParser.parse_args = parse_and_stop
    try:
        runpy.run_path(str(ROOT / script), run_name='__main__')
    except _Parsed:
        return
    except SystemExit as exit_:
        raise AssertionError(f'{script} {shlex.join(argv)}: the parser refused it ({exit_})')
    finally:
        argparse.ArgumentParser.parse_args = original
        sys.argv = saved
    raise AssertionError(f'{script} never parsed its arguments')


def test_readme_is_short():
    assert len((ROOT / 'README.md').read_text().splitlines()) <= 250


@pytest.mark.parametrize('page,target', sorted(set(_links())))
def test_every_link_resolves(page, target):
    path = target.split('#')[0]
    assert ((ROOT / page).parent / path).exists(), f'{page} links to missing {target}'


def test_pages_state_no_work_in_progress():
    """No sentence names branches, issues or unfinished work (a reader cannot see either)."""
    banned = re.compile(r'\bissue[-\s#]*\d+|\bWIP\b|work in progress|expected failure|'
                        r'git branch|\b[\w-]+ branch(?! on| of)\b(?<!MLP branch)', re.I)
    found = [(_relative(p), m.group(0)) for p in PAGES for m in banned.finditer(p.read_text())]
    assert not found, found


@pytest.mark.parametrize('page,command', sorted(set(_commands())))
def test_every_command_names_what_exists_and_parses(page, command):
    words = shlex.split(command)
    if words[:1] == ['bash']:
        assert (ROOT / words[1]).is_file(), f'{page}: {command}: no {words[1]}'
        words = words[2:]
    elif words[:1] == ['.venv/bin/python'] and words[1] != '-m':
        script, argv = words[1], _argv(words[2:])
        assert (ROOT / script).is_file(), f'{page}: {command}: no {script}'
        _parses(script, argv)
    else:
        assert words[:3] == ['.venv/bin/python', '-m', 'pytest'], f'{page}: unknown form {command}'
    for word in words:
        if re.match(r'(configs|tools|demo)/', word) and '*' not in word:
            assert (ROOT / word.split('[')[0]).exists(), f'{page}: {command}: no {word}'


def _python_blocks(page: Path) -> List[str]:
    return re.findall(r'```python\n(.*?)```', page.read_text(), re.S)


def test_readme_minimal_config_builds_and_snippet_runs(tmp_path):
    """The README's config resolves its mmdet base, its backbone feeds its neck (weights aside),
    and its snippet prints what it says."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    config, snippet = _python_blocks(ROOT / 'README.md')[:2]
    path = tmp_path / 'minimal.py'
    path.write_text(config)
    cfg = Config.fromfile(str(path))
    assert cfg.model.backbone.init_cfg.checkpoint == 'checkpoints/pvt_v2_b2.pth'
    cfg.model.backbone.init_cfg = None  # no weights here
    from mmdet.registry import MODELS
    import mmdet.models  # noqa: F401
    assert cfg.model.type == 'MaskRCNN'
    with DefaultScope.overwrite_default_scope('mmdet'):
        backbone = MODELS.build(cfg.model.backbone)
    assert backbone.out_channels == tuple(cfg.model.neck.in_channels)
    namespace: dict = {}
    exec(snippet, namespace)
    quoted = re.search(r'# (\(.*?\)), (\(.*?\))', snippet).groups()
    swin = namespace['swin']
    assert (swin.out_channels, swin.strides) == tuple(eval(q) for q in quoted)
