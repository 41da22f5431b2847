"""Check ``mmvit_ext.layers.multi_scale_deformable_attention`` against mmcv's pure-PyTorch
reference (``mmcv.ops.multi_scale_deform_attn.multi_scale_deformable_attn_pytorch``): the fp32
difference, the error of bf16 / fp16 autocast runs against an fp32 run, and the time and peak
the tensors kept for backward of both implementations, measured in the same run (the ratio is what to read).

    .venv/bin/python tools/analysis/deform_attn_check.py [--repeats 20] [--threads 1]

The shapes are ViT-Adapter-S's injector at 512x512: queries the 32x32 ViT tokens, values the
64x64 / 32x32 / 16x16 prior maps, 6 heads of 64 channels, 4 points.
"""
import argparse
import time
from functools import partial
from typing import Callable, Dict, Tuple

import torch

from mmvit_ext.layers.deform_attn import MSDeformAttn, multi_scale_deformable_attention

SHAPES = ((64, 64), (32, 32), (16, 16))


def IMPLS(reference: Callable) -> Tuple[Tuple[str, Callable], ...]:
    """Ours (samples kept for backward, and recomputed there), and mmcv's reference."""
    return (('ours', multi_scale_deformable_attention),
            ('ours_recompute', partial(multi_scale_deformable_attention, recompute=True)),
            ('mmcv', reference))


def make_inputs(batch: int, queries: int, heads: int = 6, head_dim: int = 64, points: int = 4,
                seed: int = 0) -> Tuple[torch.Tensor, ...]:
    """Values, (L, 2) shapes, locations (some outside the map: zero padding) and weights."""
    gen = torch.Generator().manual_seed(seed)
    levels = len(SHAPES)
    size = sum(h * w for h, w in SHAPES)
    value = torch.randn(batch, size, heads, head_dim, generator=gen)
    locations = torch.rand(batch, queries, heads, levels, points, 2, generator=gen) * 1.1 - 0.05
    weights = torch.rand(batch, queries, heads, levels, points, generator=gen)
    weights = (weights / weights.sum((-1, -2), keepdim=True))
    return value, torch.tensor(SHAPES), locations, weights


def fp32_difference() -> float:
    from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch
    value, shapes, locations, weights = make_inputs(2, 1024)
    ours = multi_scale_deformable_attention(value, shapes, locations, weights)
    theirs = multi_scale_deformable_attn_pytorch(value, shapes, locations, weights)
    return (ours - theirs).abs().max().item()


def autocast_errors() -> Dict[str, Tuple[float, float]]:
    """Max abs / max relative-to-scale error of the module under CPU autocast vs fp32."""
    torch.manual_seed(0)
    dim = 384
    module = MSDeformAttn(dim, len(SHAPES), 6, 4).eval()
    with torch.no_grad():  # non-trivial offsets and weights (the init makes them constant)
        module.sampling_offsets.weight.normal_(0, 0.02)
        module.attention_weights.weight.normal_(0, 0.02)
    query = torch.randn(2, 1024, dim)
    feat = torch.randn(2, sum(h * w for h, w in SHAPES), dim)
    ref = torch.rand(1, 1024, 1, 2)
    with torch.no_grad():
        reference = module(query, ref, feat, SHAPES)
        errors = {}
        for dtype in (torch.bfloat16, torch.float16):
            with torch.autocast('cpu', dtype=dtype):
                out = module(query, ref, feat, SHAPES).float()
            diff = (out - reference).abs().max().item()
            errors[str(dtype).split('.')[1]] = (diff, diff / reference.abs().max().item())
    return errors


def speed(repeats: int) -> Dict[str, float]:
    """Fastest of ``repeats`` forward + backward calls per implementation, the implementations
    taking turns (so a busy machine slows them alike)."""
    from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch
    value, shapes, locations, weights = make_inputs(2, 1024)
    for tensor in (value, locations, weights):
        tensor.requires_grad_(True)
    impls = IMPLS(multi_scale_deformable_attn_pytorch)
    times: Dict[str, list] = {name: [] for name, _ in impls}
    for _ in range(repeats + 1):
        for name, impl in impls:
            start = time.perf_counter()
            impl(value, shapes, locations, weights).square().mean().backward()
            times[name].append(time.perf_counter() - start)
    return {name: min(values[1:]) for name, values in times.items()}


def peak_activation_bytes() -> Dict[str, int]:
    """Bytes the autograd graph keeps for backward (saved tensors), per implementation."""
    from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch
    value, shapes, locations, weights = make_inputs(2, 1024)
    for tensor in (value, locations, weights):
        tensor.requires_grad_(True)
    sizes = {}
    for name, impl in IMPLS(multi_scale_deformable_attn_pytorch):
        saved = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            impl(value, shapes, locations, weights)
        inputs = {t.untyped_storage().data_ptr() for t in (value, locations, weights)}
        sizes[name] = sum(n for ptr, n in saved.items() if ptr not in inputs)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--repeats', type=int, default=20)
    parser.add_argument('--threads', type=int, default=0, help='torch threads (0: default)')
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f'fp32 max |ours - mmcv reference|: {fp32_difference():.3e}')
    print('autocast vs fp32 (module, 2 x 1024 queries, 384 channels): max abs / relative')
    for dtype, (diff, rel) in autocast_errors().items():
        print(f'  {dtype:9s} {diff:.3e} / {rel:.3e}')
    saved = peak_activation_bytes()
    print('saved for backward (MiB): ' + ', '.join(
        f'{name} {value / 2**20:.1f}' for name, value in saved.items()))
    timings = speed(args.repeats)
    theirs = timings['mmcv']
    print(f'forward + backward, fastest of {args.repeats} ({torch.get_num_threads()} threads): '
          + ', '.join(f'{name} {t * 1e3:.1f} ms' for name, t in timings.items()))
    for name in ('ours', 'ours_recompute'):
        print(f'  ratio {name} / mmcv: time {timings[name] / theirs:.2f}, saved for backward '
              f'{saved[name] / saved["mmcv"]:.2f}')


if __name__ == '__main__':
    main()
