"""The backbone contract as checks on any backbone class, so that every registered family --
and a new one -- runs the same suite (tests/test_contract.py, tests/test_new_family.py).

Each check takes the backbone class and the constructor arguments of one case."""
import math
from pathlib import Path
from typing import Any, Dict, Tuple, Type

import pytest
import torch

from mmvit_ext import flags
from mmvit_ext.backbones import BaseBackbone
from mmvit_ext.backbones.checkpointing import parse_with_cp
from mmvit_ext.converters import CheckpointError, save_state_dict

# backbone -> the torch op it runs that has no double-backward formula in torch (torch's error
# names it): ViT-Adapter's deformable attention samples with grid_sample; TimmBackbone runs
# timm's own attention, which flags.fused_attention does not switch (timm's fused_attn does)
DOUBLE_BACKWARD_LACKS = {'ViTAdapter': 'grid_sampler_2d_backward',
                         'DINOv3Adapter': 'grid_sampler_2d_backward',
                         'TimmBackbone': '_scaled_dot_product_flash_attention'}

SIZES = [(112, 137), (224, 224), (513, 769)]


def check_output_shapes(cls: Type[BaseBackbone], cfg: dict, size: Tuple[int, int]) -> None:
    model = cls(**cfg).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    assert isinstance(outs, tuple) and len(outs) == len(model.out_channels)
    assert len(model.out_channels) == len(model.strides) == len(outs)
    for out, channels, stride in zip(outs, model.out_channels, model.strides):
        assert out.shape == (1, channels, math.ceil(size[0] / stride), math.ceil(size[1] / stride))
        assert torch.isfinite(out).all()
    assert [tuple(o.shape[1:]) for o in outs] == model.output_shapes(*size)


def check_out_indices_subset_and_negative(cls: Type[BaseBackbone], cfg: dict) -> None:
    model = cls(**cfg, out_indices=(-1, 1)).eval()
    full = cls(**cfg).eval()
    assert model.out_indices == (1, full.num_outputs - 1)  # sorted, shallow to deep
    outs = model(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [full.level_channels[1], full.level_channels[-1]]


def check_frozen_stages(cls: Type[BaseBackbone], cfg: dict) -> None:
    model = cls(**cfg, frozen_stages=1, drop_path_rate=0.0)
    model.train()
    frozen = model.frozen_modules()
    assert frozen, 'frozen_stages=1 froze nothing'
    frozen_params = {id(p) for m in frozen for p in m.parameters()}
    frozen_params |= {id(p) for p in model.frozen_parameters()}
    assert all(not sub.training for mod in frozen for sub in mod.modules())
    sum(o.sum() for o in model(torch.randn(2, 3, 64, 64))).backward()
    for pname, param in model.named_parameters():
        if id(param) in frozen_params:
            assert not param.requires_grad and param.grad is None, pname
        elif param.requires_grad:
            assert param.grad is not None, f'{pname} got no gradient'
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert 0 < len(trainable) < len(list(model.parameters()))


def check_with_cp(cls: Type[BaseBackbone], cfg: dict, setting: Any = True) -> None:
    """``with_cp=setting`` (``'per_stage'``: the first block of stage 0 and every block of the
    others) recomputes what it selects -- a selected block or part is called twice, the rest
    once, a chunked MLP once per chunk in the forward, the block's recomputation and its own --
    with the plain run's outputs and gradients and the plain model's names."""
    plain = cls(**cfg, drop_path_rate=0.0).train()
    if setting == 'per_stage':
        setting = [1] + [True] * (len(plain.checkpoint_stages()) - 1)
    ckpt = cls(**cfg, drop_path_rate=0.0, with_cp=setting).train()
    ckpt.load_state_dict(plain.state_dict())
    stages = ckpt.checkpoint_stages()
    plan = parse_with_cp(setting, cls.__name__)
    parts = plan.parts(stages, cls.__name__)
    assert any(parts), (setting, parts)
    runs: Dict[str, int] = {}
    expected = {}
    chunked = set()
    for index, (block, part) in enumerate(zip([b for s in stages for b in s], parts)):
        for name, module, recomputed in ((f'{index}', block, part == 'block'),
                                         (f'{index}.attn', getattr(block, 'attn', None),
                                          part in ('block', 'attn')),
                                         (f'{index}.mlp', block.mlp, part in ('block', 'mlp'))):
            if module is None:  # a convolutional block (ConvNeXt) mixes tokens without attention
                continue
            module.register_forward_pre_hook(  # a recomputation may stop before the end
                lambda *_, key=name: runs.__setitem__(key, runs.get(key, 0) + 1))
            expected[name] = 2 if recomputed else 1
        if part == 'block' and plan.mlp_chunks > 1:  # each chunk a call: forward, its own
            chunked.add(f'{index}.mlp')  # recomputation, the block's (which may stop early)
    x = torch.randn(2, 3, 72, 56)
    outs_a, outs_b = plain(x), ckpt(x)
    for a, b in zip(outs_a, outs_b):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    sum((o ** 2).mean() for o in outs_a).backward()
    sum((o ** 2).mean() for o in outs_b).backward()
    for key in chunked:
        assert 2 * plan.mlp_chunks <= runs.pop(key) <= 3 * plan.mlp_chunks, key
        expected.pop(key)
    assert runs == expected, (setting, runs)
    grads_b = dict(ckpt.named_parameters())
    assert list(grads_b) == [n for n, _ in plain.named_parameters()]
    assert list(ckpt.state_dict()) == list(plain.state_dict())
    for pname, param in plain.named_parameters():
        torch.testing.assert_close(param.grad, grads_b[pname].grad, atol=1e-6, rtol=1e-5)


def check_state_dict_roundtrip(cls: Type[BaseBackbone], cfg: dict, path: Path) -> None:
    source = cls(**cfg).eval()
    save_state_dict(source.state_dict(), path)
    target = cls(**cfg, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    target.init_weights()
    target.eval()
    for key, value in source.state_dict().items():
        assert torch.equal(value, target.state_dict()[key]), key
    x = torch.randn(1, 3, 48, 40)
    for a, b in zip(source(x), target(x)):
        assert torch.equal(a, b)


def check_bad_arguments(cls: Type[BaseBackbone], cfg: dict) -> None:
    with pytest.raises(ValueError, match="unknown arch 'nope'"):
        cls(**dict(cfg, arch='nope'))
    with pytest.raises(ValueError, match='missing keys'):
        cls(**dict(cfg, arch={}))
    with pytest.raises(ValueError, match='out_indices entry 99'):
        cls(**cfg, out_indices=(0, 99))
    with pytest.raises(ValueError, match='duplicates'):
        cls(**cfg, out_indices=(1, 1))
    with pytest.raises(ValueError, match='frozen_stages=99'):
        cls(**cfg, frozen_stages=99)
    model = cls(**cfg).eval()
    with pytest.raises(ValueError, match='in_channels=3 but the input has 4 channels'):
        model(torch.randn(1, 4, 64, 64))
    with pytest.raises(ValueError, match='expects a'):
        model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match='at least'):
        model(torch.randn(1, 3, 2, 64))


def check_unknown_layout_refused(cls: Type[BaseBackbone], cfg: dict, path: Path) -> None:
    torch.save({'state_dict': {'foo.weight': torch.zeros(2), 'bar.bias': torch.zeros(2)}}, path)
    model = cls(**cfg, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match='shares no key'):
        model.init_weights()


def check_meta_device(cls: Type[BaseBackbone], cfg: dict) -> None:
    """Built and run on ``meta`` (deferred init, shape checks; the non-CPU code paths)."""
    with torch.device('meta'):
        model = cls(**cfg)
    with torch.no_grad():
        outs = model.eval()(torch.empty(2, 3, 200, 328, device='meta'))
    assert [tuple(o.shape[1:]) for o in outs] == model.output_shapes(200, 328)


def check_early_out_indices_train_every_parameter(cls: Type[BaseBackbone], cfg: dict) -> None:
    """DDP without find_unused_parameters needs a gradient for every trainable parameter:
    levels after the last output are not built, and their checkpoint keys are expected drops."""
    full = cls(**cfg, drop_path_rate=0.0)
    for index in sorted({0, full.num_outputs // 2}):
        model = cls(**cfg, out_indices=(index,), drop_path_rate=0.0).train()
        outs = model(torch.randn(2, 3, 64, 48))
        sum(o.float().pow(2).mean() for o in outs).backward()
        missing = [k for k, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert missing == [], f'out_indices=({index},): no gradient for {missing}'
        dropped = model.unused_checkpoint_keys(list(full.state_dict()))
        assert set(full.state_dict()) - set(model.state_dict()) == set(dropped)


def _first_block(model: BaseBackbone) -> torch.nn.Module:
    return model.checkpoint_stages()[0][0]


def _param_grads(model: torch.nn.Module, x: torch.Tensor) -> Dict[str, torch.Tensor]:
    model.zero_grad()
    sum((o ** 2).mean() for o in model(x)).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _double_backward(model: torch.nn.Module, x: torch.Tensor) -> None:
    x = x.clone().requires_grad_()
    (grad_x,) = torch.autograd.grad(sum(o.pow(2).mean() for o in model(x)), x, create_graph=True)
    (again,) = torch.autograd.grad(grad_x.pow(2).sum(), x)
    assert again.shape == x.shape and torch.isfinite(again).all() and again.abs().sum() > 0


def check_autograd_contract(cls: Type[BaseBackbone], cfg: dict) -> None:
    """What autograd allows holds: an in-place op on a LayerNorm output in a forward hook gives
    the gradients of the same op out of place; double backward runs; forward hooks on the MLP's
    layers fire once per call; two threads sharing the model give the sequential outputs."""
    torch.manual_seed(0)
    model = cls(**cfg, drop_path_rate=0.0).train()
    x = torch.randn(2, 3, 64, 48)
    block = _first_block(model)
    norm = block.norm1 if isinstance(getattr(block, 'norm1', None), torch.nn.LayerNorm) else next(
        m for m in block.modules() if isinstance(m, torch.nn.LayerNorm))
    handle = norm.register_forward_hook(lambda m, i, o: o * 1.5)
    expected = _param_grads(model, x)
    handle.remove()
    handle = norm.register_forward_hook(lambda m, i, o: o.mul_(1.5))
    got = _param_grads(model, x)
    handle.remove()
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], atol=1e-6, rtol=1e-5, msg=key)

    # double backward (gradient penalties, MAML): torch's fused CPU attention kernel has no
    # double backward and says so, naming itself; the explicit path (fused_attention(False)) has
    # one, except for the torch ops a family runs that have no double-backward formula in torch
    # at all (DOUBLE_BACKWARD_LACKS), where torch's error names the op
    lacks = DOUBLE_BACKWARD_LACKS.get(cls.__name__)
    try:
        _double_backward(model, x)
    except RuntimeError as error:
        assert 'scaled_dot_product' in str(error) or (lacks and lacks in str(error)), error
    with flags.fused_attention(False):
        try:
            _double_backward(model, x)
        except RuntimeError as error:
            assert lacks and f'derivative for aten::{lacks}' in str(error), error

    calls: Dict[str, int] = {}
    for name in ('fc1', 'act', 'fc2'):
        layer = getattr(block.mlp, name, None)
        if layer is not None:
            layer.register_forward_hook(
                lambda m, i, o, key=name: calls.__setitem__(key, calls.get(key, 0) + 1))
    assert calls == {} and {'fc1', 'fc2'} <= {n for n, _ in block.mlp.named_children()}
    model.eval()
    with torch.no_grad():
        sequential = [model(x), model(x.flip(-1))]
    assert set(calls.values()) == {2}, calls  # once per call, at inference too

    import threading
    results: Dict[int, Any] = {}

    def run(index: int, inputs: torch.Tensor) -> None:
        with torch.no_grad():
            results[index] = model(inputs)

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate((x, x.flip(-1)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, outs in enumerate(sequential):
        for a, b in zip(outs, results[index]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
