"""Checks of a whole config before a run starts, so mistakes surface as one clear line."""
import os.path as osp
from typing import Any, Iterator, List, Optional, Tuple

import torch
from mmengine.config import Config


def _walk(node: Any, path: str = '') -> Iterator[Tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f'{path}.{key}' if path else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _walk(value, f'{path}[{i}]')
    yield path, node


def missing_pretrained(cfg: Config, download: bool = True) -> List[str]:
    """``init_cfg=dict([type='Pretrained',] checkpoint=...)`` and ``pretrained=PATH`` entries
    whose file is absent. A URL is looked up in the torch hub cache and downloaded there when
    absent, as the loader does; one that cannot be fetched gives the loader's message."""
    from ..converters.io import CheckpointError, resolve_checkpoint
    problems = []
    for path, node in _walk(cfg.get('model', {}), 'model'):
        if not isinstance(node, dict):
            continue
        checks = []
        # init_cfg in the forms the peers write: with type='Pretrained', or with no type
        if node.get('type', 'Pretrained') == 'Pretrained' and 'checkpoint' in node:
            checks.append((f'{path}.checkpoint', str(node['checkpoint'])))
        if isinstance(node.get('pretrained'), str):  # mmdet / mmseg backbone pretrained=PATH
            checks.append((f'{path}.pretrained', node['pretrained']))
        for where, ckpt in checks:
            if '://' in ckpt:  # URLs (and schemes we do not read)
                try:
                    resolve_checkpoint(ckpt, download=download)
                except CheckpointError as err:
                    problems.append(f'{where}: {err}')
            elif not osp.isfile(ckpt):
                problems.append(f'{where}: pretrained weights not found at {ckpt!r}; '
                                f'download the official file there, or pass '
                                f'--cfg-options {where}=None to train from scratch')
    return problems


def missing_data(cfg: Config, splits: Tuple[str, ...] = ('train', 'val', 'test')) -> List[str]:
    """Dataset roots and annotation files of the given dataloaders that do not exist."""
    problems = []
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        dataset = loader.get('dataset', {})
        while 'dataset' in dataset:  # RepeatDataset / ClassBalancedDataset wrappers
            dataset = dataset['dataset']
        root = dataset.get('data_root', '') or ''
        if root and not osp.isdir(root):
            problems.append(f'{split}_dataloader.dataset.data_root: dataset root {root!r} '
                            f'not found{_layout_hint(dataset)}')
            continue
        ann = dataset.get('ann_file')
        if ann and not osp.isfile(osp.join(root, ann)) and not osp.isdir(osp.join(root, ann)):
            problems.append(f'{split}_dataloader.dataset.ann_file: {osp.join(root, ann)!r} not found')
        elif not ann:  # a dataset that scans folders (mmseg): each folder must be there
            absent = [repr(osp.join(root, folder)) for _, folder in
                      sorted((dataset.get('data_prefix') or {}).items())
                      if folder and not osp.isdir(osp.join(root, folder))]
            if absent:
                noun = 'folders' if len(absent) > 1 else 'folder'
                problems.append(f'{split}_dataloader.dataset.data_prefix: {noun} '
                                f'{", ".join(absent)} not found{_layout_hint(dataset)}')
    return problems


def _layout_hint(dataset: dict) -> str:
    prefix = dataset.get('data_prefix') or {}
    if 'ADE20K' in str(dataset.get('type', '')) or (
            str(prefix.get('img_path', '')).startswith('images/')
            and str(prefix.get('seg_map_path', '')).startswith('annotations/')):
        return (' (the ADEChallengeData2016 layout: images/{training,validation}/*.jpg, '
                'annotations/{training,validation}/*.png; tools/make_ade_demo_data.py writes one)')
    return ''


def neck_channel_mismatch(cfg: Config) -> List[str]:
    """Compare a neck's / decode head's ``in_channels`` with what our backbone emits."""
    model = cfg.get('model', {})
    backbone = model.get('backbone')
    if not isinstance(backbone, dict) or not str(backbone.get('type', '')).startswith('mmvit_ext.'):
        return []
    from ..registry import MODELS
    settings = {k: v for k, v in backbone.items() if k not in ('type', 'init_cfg', '_delete_')}
    cls = MODELS.get(backbone['type'].split('.', 1)[1])
    if cls is None:
        return [f'model.backbone.type: {backbone["type"]!r} is not registered in mmvit_ext']
    # the module reading the backbone: the neck, or without one the decode head (UperNet); none
    # reads a channel list in EoMT (its head takes the network's predictions)
    name = 'neck' if isinstance(model.get('neck'), dict) else 'decode_head'
    head = model.get(name)
    given = head.get('in_channels') if isinstance(head, dict) else None
    if not isinstance(given, (list, tuple)):
        return []
    channels = list(cls(**settings).out_channels)
    if list(given) == channels:
        return []
    return [f'model.{name}.in_channels={list(given)} does not match the backbone outputs; '
            f'use in_channels={channels}']


def load_run_config(config: str, cfg_options: Optional[dict], launcher: str,
                    work_dir: Optional[str]) -> Config:
    """The config of a tools/ run: file, --cfg-options, launcher and work dir (default
    ``./work_dirs/<config name>``), as tools/train.py and tools/test.py share them."""
    cfg = Config.fromfile(config)
    cfg.launcher = launcher
    if launcher != 'none' and not torch.cuda.is_available():
        # the OpenMMLab runtimes default to nccl, which needs GPUs: CPU processes talk gloo
        cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})['backend'] = 'gloo'
        if cfg.get('model_wrapper_cfg') is None:  # mmengine would pass a CUDA device id to DDP
            cfg.model_wrapper_cfg = dict(
                type='MMDistributedDataParallel', device_ids=None, broadcast_buffers=False,
                find_unused_parameters=cfg.get('find_unused_parameters', False))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cfg.work_dir = work_dir or cfg.get('work_dir') or osp.join(
        './work_dirs', osp.splitext(osp.basename(config))[0])
    return cfg
