"""Which kernel each attention call site runs on the CPU, measured: every site's attention module
of a tiny model, in inference and in training (forward + backward), in float32 and under
bfloat16 / float16 autocast, with the profiler's op names (which SDPA backend ran; for the
deformable attentions ``grid_sampler_2d`` or mmcv's ``MultiScaleDeformableAttnFunction``) and a
dispatch mode's operand dtypes (of the fused kernel, of each ``bmm`` of an explicit or math
product, of each ``grid_sampler_2d``; mmcv's CUDA kernel from its kernel names' template type)
as evidence. ``python tests/attention_kernels.py`` prints the table docs/speed.md holds;
``--device cuda`` prints the same table on a GPU (flash, mem-efficient, cudnn or mmcv seen; the
GPU check's ``kernels`` step), a call that raises as ``error (...)``."""
import argparse
import contextlib
import functools
import re
import sys
import warnings
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Set, Tuple

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / 'tests')]
from backbone_cases import CASES, TINY_DINOV3  # noqa: E402

from mmvit_ext.backbones import (CaiT, DeepViT, PyramidVisionTransformerV2,  # noqa: E402
                                 RefinedViT, SwinTransformer, VisionTransformer)
from mmvit_ext.backbones.cait import ClassAttention  # noqa: E402
from mmvit_ext.backbones.dinov3_adapter import DINOv3Adapter  # noqa: E402
from mmvit_ext.backbones.vit_adapter import ViTAdapter  # noqa: E402
from mmvit_ext.layers import AttentionBase, MSDeformAttn  # noqa: E402

FLASH = 'aten::_scaled_dot_product_flash_attention_for_cpu'
MATH = 'aten::_scaled_dot_product_attention_math'
# profiler op name -> the SDPA backend it is (CPU; CUDA)
FUSED_OPS = {FLASH: 'flash', 'aten::_scaled_dot_product_flash_attention': 'flash',
             'aten::_scaled_dot_product_efficient_attention': 'mem-efficient',
             'aten::_scaled_dot_product_cudnn_attention': 'cudnn'}
# profiler op name -> the deformable attention's implementation (mmcv's is an autograd Function)
DEFORM_OPS = {'aten::grid_sampler_2d': 'grid_sample', 'MultiScaleDeformableAttnFunction': 'mmcv'}
# the aten ops of an attention product: the fused kernels (forward, backward), matmuls, sampling
PRODUCT_OPS = tuple(name[len('aten::'):] + tail for name in (*FUSED_OPS, 'aten::grid_sampler_2d')
                    for tail in ('', '_backward')) + ('bmm',)
# mmcv's CUDA kernels (no aten op): ms_deformable_im2col_gpu_kernel<float>(...) -> float
MMCV_KERNEL = re.compile(r'ms_deformable_(?:im2col|col2im)\w*<([\w:]+)')
MMCV_TYPES = {'float': torch.float32, 'double': torch.float64, 'c10::Half': torch.float16,
              '__half': torch.float16}
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

M2F_CONFIG = ROOT / 'configs/mmseg/mask2former_dinov3_vitb16_adapter_512x512_160k_ade20k.py'


def _dinov3_m2f() -> nn.Module:
    """The tiny DINOv3 adapter and, on its maps, the shipped M2F head's pixel decoder (mmdet's
    ``MSDeformAttnPixelDecoder``, its attention mmcv's ``MultiScaleDeformableAttention``)."""
    from mmengine.config import Config, ConfigDict
    from mmengine.registry import DefaultScope
    from mmseg.registry import MODELS
    head = Config.fromfile(str(M2F_CONFIG)).model.decode_head
    with DefaultScope.overwrite_default_scope('mmseg'):
        head = MODELS.build(ConfigDict(head, in_channels=[32] * 4, hidden_dims=32, num_classes=2,
                                       loss_cls=ConfigDict(head.loss_cls, class_weight=[1.0] * 3)))
    return nn.Sequential(DINOv3Adapter(**CASES['DINOv3Adapter'][0]), head.pixel_decoder)


def _mmcv_attention(model: nn.Module) -> nn.Module:
    from mmcv.ops import MultiScaleDeformableAttention
    return _nth(MultiScaleDeformableAttention)(model)


# the deformable attentions: call site -> (tiny model, its attention module of that site)
DEFORM_SITES: Dict[str, Tuple[Callable[[], nn.Module], Callable[[nn.Module], nn.Module]]] = {
    'ViT-Adapter injector (deformable)': (lambda: ViTAdapter(**CASES['ViTAdapter'][-1]),
                                          _nth(MSDeformAttn, 0)),
    'ViT-Adapter extractor (deformable)': (lambda: ViTAdapter(**CASES['ViTAdapter'][-1]),
                                           _nth(MSDeformAttn, 1)),
    'DINOv3 adapter extractor (deformable)': (
        lambda: DINOv3Adapter(**CASES['DINOv3Adapter'][0]), _nth(MSDeformAttn, 0)),
    'DINOv3 M2F pixel decoder (mmcv)': (_dinov3_m2f, _mmcv_attention),
}


class Run(NamedTuple):
    """What one call ran: the SDPA backend seen (``flash``, ``math``, or ``explicit`` where
    no SDPA ran; ``grid_sample`` or ``mmcv`` for a deformable attention; ``error (...)`` where
    the call raised) and the dtypes of the attention products' operands."""
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
    build, pick = {**SITES, **DEFORM_SITES}[name]
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
    kwargs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in kwargs.items()}
    recorder = ProductDtypes()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == 'cuda' else [])
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with profile(activities=activities) as prof, recorder:
            try:
                with torch.set_grad_enabled(training), _autocast(DTYPES[dtype], device):
                    out = module(*args, **kwargs)
                    out = out[0] if isinstance(out, tuple) else out
                if training:
                    out.float().sum().backward()
            except (RuntimeError, NotImplementedError) as error:  # e.g. no kernel for a dtype
                raised = type(error).__name__
            else:
                raised = None
    module.zero_grad(set_to_none=True)
    module.cpu()
    if raised:
        return Run(f'error ({raised})', ())
    events = prof.events()  # CPU ops; on CUDA also each op's kernels
    names = {event.name for event in events} | {kernel.name for event in events
                                                 for kernel in getattr(event, 'kernels', ())}
    seen = sorted({ops[n] for ops in (FUSED_OPS, DEFORM_OPS) for n in names if n in ops})
    kernel = '+'.join(seen) if seen else 'math' if MATH in names else 'explicit'
    dtypes = recorder.dtypes | {MMCV_TYPES.get(match.group(1), match.group(1)) for name in names
                                for match in [MMCV_KERNEL.search(name)] if match}
    return Run(kernel, tuple(sorted(short_dtype(d) for d in dtypes)))


def short_dtype(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``'bf16'`` (fp16, fp32 alike; others as torch names them)."""
    return {torch.bfloat16: 'bf16', torch.float16: 'fp16', torch.float32: 'fp32'}.get(
        dtype, str(dtype).replace('torch.', ''))


def table_rows(device: str = 'cpu') -> List[List[str]]:
    """[site, then one cell per dtype x mode]."""
    return [[name] + [measure(name, mode, dtype, device).cell() for dtype in DTYPES
                      for mode in MODES] for name in (*SITES, *DEFORM_SITES)]


def markdown_table(device: str = 'cpu') -> str:
    header = [f'{device.upper()}, torch ' + torch.__version__.split('+')[0]] + [
        f'{dtype} {mode}' for dtype in DTYPES for mode in MODES]
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(row) + ' |' for row in table_rows(device)]
    return '\n'.join(lines)


def summary_line(device: str = 'cpu') -> str:
    """The table in one line (the GPU check's summary): the kernels seen, and the sites that
    run the math fallback, compute in float32 under bf16 / fp16 autocast, or raise."""
    runs = {(name, dtype, mode): measure(name, mode, dtype, device)
            for name in (*SITES, *DEFORM_SITES) for dtype in DTYPES for mode in MODES}

    def where(test: Callable[[str, Run], bool]) -> str:
        return ', '.join(sorted({name for (name, dtype, _), run in runs.items()
                                 if test(dtype, run)})) or 'none'

    kernels = ', '.join(sorted({run.kernel for run in runs.values()}))
    math = where(lambda dtype, run: run.kernel == 'math')
    wide = where(lambda dtype, run: dtype != 'fp32' and 'fp32' in run.product_dtypes)
    raised = where(lambda dtype, run: run.kernel.startswith('error'))
    return (f'SUMMARY attention kernels {device}: {len(runs)} runs, seen {kernels}; math '
            f'fallback: {math}; float32 under autocast: {wide}; raised: {raised}')


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default='cpu', help='cpu (the docs/speed.md table) or cuda')
    device = parser.parse_args().device
    print(markdown_table(device), '', summary_line(device), sep='\n')
