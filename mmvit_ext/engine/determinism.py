"""``randomness.deterministic=True`` on CUDA: honoured, or refused before the first iteration.

mmengine turns the setting into ``torch.use_deterministic_algorithms(True)``. On CUDA that is
not enough for a detector or segmentor:

* cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG`` set before its first call, else torch stops at the
  first matmul; :func:`prepare_cuda_determinism` sets it for a run that asks for determinism;
* mmcv's RoI and deformable ops (and our :class:`~mmvit_ext.layers.MSDeformAttn` when it runs
  mmcv's kernel) accumulate their CUDA gradients with ``atomicAdd`` and do not tell torch, so a
  run would silently not be reproducible; torch refuses ``grid_sample``, bilinear resize and
  adaptive pooling backward itself, but only in the middle of the first iteration.

:class:`DeterminismCheckHook` looks for those modules before training starts and stops the run
with one message that names them and the choices. A module is one when its class is a row of
:data:`NONDETERMINISTIC_CUDA_BACKWARD` (mmcv's and mmseg's classes), or when it says so itself
in a ``nondeterministic_cuda_backward`` attribute (ours: the reason, a string). On CPU every
kernel the stack uses is deterministic, and nothing is checked.

``randomness.deterministic`` is a bool, as mmengine reads it (any other value is refused by the
tools, :func:`deterministic_setting`): a config that is deterministic on CPU only says
``False``, and its CPU runs add ``--cfg-options randomness.deterministic=True``, as
``tools/demo.sh`` does.
"""
import os
from typing import List, Mapping, Tuple

import torch
from mmengine.hooks import Hook
from torch import nn

from ..errors import ConfigError
from ..registry import HOOKS
from .module_table import match_modules

CUBLAS_SETTING = ':4096:8'
# the attribute a module of ours sets to why its CUDA backward is not reproducible
CUDA_BACKWARD_NOTE = 'nondeterministic_cuda_backward'
# mmcv's ops whose CUDA backward kernels accumulate with atomicAdd (mmcv/ops/csrc/common/cuda)
MMCV_ATOMIC_ADD_OPS = ('RoIAlign', 'RoIPool', 'RoIAlignRotated', 'RiRoIAlignRotated', 'PrRoIPool',
                       'BezierAlign', 'BorderAlign', 'DeformRoIPool', 'DeformConv2d',
                       'ModulatedDeformConv2d', 'MultiScaleDeformableAttention', 'CARAFENaive')
# (module class, why its CUDA backward is not reproducible): classes we cannot annotate
NONDETERMINISTIC_CUDA_BACKWARD: Tuple[Tuple[str, str], ...] = (
    *((f'mmcv.ops.{name}', f'mmcv {name}: atomicAdd in the CUDA backward')
      for name in MMCV_ATOMIC_ADD_OPS),
    ('mmseg.models.decode_heads.decode_head.BaseDecodeHead',
     'mmseg decode head: bilinear resize / adaptive pooling, whose CUDA backward torch refuses '
     'under use_deterministic_algorithms'),
)


def deterministic_setting(cfg: Mapping) -> bool:
    """``randomness.deterministic`` (absent: False); :class:`ConfigError` if it is not a bool,
    which mmengine would read by truth value (``'cpu'`` as True)."""
    value = (cfg.get('randomness') or {}).get('deterministic', False)
    if not isinstance(value, bool):
        raise ConfigError(
            f'randomness.deterministic must be True or False, got {value!r} (mmengine reads it '
            'by truth value); for determinism on CPU only, set False in the config and run on '
            'CPU with --cfg-options randomness.deterministic=True (as tools/demo.sh does)')
    return value


def prepare_cuda_determinism(cfg: Mapping) -> bool:
    """Check ``randomness.deterministic`` (:func:`deterministic_setting`) and set
    ``CUBLAS_WORKSPACE_CONFIG`` (unless set) for a config that asks for it on CUDA; call before
    any CUDA work. Returns whether the config asks for determinism."""
    wanted = deterministic_setting(cfg)
    if wanted and torch.cuda.is_available():
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', CUBLAS_SETTING)
    return wanted


def nondeterministic_cuda_modules(model: nn.Module) -> List[str]:
    """``'name (why)'`` for each module of ``model`` whose CUDA backward is not reproducible:
    a class of :data:`NONDETERMINISTIC_CUDA_BACKWARD`, or a module that says why in its
    :data:`CUDA_BACKWARD_NOTE` attribute."""
    listed = {name: why for name, _, why in match_modules(model, NONDETERMINISTIC_CUDA_BACKWARD)}
    found = []
    for name, module in model.named_modules():
        why = getattr(module, CUDA_BACKWARD_NOTE, None) or listed.get(name)
        if why:
            found.append(f'{name or type(module).__name__} ({why})')
    return found


def check_cuda_determinism(model: nn.Module, device_type: str, deterministic: bool) -> None:
    """Raise :class:`ConfigError` when a deterministic run on ``device_type`` cannot be one."""
    if not deterministic or device_type != 'cuda':
        return
    problems = nondeterministic_cuda_modules(model)
    if not os.environ.get('CUBLAS_WORKSPACE_CONFIG'):
        problems.append(f'CUBLAS_WORKSPACE_CONFIG is unset (cuBLAS needs '
                        f'{CUBLAS_SETTING!r} set before the process starts using it)')
    if problems:
        raise ConfigError(
            'randomness.deterministic=True cannot be honoured on CUDA by this model: '
            + '; '.join(problems) + '. Train with randomness.deterministic=False (seeded, not '
            'bitwise reproducible), or on CPU, where these kernels are deterministic.')


@HOOKS.register_module()
class DeterminismCheckHook(Hook):
    """Before the first training iteration: :func:`check_cuda_determinism` on the runner's
    model, with the state mmengine's ``randomness`` set (``use_deterministic_algorithms``)."""

    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        model = runner.model
        param = next(model.parameters(), None)
        device_type = param.device.type if param is not None else 'cpu'
        check_cuda_determinism(model, device_type, torch.are_deterministic_algorithms_enabled())


__all__ = ['CUBLAS_SETTING', 'CUDA_BACKWARD_NOTE', 'MMCV_ATOMIC_ADD_OPS',
           'NONDETERMINISTIC_CUDA_BACKWARD', 'DeterminismCheckHook', 'check_cuda_determinism',
           'deterministic_setting', 'nondeterministic_cuda_modules', 'prepare_cuda_determinism']
