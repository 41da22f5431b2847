"""tools/train.py --compile: the backbone compiled in place (same parameter names, finite losses),
mmengine's whole-train_step compile, and the config's compile options."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from mmvit_ext.datasets.synthetic_shapes import generate_demo_coco
from mmvit_ext.engine import apply_compile_choice, compile_backbone
from mmvit_ext.utils.safe_checkpoint import trusted_training_state
from tiny_demo import CONFIG  # tests/ is on the path (conftest)

ROOT = Path(__file__).resolve().parents[1]


def test_compile_choice_sets_the_config():
    cfg = Config(dict(compile=dict(backend='eager')))
    assert apply_compile_choice(cfg, 'backbone') == {'backend': 'eager'} and 'compile' not in cfg
    cfg = Config(dict())
    assert apply_compile_choice(cfg, 'model') == {} and cfg.compile is True
    cfg = Config(dict(compile=dict(backend='eager')))
    apply_compile_choice(cfg, 'model')
    assert cfg.compile == {'backend': 'eager'}
    assert apply_compile_choice(Config(dict(compile=True)), None) == {}
    with pytest.raises(ValueError, match='--compile must be one of'):
        apply_compile_choice(Config(dict()), 'heads')


def test_compile_backbone_keeps_names_and_outputs():
    from mmvit_ext.backbones import PyramidVisionTransformerV2

    class Detector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = PyramidVisionTransformerV2(
                arch=dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4)))

    model = Detector().eval()
    names = list(model.state_dict())
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        want = model.backbone(x)
        compile_backbone(model, backend='eager')
        got = model.backbone(x)
    assert list(model.state_dict()) == names  # no _orig_mod prefix: checkpoints unchanged
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    with pytest.raises(ValueError, match='has no backbone'):
        compile_backbone(torch.nn.Linear(2, 2))


def test_train_tool_compiles_the_backbone(tmp_path):
    generate_demo_coco(tmp_path / 'shapes', num_train=4, num_val=1)
    config = tmp_path / 'tiny.py'
    config.write_text(CONFIG.format(base=ROOT / 'configs/demo/mask_rcnn_pvtv2_b2_demo.py',
                                    data=tmp_path / 'shapes'))
    work = tmp_path / 'work'
    run = subprocess.run([sys.executable, 'tools/train.py', str(config), '--work-dir', str(work),
                          '--compile', '--cfg-options', 'compile.backend=aot_eager',
                          'train_cfg.max_epochs=1'],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "[compile] PyramidVisionTransformerV2 compiled in place (torch.compile {'backend': " \
           "'aot_eager'})" in run.stdout
    scalars = next(work.glob('*/vis_data/scalars.json'))
    losses = [json.loads(line)['loss'] for line in scalars.read_text().splitlines() if '"loss"' in line]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    with trusted_training_state():
        state = torch.load(work / 'epoch_1.pth', map_location='cpu', weights_only=True)['state_dict']
    assert 'backbone.layers.0.patch_embed.proj.weight' in state  # the names of an eager run
    assert not any('_orig_mod' in k for k in state)
