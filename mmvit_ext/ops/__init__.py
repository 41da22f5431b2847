"""Device kernels beside the portable definitions of :mod:`mmvit_ext.layers` (today one:
mmcv's CUDA multi-scale deformable attention; attention calls SDPA where one of PyTorch's fused
kernels takes the call, :mod:`mmvit_ext.layers.sdpa_kernels`).

A kernel computes what a layer's pure-PyTorch function computes, faster on some devices; the
layer picks it when built (visible in ``print(model)``) and calls the portable function wherever
the kernel does not run. Compiled libraries are imported lazily, inside the finders, so
importing this package imports no mm* package. ``MMVIT_EXT_KERNELS=portable`` builds every
layer without its kernel (:mod:`mmvit_ext.flags`).
"""
from .ms_deform_attn import (DeformAttnKernel, why_portable_call, find_deform_attn_kernel,
                             kernels_enabled)

__all__ = ['DeformAttnKernel', 'why_portable_call', 'find_deform_attn_kernel', 'kernels_enabled']
