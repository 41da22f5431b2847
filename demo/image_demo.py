"""Run a detection or segmentation config on one image and draw the predictions.

Uses mmdet's / mmseg's own inference API and visualisers; the task is taken from the config
(a ``decode_head`` means segmentation). Writes a PNG.

Example:
    python demo/image_demo.py demo.jpg configs/demo/mask_rcnn_pvtv2_b2_demo.py \\
        work_dirs/demo/epoch_6.pth --out work_dirs/demo/image_demo.png
    python demo/image_demo.py scene.jpg configs/upernet_swin_t_512x512_160k_ade20k.py seg.pth \\
        --out seg.png --device cuda
"""
import argparse
from pathlib import Path

import mmvit_ext  # noqa: F401  (registers the backbones)
from mmvit_ext.utils.safe_checkpoint import trusted_training_state


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('image')
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('--out', default='image_demo.png')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--score-thr', type=float, default=0.3, help='detection score threshold')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import mmcv
    for path, what in ((args.image, 'image'), (args.config, 'config'),
                       (args.checkpoint, 'checkpoint')):
        if not Path(path).is_file():
            raise SystemExit(f'error: {what} {path} does not exist')
    from mmengine.config import Config
    cfg = Config.fromfile(args.config)
    cfg.model.backbone.init_cfg = None  # the checkpoint holds every weight
    image = mmcv.imread(args.image, channel_order='rgb')
    if 'decode_head' in cfg.model:
        from mmseg.apis import inference_model, init_model
        from mmseg.visualization import SegLocalVisualizer
        with trusted_training_state():  # a training checkpoint: mmengine's state too
            model = init_model(cfg, args.checkpoint, device=args.device)
        result = inference_model(model, args.image)
        visualizer = SegLocalVisualizer(name='mmvit_ext_demo', alpha=0.6)
        visualizer.dataset_meta = model.dataset_meta
        visualizer.add_datasample('prediction', image, result, draw_gt=False, show=False,
                                  out_file=args.out, with_labels=True)
        summary = f'{len(result.pred_sem_seg.data.unique())} classes present'
    else:
        from mmdet.apis import inference_detector, init_detector
        from mmdet.visualization import DetLocalVisualizer
        with trusted_training_state():  # a training checkpoint: mmengine's state too
            model = init_detector(cfg, args.checkpoint, device=args.device)
        result = inference_detector(model, args.image)
        visualizer = DetLocalVisualizer(name='mmvit_ext_demo')
        visualizer.dataset_meta = model.dataset_meta
        visualizer.add_datasample('prediction', image, result, draw_gt=False, show=False,
                                  out_file=args.out, pred_score_thr=args.score_thr)
        kept = int((result.pred_instances.scores >= args.score_thr).sum())
        summary = f'{kept} detections with score >= {args.score_thr}'
    print(f'wrote {args.out}: {summary}')


if __name__ == '__main__':
    main()
