"""GPU hazards of the model code, checked without a GPU: the ``meta`` device takes the non-CPU
paths (no CPU kernel, no chunking) and checks every shape, as a CUDA run would. (Every backbone
on ``meta`` and early ``out_indices`` giving every parameter a gradient are contract checks,
tests/contract.py.)"""
import gc
import math

import pytest
import torch
import torch.nn.functional as F

from mmvit_ext.backbones import SwinTransformer
from mmvit_ext.registry import MODELS
from backbone_cases import SMALL
from op_names import RecordOpNames

CUDA_GRID_Y_LIMIT = 65535  # CUDA's fused attention kernels launch one grid row per head


def _build(name, **cfg):
    return MODELS.build(dict(type=f'mmvit_ext.{name}', **cfg))


def test_swin_at_6144_px_keeps_the_head_axis_under_the_cuda_grid_limit(monkeypatch):
    """Windows are folded into the batch axis of the fused kernel, never into its head axis:
    at 6144 x 6144 stage 1 has 48,400 windows of 3 heads (145k rows if they were heads)."""
    shapes = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, 'scaled_dot_product_attention',
                        lambda q, *a, **k: shapes.append(tuple(q.shape)) or real(q, *a, **k))
    with torch.device('meta'):
        model = SwinTransformer('tiny').eval()
    with torch.no_grad():
        model(torch.empty(1, 3, 6144, 6144, device='meta'))
    assert len(shapes) == 12
    assert max(shape[1] for shape in shapes) == 24                 # heads of stage 4
    assert shapes[0] == (math.ceil(1536 / 7) ** 2, 3, 49, 32)
    assert all(shape[1] <= CUDA_GRID_Y_LIMIT for shape in shapes)


@pytest.mark.parametrize('name,cfg', [
    ('DeepViT', SMALL['DeepViT']),                                  # position embedding resize
    ('PyramidVisionTransformerV2', dict(SMALL['PyramidVisionTransformerV2'],
                                        arch=dict(SMALL['PyramidVisionTransformerV2']['arch'],
                                                  linear=True))),  # li pooling at 9x13
])
def test_backward_avoids_kernels_refused_under_deterministic_algorithms(name, cfg):
    """torch refuses the CUDA backward of bicubic upsampling and adaptive average pooling under
    ``torch.use_deterministic_algorithms(True)``: neither may appear in a backbone's backward."""
    model = _build(name, **cfg).train()
    with RecordOpNames() as record:
        sum(o.sum() for o in model(torch.randn(1, 3, 36, 52))).backward()
    backward = {n for n in record.names if 'backward' in n}
    assert backward and not {n for n in backward if 'upsample' in n or 'adaptive_avg' in n}


def _live_tensors() -> dict:
    gc.collect()
    return {id(obj): obj for obj in gc.get_objects() if torch.is_tensor(obj)}


def test_forward_keeps_no_tensors_outside_the_model():
    """Window layouts and shift masks are made per call on the input's device: after forwards
    at several batch sizes and image sizes nothing is left behind in caches."""
    model = _build('SwinTransformer', **SMALL['SwinTransformer']).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
    before = _live_tensors()
    with torch.no_grad():
        for batch, size in ((1, (64, 64)), (2, (96, 64)), (3, (40, 72))):
            outs = model(torch.randn(batch, 3, *size))
    del outs
    # new survivors only: earlier tests' tensors may be freed meanwhile (torch.compile's caches)
    left = [tuple(t.shape) for i, t in _live_tensors().items() if i not in before]
    assert not left, left


def test_benchmark_train_step_moves_data_with_the_input():
    """tools/analysis/benchmark.py --config: images, boxes and masks follow the input's device
    and size (2x pixels are 2x pixels)."""
    from mmdet.models.data_preprocessors import DetDataPreprocessor
    from mmvit_ext.benchmark.train_step import DetectorTrainStep

    class Detector(torch.nn.Module):
        data_preprocessor = DetDataPreprocessor(pad_size_divisor=32)

    step = DetectorTrainStep(Detector())
    small = step.data_for(torch.empty(2, 3, 64, 96, device='meta'))
    assert small['inputs'].device.type == 'meta' and small['inputs'].shape == (2, 3, 64, 96)
    sample = small['data_samples'][0]
    assert sample.gt_instances.bboxes.device.type == 'meta'
    big = step.data_for(torch.empty(2, 3, 128, 96))
    assert big['inputs'].shape == (2, 3, 128, 96) and big['inputs'].device.type == 'cpu'
