"""Print the segmentation demo's mIoU (per class too) and draw image | ground truth | prediction
for a few validation images, with a class-colour legend.

Example:
    python tools/summarize_seg_demo.py configs/demo/fpn_pvtv2_b0_ade_demo.py \
        work_dirs/seg_demo/iter_1000.pth work_dirs/seg_demo --num 4
"""
import argparse
import json
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

from mmvit_ext.utils.demo_report import latest_test_metrics

IGNORE_COLOUR = (255, 255, 255)  # label 0 ("other"): ignored by training and by the metric


def colourise(labels: np.ndarray, palette: Sequence[Tuple[int, int, int]]) -> np.ndarray:
    """(H, W) class indices (255 = ignore) -> (H, W, 3) uint8 colours."""
    table = np.zeros((256, 3), dtype=np.uint8)
    table[:len(palette)] = np.asarray(palette, dtype=np.uint8)
    table[255] = IGNORE_COLOUR
    return table[labels]


def predict(config: str, checkpoint: str, images: List[Path]) -> Tuple[list, list]:
    """Predicted class maps of ``images`` and the model's (classes, palette)."""
    from mmseg.apis import inference_model, init_model
    from mmvit_ext.utils.safe_checkpoint import trusted_training_state
    with trusted_training_state():  # a training checkpoint: mmengine's state too
        model = init_model(config, checkpoint, device='cpu')
    preds = [inference_model(model, str(p)).pred_sem_seg.data[0].numpy() for p in images]
    meta = model.dataset_meta
    return preds, [meta['classes'], meta['palette']]


def draw(rows: List[Tuple[np.ndarray, np.ndarray, np.ndarray]], classes: Sequence[str],
         palette: Sequence[Tuple[int, int, int]], out: Path, title: str) -> Path:
    """One row per image: image | ground truth | prediction, and a legend of the classes."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    fig, axes = plt.subplots(len(rows), 3, figsize=(7.5, 2.5 * len(rows) + 0.9), dpi=100,
                             squeeze=False)
    for row, (image, truth, pred) in zip(axes, rows):
        for ax, picture, name in zip(row, (image, colourise(truth, palette),
                                           colourise(pred, palette)),
                                     ('image', 'ground truth', 'prediction')):
            ax.imshow(picture)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(name, fontsize=9)
    handles = [Patch(facecolor=np.asarray(c) / 255, edgecolor='grey', label=n)
               for n, c in zip(classes, palette)]
    handles.append(Patch(facecolor=np.asarray(IGNORE_COLOUR) / 255, edgecolor='grey',
                         label='other (ignored)'))
    fig.legend(handles=handles, loc='lower center', ncol=6, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.9 / (2.5 * len(rows) + 0.9), 1, 0.97))
    fig.savefig(out)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('work_dir', help='holds test/ (tools/test.py --work-dir WORK_DIR/test)')
    parser.add_argument('--num', type=int, default=4, help='validation images to draw')
    args = parser.parse_args()
    from mmengine.config import Config
    from PIL import Image
    work_dir = Path(args.work_dir)
    metrics = latest_test_metrics(work_dir / 'test')
    (work_dir / 'metrics.json').write_text(json.dumps(metrics, indent=2))

    dataset = Config.fromfile(args.config).test_dataloader.dataset
    root = Path(dataset.data_root)
    images = sorted((root / dataset.data_prefix.img_path).glob('*.jpg'))[:args.num]
    preds, (classes, palette) = predict(args.config, args.checkpoint, images)
    rows = []
    for path, pred in zip(images, preds):
        raw = np.asarray(Image.open(root / dataset.data_prefix.seg_map_path /
                                    f'{path.stem}.png'))
        truth = np.where(raw == 0, 255, raw.astype(np.int64) - 1)  # reduce_zero_label
        rows.append((np.asarray(Image.open(path).convert('RGB')), truth, pred))
    out = draw(rows, classes, palette, work_dir / 'predictions.png',
               f'{Path(args.config).stem}, demo val split: mIoU {metrics["mIoU"]:.1f}')
    print(f'\n[seg demo] mIoU {metrics["mIoU"]:.2f}  aAcc {metrics["aAcc"]:.2f}  '
          f'mAcc {metrics["mAcc"]:.2f}  (val split, {len(classes)} classes)')
    print(f'metrics: {work_dir / "metrics.json"}\npredictions: {out}')


if __name__ == '__main__':
    main()
