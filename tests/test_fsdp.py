"""tools/train.py with 2 CPU processes (gloo), a CaiT classifier with frozen_stages=1, with_cp
(attention parts, whole blocks, or per stage) and layer decay: under mmengine's FlexibleRunner +
FSDPStrategy with our block auto-wrap policy (every backbone block its own FSDP unit), and under
DDP. Two steps with finite losses; frozen parameters stay, the others move; layer-decay groups from the unwrapped names."""
import json

import numpy as np
import pytest
from classifier_runs import classifier_config, run_launch, write_shape_folders

TRAIN = dict(train_cfg='dict(by_epoch=False, max_iters=2)', optim_wrapper="""dict(
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
    constructor='mmvit_ext.LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.5))""")
FSDP = """
runner_type = 'FlexibleRunner'
strategy = dict(type='FSDPStrategy', model_wrapper=dict(
    auto_wrap_policy=dict(type='mmvit_ext.backbone_block_policy')))
"""

DUMP = '''
import json, os
import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


@HOOKS.register_module()
class FSDPDumpHook(Hook):
    """Per rank: losses, the FSDP units, lr scales, and which parameters changed."""

    def __init__(self, out_dir):
        self.out_dir, self.losses = out_dir, []

    def before_train(self, runner):
        self.start = {n: p.detach().clone() for n, p in runner.model.named_parameters()}
        self.calls = {}  # attention calls: 2 per step where recomputed
        for name, module in runner.model.named_modules():
            name = name.replace('_fsdp_wrapped_module.', '').removeprefix('module.')
            if name.endswith('.attn'):
                module.register_forward_pre_hook(
                    lambda *_, key=name: self.calls.__setitem__(key, self.calls.get(key, 0) + 1))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.losses.append(float(outputs['loss']))

    def after_run(self, runner):
        model = runner.model
        units = [n.replace('_fsdp_wrapped_module.', '') for n, m in model.named_modules()
                 if isinstance(m, FSDP) and n]
        changed = {n.replace('_fsdp_wrapped_module.', '').removeprefix('module.'):
                   bool((p.detach() != self.start[n]).any())
                   for n, p in model.named_parameters() if p.numel()}
        scales = sorted({g['lr_scale'] for g in runner.optim_wrapper.optimizer.param_groups})
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, f'rank{get_rank()}.json'), 'w') as f:
            json.dump(dict(losses=self.losses, units=units, changed=changed, scales=scales,
                           calls=self.calls), f)
'''


@pytest.mark.parametrize('wrapper,with_cp', [('fsdp', 'attn'), ('fsdp', True), ('ddp', [1, True])])
def test_two_cpu_processes_train_with_frozen_stages_and_with_cp(tmp_path, wrapper, with_cp):
    classes = write_shape_folders(tmp_path / 'data', 8)
    (tmp_path / 'fsdp_dump.py').write_text(DUMP)
    config = tmp_path / 'fsdp.py'
    config.write_text(classifier_config(
        depth=3, num_classes=len(classes), batch=2, data=tmp_path / 'data', out=tmp_path / 'out',
        hook_module='fsdp_dump', hook='FSDPDumpHook',
        backbone_extra=f', frozen_stages=1, with_cp={with_cp!r}', **TRAIN)
        + (FSDP if wrapper == 'fsdp' else ''))
    run_launch(['bash', 'tools/dist_train.sh', str(config), '2', '--work-dir',
                str(tmp_path / 'work')], tmp_path,
               port=29531 + (wrapper == 'ddp') + 2 * (with_cp is True))
    ranks = [json.loads((tmp_path / f'out/rank{r}.json').read_text()) for r in (0, 1)]
    for dump in ranks:
        assert len(dump['losses']) == 2 and np.isfinite(dump['losses']).all()
        blocks = sorted(u for u in dump['units'] if 'blocks.' in u)
        assert blocks == (['backbone.blocks.0', 'backbone.blocks.1', 'backbone.blocks.2',
                           'backbone.cls_blocks.0', 'backbone.cls_blocks.1']
                          if wrapper == 'fsdp' else []), dump['units']
        assert len(dump['scales']) > 3 and min(dump['scales']) < 0.1  # layer decay 0.5 over 7 ids
        # recomputed: the selected blocks' attention; in the frozen block 0 only when FSDP
        # checkpoints whole blocks (the root unit's flat parameter reaches the block's input);
        # its checkpointed attention part alone is not recomputed (measured; see the stop note)
        selected = [1, 0, 0, 1, 1] if isinstance(with_cp, list) else [1] * 5  # [1, True]: 1 + 2
        block0 = wrapper == 'fsdp' and with_cp is True
        recomputed = [s and (i != 0 or block0) for i, s in enumerate(selected)]
        names = [f'backbone.blocks.{i}.attn' for i in range(3)] + \
            [f'backbone.cls_blocks.{i}.attn' for i in range(2)]
        assert dump['calls'] == {n: 2 * (1 + r) for n, r in zip(names, recomputed)}, dump['calls']
    changed = {}  # each rank holds a shard: a parameter changed if its shard changed anywhere
    for dump in ranks:
        for name, moved in dump['changed'].items():
            changed[name] = changed.get(name, False) or moved
    frozen = [n for n in changed if n.startswith(('backbone.blocks.0.', 'backbone.patch_embed',
                                                  'backbone.pos_embed'))]
    assert frozen and not any(changed[n] for n in frozen), 'frozen_stages=1 moved'
    assert changed['head.fc.weight'] and changed['backbone.blocks.2.mlp.fc1.weight']
