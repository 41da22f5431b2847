"""mmcv's compiled multi-scale deformable attention, as a kernel of
:func:`mmvit_ext.layers.deform_attn.multi_scale_deformable_attention`.

mmcv 2.x builds it for CUDA only (no CPU kernel, its ``_ext`` refuses CPU tensors), for float32,
float64 and float16 (mmcv 2.1 ``ms_deform_attn_cuda.cu``: ``AT_DISPATCH_FLOATING_TYPES_AND_HALF``;
no bfloat16, open-mmlab/mmcv#2878). We declare float32 and float64 only: the float16
instantiation accumulates the value gradient with float16 ``atomicAdd``, and the locations would
lose their sub-pixel precision; the layer casts other dtypes at the boundary (the dtype the
portable path computes in) and runs the portable ``grid_sample`` path on every other device, in
export and under ``torch.compile``.
"""
import functools
import os
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

from .. import torch_compat
from ..flags import KERNELS_ENV as PORTABLE_ENV  # =portable: no device kernel anywhere


@dataclass(frozen=True)
class DeformAttnKernel:
    """A compiled multi-scale deformable attention.

    Attributes:
        name: shown in the layer's repr (``kernel=<name>``).
        forward: ``(value (B, S, heads, C/heads), spatial_shapes (L, 2) int64,
            level_start_index (L,) int64, sampling_locations (B, Q, heads, L, P, 2),
            attention_weights (B, Q, heads, L, P), im2col_step) -> (B, Q, C)``, all on one
            device, contiguous, in one dtype of ``dtypes``; differentiable in value, locations
            and weights.
        devices: device types it runs on.
        dtypes: dtypes it computes in; the caller casts others to ``dtypes[0]`` and back.
    """

    name: str
    forward: Callable[..., torch.Tensor]
    devices: Tuple[str, ...]
    dtypes: Tuple[torch.dtype, ...]

    def describe(self) -> str:
        """``'mmcv (cuda; pytorch elsewhere)'``: what the layer's repr shows."""
        return f'{self.name} ({", ".join(self.devices)}; pytorch elsewhere)'


def kernels_enabled() -> bool:
    """False when ``MMVIT_EXT_KERNELS=portable`` (read when a model is built)."""
    return os.environ.get(PORTABLE_ENV, '').strip().lower() != 'portable'


def why_portable_call(devices: Tuple[str, ...], tensor: torch.Tensor) -> Optional[str]:
    """Why a kernel for ``devices`` cannot run on this call, or ``None``: export (the graph
    holds the portable ops only), ``torch.compile``, or ``tensor`` on another device."""
    if torch.onnx.is_in_onnx_export() or torch_compat.is_exporting():
        return 'export'
    if torch_compat.is_compiling():
        return 'torch.compile'
    if tensor.device.type not in devices:
        return f'{tensor.device.type} tensors'
    return None


@functools.lru_cache(maxsize=None)
def _mmcv_kernel() -> Tuple[Optional[DeformAttnKernel], str]:
    try:
        from mmcv import _ext
        from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    except Exception as error:  # mmcv-lite, no mmcv, or an _ext built for another torch
        return None, f'mmcv ops not importable: {type(error).__name__}'
    if not hasattr(_ext, 'ms_deform_attn_forward'):
        return None, 'mmcv._ext has no ms_deform_attn_forward'
    compiled_cuda = getattr(_ext, 'get_compiling_cuda_version', lambda: 'not available')()
    if compiled_cuda == 'not available':  # its only kernel is a CUDA one
        return None, 'mmcv ops built without CUDA'
    return DeformAttnKernel('mmcv', MultiScaleDeformableAttnFunction.apply, ('cuda',),
                            (torch.float32, torch.float64)), ''


def find_deform_attn_kernel() -> Tuple[Optional[DeformAttnKernel], str]:
    """The kernel this process can use, or ``(None, why not)`` in a few words."""
    if not kernels_enabled():
        return None, f'{PORTABLE_ENV}=portable'
    return _mmcv_kernel()


__all__ = ['DeformAttnKernel', 'why_portable_call', 'find_deform_attn_kernel', 'kernels_enabled',
           'PORTABLE_ENV']
