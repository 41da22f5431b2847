"""Hooks of a run: ``--resume`` continues the exact random stream of the interrupted run;
``load_from`` / ``--resume`` read mmengine's training state under torch's weights-only loading."""
import random
from contextlib import ExitStack
from typing import Optional

import numpy as np
import torch
from mmengine.hooks import Hook

from ..converters.layouts import convert_model_layout
from ..registry import HOOKS
from ..utils.safe_checkpoint import trusted_training_state


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


@HOOKS.register_module()
class TrustedCheckpointHook(Hook):
    """For the peers' tools (mmdet's / mmseg's ``tools/train.py``): the run's ``load_from`` /
    ``--resume`` (and ``init_cfg`` checkpoints) load mmengine's training state under torch's
    weights-only loading (:func:`~mmvit_ext.utils.safe_checkpoint.trusted_training_state`).

    mmengine loads between ``before_run`` and the first ``before_train`` / ``before_val`` /
    ``before_test``: the allowlist is on from the first to the earliest of those,
    ``after_load_checkpoint`` and ``after_run``. A load that raises leaves it on until one of
    them comes (mmengine has no hook for a failed run); ``tools/train.py`` and ``tools/test.py``
    use the context manager around the whole run instead, which exceptions close too.
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._trusted = ExitStack()

    def before_run(self, runner) -> None:
        self._close()
        self._trusted.enter_context(trusted_training_state())

    def _close(self, *args, **kwargs) -> None:
        self._trusted.close()

    after_load_checkpoint = before_train = before_val = before_test = after_run = _close


@HOOKS.register_module()
class ModelLayoutHook(Hook):
    """``load_from`` / tools/test.py of a whole-model checkpoint in another codebase's module tree
    (:func:`~mmvit_ext.converters.layouts.register_model_layout`: the official DINOv3
    segmentor's ``segmentation_model.0`` / ``.1``): its keys converted to the model's
    (``backbone.``, ``decode_head.``) in place. mmengine's ``Runner.load_checkpoint`` calls
    ``after_load_checkpoint`` between reading the file and loading it into the model."""

    priority = 'VERY_HIGH'

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        state = checkpoint.get('state_dict', checkpoint)
        converted, layout = convert_model_layout(state)
        if layout is not None:
            state.clear()
            state.update(converted)
            runner.logger.info(f'ModelLayoutHook: {layout} -> {len(converted)} tensors under '
                               f'{sorted({k.split(".")[0] for k in converted})}')


def add_run_hooks(cfg, training: bool) -> None:
    """Append to ``cfg.custom_hooks`` the hooks every run of tools/train.py and tools/test.py
    has, unless the config names them already: :class:`~mmvit_ext.engine.Fp32OpsHook` and, for
    training, :class:`~mmvit_ext.engine.DeterminismCheckHook` and :class:`RandomStateHook`."""
    wanted = ['Fp32OpsHook'] + (['DeterminismCheckHook', 'RandomStateHook'] if training else [])
    hooks = list(cfg.get('custom_hooks') or [])
    present = {str(h.get('type', '')).rpartition('.')[2] for h in hooks}
    cfg.custom_hooks = hooks + [dict(type=f'mmvit_ext.{name}') for name in wanted
                                if name not in present]
