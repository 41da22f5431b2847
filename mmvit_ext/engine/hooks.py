"""A hook that makes ``--resume`` continue the exact random stream of the interrupted run."""
import random
from typing import Optional

import numpy as np
import torch
from mmengine.hooks import Hook

from ..registry import HOOKS


@HOOKS.register_module()
class RandomStateHook(Hook):
    """Save the torch / numpy / Python random states with every checkpoint and restore them when
    resuming, so a resumed run draws the same drop-path masks, RoI samples and augmentations as
    an uninterrupted one (with ``randomness.deterministic`` and a fixed seed: equal weights).

    The states are plain tensors / arrays / ints, which the safe unpickler accepts. They are
    restored at ``before_train`` (after everything that consumes randomness while building) and
    only when resuming, not for ``load_from`` fine-tuning.
    """

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self._pending: Optional[dict] = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        numpy_state = {'name': name, 'keys': torch.from_numpy(keys.astype(np.int64)),
                       'pos': int(pos), 'has_gauss': int(has_gauss), 'cached': float(cached)}
        # numpy's state as a tensor + plain values: nothing the safe unpickler must trust more
        state = {'torch': torch.get_rng_state(), 'numpy': numpy_state,
                 'python': random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        checkpoint.setdefault('meta', {})['random_state'] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if getattr(runner, '_resume', False):
            self._pending = checkpoint.get('meta', {}).get('random_state')
            if self._pending is None:
                runner.logger.warning('RandomStateHook: the resumed checkpoint holds no random '
                                      'state; the run continues with a fresh random stream')

    def before_train(self, runner) -> None:
        state, self._pending = self._pending, None
        if not state:
            return
        torch.set_rng_state(state['torch'])
        numpy_state = state['numpy']
        np.random.set_state((numpy_state['name'], numpy_state['keys'].numpy().astype(np.uint32),
                             numpy_state['pos'], numpy_state['has_gauss'],
                             numpy_state['cached']))
        random.setstate(state['python'])
        if 'cuda' in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state['cuda'])
        runner.logger.info('RandomStateHook: restored the random state of the checkpoint')


def add_run_hooks(cfg, training: bool) -> None:
    """Append to ``cfg.custom_hooks`` the hooks every run of tools/train.py and tools/test.py
    has, unless the config names them already: :class:`~mmvit_ext.engine.Fp32OpsHook` and, for
    training, :class:`~mmvit_ext.engine.DeterminismCheckHook` and :class:`RandomStateHook`."""
    wanted = ['Fp32OpsHook'] + (['DeterminismCheckHook', 'RandomStateHook'] if training else [])
    hooks = list(cfg.get('custom_hooks') or [])
    present = {str(h.get('type', '')).rpartition('.')[2] for h in hooks}
    cfg.custom_hooks = hooks + [dict(type=f'mmvit_ext.{name}') for name in wanted
                                if name not in present]
