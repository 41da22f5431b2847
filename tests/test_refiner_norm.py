"""The Refiner's recompute (RefinerMap ``recompute``, RefinedViT ``recompute_maps``) and its
norms: plain BatchNorm statistics are counted once per training step, whichever part is
recomputed; a SyncBatchNorm (or any other norm) is refused in the recompute with one line, and
runs synchronised through its module without it."""
import pytest
import torch
from torch import nn

from mmvit_ext.backbones import RefinedViT
from mmvit_ext.errors import ConfigError
from mmvit_ext.layers import RefinerMap

TINY = dict(arch=dict(embed_dims=48, depth=4, num_heads=4, conv_stem=(8, 16, 32)),
            window_size=None, drop_path_rate=0.0)


def _pair(momentum=0.1):
    torch.manual_seed(0)
    again = RefinerMap(4, expand_ratio=3, scale=0.5, recompute=True).double().train()
    keep = RefinerMap(4, expand_ratio=3, scale=0.5, recompute=False).double().train()
    for module in (again, keep):
        for norm in module.modules():
            if isinstance(norm, nn.BatchNorm2d):
                norm.momentum = momentum
    with torch.no_grad():  # non-trivial affine parameters
        for param in again.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    keep.load_state_dict(again.state_dict())
    return again, keep


@pytest.mark.parametrize('momentum', [0.1, None])  # None: cumulative average over batches
def test_recompute_counts_batchnorm_statistics_once(momentum):
    again, keep = _pair(momentum)
    for step in range(2):
        maps = torch.rand(2, 3, 4, 9, 9, dtype=torch.float64).softmax(-1).requires_grad_()
        outs = [module(maps) for module in (again, keep)]
        grads = [torch.autograd.grad(out.square().sum(), maps)[0] for out in outs]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)
    buffers = dict(keep.named_buffers())
    for name, buffer in again.named_buffers():
        torch.testing.assert_close(buffer, buffers[name], rtol=1e-12, atol=1e-14, msg=name)
    assert int(again.bn1.num_batches_tracked) == 2


def test_syncbn_in_the_recompute_is_refused_with_one_line():
    model = nn.SyncBatchNorm.convert_sync_batchnorm(RefinedViT(**TINY)).train()
    refiners = [m for m in model.modules() if isinstance(m, RefinerMap)]
    assert refiners and all(isinstance(m.bn1, nn.SyncBatchNorm) for m in refiners)
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(ConfigError, match=r'RefinerMap\.bn1 is SyncBatchNorm.*'
                                          r'set recompute_maps=False') as error:
        model(x)
    assert '\n' not in str(error.value)
    # evaluation and no-grad forwards recompute nothing and run the modules
    with torch.no_grad():
        assert len(model(x)) == len(model.out_channels)
    assert len(model.eval()(x)) == len(model.out_channels)


def test_without_recompute_the_syncbn_modules_run():
    """recompute_maps=False: the Refiner calls its norm modules, so SyncBatchNorm runs as
    configured (here, outside a process group, it normalises with the local batch as BatchNorm
    does: equal outputs, gradients and statistics)."""
    torch.manual_seed(0)
    plain = RefinedViT(**TINY, recompute_maps=False).train()
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(
        RefinedViT(**TINY, recompute_maps=False)).train()
    synced.load_state_dict(plain.state_dict())
    calls = []
    for refiner in (m for m in synced.modules() if isinstance(m, RefinerMap)):
        for norm in (refiner.bn1, refiner.bn2, refiner.bn3, refiner.adapt_bn):
            assert isinstance(norm, nn.SyncBatchNorm)
            norm.register_forward_hook(lambda *args: calls.append(1))
    x = torch.randn(2, 3, 32, 32)
    outs = [model(x) for model in (plain, synced)]
    assert len(calls) == 2 * 4  # two shared blocks, four norms each
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b)
    for (name, a), b in zip(plain.named_buffers(), synced.buffers()):
        torch.testing.assert_close(a, b, msg=name)


def test_reverted_syncbn_is_plain_batchnorm_and_recomputes():
    """mmengine's revert_sync_batchnorm (SyncBN configs run on CPU) gives _BatchNormXd, whose
    forward is BatchNorm's: accepted by the recompute."""
    from mmengine.model import revert_sync_batchnorm
    model = revert_sync_batchnorm(nn.SyncBatchNorm.convert_sync_batchnorm(
        RefinedViT(**TINY))).train()
    refiner = next(m for m in model.modules() if isinstance(m, RefinerMap))
    assert type(refiner.bn1) is not nn.BatchNorm2d and refiner.recompute
    outs = model(torch.randn(2, 3, 32, 32))
    sum(o.sum() for o in outs).backward()
    assert int(refiner.bn1.num_batches_tracked) == 1


@pytest.mark.parametrize('recompute_maps', [True, False])
def test_block_checkpointing_counts_refiner_statistics_once(recompute_maps):
    """with_cp recomputes whole blocks in backward, the Refiner in them included: its running
    statistics still count the step once."""
    torch.manual_seed(0)
    plain = RefinedViT(**TINY, recompute_maps=recompute_maps).train().double()
    checkpointed = RefinedViT(**TINY, recompute_maps=recompute_maps, with_cp=True).train().double()
    checkpointed.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    for model in (plain, checkpointed):
        sum(o.square().sum() for o in model(x)).backward()
    buffers = dict(plain.named_buffers())
    for name, buffer in checkpointed.named_buffers():
        torch.testing.assert_close(buffer, buffers[name], rtol=1e-10, atol=1e-12, msg=name)
