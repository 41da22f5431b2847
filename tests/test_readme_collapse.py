"""The attention-collapse figures docs/analysis.md quotes are what its command measures (untrained
DeepViT-S with the tool's fixed seed on the built-in shapes: deterministic on CPU)."""
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / 'tools/analysis/attention_collapse.py'
NUMBER = r'(-?\d+\.\d+)'


def load_tool():
    spec = importlib.util.spec_from_file_location('attention_collapse', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_command_and_paragraph():
    readme = (ROOT / 'docs/analysis.md').read_text()
    command = re.search(r'^(?:\.venv/bin/)?python tools/analysis/attention_collapse\.py (.*)$',
                        readme, re.M)
    paragraph = re.search(r'`attention_collapse\.py` computes.*?\n\n', readme, re.S)
    assert command and paragraph, 'docs/analysis.md lost the attention_collapse command or paragraph'
    return shlex.split(command.group(1).split('#')[0]), ' '.join(paragraph.group(0).split())


def test_readme_collapse_figures_are_measured():
    argv, text = readme_command_and_paragraph()
    plain_quoted = re.search(r'plain attention is trivially identical across blocks \(mean '
                             rf'similarity to the 2 nearest blocks {NUMBER}\)', text)
    split = re.search(rf'mean similarity to the 2 nearest blocks {NUMBER} over blocks '
                      rf'(\d+)–(\d+), {NUMBER} over blocks (\d+)–(\d+), {NUMBER} over all '
                      r'(\d+) blocks', text)
    assert plain_quoted and split, text
    transform_mean, t0, t1, other_mean, o0, o1, all_mean, count = split.groups()

    tool = load_tool()
    model, stats, plain = tool.measure(tool.parse_args(argv))
    blocks = tool.transform_blocks(model)
    assert blocks == list(range(int(t0), int(t1) + 1))  # the quoted ranges are the real ones
    assert int(o0) == 0 and int(o1) == blocks[0] - 1 and int(count) == len(stats.nearest)
    measured = tool.nearest_means(stats, blocks)
    # quoted to 3 decimals; CPU float noise is far below that
    tol = 6e-4
    assert measured['transform'] == pytest.approx(float(transform_mean), abs=tol)
    assert measured['other'] == pytest.approx(float(other_mean), abs=tol)
    assert measured['all'] == pytest.approx(float(all_mean), abs=tol)
    assert tool.nearest_means(plain, blocks)['all'] == \
        pytest.approx(float(plain_quoted.group(1)), abs=tol)
    # the mean over all blocks is not the re-attention blocks' figure
    assert abs(measured['all'] - measured['transform']) > 0.1
