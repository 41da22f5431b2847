"""Each attention call site runs a fused kernel only where PyTorch's gates take its operands, and
never computes its attention product in float32 under bfloat16 / float16 autocast: measured on
the CPU (profiler op names and dispatched dtypes, :mod:`attention_kernels`) for every site x
inference / training x fp32 / bf16 / fp16; the table of :mod:`mmvit_ext.layers.sdpa_kernels`
agrees with what SDPA itself picks; the deformable attentions sample with ``grid_sample`` in
float32, as our module's repr says; docs/speed.md holds the measured table."""
import itertools
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from attention_kernels import (DEFORM_SITES, DTYPES, FLASH, MATH, MODES, SITES, Run, _site,
                               markdown_table, measure, short_dtype)
from mmvit_ext.layers import MSDeformAttn, fused_sdpa_kernel
from mmvit_ext.layers.sdpa_kernels import FIXED, LEARNED

ROOT = Path(__file__).resolve().parents[1]


def _sdpa_backend(dtype, mask, dropout, v_dim):
    """What SDPA runs on the CPU for one form of operands, read from the profiler."""
    torch.manual_seed(0)
    q = torch.randn(2, 2, 8, 8, dtype=dtype)
    v = torch.randn(2, 2, 8, v_dim, dtype=dtype)
    attn_mask = None
    if mask is not None:
        attn_mask = torch.randn(1, 2, 8, 8, dtype=dtype, requires_grad=mask == LEARNED)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, q, v, attn_mask=attn_mask, dropout_p=dropout)
    names = {event.name for event in prof.events()}
    assert (FLASH in names) != (MATH in names)
    return FLASH in names


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16])
def test_kernel_table_matches_what_sdpa_picks_on_cpu(dtype):
    for mask, dropout, v_dim in itertools.product((None, FIXED, LEARNED), (0.0, 0.5), (8, 16)):
        kernel = fused_sdpa_kernel('cpu', dtype, 8, v_dim, mask, dropout > 0)
        assert (kernel is not None) == _sdpa_backend(dtype, mask, dropout, v_dim), \
            (mask, dropout, v_dim)


def test_cuda_rows_take_what_the_cpu_refuses():
    """The table's CUDA rows: the memory-efficient kernel takes a bias with a gradient and
    q / k wider than v; flash takes no mask; float32 goes to the memory-efficient kernel."""
    assert fused_sdpa_kernel('cuda', torch.bfloat16, 32, 32).name == 'cuda flash'
    assert fused_sdpa_kernel('cuda', torch.bfloat16, 32, 32, LEARNED).name == 'cuda mem-efficient'
    assert fused_sdpa_kernel('cuda', torch.float32, 32, 32, FIXED).name == 'cuda mem-efficient'
    assert fused_sdpa_kernel('cuda', torch.bfloat16, 40, 32).name == 'cuda mem-efficient'
    assert fused_sdpa_kernel('cuda', torch.bfloat16, 36, 32) is None  # alignment: math
    assert fused_sdpa_kernel('cpu', torch.bfloat16, 32, 32, LEARNED) is None


@pytest.mark.parametrize('name', list(SITES))
def test_no_attention_product_in_float32_under_autocast(name):
    for dtype, mode in itertools.product(('bf16', 'fp16'), MODES):
        run = measure(name, mode, dtype)
        assert run.kernel != 'math' and run.product_dtypes == (dtype,), (dtype, mode, run)
    for mode in MODES:  # float32: no math fallback either
        assert measure(name, mode, 'fp32') in ((('flash', ('fp32',))), ('explicit', ('fp32',)))


@pytest.mark.parametrize('name', list(SITES))
def test_repr_names_the_kernel_that_runs(name):
    module = _site(name)[0]
    ran = {mode: {measure(name, mode, dtype).kernel for dtype in DTYPES} for mode in MODES}
    if module.map_transforms or not module.fused:
        assert 'explicit (' in module.extra_repr() and all(
            kernels == {'explicit'} for kernels in ran.values())
        return
    paths = {}
    for mode in MODES:
        forms = module.operand_forms(training=mode == 'training')
        taken = any(fused_sdpa_kernel('cpu', torch.float32, module.head_dim + (
            0 if form.same_value_dim else 8), module.head_dim, form.mask) for form in forms)
        assert ran[mode] == {'flash' if taken else 'explicit'}, (mode, ran)  # every dtype
        paths[mode] = 'cpu flash' if taken else 'explicit'
    expected = paths['inference'] if len(set(paths.values())) == 1 else \
        f"{paths['inference']} in inference; {paths['training']} in training"
    assert module.extra_repr().endswith(f'fused: {expected}')


@pytest.mark.parametrize('name', list(DEFORM_SITES))
def test_deformable_attention_samples_in_float32_as_the_repr_says(name):
    """mmcv's kernel is CUDA-only: on the CPU every deformable attention (ours, and mmcv's
    module in mmdet's pixel decoder) samples with ``grid_sample``, in float32 under every
    autocast dtype; ours names that path and dtype in its repr."""
    module = _site(name)[0]
    runs = {measure(name, mode, dtype) for dtype in DTYPES for mode in MODES}
    assert runs == {Run('grid_sample', ('fp32',))}, runs
    if isinstance(module, MSDeformAttn):
        assert short_dtype(module.sampling_dtype()) == 'fp32'
        assert module.extra_repr().endswith('deform: pytorch grid_sample (float32)')


def test_speed_doc_holds_the_measured_table():
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        table = markdown_table()
    assert table in (ROOT / 'docs' / 'speed.md').read_text(), \
        f'docs/speed.md: replace the attention-kernel table by\n{table}'
