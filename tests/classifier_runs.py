"""What the multi-process training tests share: a folder-per-class set of synthetic shapes, a
tiny CaiT classifier config around it, and the environment tools/dist_train.sh runs in."""
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import numpy as np

from mmvit_ext.datasets.synthetic_shapes import CLASSES, render_scene

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
_base_ = ['mmpretrain::_base_/default_runtime.py']
custom_imports = dict(imports=['mmvit_ext', {hook_module!r}], allow_failed_imports=False)
model = dict(
    type='ImageClassifier',
    backbone=dict(type='mmvit_ext.CaiT', arch=dict(embed_dims=32, depth={depth}, num_heads=2),
                  img_size=64, out_type='cls_token', drop_path_rate=0.0{backbone_extra}),
    neck=None,
    head=dict(type='LinearClsHead', num_classes={num_classes}, in_channels=32,
              loss=dict(type='CrossEntropyLoss')))
data_preprocessor = dict(num_classes={num_classes}, mean=[127.5] * 3, std=[127.5] * 3,
                         to_rgb=True)
pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(
    batch_size={batch}, num_workers=0,
    dataset=dict(type='CustomDataset', data_root='{data}', pipeline=pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False))
train_cfg = {train_cfg}
optim_wrapper = {optim_wrapper}
param_scheduler = []
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=100))
custom_hooks = [dict(type={hook!r}, out_dir='{out}')]
randomness = dict(seed=0)
"""


def write_shape_folders(root: Path, count: int) -> List[str]:
    """``count`` 64 x 64 images of one shape each under ``root/<class>/``; the class names."""
    import mmcv
    rng = np.random.default_rng(0)
    for i in range(count):
        image, _, objects = render_scene(rng, (64, 64), max_objects=1)
        folder = root / CLASSES[objects[0][0]]
        folder.mkdir(parents=True, exist_ok=True)
        mmcv.imwrite(image[..., ::-1], str(folder / f'{i:02d}.png'))
    return sorted(p.name for p in root.iterdir())


def classifier_config(*, depth: int, num_classes: int, batch: int, data: Path, out: Path,
                      hook_module: str, hook: str, train_cfg: str, optim_wrapper: str,
                      backbone_extra: str = '') -> str:
    """The config text of a CaiT classifier on :func:`write_shape_folders` data whose hook
    ``hook`` (defined in the importable module ``hook_module``) writes to ``out``."""
    return CONFIG.format(depth=depth, num_classes=num_classes, batch=batch, data=data, out=out,
                         hook_module=hook_module, hook=hook, train_cfg=train_cfg,
                         optim_wrapper=optim_wrapper, backbone_extra=backbone_extra)


def run_launch(cmd: List[str], hook_dir: Path, port: int, timeout: int = 900
               ) -> subprocess.CompletedProcess:
    """Run ``cmd`` in the repository with ``hook_dir`` importable, one thread per process and
    the rendezvous ``port``; fails with the output's tail unless it exits 0."""
    env = {**os.environ, 'PYTHONPATH': f'{hook_dir}{os.pathsep}{os.environ.get("PYTHONPATH", "")}',
           'PORT': str(port), 'OMP_NUM_THREADS': '1', 'PYTHON': sys.executable}
    env['PATH'] = f'{Path(sys.executable).parent}{os.pathsep}{env["PATH"]}'
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result
