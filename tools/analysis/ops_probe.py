"""Probe the compiled ops our configs need on a device, by running them (not by importing).

mmcv's ``nms``, ``batched_nms`` and ``RoIAlign`` (forward + backward, as the RoI extractors use
it; the mask-target crop as ``mask_target`` uses it) run on tensors of ``--device`` and are
compared with torchvision's kernels on CPU, an independent implementation (``ok``: equal
boxes kept, RoIAlign within 1e-4 / gradients within 1e-3, at most 2 mask pixels apart). A CPU-only mmcv
build imports fine on a GPU machine and fails here, on the first CUDA tensor. Under
``--dtype bf16 / fp16`` the RoI extractor of a Mask R-CNN runs under autocast with our float32
boundary (mmvit_ext.engine.precision). Prints one row per op and a ``PROBE`` summary line.

Example:
    python tools/analysis/ops_probe.py --device cuda --dtype bf16
"""
import argparse
import sys
from typing import Callable, List, Tuple

import torch
import torchvision

import mmvit_ext  # noqa: F401
from mmvit_ext.benchmark.measure import DTYPES


def _boxes(n: int, gen: torch.Generator, size: float = 800.) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=gen) * size * 0.8
    wh = torch.rand(n, 2, generator=gen) * size * 0.2 + 4
    return torch.cat([xy, xy + wh], 1)


def probe_nms(device: torch.device, gen: torch.Generator) -> str:
    from mmcv.ops import batched_nms, nms
    boxes, scores = _boxes(500, gen), torch.rand(500, generator=gen)
    _, keep = nms(boxes.to(device), scores.to(device), iou_threshold=0.5)
    ref = torchvision.ops.nms(boxes, scores, 0.5)
    if not torch.equal(keep.cpu(), ref):
        return f'nms keeps {keep.numel()} boxes, torchvision {ref.numel()}'
    ids = torch.randint(0, 5, (500,), generator=gen)
    _, keep = batched_nms(boxes.to(device), scores.to(device), ids.to(device),
                          dict(type='nms', iou_threshold=0.5))
    ref = torchvision.ops.batched_nms(boxes, scores, ids, 0.5)
    if not torch.equal(keep.cpu(), ref):
        return f'batched_nms keeps {keep.numel()} boxes, torchvision {ref.numel()}'
    return ''


def probe_roi_align(device: torch.device, gen: torch.Generator) -> str:
    from mmcv.ops import RoIAlign
    feats = torch.randn(2, 8, 50, 84, generator=gen)
    rois = torch.cat([torch.randint(0, 2, (64, 1), generator=gen).float(), _boxes(64, gen)], 1)
    op = RoIAlign((7, 7), spatial_scale=1 / 16, sampling_ratio=0, aligned=True)
    x = feats.to(device, copy=True).requires_grad_()
    out = op(x, rois.to(device))
    out.square().sum().backward()
    xr = feats.clone().requires_grad_()
    ref = torchvision.ops.roi_align(xr, rois, (7, 7), 1 / 16, 0, aligned=True)
    ref.square().sum().backward()
    err = (out.detach().cpu() - ref.detach()).abs().max().item()
    gerr = (x.grad.cpu() - xr.grad).abs().max().item()
    return '' if err < 1e-4 and gerr < 1e-3 else f'forward {err:.1e}, grad {gerr:.1e} off'


def probe_mask_crop(device: torch.device, gen: torch.Generator) -> str:
    """``mask_target``'s crop: BitmapMasks.crop_and_resize (mmcv roi_align on the device)."""
    import numpy as np
    from mmdet.structures.mask import BitmapMasks
    masks = (torch.rand(6, 96, 128, generator=gen) > 0.5).numpy().astype(np.uint8)
    boxes = _boxes(6, gen, size=96.)
    got = BitmapMasks(masks, 96, 128).crop_and_resize(
        boxes.to(device), (28, 28), torch.arange(6, device=device), device=device).masks
    rois = torch.cat([torch.arange(6.)[:, None], boxes], 1)
    ref = torchvision.ops.roi_align(torch.from_numpy(masks).float()[:, None], rois, (28, 28),
                                    1.0, 0, aligned=True)
    ref = (ref[:, 0] >= 0.5).numpy()
    differ = int((got != ref).sum())
    return '' if differ <= 2 else f'{differ} of {ref.size} mask pixels differ'


def probe_autocast_roi_head(device: torch.device, gen: torch.Generator, dtype: str) -> str:
    """A Mask R-CNN RoI head's extractor under autocast, float32 boundary drawn."""
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
    from mmvit_ext.engine import keep_ops_float32
    extractor = SingleRoIExtractor(dict(type='RoIAlign', output_size=7, sampling_ratio=0),
                                   out_channels=8, featmap_strides=[4, 8]).to(device)
    keep_ops_float32(extractor)
    feats = [torch.randn(1, 8, 200 // s, 336 // s, generator=gen).to(device) for s in (4, 8)]
    rois = torch.cat([torch.zeros(32, 1), _boxes(32, gen)], 1).to(device)
    with torch.no_grad():
        ref = extractor(feats, rois)
    with torch.autocast(device.type, dtype=DTYPES[dtype], enabled=dtype != 'fp32'):
        half = [f.to(DTYPES[dtype]) for f in feats]
        out = extractor(half, rois)
    if out.dtype != half[0].dtype:
        return f'output dtype {out.dtype}, caller gave {half[0].dtype}'
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    return '' if err < 2e-2 else f'relative error {err:.1e} against float32'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', choices=sorted(DTYPES), default='bf16',
                        help='autocast dtype of the RoI-extractor probe')
    args = parser.parse_args()
    device = torch.device(args.device)
    import mmcv.ops
    compiled = mmcv.ops.get_compiling_cuda_version()
    print(f'mmcv {mmcv.__version__}, compiled CUDA {compiled}, torch {torch.__version__} '
          f'(CUDA {torch.version.cuda}), torchvision {torchvision.__version__}')
    probes: List[Tuple[str, Callable[[], str]]] = [
        ('nms / batched_nms', lambda: probe_nms(device, gen)),
        ('RoIAlign fwd+bwd', lambda: probe_roi_align(device, gen)),
        ('mask target crop', lambda: probe_mask_crop(device, gen)),
        (f'RoI extractor {args.dtype} autocast', lambda: probe_autocast_roi_head(device, gen,
                                                                               args.dtype)),
    ]
    print('| op | device | result |\n|---|---|---|')
    failed = []
    for name, run in probes:
        gen = torch.Generator().manual_seed(0)
        try:
            problem = run()
        except Exception as err:  # a missing kernel: report it, probe the rest
            problem = f'{type(err).__name__}: {str(err).splitlines()[0][:200]}'
        print(f'| {name} | {device.type} | {problem or "ok"} |', flush=True)
        if problem:
            failed.append(name)
    print(f'PROBE {device.type}: ' + (f'FAILED {failed}' if failed else
                                      f'{len(probes)} ops ok, mmcv compiled CUDA {compiled}'))
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
