"""Every count the README, docs/ and the current CHANGELOG section state comes from one source,
computed here: backbone families from the registry (``family_classes()``), the peers' configs
that build ours by ``type=`` from the collection ``tests/test_peer_configs.py`` runs on, the
papers from CITATION.cff. A count phrase with no source here fails, so a new one brings its
source with it; the number of tests is never stated (pytest says it)."""
import re
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORDS = {'one': 1, 'two': 2, 'three': 3, 'four': 4, 'five': 5, 'six': 6, 'seven': 7,
         'eight': 8, 'nine': 9, 'ten': 10, 'eleven': 11, 'twelve': 12, 'thirteen': 13}
NUMBER = r'(\d+|%s)' % '|'.join(WORDS)
# '<number> [up to two words] <noun>': the nouns whose counts drift as the code grows
# (a version's last digit, '4.46.3 from configs', is no count: no dots before, no prepositions)
COUNT = re.compile(r'(?<![\w.])%s ((?:(?!(?:from|of|in|on|at|to|for|with|by|and)\b)[`\w.-]+ ){0,2}?)'
                   r'(famil(?:y|ies)|configs|tests|papers|references)\b' % NUMBER, re.I)


def _value(word: str) -> int:
    return int(word) if word.isdigit() else WORDS[word.lower()]


def _current_changelog() -> str:
    text = (ROOT / 'CHANGELOG.md').read_text()
    sections = re.split(r'^## ', text, flags=re.M)
    return sections[1]  # the newest version's section (test_packaging: it is __version__)


def _pages() -> Dict[str, str]:
    pages = {'README.md': (ROOT / 'README.md').read_text(),
             'CHANGELOG.md (current version)': _current_changelog()}
    pages.update({f'docs/{p.name}': p.read_text() for p in sorted((ROOT / 'docs').glob('*.md'))})
    return pages


def _prose(text: str) -> Iterator[str]:
    """Lines outside code blocks."""
    inside = False
    for line in text.splitlines():
        if line.startswith('```'):
            inside = not inside
        elif not inside:
            yield line


def _count_phrases() -> List[Tuple[str, str, int, str]]:
    """(page, phrase, number, noun) of every count phrase; a phrase may span a line break."""
    found = []
    for page, text in _pages().items():
        prose = ' '.join(' '.join(_prose(text)).split())
        for m in COUNT.finditer(prose):
            found.append((page, m.group(0), _value(m.group(1)), m.group(3).lower()))
    return found


def _families() -> int:
    import mmvit_ext  # noqa: F401  (registers the scope)
    from mmvit_ext.backbones import family_classes
    return len(family_classes())


@pytest.fixture(scope='module')
def peer_counts() -> Counter:
    """(peer, class) -> how many of the peers' shipped configs build ours by ``type=``: the same
    collection the drop-in test builds (reading the peers' configs takes about a minute)."""
    import test_peer_configs
    counts = Counter((peer, backbone['type'].split('.')[-1])
                     for peer, _, backbone in test_peer_configs.CONFIGS)
    counts['total'] = len(test_peer_configs.CONFIGS)
    return counts


def test_no_page_states_a_count_without_a_source():
    """Families: the registry. Tests: never stated. Papers: CITATION.cff. Configs: only the
    peer-config sentences checked below."""
    families = _families()
    papers = len(yaml.safe_load((ROOT / 'CITATION.cff').read_text())['references'])
    wrong = []
    for page, phrase, number, noun in _count_phrases():
        if noun.startswith('famil'):
            # 'one family' / 'a new family' speak of a single family, not of how many there are
            if number != 1 and number != families:
                wrong.append((page, phrase, f'the registry has {families}'))
        elif noun == 'tests':
            wrong.append((page, phrase, 'a test count goes stale; pytest states it'))
        elif noun in ('papers', 'references'):
            if number != papers:
                wrong.append((page, phrase, f'CITATION.cff lists {papers}'))
        elif noun == 'configs':  # only in a sentence the peer-config test reads
            checked = PEER_SENTENCES.get(page)
            numbers = checked.search(_one_line(page)).groups() if checked else ()
            if str(number) not in numbers:
                wrong.append((page, phrase, 'no source for this config count'))
    assert not wrong, wrong


def _one_line(page: str) -> str:
    return ' '.join((ROOT / page).read_text().split())


# the sentences that count the peers' configs, and which count each number is
PEER_SENTENCES = {
    'docs/migrating.md': re.compile(r'\((\d+) configs, (\d+) of them ViT\)'),
    'docs/vit.md': re.compile(r'all (\d+) `VisionTransformer` backbone configs that mmseg 1\.2 '
                              r'\((\d+): .*?\) and mmpretrain 1\.2 \((\d+):'),
}


def test_peer_config_counts_are_the_collected_ones(peer_counts):
    total, vit = PEER_SENTENCES['docs/migrating.md'].search(_one_line('docs/migrating.md')).groups()
    vit_configs = sum(n for key, n in peer_counts.items()
                      if key != 'total' and key[1] == 'VisionTransformer')
    assert (int(total), int(vit)) == (peer_counts['total'], vit_configs)
    all_vit, mmseg, mmpretrain = \
        PEER_SENTENCES['docs/vit.md'].search(_one_line('docs/vit.md')).groups()
    assert (int(all_vit), int(mmseg), int(mmpretrain)) == (
        vit_configs, peer_counts[('mmseg', 'VisionTransformer')],
        peer_counts[('mmpretrain', 'VisionTransformer')])


def test_family_counts_are_the_registry():
    """The count phrases the pages hold now are found (the scanner is not blind) and agree."""
    families = _families()
    stated = [(page, number) for page, _, number, noun in _count_phrases()
              if noun.startswith('famil') and number != 1]
    assert any(page == 'docs/gpu.md' for page, _ in stated)
    assert all(number == families for _, number in stated), stated


def _table_classes(page: str, header: str) -> List[str]:
    """The backticked names in the first column of the table whose header row starts so."""
    rows, inside = [], False
    for line in (ROOT / page).read_text().splitlines():
        if line.startswith(header):
            inside = True
            continue
        if inside and not line.startswith('|'):
            break
        if inside and not set(line) <= set('|- '):
            rows.append(re.match(r'\| `(\w+)`', line).group(1))
    return rows


@pytest.mark.parametrize('page,header', [('README.md', '| backbone (`mmvit_ext.`)'),
                                         ('docs/backbones.md', '| backbone | presets')])
def test_family_tables_list_the_registered_classes(page, header):
    import mmvit_ext  # noqa: F401
    from mmvit_ext.backbones import registered_families
    rows = _table_classes(page, header)
    assert sorted(rows) == sorted(registered_families().values()), (page, rows)


def test_readme_cites_what_citation_cff_cites():
    cff = yaml.safe_load((ROOT / 'CITATION.cff').read_text())
    cited = {ref['url'].rsplit('/', 1)[1]: ref['title'] for ref in cff['references']}
    section = (ROOT / 'README.md').read_text().split('## Licence and citation')[1]
    readme = dict((arxiv, title) for title, arxiv in
                  re.findall(r'\*(.+?)\* \(.*?\[arXiv:([\d.]+)\]', section))
    assert readme == cited
    assert 'CITATION.cff' in section
