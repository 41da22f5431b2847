"""EoMT's training schedule in mmengine: the mask annealing hook and the official two-stage
warm-up + poly learning rate (tue-mps/eomt ``training/lightning_module.py``,
``training/two_stage_warmup_poly_schedule.py``)."""
from typing import List, Optional, Sequence

import torch
from mmengine.hooks import Hook
from mmengine.optim.scheduler.param_scheduler import _ParamScheduler
from torch import nn

from ..errors import ConfigError
from ..registry import HOOKS, PARAM_SCHEDULERS


def mask_probability(step: int, start: int, end: int, poly_power: float = 0.9) -> float:
    """The official schedule of one block's mask probability at ``step``: 1 before ``start``,
    0 from ``end``, ``(1 - progress) ** poly_power`` between."""
    if step < start:
        return 1.0
    if step >= end:
        return 0.0
    return (1.0 - (step - start) / (end - start)) ** poly_power


def _eomt_networks(model: nn.Module) -> List[nn.Module]:
    return [m for m in model.modules() if isinstance(getattr(m, 'attn_mask_probs', None),
                                                      torch.Tensor)]


@HOOKS.register_module()
class EoMTMaskAnnealingHook(Hook):
    """Anneals the EoMT network's ``attn_mask_probs`` per query block, as the official
    ``on_train_batch_end``: after the iteration that brings the step count to ``s`` (Lightning's
    ``global_step``, mmengine's ``runner.iter + 1``), block ``i``'s probability is
    :func:`mask_probability` ``(s, start_iters[i], end_iters[i])``. At probability 0 the block
    takes no mask.

    Args:
        start_iters / end_iters: per query block (the published configs'
            ``attn_mask_annealing_start_steps`` / ``_end_steps``).
        poly_power: the schedule's power (official 0.9, the lr schedule's).
    """

    priority = 'NORMAL'

    def __init__(self, start_iters: Sequence[int], end_iters: Sequence[int],
                 poly_power: float = 0.9) -> None:
        if len(start_iters) != len(end_iters) or any(
                e < s for s, e in zip(start_iters, end_iters)):
            raise ConfigError(f'EoMTMaskAnnealingHook: start_iters and end_iters need one entry '
                              f'per query block, each end >= its start; got {list(start_iters)} '
                              f'and {list(end_iters)}')
        self.start_iters, self.end_iters = list(start_iters), list(end_iters)
        self.poly_power = poly_power

    def set_probabilities(self, model: nn.Module, step: int) -> None:
        networks = _eomt_networks(model)
        if not networks:
            raise ConfigError('EoMTMaskAnnealingHook: the model holds no EoMT network '
                              '(no attn_mask_probs buffer)')
        for network in networks:
            if network.attn_mask_probs.numel() != len(self.start_iters):
                raise ConfigError(f'EoMTMaskAnnealingHook: {len(self.start_iters)} schedules for '
                                  f'{network.attn_mask_probs.numel()} query blocks')
            probs = [mask_probability(step, s, e, self.poly_power)
                     for s, e in zip(self.start_iters, self.end_iters)]
            network.attn_mask_probs.copy_(torch.tensor(probs))

    def trained_state(self, model: nn.Module) -> None:
        """The probabilities training leaves (every schedule ended: 0), for timing or exporting
        a model built without its checkpoint."""
        self.set_probabilities(model, max(self.end_iters))

    def before_train(self, runner) -> None:
        self.set_probabilities(runner.model, runner.iter)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self.set_probabilities(runner.model, runner.iter + 1)


def two_stage_factor(step: int, trunk: bool, warmup: Sequence[int], total: int,
                     power: float) -> float:
    """The official lr factor at ``step``: heads warm up linearly over ``warmup[0]`` steps; the
    trunk stays at 0 for those, then warms up over ``warmup[1]``; both then decay as
    ``(1 - t / T) ** power`` over the rest of ``total``."""
    head_warmup, trunk_warmup = warmup
    if not trunk:
        if head_warmup > 0 and step < head_warmup:
            return step / head_warmup
        done, span = max(0, step - head_warmup), max(1, total - head_warmup)
    else:
        if step < head_warmup:
            return 0.0
        if step < head_warmup + trunk_warmup:
            return (step - head_warmup) / trunk_warmup
        done = max(0, step - head_warmup - trunk_warmup)
        span = max(1, total - head_warmup - trunk_warmup)
    return (1 - done / span) ** power


@PARAM_SCHEDULERS.register_module()
class TwoStageWarmupPolyLR(_ParamScheduler):
    """The official EoMT schedule per parameter group (:func:`two_stage_factor`); a group is the
    trunk's where it has ``trunk=True`` (set by the optimizer constructor's ``custom_keys``,
    e.g. ``{'backbone.encoder.': dict(trunk=True)}``). By iteration.

    Args:
        warmup_iters: (heads' warm-up, trunk's warm-up after it); official ``[500, 1000]``
            (DINOv2) / ``[2000, 3000]`` (DINOv3 ADE20K).
        total_iters: the run's iterations (``end``).
        poly_power: official 0.9.
    """

    def __init__(self, optimizer, warmup_iters: Sequence[int], total_iters: int,
                 poly_power: float = 0.9, by_epoch: bool = False,
                 end: Optional[int] = None, **kwargs) -> None:
        if len(warmup_iters) != 2:
            raise ConfigError(f'TwoStageWarmupPolyLR: warmup_iters is (heads, trunk), got '
                              f'{warmup_iters!r}')
        self.warmup_iters, self.total_iters = tuple(warmup_iters), int(total_iters)
        self.poly_power = poly_power
        super().__init__(optimizer, 'lr', by_epoch=by_epoch, end=end or total_iters, **kwargs)

    def _get_value(self) -> List[float]:
        return [base * two_stage_factor(self.last_step, bool(group.get('trunk')),
                                        self.warmup_iters, self.total_iters, self.poly_power)
                for base, group in zip(self.base_values, self.optimizer.param_groups)]
