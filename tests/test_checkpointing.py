"""Dialable activation checkpointing (mmvit_ext.backbones.checkpointing): every setting recomputes
what it selects and gives the plain run's gradients in every registered family; also with frozen_stages, bf16 autocast and torch.compile. Bad settings raise
naming with_cp; eval and no-grad forwards recompute nothing."""
import pytest
import torch

import contract
from backbone_cases import SMALL
from mmvit_ext.backbones import family_classes
from mmvit_ext.errors import ConfigError
from mmvit_ext.registry import MODELS

FAMILIES = sorted(cls.__name__ for cls in family_classes().values())
SETTINGS = [2, 'per_stage', 'attn', 'mlp', dict(blocks=1, part='mlp')]


def test_every_registered_family_has_a_small_case():
    assert set(FAMILIES) <= set(SMALL)


def _has_attention(name):
    model = MODELS.get(name)(**SMALL[name])
    return all(hasattr(b, 'attn') for s in model.checkpoint_stages() for b in s)


@pytest.mark.parametrize('setting', SETTINGS, ids=str)
@pytest.mark.parametrize('name', FAMILIES)
def test_setting_gives_plain_gradients(name, setting):
    """Every setting in every family; 'attn' in a family whose blocks have no attention (the
    convolutional ConvNeXt) is refused, naming the part."""
    if setting == 'attn' and not _has_attention(name):
        with pytest.raises(ConfigError, match="with_cp part 'attn' needs blocks whose 'attn'"):
            contract.check_with_cp(MODELS.get(name), SMALL[name], setting)
        return
    contract.check_with_cp(MODELS.get(name), SMALL[name], setting)


def _token_wise(name):
    model = MODELS.get(name)(**SMALL[name])
    return all(getattr(b.mlp, 'token_wise', False) for s in model.checkpoint_stages() for b in s)


@pytest.mark.parametrize('name', FAMILIES)
def test_mlp_chunks_give_plain_gradients(name):
    """Whole blocks with their MLP in token chunks: the plain run's outputs and gradients;
    a family whose MLP mixes tokens (PVTv2's depthwise conv) is refused, naming it."""
    setting = dict(blocks=True, mlp_chunks=3)
    if _token_wise(name):
        contract.check_with_cp(MODELS.get(name), SMALL[name], setting)
    else:
        with pytest.raises(ConfigError, match='mlp_chunks needs a token-wise MLP'):
            contract.check_with_cp(MODELS.get(name), SMALL[name], setting)


def test_mlp_chunks_recompute_each_chunk_on_its_own():
    """fc1 of a chunked block's MLP runs once per chunk in the forward, again in the block's
    recomputation and again in chunks' own recomputations (more than those 2 x 3 calls; the
    block's recomputation may stop early); bf16 autocast gives the plain run's gradients."""
    plain, ckpt = _pair('SwinTransformer', dict(blocks=[1, 0, 0, 0], mlp_chunks=3))
    calls = []
    ckpt.layers[0].blocks[0].mlp.fc1.register_forward_pre_hook(lambda *_: calls.append(1))
    x = torch.randn(2, 3, 64, 48)
    _assert_same(_grads(ckpt, x), _grads(plain, x))
    assert len(calls) > 2 * 3
    plain, ckpt = _pair('SwinTransformer', dict(blocks=True, mlp_chunks=3))
    _assert_same(_grads(ckpt, x, torch.bfloat16), _grads(plain, x, torch.bfloat16))


def test_classifier_counts_class_attention_blocks_as_a_stage():
    cfg = dict(arch=dict(embed_dims=32, depth=2, num_heads=2), img_size=32, out_type='cls_token')
    model = MODELS.get('CaiT')(**cfg, with_cp=[0, True]).train()
    assert [len(s) for s in model.checkpoint_stages()] == [2, 2]
    assert model._cp_whole == {id(b) for b in model.cls_blocks}
    contract.check_with_cp(MODELS.get('CaiT'), cfg, [0, True])


def _grads(model, x, autocast=None):
    model.zero_grad()
    with torch.autocast('cpu', dtype=autocast, enabled=autocast is not None):
        outs = model(x)
    sum(o.float().square().mean() for o in outs).backward()
    return {n.removeprefix('_orig_mod.'): p.grad.clone() for n, p in model.named_parameters()
            if p.grad is not None}  # a compiled model names its module _orig_mod


def _pair(name, setting, **extra):
    torch.manual_seed(0)
    cls = MODELS.get(name)
    plain = cls(**SMALL[name], drop_path_rate=0.0, **extra)
    ckpt = cls(**SMALL[name], drop_path_rate=0.0, with_cp=setting, **extra)
    ckpt.load_state_dict(plain.state_dict())
    return plain.train(), ckpt.train()


def _assert_same(a, b, rtol=1e-5):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=1e-6, msg=key)


@pytest.mark.parametrize('setting', [True, 'attn', 3])
@pytest.mark.parametrize('name', ['SwinTransformer', 'DeepViT'])
def test_frozen_stages(name, setting):
    plain, ckpt = _pair(name, setting, frozen_stages=1)
    x = torch.randn(2, 3, 64, 48)
    got, ref = _grads(ckpt, x), _grads(plain, x)
    frozen = {n for n, p in ckpt.named_parameters() if not p.requires_grad}
    assert frozen and not frozen & set(got)
    _assert_same(got, ref)


@pytest.mark.parametrize('setting', [True, 'mlp', 'attn'])
@pytest.mark.parametrize('name', ['SwinTransformer', 'PyramidVisionTransformerV2'])
def test_bf16_autocast(name, setting):
    """The plain run's gradients under bf16 autocast."""
    plain, ckpt = _pair(name, setting)
    x = torch.randn(2, 3, 64, 48)
    _assert_same(_grads(ckpt, x, torch.bfloat16), _grads(plain, x, torch.bfloat16))


def test_torch_compile():
    """Whole checkpointed blocks trace (aot_eager: dynamo + AOT autograd, no C++ build) and
    give eager's gradients."""
    plain, ckpt = _pair('SwinTransformer', True)
    x = torch.randn(2, 3, 64, 48)
    torch._dynamo.reset()
    compiled = torch.compile(ckpt, backend='aot_eager')
    _assert_same(_grads(compiled, x), _grads(plain, x), rtol=1e-4)


@pytest.mark.parametrize('setting', ['attn', dict(blocks=True, mlp_chunks=2)], ids=str)
def test_torch_compile_parts(setting):
    """Parts and MLP chunks are checkpointed inside the compiled graph too, with eager's
    gradients (their saved bytes: tests/test_compiled_memory.py)."""
    plain, ckpt = _pair('DeepViT', setting)
    x = torch.randn(2, 3, 64, 48)
    torch._dynamo.reset()
    compiled = torch.compile(ckpt, backend='aot_eager')
    _assert_same(_grads(compiled, x), _grads(plain, x), rtol=1e-4)


@pytest.mark.parametrize('setting', [True, 'attn', 'mlp'])
def test_eval_and_no_grad_recompute_nothing(setting):
    _, model = _pair('SwinTransformer', setting)
    calls = []
    for block in model.layers[0].blocks:
        for module in (block, block.attn, block.mlp):
            module.register_forward_pre_hook(lambda *_: calls.append(1))
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        model(x)
    model.eval()
    sum(o.sum() for o in model(x)).backward()
    assert len(calls) == 2 * 3 * len(model.layers[0].blocks)  # each module once per forward


@pytest.mark.parametrize('value,match', [
    ('attention', "with_cp='attention' is not supported"),
    (-1, 'with_cp blocks must be'),
    ([1, 'x'], 'with_cp blocks must be'),
    (dict(part='qkv'), "with_cp part='qkv'"),
    (dict(blocks=1, layers=2), "unknown keys \\['layers'\\]"),
    (dict(mlp_chunks=0), 'mlp_chunks must be an int >= 1'),
    (dict(part='attn', mlp_chunks=2), "it needs part='block'"),
])
def test_bad_settings_raise(value, match):
    with pytest.raises(ConfigError, match=match):
        MODELS.get('SwinTransformer')(**SMALL['SwinTransformer'], with_cp=value)


@pytest.mark.parametrize('value,match', [
    ([1, 1], 'one entry per stage'),
    ([3, 0, 0, 0], 'more blocks than stages have'),
    (99, 'with_cp=99 asks for more blocks'),
])
def test_settings_that_do_not_fit_the_model_raise(value, match):
    model = MODELS.get('SwinTransformer')(**SMALL['SwinTransformer'], with_cp=value)
    with pytest.raises(ConfigError, match=match):
        model.train()


def test_changing_the_setting_reselects():
    _, model = _pair('PyramidVisionTransformerV2', 'attn')
    blocks = [b for s in model.checkpoint_stages() for b in s]
    assert all(b.attn.checkpoint_chunks == 1 and b.mlp.checkpoint_chunks == 0 for b in blocks)
    assert not model._cp_whole
    model.with_cp = dict(blocks=[1, 0, 0, 0])
    model(torch.randn(1, 3, 32, 32))
    assert all(b.attn.checkpoint_chunks == 0 for b in blocks)
    assert model._cp_whole == {id(model.layers[0].blocks[0])}


def test_a_block_checkpoint_stages_does_not_list_raises():
    model = MODELS.get('SwinTransformer')(**SMALL['SwinTransformer'], with_cp=True).train()
    model.checkpoint_stages = lambda: [list(model.layers[0].blocks)]  # misses stages 1-3
    with pytest.raises(RuntimeError, match='checkpoint_stages\\(\\) does not list'):
        model(torch.randn(1, 3, 32, 32))
