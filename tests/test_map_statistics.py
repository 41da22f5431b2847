"""DeepViT / Refined-ViT map-transform BatchNorms behave like any BatchNorm: a block called in
training counts its batch in the running statistics once per forward, whoever calls it (the
backbone's forward or other code), also when ``with_cp`` or the Refiner's own recompute runs
the block again in backward; eager and compiled."""
import pytest
import torch
from torch import nn

from mmvit_ext.backbones import DeepViT, RefinedViT
from mmvit_ext.layers import ReAttention, RefinerMap

ARCH = dict(embed_dims=32, depth=2, num_heads=2)
CASES = {
    'DeepViT': (DeepViT, dict(arch=dict(ARCH, reattention_blocks=2))),
    'RefinedViT': (RefinedViT, dict(arch=dict(ARCH, conv_stem=(8, 8, 16)))),
}
BACKEND = 'aot_eager_decomp_partition'  # AOT autograd with inductor's partitioner, no C++ build


def _build(name: str, **extra) -> nn.Module:
    cls, cfg = CASES[name]
    torch.manual_seed(0)
    return cls(**cfg, window_size=None, drop_path_rate=0.0, **extra).double().train()


def _map_norms(model: nn.Module) -> dict:
    return {name: module for name, module in model.named_modules()
            if isinstance(module, nn.BatchNorm2d) and '.attn.' in name}


def _train_last_block(model: nn.Module, direct: bool, backend=None, steps: int = 2) -> None:
    """``steps`` forward/backward passes through the last block (a Refiner block for
    Refined-ViT): called directly, or through the backbone's ``run_block`` (where ``with_cp``
    checkpoints whole blocks)."""
    block = model.blocks[-1]

    def step(tokens: torch.Tensor, prev_map: torch.Tensor) -> torch.Tensor:
        args = (tokens, (4, 4)) + ((prev_map,) if isinstance(model, RefinedViT) else ())
        out = block(*args) if direct else model.run_block(block, *args)
        return out[0] if isinstance(out, tuple) else out

    run = step if backend is None else torch.compile(step, backend=backend)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        tokens = torch.randn(2, 16, 32, generator=gen, dtype=torch.float64, requires_grad=True)
        prev_map = torch.rand(2, 2, 16, 16, generator=gen, dtype=torch.float64).softmax(-1)
        run(tokens, prev_map).square().sum().backward()


@pytest.mark.parametrize('compiled', [False, True], ids=['eager', 'compiled'])
@pytest.mark.parametrize('with_cp', [False, 'attn', True], ids=str)
@pytest.mark.parametrize('name', sorted(CASES))
def test_block_called_directly_counts_its_batch_once(name, with_cp, compiled):
    """The plain modules (no checkpoint, no Refiner recompute) are the reference: the same
    running statistics after two steps, ``num_batches_tracked == 2``. ``with_cp=True``
    checkpoints whole blocks in ``run_block``; ``'attn'`` checkpoints the attention inside
    the block's own call."""
    if compiled:
        torch._dynamo.reset()
    reference = _build(name, **({'recompute_maps': False} if name == 'RefinedViT' else {}))
    model = _build(name, with_cp=with_cp)
    model.load_state_dict(reference.state_dict())
    _train_last_block(reference, direct=True)
    _train_last_block(model, direct=with_cp is not True, backend=BACKEND if compiled else None)
    expected, got = _map_norms(reference), _map_norms(model)
    last = f'blocks.{len(model.blocks) - 1}.'
    assert any(name.startswith(last) for name in got)
    for name, norm in got.items():
        if name.startswith(last):
            assert int(norm.num_batches_tracked) == 2, name
            torch.testing.assert_close(norm.running_mean, expected[name].running_mean, msg=name)
            torch.testing.assert_close(norm.running_var, expected[name].running_var, msg=name)


@pytest.mark.parametrize('with_cp', [False, True], ids=str)
@pytest.mark.parametrize('name', sorted(CASES))
def test_forward_features_counts_each_transform_once(name, with_cp):
    """The whole backbone: every map transform's norms count one batch per training step."""
    model = _build(name, with_cp=with_cp)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    for _ in range(2):
        sum(out.square().sum() for out in model(x)).backward()
    norms = _map_norms(model)
    assert norms and all(int(norm.num_batches_tracked) == 2 for norm in norms.values())


def test_transforms_count_in_their_own_forward():
    """No owner needed: a ReAttention or a RefinerMap alone counts as a BatchNorm does."""
    for transform in (ReAttention(2), RefinerMap(2, recompute=True),
                      RefinerMap(2, recompute=False)):
        transform.train()
        transform(torch.rand(2, 2, 5, 5).softmax(-1).requires_grad_()).sum().backward()
        norms = [m for m in transform.modules() if isinstance(m, nn.BatchNorm2d)]
        assert [int(norm.num_batches_tracked) for norm in norms] == [1] * len(norms)
        assert all(norm.running_var.ne(1).any() for norm in norms)
