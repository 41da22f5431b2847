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
    assert len((ROOT / 'README.md').read_text().splitlines()) <= 220


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
    while words and re.fullmatch(r'[A-Z_]+=\S*', words[0]):  # VAR=value before the command
        words = words[1:]
    if words[:3] == ['python3', '-m', 'venv']:
        return
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


# ---- the figures rule: ours (command, date, machine, one value) or published (source, recipe) --
# a commit hash: 7-40 hex digits with a digit and a letter, not part of a file name
# (``deit_small_patch16_224-cd65a155.pth`` names a released file)
COMMIT_HASH = re.compile(r'(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w.-])')
# words that narrate how a figure was taken instead of stating it
RUN_LOG = re.compile(
    r'\bwas ~|\bwas \d[\d.]*×|heavy load|other sessions|other processes|quieter|busy neighbour|'
    r'(?:before|after) the merge|\bre-?measured\b|\bre-?runs?\b|load average|minutes earlier|'
    r'first version|(?:GPU|machine) was lent|same code as before|varied between|'
    r'\bbefore:|\bafter:|\bthis work\b|still to be taken', re.I)


def _text_lines(page: Path) -> Iterator[Tuple[int, str]]:
    """(line number, line) outside code blocks."""
    inside = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith('```'):
            inside = not inside
        elif not inside:
            yield number, line


def test_pages_name_no_commit_hashes():
    found = [(_relative(p), n, m.group(0)) for p in PAGES for n, line in _text_lines(p)
             for m in COMMIT_HASH.finditer(line)]
    assert not found, f'commit hashes in the docs (a reader cannot check them): {found}'


def test_pages_state_figures_not_how_they_were_taken():
    found = [(_relative(p), n, m.group(0)) for p in PAGES for n, line in _text_lines(p)
             for m in RUN_LOG.finditer(line)]
    assert not found, f'run-log words (state one value with its command and date): {found}'


def test_ratio_ranges_are_not_given_for_one_figure():
    """One value per figure of ours: a speed ratio given as a range ('1.38–1.54×') is a run log."""
    ranged = re.compile(r'\d\.\d+\s*[–-]\s*\d\.\d+\s*×')
    allowed = re.compile(r'per layer|tokens|faster than')  # ranges over sizes, not over runs
    found = [(_relative(p), n, line.strip()[:80]) for p in PAGES for n, line in _text_lines(p)
             if ranged.search(line) and not allowed.search(line)]
    assert not found, found


ZOO = ROOT / 'docs' / 'model_zoo.md'
RECIPE = re.compile(r'matches|differs: .+|not checked( \(.+\))?|unknown: .+')


def _zoo_tables() -> List[Tuple[List[str], List[List[str]]]]:
    """(header cells, rows of cells) of every table of docs/model_zoo.md with a published column."""
    tables, header = [], None
    for line in ZOO.read_text().splitlines():
        if not line.startswith('|'):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip('|').split(' | ')]
        if header is None:
            header = cells
            if any(cell.startswith('published') for cell in cells):
                tables.append((cells, []))
        elif not set(line) <= set('|-') and tables and tables[-1][0] is header:
            tables[-1][1].append(cells)
    return tables


def test_model_zoo_marks_every_published_figure():
    """Every published figure names its source (a key the page defines) and says whether our
    recipe is the one behind it; the page says once that no row was trained here."""
    text = ZOO.read_text()
    assert 'No row on this page was trained by this project' in text
    tables = _zoo_tables()
    assert len(tables) == 3
    defined = set(re.findall(r'\[([\w-]+)\]\s[\w*]', text))
    for header, rows in tables:
        published = next(i for i, h in enumerate(header) if h.startswith('published'))
        assert header[published + 1] == 'our recipe vs the published one'
        assert len(rows) > 10
        for row in rows:
            figure, recipe = row[published], row[published + 1]
            if figure == '—':
                assert recipe == '—', row[0]
                continue
            sources = re.findall(r'\[([\w-]+)\]', figure)
            assert sources and set(sources) <= defined, (row[0], figure)
            assert RECIPE.fullmatch(recipe), (row[0], recipe)


def test_published_figures_elsewhere_say_whether_the_recipe_matches():
    """Outside the model zoo, a line quoting a published figure says recipe matches / differs."""
    quoted = re.compile(r'published[^.|]*?\d+\.\d')
    found = [(_relative(p), n) for p in PAGES if p != ZOO for n, line in _text_lines(p)
             if quoted.search(line) and not re.search(r'recipe (matches|differs)', line)]
    assert not found, found
