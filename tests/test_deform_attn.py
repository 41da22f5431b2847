"""Multi-scale deformable attention: the portable definition against an independent float64
reference and finite differences, the kernel dispatch (selection, repr, the fp32 boundary,
export) with an injected fake kernel, and, where CUDA and mmcv's compiled ops exist, mmcv's
kernel against the definition.

Tolerances (kernel vs definition, tests/test_deform_attn.py::test_mmcv_kernel_matches_definition):
float32 outputs, value and weight gradients to 1e-5 / 1e-4 of their largest entry (summation
order: the kernel accumulates with atomicAdd). Location gradients are sums over channels of
differences of neighbouring pixels (cancellation), compared to 1e-3 of their largest entry, and
only at locations off the pixel grid: where a sample sits exactly on a pixel row or column or
the map's border, bilinear sampling is not differentiable and the two implementations may take
different one-sided derivatives (random locations never land there; Deformable DETR's
initialisation, pixel centres plus integer offsets, always does).
"""
import pytest
import torch

import mmvit_ext.layers.deform_attn as layer
from mmvit_ext import ops, torch_compat
from mmvit_ext.layers.deform_attn import (MSDeformAttn, why_portable,
                                          multi_scale_deformable_attention)
from mmvit_ext.ops import DeformAttnKernel

SHAPES = ((7, 9), (4, 5), (2, 3))


def _inputs(batch=2, queries=11, heads=3, head_dim=4, points=2, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    size = sum(h * w for h, w in SHAPES)
    value = torch.randn(batch, size, heads, head_dim, generator=gen, dtype=dtype)
    # some locations outside [0, 1]: zero padding
    locations = torch.rand(batch, queries, heads, len(SHAPES), points, 2, generator=gen,
                           dtype=dtype) * 1.3 - 0.15
    weights = torch.rand(batch, queries, heads, len(SHAPES), points, generator=gen,
                         dtype=dtype).softmax(-1)
    return [t.requires_grad_() for t in (value, locations, weights)]


def reference(value, sizes, locations, weights):
    """Explicit bilinear sampling (four corners gathered by index, zero outside the map,
    pixel centres at (i + 0.5) / size), no grid_sample: (B, Q, C)."""
    batch, _, heads, head_dim = value.shape
    out = value.new_zeros(batch, locations.shape[1], heads, head_dim)
    b = torch.arange(batch)[:, None, None, None]
    h = torch.arange(heads)[None, None, :, None]
    start = 0
    for level, (height, width) in enumerate(sizes):
        level_value = value[:, start:start + height * width]
        start += height * width
        x = locations[:, :, :, level, :, 0] * width - 0.5  # (B, Q, heads, P) pixel coordinates
        y = locations[:, :, :, level, :, 1] * height - 0.5
        for dx in (0, 1):
            for dy in (0, 1):
                xi, yi = x.detach().floor() + dx, y.detach().floor() + dy
                corner = (1 - (x - xi).abs()) * (1 - (y - yi).abs())
                inside = (xi >= 0) & (xi < width) & (yi >= 0) & (yi < height)
                index = (yi.clamp(0, height - 1) * width + xi.clamp(0, width - 1)).long()
                gathered = level_value[b, index, h]  # (B, Q, heads, P, C/heads)
                scale = weights[:, :, :, level] * corner * inside
                out = out + (scale[..., None] * gathered).sum(3)
    return out.flatten(2)


@pytest.mark.parametrize('recompute', [False, True])
def test_definition_equals_float64_reference(recompute):
    inputs = _inputs()
    ours = multi_scale_deformable_attention(inputs[0], SHAPES, inputs[1], inputs[2], recompute)
    theirs = reference(inputs[0], SHAPES, inputs[1], inputs[2])
    assert ours.shape == (2, 11, 12) and ours.dtype == torch.float64
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(ours.square().sum(), inputs)
    ref_grads = torch.autograd.grad(theirs.square().sum(), inputs)
    for name, ours_grad, ref_grad in zip(('value', 'locations', 'weights'), grads, ref_grads):
        torch.testing.assert_close(ours_grad, ref_grad, rtol=1e-10, atol=1e-10, msg=name)
    # float32: to float32 rounding of the float64 reference
    single = [t.detach().float().requires_grad_() for t in inputs]
    out32 = multi_scale_deformable_attention(single[0], SHAPES, single[1], single[2], recompute)
    assert (out32.double() - theirs).abs().max() <= 1e-5 * theirs.abs().max()
    for name, grad, ref_grad in zip(('value', 'locations', 'weights'),
                                    torch.autograd.grad(out32.square().sum(), single), ref_grads):
        assert (grad.double() - ref_grad).abs().max() <= 1e-4 * ref_grad.abs().max(), name


def test_definition_gradients_equal_finite_differences():
    inputs = _inputs(batch=1, queries=3, heads=2, head_dim=2)
    assert torch.autograd.gradcheck(
        lambda v, loc, w: multi_scale_deformable_attention(v, SHAPES, loc, w, True),
        inputs, eps=1e-6, atol=1e-6)


def test_pieces_bound_the_samples_and_give_the_same_result(monkeypatch):
    """Queries in chunks of PIECE_ELEMENTS samples: equal outputs and gradients; autograd keeps
    one samples tensor per (chunk, level) piece, and none with recompute."""
    inputs = _inputs(queries=40, head_dim=8, points=4)
    whole = multi_scale_deformable_attention(inputs[0], SHAPES, inputs[1], inputs[2])
    grads = torch.autograd.grad(whole.square().sum(), inputs)
    monkeypatch.setattr(layer, 'PIECE_ELEMENTS', 2 * 3 * 8 * 4 * 7)  # 7 queries per piece
    for recompute in (False, True):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t,
                                                      lambda t: t):
            out = multi_scale_deformable_attention(inputs[0], SHAPES, inputs[1], inputs[2],
                                                   recompute)
        torch.testing.assert_close(out, whole, rtol=1e-12, atol=1e-12)
        for a, b in zip(torch.autograd.grad(out.square().sum(), inputs), grads):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        # samples: (B*heads, C/heads, queries of the piece, P)
        samples = sorted(s[2] for s in saved if len(s) == 4 and s[:2] == (6, 8) and s[3] == 4)
        assert samples == ([] if recompute else [5] * 3 + [7] * 15), samples


def _autocast_on() -> bool:
    try:
        return torch.is_autocast_enabled('cpu')
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


class FakeKernel:
    """A kernel on CPU that records what it is given and computes with :func:`reference`."""

    def __init__(self, devices=('cpu',)):
        self.calls = []
        self.kernel = DeformAttnKernel('fake', self.forward, devices,
                                       (torch.float32, torch.float64))

    def forward(self, value, shapes, starts, locations, weights, im2col_step):
        self.calls.append(dict(dtypes={value.dtype, locations.dtype, weights.dtype},
                               shapes=shapes.tolist(), starts=starts.tolist(),
                               step=im2col_step, autocast=_autocast_on(),
                               contiguous=all(t.is_contiguous()
                                              for t in (value, locations, weights))))
        return reference(value, shapes.tolist(), locations, weights)


def _module(monkeypatch, kernel=None, note='none here'):
    monkeypatch.setattr(layer, 'find_deform_attn_kernel', lambda: (kernel, note))
    torch.manual_seed(0)
    module = MSDeformAttn(24, len(SHAPES), 3, 2)
    with torch.no_grad():
        module.sampling_offsets.weight.normal_(0, 0.2)
        module.attention_weights.weight.normal_(0, 0.2)
    return module


def _module_inputs():
    gen = torch.Generator().manual_seed(1)
    return (torch.randn(2, 10, 24, generator=gen), torch.rand(2, 10, 1, 2, generator=gen),
            torch.randn(2, sum(h * w for h, w in SHAPES), 24, generator=gen))


def test_kernel_is_chosen_at_build_shown_in_repr_and_run(monkeypatch):
    fake = FakeKernel()
    module = _module(monkeypatch, fake.kernel)
    portable = _module(monkeypatch, None, 'MMVIT_EXT_KERNELS=portable')
    portable.load_state_dict(module.state_dict())
    assert 'kernel=fake (cpu; pytorch elsewhere), deform: fake (float32)' in repr(module)
    assert ('kernel=pytorch (MMVIT_EXT_KERNELS=portable), deform: pytorch grid_sample (float32)'
            in repr(portable))
    # what runs on the module's device, in the dtype the sampling takes (float64 stays)
    cuda_only = _module(monkeypatch, FakeKernel(devices=('cuda',)).kernel)
    assert cuda_only.runs() == 'pytorch grid_sample (float32)'
    assert (_module(monkeypatch, fake.kernel).double().runs(),
            _module(monkeypatch, fake.kernel).half().runs()) == ('fake (float64)', 'fake (float32)')
    query, ref, feat = _module_inputs()
    out = module(query, ref, feat, SHAPES)
    assert len(fake.calls) == 1
    call = fake.calls[0]
    assert call['shapes'] == [list(s) for s in SHAPES] and call['starts'] == [0, 63, 83]
    assert call['dtypes'] == {torch.float32} and call['step'] == 2 and call['contiguous']
    expected = portable(query, ref, feat, SHAPES)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), list(module.parameters()))
    expected_grads = torch.autograd.grad(expected.square().sum(), list(portable.parameters()))
    for grad, expected_grad in zip(grads, expected_grads):
        assert (grad - expected_grad).abs().max() <= 1e-4 * expected_grad.abs().max() + 1e-7


def test_kernel_sees_float32_under_bf16_autocast_and_bf16_inputs(monkeypatch):
    fake = FakeKernel()
    module = _module(monkeypatch, fake.kernel)
    query, ref, feat = _module_inputs()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = module(query, ref, feat, SHAPES)
    # value arrives in bfloat16 from the projection, locations and weights in float32:
    # all float32 inside, autocast off, and back in the projection's dtype after output_proj
    assert fake.calls[-1]['dtypes'] == {torch.float32} and not fake.calls[-1]['autocast']
    assert out.dtype == torch.bfloat16
    value, locations, weights = (t.detach().bfloat16() for t in _inputs(dtype=torch.float32))
    got = multi_scale_deformable_attention(value, SHAPES, locations, weights, kernel=fake.kernel)
    assert fake.calls[-1]['dtypes'] == {torch.float32}  # no bfloat16 kernel: cast at the boundary
    assert got.dtype == torch.bfloat16  # and back
    definition = multi_scale_deformable_attention(value, SHAPES, locations, weights)
    assert (got.float() - definition.float()).abs().max() <= 2e-2 * definition.abs().max().float()


def test_definition_runs_in_export_under_compile_and_on_other_devices(monkeypatch):
    fake = FakeKernel()
    value, locations, weights = (t.detach() for t in _inputs())
    assert why_portable(fake.kernel, value) is None
    assert why_portable(None, value) == 'no kernel'
    assert why_portable(FakeKernel(devices=('cuda',)).kernel, value) == 'cpu tensors'
    for flag, reason in (('is_exporting', 'export'), ('is_compiling', 'torch.compile')):
        with monkeypatch.context() as patch:
            patch.setattr(torch_compat, flag, lambda: True)
            assert why_portable(fake.kernel, value) == reason
            multi_scale_deformable_attention(value, SHAPES, locations, weights,
                                             kernel=fake.kernel)
    with monkeypatch.context() as patch:
        patch.setattr(torch.onnx, 'is_in_onnx_export', lambda: True)
        assert why_portable(fake.kernel, value) == 'export'
    assert fake.calls == []


def test_onnx_export_holds_no_kernel_call(monkeypatch, tmp_path):
    """A real (TorchScript) ONNX export of a module built with a kernel: the graph holds the
    portable grid_sample and the kernel is never called."""
    pytest.importorskip('onnx')
    fake = FakeKernel()
    module = _module(monkeypatch, fake.kernel).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = module

        def forward(self, query, ref, feat):
            return self.attn(query, ref, feat, SHAPES)

    path = tmp_path / 'msda.onnx'
    torch.onnx.export(Wrapped(), _module_inputs(), str(path), opset_version=17, dynamo=False)
    import onnx
    assert 'GridSample' in {node.op_type for node in onnx.load(str(path)).graph.node}
    assert fake.calls == []


def test_portable_env_builds_without_kernel(monkeypatch):
    monkeypatch.setenv(ops.ms_deform_attn.PORTABLE_ENV, 'portable')
    kernel, note = ops.find_deform_attn_kernel()
    assert kernel is None and note == 'MMVIT_EXT_KERNELS=portable'
    assert 'kernel=pytorch (MMVIT_EXT_KERNELS=portable)' in repr(MSDeformAttn(24, 3, 3, 2))


def test_mmcv_kernel_is_cuda_only():
    """mmcv's compiled op refuses CPU tensors (mmcv 2.x has no CPU kernel for it): the kernel is
    declared for CUDA only, and not offered at all by ops built without CUDA."""
    ext = pytest.importorskip('mmcv._ext', reason='no mmcv compiled ops here')
    from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    value, locations, weights = (t.detach().float().contiguous() for t in _inputs())
    with pytest.raises(Exception):
        MultiScaleDeformableAttnFunction.apply(value, torch.tensor(SHAPES),
                                               torch.tensor([0, 63, 83]), locations, weights, 2)
    kernel, note = ops.ms_deform_attn._mmcv_kernel()
    if ext.get_compiling_cuda_version() == 'not available':
        assert kernel is None and note == 'mmcv ops built without CUDA'
    else:
        assert kernel.name == 'mmcv' and kernel.devices == ('cuda',)
        assert kernel.dtypes == (torch.float32, torch.float64)
        assert why_portable(kernel, value) == 'cpu tensors'


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA (mmcv has only a CUDA '
                    'kernel for multi-scale deformable attention)')
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_mmcv_kernel_matches_definition(dtype):
    kernel, note = ops.ms_deform_attn._mmcv_kernel()
    assert kernel is not None, f'CUDA without mmcv ops: {note}'
    inputs = [t.detach().to('cuda', dtype).requires_grad_()
              for t in _inputs(queries=200, heads=4, head_dim=32, points=4, dtype=dtype)]
    assert why_portable(kernel, inputs[0]) is None
    ours = multi_scale_deformable_attention(*inputs[:1], SHAPES, *inputs[1:], kernel=kernel)
    definition = multi_scale_deformable_attention(*inputs[:1], SHAPES, *inputs[1:])
    tight = 1e-5 if dtype == torch.float32 else 1e-12
    assert (ours - definition).abs().max() <= tight * definition.abs().max()
    grad_out = torch.randn_like(definition)
    grads = torch.autograd.grad(ours, inputs, grad_out)
    expected = torch.autograd.grad(definition, inputs, grad_out)
    bounds = (1e-4, 1e-3, 1e-4) if dtype == torch.float32 else (1e-10, 1e-9, 1e-10)
    for name, grad, ref, bound in zip(('value', 'locations', 'weights'), grads, expected, bounds):
        error = ((grad - ref).abs().max() / ref.abs().max()).item()
        assert error <= bound, (name, error)
