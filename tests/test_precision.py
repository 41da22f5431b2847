"""Whole-model mixed precision (float32 around mmcv ops), CPU AMP, determinism on CUDA refused
before the first iteration, and the hooks every tools/ run gets."""
import threading
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import OptimWrapper

from mmvit_ext.engine import (CpuAmpOptimWrapper, add_run_hooks, amp_on_cpu,
                              check_cuda_determinism, keep_ops_float32,
                              nondeterministic_cuda_modules)
from mmvit_ext.engine.precision import boundaries_of
from mmvit_ext.errors import ConfigError
from mmvit_ext.utils import build_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def mask_rcnn():
    return build_model(ROOT / 'configs/mmdet/mask_rcnn_pvtv2_b0_fpn_1x_coco.py', pretrained=False)


def _extractor():
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
    return SingleRoIExtractor(dict(type='RoIAlign', output_size=7, sampling_ratio=0),
                              out_channels=4, featmap_strides=[4, 8])


def _rois(n=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=gen) * 500
    return torch.cat([torch.zeros(n, 1), xy, xy + 20 + torch.rand(n, 2, generator=gen) * 200], 1)


def test_boundaries_drawn_once_at_the_heads_and_extractors(mask_rcnn):
    applied = keep_ops_float32(mask_rcnn)
    assert keep_ops_float32(mask_rcnn) == applied  # idempotent: no second set of hooks
    assert boundaries_of(mask_rcnn) == {
        'rpn_head': 'outputs', 'roi_head.bbox_roi_extractor': 'inputs',
        'roi_head.bbox_head': 'outputs', 'roi_head.mask_roi_extractor': 'inputs',
        'roi_head.mask_head': 'outputs'}
    assert len(mask_rcnn.rpn_head._forward_hooks) == 1
    assert len(mask_rcnn.roi_head.bbox_roi_extractor._forward_pre_hooks) == 1
    assert not boundaries_of(mask_rcnn.backbone)  # the backbone is untouched
    assert set(mask_rcnn.state_dict()) == set(
        build_model(ROOT / 'configs/mmdet/mask_rcnn_pvtv2_b0_fpn_1x_coco.py',
                    pretrained=False).state_dict())


def test_extractor_runs_float32_and_returns_the_callers_dtype():
    """RoIs keep float32 precision (bf16 rounds 256-512 px to steps of 2 px): the output equals
    the float32 extractor's on the same (upcast) features, cast to the caller's dtype."""
    extractor = _extractor()
    keep_ops_float32(extractor)
    feats = [torch.randn(1, 4, 200 // s, 200 // s).bfloat16() for s in (4, 8)]
    rois = _rois()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = extractor(feats, rois)
    plain = _extractor()
    ref = plain([f.float() for f in feats], rois).bfloat16()
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)
    with pytest.raises(RuntimeError):  # mmcv's CPU kernel: float only
        plain(feats, rois.bfloat16())


def test_extractor_dtype_is_kept_per_thread():
    extractor = _extractor()
    keep_ops_float32(extractor)
    results, errors = {}, []

    def run(dtype):
        try:
            for _ in range(20):
                feats = [torch.randn(1, 4, 50 // s, 50 // s).to(dtype) for s in (1, 2)]
                results.setdefault(dtype, set()).add(extractor(feats, _rois(4)).dtype)
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=run, args=(d,)) for d in (torch.bfloat16, torch.float32,
                                                                 torch.float16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == {d: {d} for d in (torch.bfloat16, torch.float32,
                                                        torch.float16)}


def test_boundary_stack_is_popped_when_the_forward_raises():
    """A forward that raises inside the boundary leaves no entry behind: the next call (same
    thread) gets its own dtype back, and the per-thread stack is empty after every call."""
    extractor = _extractor()
    keep_ops_float32(extractor)
    pre_hook, = extractor._forward_pre_hooks.values()
    boundary = pre_hook.__self__
    feats = [torch.randn(1, 4, 64, 64).bfloat16(), torch.randn(1, 4, 32, 32).bfloat16()]

    def failing(*args, **kwargs):
        raise RuntimeError('forward failed')
    extractor.forward = failing  # this instance only
    for _ in range(3):
        with pytest.raises(RuntimeError, match='forward failed'):
            extractor(feats, _rois(4))
        assert boundary._stack() == []
    del extractor.forward
    out = extractor([f.float() for f in feats], _rois(4))  # float32 caller: float32 back
    assert out.dtype == torch.float32 and out.shape == (4, 4, 7, 7)
    assert extractor(feats, _rois(4)).dtype == torch.bfloat16
    assert boundary._stack() == []


def test_dense_head_outputs_leave_as_float32(mask_rcnn):
    keep_ops_float32(mask_rcnn)
    feats = tuple(torch.randn(1, 256, 64 // s, 64 // s) for s in (4, 8, 16, 32, 64))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        scores, deltas = mask_rcnn.rpn_head(feats)
    assert {t.dtype for t in scores + deltas} == {torch.float32}


def test_cpu_amp_optim_wrapper():
    model = torch.nn.Linear(4, 4)
    cfg = dict(type='AmpOptimWrapper', loss_scale=512.,
               optimizer=dict(type='SGD', lr=0.1))
    assert amp_on_cpu(cfg) == (not torch.cuda.is_available())
    wrapper = CpuAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with wrapper.optim_context(model):
        out = model(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    wrapper.update_params(out.float().square().mean())
    with pytest.raises(ConfigError, match='bfloat16'):
        CpuAmpOptimWrapper(dtype='float16', optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for float32 in ('float32', torch.float32):  # CPU autocast would ignore it: refused
        with pytest.raises(ConfigError, match=r"^AMP on CPU runs bfloat16; optim_wrapper.dtype="
                                              r"'float32' would autocast nothing"):
            CpuAmpOptimWrapper(dtype=float32, optimizer=torch.optim.SGD(model.parameters(),
                                                                        lr=0.1))
    assert not amp_on_cpu(dict(type='OptimWrapper'))
    assert isinstance(wrapper, OptimWrapper)


def test_determinism_refused_on_cuda_before_training(mask_rcnn, monkeypatch):
    found = nondeterministic_cuda_modules(mask_rcnn)
    assert any(f.startswith('roi_head.bbox_roi_extractor.roi_layers.0 (mmcv RoIAlign') for f in found)
    with pytest.raises(ConfigError, match='roi_head.mask_roi_extractor.roi_layers.0') as err:
        check_cuda_determinism(mask_rcnn, 'cuda', True)
    assert 'randomness.deterministic=False' in str(err.value)
    check_cuda_determinism(mask_rcnn, 'cpu', True)  # CPU kernels are deterministic
    check_cuda_determinism(mask_rcnn, 'cuda', False)
    classifier = build_model(ROOT / 'configs/mmpretrain/pvtv2_b0_in1k.py', pretrained=False)
    assert nondeterministic_cuda_modules(classifier) == []
    monkeypatch.delenv('CUBLAS_WORKSPACE_CONFIG', raising=False)
    with pytest.raises(ConfigError, match='CUBLAS_WORKSPACE_CONFIG'):
        check_cuda_determinism(classifier, 'cuda', True)
    monkeypatch.setenv('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
    check_cuda_determinism(classifier, 'cuda', True)


def test_segmentor_heads_are_named_for_cuda_determinism():
    segmentor = build_model(ROOT / 'configs/upernet_swin_t_512x512_160k_ade20k.py',
                            pretrained=False)
    found = nondeterministic_cuda_modules(segmentor)
    assert [f.split(' ')[0] for f in found] == ['decode_head', 'auxiliary_head']


def test_run_hooks_added_once():
    cfg = Config(dict(custom_hooks=[dict(type='mmvit_ext.RandomStateHook')]))
    add_run_hooks(cfg, training=True)
    add_run_hooks(cfg, training=True)
    assert [h['type'] for h in cfg.custom_hooks] == [
        'mmvit_ext.RandomStateHook', 'mmvit_ext.Fp32OpsHook', 'mmvit_ext.DeterminismCheckHook']
    test_cfg = Config(dict())
    add_run_hooks(test_cfg, training=False)
    assert [h['type'] for h in test_cfg.custom_hooks] == ['mmvit_ext.Fp32OpsHook']
