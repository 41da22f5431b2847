"""Which kernel each attention call site runs on the CPU, measured: every site's attention module
of a tiny model, in inference and in training (forward + backward), in float32 and under
bfloat16 / float16 autocast, with the profiler's op names (which SDPA backend ran) and a dispatch
mode's operand dtypes (of the fused kernel, or of each ``bmm`` of an explicit or math product)
as evidence. ``python tests/attention_kernels.py`` prints the table docs/speed.md holds;
``--device cuda`` prints the same table on a GPU (flash, mem-efficient or cudnn seen)."""
import argparse
import contextlib
import functools
import sys
import warnings
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Set, Tuple

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backbone_cases import TINY_DINOV3  # noqa: E402

from mmvit_ext.backbones import (CaiT, DeepViT, PyramidVisionTransformerV2,  # noqa: E402
                                 RefinedViT, SwinTransformer, VisionTransformer)
from mmvit_ext.backbones.cait import ClassAttention  # noqa: E402
from mmvit_ext.layers import AttentionBase  # noqa: E402

FLASH = 'aten::_scaled_dot_product_flash_attention_for_cpu'
MATH = 'aten::_scaled_dot_product_attention_math'
# profiler op name -> the SDPA backend it is (CPU; CUDA)
FUSED_OPS = {FLASH: 'flash', 'aten::_scaled_dot_product_flash_attention': 'flash',
             'aten::_scaled_dot_product_efficient_attention': 'mem-efficient',
             'aten::_scaled_dot_product_cudnn_attention': 'cudnn'}
# the aten ops of an attention product: the fused kernels (forward, backward), matmuls
PRODUCT_OPS = tuple(name[len('aten::'):] + tail for name in FUSED_OPS
                    for tail in ('', '_backward')) + ('bmm',)
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}
MODES = ('inference', 'training')
SIZE = 64


def _nth(kind: type, index: int = 0, where: Callable[[nn.Module], bool] = lambda m: True
         ) -> Callable[[nn.Module], nn.Module]:
    def pick(model: nn.Module) -> nn.Module:
        return [m for m in model.modules() if isinstance(m, kind) and where(m)][index]
    return pick


_TINY_SWIN = dict(arch=dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(2, 2, 4, 4)),
                  window_size=4, drop_path_rate=0.0)
_TINY_PVT = dict(embed_dims=(16, 16, 32, 32), depths=(1, 1, 1, 1), num_heads=(2, 2, 4, 4))
_TINY_VIT = dict(embed_dims=32, depth=2, num_heads=4)
_PLAIN = dict(simple_pyramid=False, window_size=2, global_blocks=(1,))
_REFINED = dict(_PLAIN, global_blocks=())  # a pair of blocks shares its windows

# call site -> (tiny model, its attention module of that site)
SITES: Dict[str, Tuple[Callable[[], nn.Module], Callable[[nn.Module], nn.Module]]] = {
    'Swin W-MSA (position bias)': (lambda: SwinTransformer(**_TINY_SWIN), _nth(AttentionBase, 0)),
    'Swin SW-MSA (bias + shift mask)': (lambda: SwinTransformer(**_TINY_SWIN),
                                        _nth(AttentionBase, 1)),
    'PVTv2 SRA': (lambda: PyramidVisionTransformerV2(_TINY_PVT), _nth(AttentionBase, 0)),
    'PVTv2 linear SRA': (lambda: PyramidVisionTransformerV2(dict(_TINY_PVT, linear=True)),
                         _nth(AttentionBase, 0)),
    'plain ViT (global)': (lambda: VisionTransformer(_TINY_VIT, img_size=SIZE),
                           _nth(AttentionBase, 0)),
    'ViTDet window + rel-pos': (lambda: VisionTransformer(_TINY_VIT, use_rel_pos=True,
                                                          img_size=SIZE, **_PLAIN),
                                _nth(AttentionBase, 0)),
    'ViTDet global + rel-pos': (lambda: VisionTransformer(_TINY_VIT, use_rel_pos=True,
                                                          img_size=SIZE, **_PLAIN),
                                _nth(AttentionBase, 1)),
    'DINOv3 RoPE': (lambda: VisionTransformer(**TINY_DINOV3), _nth(AttentionBase, 0)),
    'CaiT talking heads': (lambda: CaiT(dict(_TINY_VIT, layer_scale=0.1), **_PLAIN),
                           _nth(AttentionBase, 0)),
    'CaiT class attention': (lambda: CaiT(dict(_TINY_VIT, layer_scale=0.1), out_type='cls_token',
                                          window_size=None, img_size=SIZE),
                             _nth(ClassAttention)),
    'DeepViT re-attention': (lambda: DeepViT(dict(_TINY_VIT, reattention_blocks=2), **_PLAIN),
                             _nth(AttentionBase, 0)),
    'Refined-ViT map (computing block)': (
        lambda: RefinedViT(dict(_TINY_VIT, depth=2, conv_stem=(8, 8, 16)), **_REFINED),
        _nth(AttentionBase, 0)),
    'Refined-ViT map (refiner block)': (
        lambda: RefinedViT(dict(_TINY_VIT, depth=2, conv_stem=(8, 8, 16)), **_REFINED),
        _nth(AttentionBase, 1)),
}


class Run(NamedTuple):
    """What one call ran: the SDPA backend seen (``flash``, ``math``, or ``explicit`` where
    no SDPA ran) and the dtypes of the attention products' operands."""
    kernel: str
    product_dtypes: Tuple[str, ...]

    def cell(self) -> str:
        return f"{self.kernel} ({', '.join(self.product_dtypes)})"


class ProductDtypes(TorchDispatchMode):
    """Records the dtype of the first operand of every attention-product op."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: Set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split('.')[0] in PRODUCT_OPS:
            self.dtypes.add(args[0].dtype)
        return func(*args, **(kwargs or {}))


def _autocast(dtype: torch.dtype, device: str):
    return (torch.autocast(device, dtype) if dtype != torch.float32
            else contextlib.nullcontext())


@functools.lru_cache(maxsize=None)
def _site(name: str) -> Tuple[nn.Module, tuple, dict]:
    """The site's attention module and the arguments the model's forward gave it."""
    torch.manual_seed(0)
    build, pick = SITES[name]
    model = build().eval()
    module, seen = pick(model), []
    handle = module.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append((args, kwargs)) if not seen else None,
        with_kwargs=True)
    with torch.no_grad():
        model(torch.randn(2, 3, SIZE, SIZE))
    handle.remove()
    args, kwargs = seen[0]
    return module, tuple(a.detach() if torch.is_tensor(a) else a for a in args), kwargs


def measure(name: str, mode: str, dtype: str, device: str = 'cpu') -> Run:
    """Run one site's attention once (training: forward + backward) and name what ran; one
    run per site, mode, dtype and device in a process."""
    return _measure(name, mode, dtype, device)


@functools.lru_cache(maxsize=None)
def _measure(name: str, mode: str, dtype: str, device: str) -> Run:
    module, args, kwargs = _site(name)
    training = mode == 'training'
    module.to(device).train(training)
    args = tuple(a.to(device).requires_grad_(training)
                 if torch.is_tensor(a) and a.is_floating_point() else
                 a.to(device) if torch.is_tensor(a) else a for a in args)
    recorder = ProductDtypes()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with profile(activities=[ProfilerActivity.CPU]) as prof, recorder:
            with torch.set_grad_enabled(training), _autocast(DTYPES[dtype], device):
                out = module(*args, **kwargs)
                out = out[0] if isinstance(out, tuple) else out
            if training:
                out.float().sum().backward()
    module.zero_grad(set_to_none=True)
    module.cpu()
    names = {event.name for event in prof.events()}
    fused = sorted({FUSED_OPS[n] for n in names if n in FUSED_OPS})
    kernel = '+'.join(fused) if fused else 'math' if MATH in names else 'explicit'
    short = sorted(str(d).replace('torch.', '').replace('bfloat16', 'bf16')
                   .replace('float16', 'fp16').replace('float32', 'fp32')
                   for d in recorder.dtypes)
    return Run(kernel, tuple(short))


def table_rows(device: str = 'cpu') -> List[List[str]]:
    """[site, then one cell per dtype x mode]."""
    return [[name] + [measure(name, mode, dtype, device).cell() for dtype in DTYPES
                      for mode in MODES] for name in SITES]


def markdown_table(device: str = 'cpu') -> str:
    header = [f'{device.upper()}, torch ' + torch.__version__.split('+')[0]] + [
        f'{dtype} {mode}' for dtype in DTYPES for mode in MODES]
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(row) + ' |' for row in table_rows(device)]
    return '\n'.join(lines)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default='cpu', help='cpu (the docs/speed.md table) or cuda')
    print(markdown_table(parser.parse_args().device))
