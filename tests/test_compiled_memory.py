"""Every activation-memory saving holds under ``torch.compile``: the Refiner's recompute of its
expanded maps and ``with_cp`` (whole blocks, or their attention / MLP) keep for backward what
eager keeps (bytes of the tensors saved for backward, each storage once), within a small
tolerance.

Compiled with ``aot_eager_decomp_partition``: dynamo, AOT autograd, inductor's decompositions
and its min-cut partitioner (the part that decides what is saved), without the C++ build."""
from typing import Any, Callable, Tuple

import pytest
import torch

from mmvit_ext.backbones import DeepViT, RefinedViT
from mmvit_ext.layers import RefinerMap

BACKEND = 'aot_eager_decomp_partition'
ARCH = dict(embed_dims=32, depth=4, num_heads=2)
MODELS = {
    'DeepViT': (DeepViT, dict(arch=dict(ARCH, reattention_blocks=4))),
    'RefinedViT': (RefinedViT, dict(arch=dict(ARCH, conv_stem=(8, 8, 16)))),
}


def saved_bytes(fn: Callable[..., Any], *args: Any) -> Tuple[Any, int]:
    """``fn(*args)`` and the bytes of the tensors autograd saves for its backward, summed over
    distinct storages (views and repeats of one tensor count once)."""
    storages = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn(*args)
    return out, sum(storages.values())


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(fn, backend=BACKEND)


def test_refiner_recompute_holds_under_compile():
    """A (2, 6, 64, 64) map: the recompute keeps about the input maps (and their reduction),
    not the 3x expanded ones, eager and compiled alike."""
    maps = torch.rand(2, 6, 64, 64).softmax(-1).requires_grad_()
    map_bytes = maps.numel() * maps.element_size()
    kept = {}
    for recompute in (True, False):
        refiner = RefinerMap(6, expand_ratio=3, scale=0.5, recompute=recompute).train()
        _, kept[recompute, 'eager'] = saved_bytes(refiner, maps)
        _, kept[recompute, 'compiled'] = saved_bytes(_compiled(refiner), maps)
    eager, compiled = kept[True, 'eager'], kept[True, 'compiled']
    assert eager <= 2 * map_bytes, kept  # the maps and their reduction (H channels each)
    assert compiled <= 1.05 * eager + 16 * 2 ** 10, kept  # a few weights more
    assert compiled < 0.25 * kept[False, 'compiled'], kept
    assert eager < 0.25 * kept[False, 'eager'], kept


@pytest.mark.parametrize('with_cp', [True, 'attn', 'mlp'], ids=str)
@pytest.mark.parametrize('name', sorted(MODELS))
def test_checkpointing_holds_under_compile(name, with_cp):
    """with_cp: compiled keeps what eager keeps (within 10%, and a copy of the weights,
    which the compiled backward may keep transposed), both less than without checkpoints. 64
    tokens, so that the maps outweigh the tiny model's weights as they do at real sizes."""
    cls, cfg = MODELS[name]
    x = torch.randn(2, 3, 128, 128)
    kept = {}
    for setting in (with_cp, False):
        torch.manual_seed(0)
        model = cls(**cfg, window_size=None, drop_path_rate=0.0, with_cp=setting).train()
        _, kept[setting, 'eager'] = saved_bytes(model, x)
        _, kept[setting, 'compiled'] = saved_bytes(_compiled(model), x)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    eager, compiled = kept[with_cp, 'eager'], kept[with_cp, 'compiled']
    assert compiled <= 1.1 * eager + weight_bytes, (kept, weight_bytes)
    # the blocks' activations go (a part's input stays); the conv stem's (Refined-ViT) stay
    saving = 0.85 if with_cp is True else 1.0
    assert eager < saving * kept[False, 'eager'], kept
    assert compiled < saving * kept[False, 'compiled'], kept


def test_training_outputs_and_gradients_equal_eager():
    """The compiled Refined-ViT with both savings on computes eager's outputs and gradients
    (float64: in float32 the compiled BatchNorm's other summation order moves the small
    gradients of the stacked norms by up to 0.5%)."""
    cls, cfg = MODELS['RefinedViT']
    torch.manual_seed(0)
    model = cls(**cfg, window_size=None, drop_path_rate=0.0, with_cp=True).train().double()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    grads = []
    for run in (model, _compiled(model)):
        model.zero_grad()
        outs = run(x)
        sum(out.square().mean() for out in outs).backward()
        grads.append(({n: p.grad.clone() for n, p in model.named_parameters()}, outs))
    (eager_grads, eager_outs), (compiled_grads, compiled_outs) = grads
    for a, b in zip(eager_outs, compiled_outs):
        torch.testing.assert_close(a, b)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, msg=name)

