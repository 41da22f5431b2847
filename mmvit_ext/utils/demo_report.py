"""Summaries of a demo run: metrics table, loss curve, one prediction image."""
import json
import shutil
from pathlib import Path
from typing import Dict, List, Optional

COCO_KEYS = ('mAP', 'mAP_50', 'mAP_75', 'mAP_s', 'mAP_m', 'mAP_l')


def latest_test_metrics(test_dir: Path) -> Dict[str, float]:
    """Metrics dict that ``tools/test.py`` logged last (``<timestamp>/<timestamp>.json``)."""
    logs = sorted(p for p in Path(test_dir).glob('*/*.json') if p.stem == p.parent.name)
    if not logs:
        raise FileNotFoundError(f'no test metrics json under {test_dir}')
    lines = [json.loads(line) for line in logs[-1].read_text().splitlines() if line.strip()]
    return {k: v for line in lines for k, v in line.items()}


def train_scalars(work_dir: Path) -> List[dict]:
    """Every record of the latest training run's ``vis_data/scalars.json``."""
    files = sorted(Path(work_dir).glob('*/vis_data/scalars.json'))
    if not files:
        return []
    return [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]


def metrics_table(metrics: Dict[str, float], tasks=('bbox', 'segm')) -> str:
    """Markdown table of the COCO metrics, one row per task."""
    rows = ['| task | ' + ' | '.join(COCO_KEYS) + ' |', '|---' * (len(COCO_KEYS) + 1) + '|']
    for task in tasks:
        values = [metrics.get(f'coco/{task}_{k}') for k in COCO_KEYS]
        if any(v is not None for v in values):
            rows.append(f'| {task} | ' + ' | '.join('-' if v is None else f'{v:.3f}'
                                                    for v in values) + ' |')
    return '\n'.join(rows)


def plot_losses(records: List[dict], out: Path) -> Optional[Path]:
    """Loss curves (every ``loss*`` key against iteration) to a PNG."""
    records = [r for r in records if 'loss' in r and 'iter' in r]
    if not records:
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    keys = sorted({k for r in records for k in r if k.startswith('loss')})
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for key in keys:
        points = [(r['iter'], r[key]) for r in records if key in r]
        ax.plot(*zip(*points), label=key, linewidth=2 if key == 'loss' else 1)
    ax.set_xlabel('iteration')
    ax.set_ylabel('loss')
    ax.set_yscale('log')
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def first_prediction_image(test_dir: Path, out: Path) -> Optional[Path]:
    """Copy one visualised prediction (GT | prediction) to ``out``."""
    images = sorted(Path(test_dir).glob('*/vis/*.png'))
    if not images:
        return None
    shutil.copyfile(images[0], out)
    return out
