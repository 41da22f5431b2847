"""``randomness.deterministic=True`` on CUDA: honoured, or refused before the first iteration.

mmengine turns the setting into ``torch.use_deterministic_algorithms(True)``. On CUDA that is
not enough for a detector or segmentor:

* cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG`` set before its first call, else torch stops at the
  first matmul; :func:`prepare_cuda_determinism` sets it for a run that asks for determinism;
* mmcv's RoI and deformable ops accumulate their CUDA gradients with ``atomicAdd`` and do not
  tell torch, so a run would silently not be reproducible; torch refuses bilinear / adaptive
  pooling backward itself, but only in the middle of the first iteration.

:class:`DeterminismCheckHook` looks for the modules of :data:`NONDETERMINISTIC_CUDA_BACKWARD`
before training starts and stops the run with one message that names them and the choices. On
CPU every kernel the stack uses is deterministic, and nothing is checked.

The shipped configs ask ``randomness.deterministic='cpu'`` (:data:`ON_CPU`): bitwise reproducible
on CPU, seeded only on CUDA, where those kernels make it impossible; the training and test tools
resolve it before the runner is built and say so in one line on CUDA. An explicit ``True`` keeps
its meaning, and on CUDA is refused as above.
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
ON_CPU = 'cpu'  # randomness.deterministic: deterministic where the device allows it (CPU)
# (module class, why its CUDA backward is not reproducible)
NONDETERMINISTIC_CUDA_BACKWARD: Tuple[Tuple[str, str], ...] = (
    ('mmcv.ops.RoIAlign', 'mmcv RoIAlign: atomicAdd in the CUDA backward'),
    ('mmcv.ops.RoIPool', 'mmcv RoIPool: atomicAdd in the CUDA backward'),
    ('mmcv.ops.DeformConv2d', 'mmcv DeformConv2d: atomicAdd in the CUDA backward'),
    ('mmcv.ops.ModulatedDeformConv2d', 'mmcv ModulatedDeformConv2d: atomicAdd in the CUDA '
                                       'backward'),
    ('mmcv.ops.MultiScaleDeformableAttention', 'mmcv MultiScaleDeformableAttention: atomicAdd '
                                               'in the CUDA backward'),
    ('mmseg.models.decode_heads.decode_head.BaseDecodeHead',
     'mmseg decode head: bilinear resize / adaptive pooling, whose CUDA backward torch refuses '
     'under use_deterministic_algorithms'),
)


def resolve_deterministic(cfg: Mapping, cuda: bool) -> bool:
    """``randomness.deterministic`` with :data:`ON_CPU` resolved for a run on CUDA or not: the
    config is updated in place (mmengine then sees a bool) and a CUDA run is told in one line."""
    randomness = cfg.get('randomness') or {}
    wanted = randomness.get('deterministic', False)
    if wanted == ON_CPU:
        wanted = not cuda
        randomness['deterministic'] = wanted
        if cuda:
            print("[determinism] randomness.deterministic='cpu' on CUDA: seeded, not bitwise "
                  'reproducible (mmcv RoI ops accumulate CUDA gradients with atomicAdd)')
    return bool(wanted)


def prepare_cuda_determinism(cfg: Mapping) -> bool:
    """Resolve :data:`ON_CPU` and set ``CUBLAS_WORKSPACE_CONFIG`` (unless set) for a config that
    asks for deterministic CUDA runs; call before any CUDA work. Returns whether it asks."""
    cuda = torch.cuda.is_available()
    wanted = resolve_deterministic(cfg, cuda)
    if wanted and cuda:
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', CUBLAS_SETTING)
    return wanted


def nondeterministic_cuda_modules(model: nn.Module) -> List[str]:
    """``'name (why)'`` for each module of ``model`` whose CUDA backward is not reproducible."""
    return [f'{name} ({why})' for name, _, why in
            match_modules(model, NONDETERMINISTIC_CUDA_BACKWARD)]


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


__all__ = ['CUBLAS_SETTING', 'NONDETERMINISTIC_CUDA_BACKWARD', 'ON_CPU', 'DeterminismCheckHook',
           'check_cuda_determinism', 'nondeterministic_cuda_modules', 'prepare_cuda_determinism',
           'resolve_deterministic']
