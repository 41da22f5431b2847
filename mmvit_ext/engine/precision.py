"""Whole-model mixed precision for detectors: mmcv's RoI and NMS ops see float32.

mmengine's ``AmpOptimWrapper`` autocasts the whole ``train_step`` and FSDP's ``param_dtype``
makes every head compute in bfloat16. mmdet's heads then hand half-precision features, boxes and
scores to mmcv's ``RoIAlign`` and ``nms``, which have no bfloat16 kernels (CPU: float32 only);
bfloat16 also rounds a box coordinate between 512 and 1024 px to a multiple of 4 px.
torchvision registers autocast kernels for its own ops; mmcv's are plain extension calls that
autocast never sees. The boundary is therefore drawn at the modules around them, once, from a
table (:data:`FP32_BOUNDARIES`):

* ``inputs``: the module runs on float32 inputs and returns its output in the dtype its caller
  gave it (RoI extractors: RoIs are cast with ``rois.type_as(feats[0])`` inside, so they stay
  float32 too);
* ``outputs``: the module computes in whatever dtype autocast / its parameters choose and its
  outputs leave as float32 (dense heads, box and mask heads: their outputs feed box decoding,
  NMS and the losses).

:class:`Fp32OpsHook` applies it when a run starts; ``tools/train.py`` and ``tools/test.py`` add
the hook to every run, a config for mmdet's own tools adds
``custom_hooks=[dict(type='mmvit_ext.Fp32OpsHook')]``. Float32 runs are unchanged (every cast is
a no-op) and no parameter, buffer or state-dict key changes.
"""
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Tuple

import torch
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapper
from torch import nn

from ..errors import ConfigError
from ..registry import HOOKS, OPTIM_WRAPPERS
from .module_table import match_modules

HALF_DTYPES = (torch.float16, torch.bfloat16)

# (module class, where float32 starts): see the module docstring
FP32_BOUNDARIES: Tuple[Tuple[str, str], ...] = (
    ('mmdet.models.roi_heads.roi_extractors.base_roi_extractor.BaseRoIExtractor', 'inputs'),
    ('mmdet.models.dense_heads.base_dense_head.BaseDenseHead', 'outputs'),
    ('mmdet.models.roi_heads.bbox_heads.bbox_head.BBoxHead', 'outputs'),
    ('mmdet.models.roi_heads.mask_heads.fcn_mask_head.FCNMaskHead', 'outputs'),
)
_MARK = '_mmvit_ext_fp32_boundary'


def _cast(value: Any, dtype: torch.dtype, only: Tuple[torch.dtype, ...] = ()) -> Any:
    """``value`` (tensors in tuples, lists, dicts) with its floating tensors (those of ``only``'s
    dtypes, if given) cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        wanted = value.dtype in only if only else value.is_floating_point()
        return value.to(dtype) if wanted else value
    if isinstance(value, (list, tuple)) and not hasattr(value, '_fields'):
        return type(value)(_cast(v, dtype, only) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype, only) for k, v in value.items()}
    return value


def to_float32(value: Any) -> Any:
    """``value`` with every float16 / bfloat16 tensor in it (tuples, lists, dicts) as float32."""
    return _cast(value, torch.float32, HALF_DTYPES)


def _half_dtype(value: Any):
    """The first float16 / bfloat16 dtype among the tensors in ``value``, else ``None``."""
    if isinstance(value, torch.Tensor):
        return value.dtype if value.dtype in HALF_DTYPES else None
    if isinstance(value, (list, tuple)):
        return next((d for d in map(_half_dtype, value) if d is not None), None)
    if isinstance(value, dict):
        return _half_dtype(list(value.values()))
    return None


class _Float32Inputs:
    """Forward pre-hook + hook pair: float32 in, the caller's dtype out. The caller's dtype is
    kept per thread (a stack, for nested calls), so threads sharing a model do not mix it up;
    the hook runs when the forward raises too (``always_call``), so the entry is always popped."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _stack(self) -> list:
        if not hasattr(self._local, 'stack'):
            self._local.stack = []
        return self._local.stack

    def before(self, module: nn.Module, args: tuple, kwargs: dict):
        self._stack().append(_half_dtype((args, kwargs)))
        return to_float32(args), to_float32(kwargs)

    def after(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        stack = self._stack()
        dtype = stack.pop() if stack else None  # empty: a pre-hook before ours raised
        return output if dtype is None else _cast(output, dtype)


def _float32_outputs(module: nn.Module, args: tuple, output: Any) -> Any:
    return to_float32(output)


def keep_ops_float32(model: nn.Module) -> List[str]:
    """Draw the float32 boundaries of :data:`FP32_BOUNDARIES` in ``model`` (idempotent); returns
    ``'name (ClassName: inputs|outputs)'`` for each module it applies to."""
    applied = []
    for name, module, side in match_modules(model, FP32_BOUNDARIES):
        applied.append(f'{name} ({type(module).__name__}: {side})')
        if getattr(module, _MARK, None):
            continue
        if side == 'inputs':
            boundary = _Float32Inputs()
            module.register_forward_pre_hook(boundary.before, with_kwargs=True)
            module.register_forward_hook(boundary.after, with_kwargs=True, always_call=True)
        else:
            module.register_forward_hook(_float32_outputs)
        setattr(module, _MARK, side)
    return applied


@HOOKS.register_module()
class Fp32OpsHook(Hook):
    """Apply :func:`keep_ops_float32` to the runner's model before it runs (train, val or test),
    and log where. Needed for whole-model bfloat16 (``AmpOptimWrapper(dtype='bfloat16')``, FSDP
    ``param_dtype='bfloat16'``); harmless in float32 and float16."""

    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        model = runner.model
        model = getattr(model, 'module', model)  # DDP / FSDP wrappers
        applied = keep_ops_float32(model)
        if applied:
            runner.logger.info(f'Fp32OpsHook: float32 around mmcv ops at {len(applied)} '
                               f'modules: {", ".join(applied)}')


@OPTIM_WRAPPERS.register_module()
class CpuAmpOptimWrapper(OptimWrapper):
    """``AmpOptimWrapper`` for a machine without an accelerator (mmengine's asserts one): the
    step runs under CPU bfloat16 autocast, with no loss scaling (bfloat16 has float32's range).
    ``dtype=None`` means bfloat16, as torch's CPU autocast; float16 is refused (its loss scaler
    is an accelerator's), and so is float32, which CPU autocast ignores (a float32 run is
    ``OptimWrapper``). ``loss_scale`` is accepted so that an AMP config runs unchanged, and
    unused."""

    def __init__(self, dtype: Any = None, loss_scale: Any = 'dynamic', use_fsdp: bool = False,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        dtype = getattr(torch, dtype, dtype) if isinstance(dtype, str) else dtype
        if dtype == torch.float32:
            raise ConfigError("AMP on CPU runs bfloat16; optim_wrapper.dtype='float32' would "
                              "autocast nothing (CPU autocast ignores it): set dtype='bfloat16', "
                              "or type='OptimWrapper' for a float32 run")
        if dtype not in (None, torch.bfloat16):
            raise ConfigError(f'AMP on CPU runs bfloat16 (no loss scaler for {dtype} without '
                              f"an accelerator): set optim_wrapper.dtype='bfloat16'")
        self.cast_dtype = dtype or torch.bfloat16

    @contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield


def amp_on_cpu(optim_wrapper: dict) -> bool:
    """Turn an ``AmpOptimWrapper`` config into :class:`CpuAmpOptimWrapper` when no CUDA device
    is visible (in place); returns whether it did."""
    if optim_wrapper.get('type') != 'AmpOptimWrapper' or torch.cuda.is_available():
        return False
    optim_wrapper['type'] = 'mmvit_ext.CpuAmpOptimWrapper'
    return True


def boundaries_of(model: nn.Module) -> Dict[str, str]:
    """``{module name: side}`` of the boundaries drawn in ``model`` (for tests and reports)."""
    return {name: getattr(module, _MARK) for name, module in model.named_modules()
            if getattr(module, _MARK, None)}


__all__ = ['FP32_BOUNDARIES', 'Fp32OpsHook', 'CpuAmpOptimWrapper', 'amp_on_cpu', 'keep_ops_float32', 'boundaries_of', 'to_float32']
