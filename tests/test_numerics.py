"""Mixed precision: every family trains 100 steps under fp16 and bf16 autocast without NaN/Inf.

48 px images, the smallest that still take every path of the tiny archs (backbone_cases.SMALL):
Swin's shifted block runs on a 6x6 map padded to its 4 px windows and its deepest windows
shrink to a 3x3 map; the plain ViTs' 3x3 grid is padded to their 2 px windows. A step costs a
third less than at 64 px (Swin fp16: 2.6 s against 4.0 s of CPU per 25 steps), which counts
where reduced-precision kernels are emulated (fp16 on most CPUs, bf16 on AVX2)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmvit_ext.datasets.synthetic_shapes import CLASSES, render_scene
from mmvit_ext.registry import MODELS
from backbone_cases import OWN_CODE as SMALL  # not library wrappers

STEPS = 100
SIZE = (48, 48)


@pytest.fixture(scope='module')
def demo_batches():
    """32 synthetic-shape images with per-pixel class labels (0 = background)."""
    rng = np.random.default_rng(0)
    images, labels = [], []
    for _ in range(32):
        image, instances, objects = render_scene(rng, SIZE, max_objects=3)
        classes = np.zeros(SIZE, dtype=np.int64)
        for index, (kind, _) in enumerate(objects):
            classes[instances == index + 1] = kind + 1
        images.append(torch.from_numpy(image).permute(2, 0, 1).float() / 127.5 - 1)
        labels.append(torch.from_numpy(classes))
    return torch.stack(images), torch.stack(labels)


class Segmenter(nn.Module):
    """Backbone + a 1x1 classifier on every output, summed at the finest output's resolution."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.heads = nn.ModuleList(nn.Conv2d(c, len(CLASSES) + 1, 1) for c in backbone.out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.backbone(x)
        size = feats[0].shape[-2:]
        logits = sum(F.interpolate(head(f), size=size, mode='bilinear', align_corners=False)
                     for head, f in zip(self.heads, feats))
        return F.interpolate(logits, size=x.shape[-2:], mode='bilinear', align_corners=False)


@pytest.mark.parametrize('dtype', ['fp16', 'bf16'])
@pytest.mark.parametrize('name', sorted(SMALL))
def test_autocast_training_stays_finite(name, dtype, demo_batches):
    torch.manual_seed(0)
    images, labels = demo_batches
    backbone = MODELS.build(dict(type=f'mmvit_ext.{name}', **SMALL[name], drop_path_rate=0.1))
    model = Segmenter(backbone).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    amp_dtype = torch.float16 if dtype == 'fp16' else torch.bfloat16
    scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 12, enabled=dtype == 'fp16')
    losses, skipped = [], 0
    for step in range(STEPS):
        index = torch.arange(4 * step, 4 * step + 4) % len(images)
        with torch.autocast('cpu', dtype=amp_dtype):
            logits = model(images[index])
            loss = F.cross_entropy(logits.float(), labels[index])
        assert torch.isfinite(loss), f'{name} {dtype}: loss {loss.item()} at step {step}'
        optimizer.zero_grad(set_to_none=True)
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if scaler.is_enabled() and scaler.get_scale() < scale:
            skipped += 1  # an overflowing step, skipped and the scale lowered
        losses.append(loss.item())
    assert all(torch.isfinite(p).all() for p in model.parameters()), f'{name} {dtype}: NaN weights'
    assert skipped <= 5, f'{name} {dtype}: {skipped} of {STEPS} fp16 steps overflowed'
    first, last = np.mean(losses[:20]), np.mean(losses[-20:])
    assert last < first, f'{name} {dtype}: loss did not go down ({first:.3f} -> {last:.3f})'
