"""Parameters and FLOPs of a backbone preset or of a config's model (mmengine's counter).

FLOPs follow mmengine/fvcore: one multiply-add counts as one FLOP, as in the papers' tables.
Attention runs on its explicit path for counting (the fused kernel is invisible to the counter).
What is counted (printed with every figure):
  FAMILY:ARCH     the bare backbone (dense form: its feature maps, no head), at --size;
  --all           every preset in classifier form (backbone + a 1000-class head) at 224x224,
                  with the paper's numbers beside ours;
  --config / --zoo  the config's model at the task's input size (--size overrides):
                  mmdet 800x1280 (H x W, the size of mmdet's get_flops and the Swin / PVT
                  papers): params of the whole detector; FLOPs of backbone + neck + the dense
                  head (RPN or RetinaNet head); RoI heads are left out, their cost depends on
                  the proposal count;
                  mmseg 512x512: params of the whole segmentor (auxiliary head included);
                  FLOPs of the inference path (backbone + neck + decode head);
                  mmpretrain 224x224: the whole classifier.
                  Backbone params / FLOPs at the same size are given beside.
``--zoo CONFIG...`` prints one markdown row per config (the README's model-zoo columns).

Example:
    python tools/analysis/model_stats.py deepvit:s --size 800 1216
    python tools/analysis/model_stats.py --config configs/mask_rcnn_cait_s24_fpn_1x_coco.py
    python tools/analysis/model_stats.py --zoo configs/mmseg/*.py
    python tools/analysis/model_stats.py --all
"""
import argparse
import logging
import sys
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

import mmvit_ext  # noqa: F401
from mmvit_ext.backbones import family_class, family_classes, preset_config
from mmvit_ext.layers import AttentionBase
from mmvit_ext.registry import MODELS


def paper_figures() -> Dict[str, Tuple[Optional[float], Optional[float]]]:
    """``FAMILY:ARCH`` -> the paper's (params M, GFLOPs) at 224x224 with the ImageNet head,
    for every preset ``--all`` counts: each family's ``paper_figures`` (sources beside them)."""
    return {f'{family}:{arch}': figures for family, cls in family_classes().items()
            for arch, figures in cls.paper_figures.items()}


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
    if classifier:
        settings = {**family_class(spec.partition(':')[0]).classifier_settings(), **settings}
    model = MODELS.build(preset_config(spec, **settings))
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


def all_presets_table(size: Tuple[int, int] = (224, 224),
                      presets: Optional[Sequence[str]] = None) -> str:
    from mmengine.utils import track_iter_progress
    rows = ['| preset | params (M) | paper params (M) | GFLOPs | paper GFLOPs |',
            '|---|---|---|---|---|']
    papers = paper_figures()
    for spec in track_iter_progress(list(papers if presets is None else presets),
                                    file=sys.stderr):
        stats = count(build_preset(spec, classifier=True), size)
        paper = papers.get(spec, (None, None))
        fmt = (lambda v: '—' if v is None else f'{v:g}')
        rows.append(f'| {spec} | {stats["params"] / 1e6:.2f} | {fmt(paper[0])} | '
                    f'{stats["flops"] / 1e9:.2f} | {fmt(paper[1])} |')
    return '\n'.join(rows)


TASK_SIZE = {'mmdet': (800, 1280), 'mmseg': (512, 512), 'mmpretrain': (224, 224)}
FORM = {'mmdet': 'params: whole detector; FLOPs: backbone + neck + dense head (no RoI heads)',
        'mmseg': 'params: whole segmentor; FLOPs: backbone + neck + decode head (inference)',
        'mmpretrain': 'whole classifier'}


def config_model(path: str) -> Tuple[nn.Module, str]:
    """The config's model, built in its task's scope with the backbone's weights left out."""
    from mmengine.config import Config
    from mmvit_ext.utils import build_model, task_scope
    cfg = Config.fromfile(path)
    return build_model(cfg, pretrained=False), task_scope(cfg)


class _Counted(nn.Module):
    """The part of a task model that the counter runs (see the module docstring)."""

    def __init__(self, model: nn.Module, scope: str) -> None:
        super().__init__()
        self.model, self.scope = model, scope

    def forward(self, x: torch.Tensor):
        if self.scope != 'mmdet':
            return self.model(x, mode='tensor')
        feats = self.model.extract_feat(x)
        head = self.model.rpn_head if hasattr(self.model, 'rpn_head') else self.model.bbox_head
        return feats, head(feats)


def config_stats(path: str, size: Optional[Tuple[int, int]] = None,
                 flops: bool = True) -> Dict[str, object]:
    """Params / FLOPs of a config's model and of its backbone at the task's size (one pass)."""
    from mmengine.analysis import FlopAnalyzer
    model, scope = config_model(path)
    size = tuple(size or TASK_SIZE[scope])
    stats = dict(scope=scope, size=size, form=FORM[scope],
                 params=float(sum(p.numel() for p in model.parameters())),
                 backbone_params=float(sum(p.numel() for p in model.backbone.parameters())),
                 flops=None, backbone_flops=None)
    if flops:
        for module in model.modules():
            if isinstance(module, AttentionBase):
                module.fused = False
        counted = _Counted(model, scope).eval()
        with torch.no_grad():
            analyzer = FlopAnalyzer(counted, (torch.zeros(1, 3, *size),))
            analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            by_module = analyzer.by_module()
        stats.update(flops=float(by_module['']), backbone_flops=float(by_module['model.backbone']))
    return stats


def zoo_rows(paths: Sequence[str], size: Optional[Tuple[int, int]] = None,
             flops: bool = True) -> str:
    """Markdown rows: config | params (M) | GFLOPs | backbone params (M) | backbone GFLOPs."""
    rows = ['| config | params (M) | GFLOPs | backbone params (M) | backbone GFLOPs |',
            '|---|---|---|---|---|']
    fmt = (lambda v, scale, digits: '—' if v is None else f'{v / scale:.{digits}f}')
    for path in paths:
        s = config_stats(path, size, flops)
        rows.append(f'| `{path}` | {fmt(s["params"], 1e6, 2)} | {fmt(s["flops"], 1e9, 1)} | '
                    f'{fmt(s["backbone_params"], 1e6, 2)} | {fmt(s["backbone_flops"], 1e9, 1)} |')
        print(rows[-1], file=sys.stderr, flush=True)
    return '\n'.join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('backbone', nargs='?', help='FAMILY:ARCH, e.g. deepvit:s, swin:tiny '
                        '(counts the bare backbone)')
    parser.add_argument('--config', help="count a config's model at its task's input size")
    parser.add_argument('--zoo', nargs='+', metavar='CONFIG', help='markdown rows for configs')
    parser.add_argument('--all', action='store_true',
                        help='markdown table of every preset in classifier form at 224x224')
    parser.add_argument('--params-only', action='store_true',
                        help='with --zoo: parameters only (no forward pass; seconds per config)')
    parser.add_argument('--size', type=int, nargs=2, default=None, metavar=('H', 'W'),
                        help='input size (default: 224 224; the task size for configs)')
    args = parser.parse_args()
    if sum(map(bool, (args.backbone, args.config, args.zoo, args.all))) != 1:
        parser.error('give one of: a backbone FAMILY:ARCH, --config, --zoo, --all')
    size = tuple(args.size) if args.size else None
    if args.all:
        print('classifier form (backbone + 1000-class head)')
        print(all_presets_table(size or (224, 224)))
        return
    if args.zoo:
        print(zoo_rows(args.zoo, size, flops=not args.params_only))
        return
    if args.config:
        s = config_stats(args.config, size)
        print(f'{args.config} at {s["size"][0]}x{s["size"][1]} ({s["form"]}): '
              f'{s["params"] / 1e6:.2f} M params, {s["flops"] / 1e9:.2f} GFLOPs; backbone '
              f'{s["backbone_params"] / 1e6:.2f} M params, {s["backbone_flops"] / 1e9:.2f} GFLOPs')
        return
    try:
        model = build_preset(args.backbone)
    except ValueError as error:
        parser.error(str(error))
    size = size or (224, 224)
    stats = count(model, size)
    print(f'{args.backbone} at {size[0]}x{size[1]} (backbone, dense form, no head): '
          f'{stats["params"] / 1e6:.2f} M params, {stats["flops"] / 1e9:.2f} GFLOPs')


if __name__ == '__main__':
    main()
