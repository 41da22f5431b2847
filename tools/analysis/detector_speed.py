"""Training-step speed of a whole detector: our backbone against mmdet's own, same everything else.

One config's detector is built twice: as the config says (our backbone), and with mmdet's
implementation of the same backbone holding our weights (checked to give our outputs) in its
place. Same heads, same weights, same synthetic annotated batch (mmdet's ``demo_mm_inputs``);
forward + backward of the loss under autocast (as ``AmpOptimWrapper`` runs it), median of
--repeat runs after --warmup, the two interleaved run by run. Prints images/s of each and the
ratio, the last line a ``SUMMARY`` for scripts (tools/dev/gpu_check_steps.py's ``detector`` step).

Example:
    python tools/analysis/detector_speed.py configs/mask_rcnn_swin_t_fpn_1x_coco.py
    python tools/analysis/detector_speed.py configs/mask_rcnn_pvtv2_b2.py --device cpu \\
        --size 64 64 --batch 1 --warmup 0 --repeat 1
"""
import argparse
import copy
from typing import Dict, Tuple

import torch
from torch import nn

import mmvit_ext  # noqa: F401
from mmvit_ext.benchmark import build_peers, check_peers
from mmvit_ext.benchmark.measure import DTYPES, measure_interleaved
from mmvit_ext.benchmark.train_step import DetectorTrainStep
from mmvit_ext.utils import build_model


def detector_pair(config: str, size: Tuple[int, int]) -> Dict[str, nn.Module]:
    """``{'ours': step, 'mmdet': step}``: the config's detector, and a copy whose backbone is
    mmdet's implementation with our weights; each wrapped as a training step."""
    from mmengine.config import Config
    cfg = Config.fromfile(config)
    cfg.model.backbone.drop_path_rate = 0.0
    detector = build_model(cfg, pretrained=False)
    detector.init_weights()
    peer = build_peers(detector.backbone, size)['mmdet']
    (check, diff), = check_peers(detector.backbone, {'mmdet': peer}, size).values()
    print(f'[check] mmdet backbone: outputs match ours at {check[0]}x{check[1]} '
          f'(max abs diff {diff:.1e})')
    other = copy.deepcopy(detector)
    other.backbone = peer
    return {'ours': DetectorTrainStep(detector), 'mmdet': DetectorTrainStep(other)}


def images_per_second(batch: int, seconds: float) -> float:
    return batch / seconds


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='an mmdet config whose backbone has mmdet peers (Swin, PVTv2)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', choices=sorted(DTYPES), default='bf16')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--size', type=int, nargs=2, default=(800, 1333), metavar=('H', 'W'))
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--repeat', type=int, default=10)
    parser.add_argument('--name', help='what the SUMMARY line calls it (default: the config)')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    size, device = tuple(args.size), torch.device(args.device)
    models = detector_pair(args.config, size)
    for model in models.values():
        model.to(device).train()
    x = torch.randn(args.batch, 3, *size, device=device)
    results = measure_interleaved(models, x, ['fwdbwd'], DTYPES[args.dtype], args.warmup,
                                  args.repeat)
    rates = {name: images_per_second(args.batch, res.median('fwdbwd'))
             for name, res in results.items()}
    print(f'device {device}, {args.dtype} autocast, batch {args.batch}, {size[0]}x{size[1]}, '
          f'median of {args.repeat}\n\n| backbone | median s | images/s | peak MB |\n|---|---|---|---|')
    for name, res in results.items():
        print(f'| {name} | {res.median("fwdbwd"):.3f} | {rates[name]:.2f} | '
              f'{res.peak_mem["fwdbwd"] / 2 ** 20:.0f} |')
    ratio = rates['ours'] / rates['mmdet']
    print(f'SUMMARY {args.name or args.config} {args.dtype} b{args.batch} {size[0]}x{size[1]} '
          f'ours={rates["ours"]:.2f} img/s mmdet={rates["mmdet"]:.2f} img/s '
          f'ours/mmdet={ratio:.2f}')


if __name__ == '__main__':
    main()
