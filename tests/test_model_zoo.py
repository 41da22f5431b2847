"""docs/model_zoo.md stays true: every config is named, and sampled rows are re-measured."""
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools' / 'analysis'))
SECTION = (ROOT / 'docs/model_zoo.md').read_text()
TOOLS = (ROOT / 'docs/training.md').read_text() + (ROOT / 'docs/analysis.md').read_text()
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / 'configs').rglob('*.py')
                 if '_base_' not in p.parts)


def _row(path: str) -> list:
    """The cells of the model-zoo row of ``path``."""
    line = next(line for line in SECTION.splitlines() if line.startswith(f'| `{path}` |'))
    return [cell.strip() for cell in line.strip('|').split('|')]


def test_every_config_is_named_in_the_model_zoo():
    missing = [path for path in CONFIGS if f'`{path}`' not in SECTION]
    assert not missing, f'configs missing from docs/model_zoo.md: {missing}'


@pytest.mark.parametrize('path,with_flops', [
    ('configs/mmpretrain/pvtv2_b0_in1k.py', True),
    ('configs/mmseg/fpn_pvtv2_b0_512x512_40k_ade20k.py', True),
    ('configs/mmdet/retinanet_pvtv2_b0_fpn_1x_coco.py', False),
    ('configs/mask_rcnn_pvtv2_b2.py', False),
    ('configs/mmpretrain/deit_s_in1k.py', True),
    ('configs/mmdet/mask_rcnn_vit_b_vitdet_1x_coco.py', False),
])
def test_model_zoo_rows_are_what_model_stats_measures(path, with_flops):
    from model_stats import config_stats
    cells = _row(path)  # config, backbone, params, GFLOPs, backbone params, backbone GFLOPs, ...
    stats = config_stats(str(ROOT / path), flops=with_flops)
    assert cells[2] == f'{stats["params"] / 1e6:.2f}'
    assert cells[4] == f'{stats["backbone_params"] / 1e6:.2f}'
    if with_flops:
        assert cells[3] == f'{stats["flops"] / 1e9:.1f}'
        assert cells[5] == f'{stats["backbone_flops"] / 1e9:.1f}'


def test_tools_section_runs_the_venv_python_and_model_stats_names_its_form():
    commands = [line for line in TOOLS.splitlines() if re.match(r'\s*python\s', line)]
    assert not commands, f'bare `python` (no torch on a fresh machine): {commands}'
    assert '.venv/bin/python tools/train.py' in TOOLS
    source = (ROOT / 'tools/analysis/model_stats.py').read_text()
    for form in ('bare backbone', 'classifier form', 'whole detector', 'whole segmentor'):
        assert form in source
