"""Parameters and FLOPs of a backbone preset or a whole config's model (mmengine's counter).

FLOPs follow mmengine/fvcore: one multiply-add counts as one FLOP, as in the papers' tables.
Attention runs on its explicit path for counting (the fused kernel is invisible to the counter).
``--all`` prints a markdown table for every preset at 224x224 in classifier form (a 1000-class
head counted) with the paper's numbers beside ours.

Example:
    python tools/analysis/model_stats.py deepvit:s --size 800 1216
    python tools/analysis/model_stats.py --config configs/mask_rcnn_cait_s24_fpn_1x_coco.py
    python tools/analysis/model_stats.py --all
"""
import argparse
import logging
import sys
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

import mmvit_ext  # noqa: F401
from mmvit_ext.backbones import preset_config
from mmvit_ext.layers import AttentionBase
from mmvit_ext.registry import MODELS

# Paper figures at 224x224 with the ImageNet head: (params M, GFLOPs); None where the paper gives
# no figure for the preset. Swin: Liu et al. 2021 Tab. 1; PVTv2: the official whai362/PVT model
# table; CaiT: Touvron et al. 2021 (S36 counted at 224); DeepViT-S and Refined-ViT: their papers.
PAPER = {
    'swin:tiny': (28, 4.5), 'swin:small': (50, 8.7), 'swin:base': (88, 15.4),
    'pvtv2:b0': (3.7, 0.6), 'pvtv2:b1': (14.0, 2.1), 'pvtv2:b2': (25.4, 4.0),
    'pvtv2:b2_li': (22.6, 3.9), 'pvtv2:b3': (45.2, 6.9), 'pvtv2:b4': (62.6, 10.1),
    'pvtv2:b5': (82.0, 11.8),
    'cait:xxs24': (12.0, 2.5), 'cait:xxs36': (17.3, 3.8), 'cait:xs24': (26.6, 5.4),
    'cait:s24': (46.9, 9.4), 'cait:s36': (68.2, 13.9), 'cait:m36': (270.1, 53.7),
    'cait:m48': (356.5, 71.5),
    'deepvit:s': (27, None),
    'refiner:s': (25, None), 'refiner:m': (55, None), 'refiner:l': (81, None),
}
PRESETS = ['swin:tiny', 'swin:small', 'swin:base', 'pvtv2:b0', 'pvtv2:b1', 'pvtv2:b2',
           'pvtv2:b2_li', 'pvtv2:b3', 'pvtv2:b4', 'pvtv2:b5', 'cait:xxs24', 'cait:xxs36',
           'cait:xs24', 'cait:s24', 'cait:s36', 'cait:m36', 'cait:m48', 'deepvit:16b',
           'deepvit:24b', 'deepvit:32b', 'deepvit:s', 'deepvit:l', 'refiner:s', 'refiner:m',
           'refiner:l']


class Classifier(nn.Module):
    """Backbone in classifier form + a 1000-way linear head (pooled last map or class token)."""

    def __init__(self, backbone: nn.Module, num_classes: int = 1000) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.out_channels[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.backbone(x)[-1]
        return self.head(feat.mean(dim=(2, 3)) if feat.dim() == 4 else feat)


def build_preset(spec: str, classifier: bool = False, **settings) -> nn.Module:
    cfg = preset_config(spec, **settings)
    if classifier:
        if cfg['type'] in ('mmvit_ext.DeepViT', 'mmvit_ext.CaiT', 'mmvit_ext.RefinedViT'):
            cfg['out_type'] = 'cls_token'
        else:
            cfg['out_indices'] = (-1,)
    model = MODELS.build(cfg)
    return Classifier(model) if classifier else model


def count(model: nn.Module, size: Tuple[int, int], inputs: Optional[tuple] = None
          ) -> Dict[str, float]:
    """{'params': n, 'flops': n} with mmengine's analysis tools, attention made explicit."""
    from mmengine.analysis import get_model_complexity_info
    for module in model.modules():
        if isinstance(module, AttentionBase):
            module.fused = False
    model.eval()
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.ERROR)  # silence the per-operator coverage warnings
    try:
        with torch.no_grad():
            info = get_model_complexity_info(
                model, inputs=inputs if inputs is not None else (torch.zeros(1, 3, *size),),
                show_table=False, show_arch=False)
    finally:
        logger.setLevel(level)
    return {'params': float(info['params']), 'flops': float(info['flops'])}


def all_presets_table(size: Tuple[int, int] = (224, 224), presets: Sequence[str] = PRESETS) -> str:
    from mmengine.utils import track_iter_progress
    rows = ['| preset | params (M) | paper params (M) | GFLOPs | paper GFLOPs |',
            '|---|---|---|---|---|']
    for spec in track_iter_progress(list(presets), file=sys.stderr):
        stats = count(build_preset(spec, classifier=True), size)
        paper = PAPER.get(spec, (None, None))
        fmt = (lambda v: '—' if v is None else f'{v:g}')
        rows.append(f'| {spec} | {stats["params"] / 1e6:.2f} | {fmt(paper[0])} | '
                    f'{stats["flops"] / 1e9:.2f} | {fmt(paper[1])} |')
    return '\n'.join(rows)


def config_model(path: str) -> Tuple[nn.Module, tuple]:
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmvit_ext.utils.config_checks import task_scope
    cfg = Config.fromfile(path)
    cfg.model.backbone.init_cfg = None
    scope = task_scope(cfg)
    __import__(f'{scope}.models')
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.build(cfg.model)
    return model, scope


class _Tensor(nn.Module):
    """A detector / segmentor in tensor mode, for the counter."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor):
        return self.model(x, mode='tensor')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('backbone', nargs='?', help='FAMILY:ARCH, e.g. deepvit:s, swin:tiny')
    parser.add_argument('--config', help='count a whole model from a config instead')
    parser.add_argument('--all', action='store_true', help='markdown table of every preset')
    parser.add_argument('--size', type=int, nargs=2, default=(224, 224), metavar=('H', 'W'))
    args = parser.parse_args()
    if sum(map(bool, (args.backbone, args.config, args.all))) != 1:
        parser.error('give one of: a backbone FAMILY:ARCH, --config, --all')
    size = tuple(args.size)
    if args.all:
        print(all_presets_table(size))
        return
    if args.config:
        model, _ = config_model(args.config)
        stats = count(_Tensor(model), size)
        name = args.config
    else:
        try:
            model = build_preset(args.backbone)
        except ValueError as error:
            parser.error(str(error))
        stats = count(model, size)
        name = args.backbone
    print(f'{name} at {size[0]}x{size[1]}: {stats["params"] / 1e6:.2f} M params, '
          f'{stats["flops"] / 1e9:.2f} GFLOPs')


if __name__ == '__main__':
    main()
