"""torch.compile: every backbone's forward traces as one graph (no graph breaks)."""
import pytest
import torch

from mmvit_ext.registry import MODELS
from backbone_cases import OWN_CODE as SMALL  # not library wrappers
from backbone_cases import TINY_DINOV3


CASES = [(name, mode, {}) for name in sorted(SMALL) for mode in ('train', 'eval')]
CASES += [(name, 'eval', dict(simple_pyramid=True)) for name in ('DeepViT', 'CaiT', 'RefinedViT')]


@pytest.mark.parametrize('name,mode,extra', CASES)
def test_forward_has_no_graph_breaks(name, mode, extra):
    _check_one_graph(MODELS.build(dict(type=f'mmvit_ext.{name}', **{**SMALL[name], **extra})), mode)


@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_dinov3_forward_has_no_graph_breaks(mode):
    _check_one_graph(MODELS.build(dict(type='mmvit_ext.VisionTransformer', **TINY_DINOV3)), mode)


def _check_one_graph(model, mode):
    import torch._dynamo as dynamo
    model.train(mode == 'train')
    dynamo.reset()
    x = torch.randn(2, 3, 64, 80)
    explanation = dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    if mode == 'eval':
        compiled = torch.compile(model, backend='eager')
        with torch.no_grad():
            for a, b in zip(model(x), compiled(x)):
                torch.testing.assert_close(a, b)


@pytest.mark.parametrize('name', ['SwinTransformer'])
def test_inductor_compiles_training_step(name):
    """The default backend (inductor's generated C++ on CPU) builds and runs forward + backward
    of a shifted-window backbone and agrees with eager: the shift mask's slice assignments
    once made inductor emit C++ that gcc rejects."""
    torch.manual_seed(0)
    model = MODELS.build(dict(type=f'mmvit_ext.{name}', **{**SMALL[name], 'drop_path_rate': 0.0}))
    model.train()
    torch._dynamo.reset()
    x = torch.randn(2, 3, 64, 80)
    outs = torch.compile(model)(x)
    sum(o.square().mean() for o in outs).backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    refs = model(x)
    sum(o.square().mean() for o in refs).backward()
    for a, b in zip(outs, refs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-3, atol=1e-5, msg=n)
