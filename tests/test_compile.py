"""torch.compile: every backbone's forward traces as one graph (no graph breaks)."""
import pytest
import torch

from mmvit_ext.registry import MODELS
from backbone_cases import SMALL

CASES = [(name, mode, {}) for name in sorted(SMALL) for mode in ('train', 'eval')]
CASES += [(name, 'eval', dict(simple_pyramid=True)) for name in ('DeepViT', 'CaiT', 'RefinedViT')]


@pytest.mark.parametrize('name,mode,extra', CASES)
def test_forward_has_no_graph_breaks(name, mode, extra):
    import torch._dynamo as dynamo
    model = MODELS.build(dict(type=f'mmvit_ext.{name}', **{**SMALL[name], **extra}))
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
