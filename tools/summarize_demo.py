"""Print the demo's COCO metrics table and write loss_curve.png / predictions.png.

Example:
    python tools/summarize_demo.py work_dirs/demo
"""
import argparse
import json
from pathlib import Path

from mmvit_ext.utils.demo_report import (first_prediction_image, latest_test_metrics,
                                         metrics_table, plot_losses, train_scalars)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('work_dir', help='work dir of tools/demo.sh (holds test/ and the log)')
    args = parser.parse_args()
    work_dir = Path(args.work_dir)
    metrics = latest_test_metrics(work_dir / 'test')
    (work_dir / 'metrics.json').write_text(json.dumps(metrics, indent=2))
    curve = plot_losses(train_scalars(work_dir), work_dir / 'loss_curve.png')
    image = first_prediction_image(work_dir / 'test', work_dir / 'predictions.png')
    print('\nMask R-CNN PVTv2-b2 on the demo val split (COCO metrics):')
    print(metrics_table(metrics))
    print(f'\nmetrics: {work_dir / "metrics.json"}\nloss curve: {curve}\npredictions: {image}')


if __name__ == '__main__':
    main()
