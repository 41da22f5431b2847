"""Our EoMT against transformers' own (``EomtForUniversalSegmentation``, DINOv2 form;
``EomtDinov3ForUniversalSegmentation``, DINOv3 form) with the same weights, loaded through our
transformers converter: the newest stack (transformers 5.24) has both; the pinned 4.46 neither,
where each test checks instead that the peer is refused with that reason. Ours is checked
against the official semantics in test_eomt.py; here transformers' model is the peer ``benchmark.py --compare`` times."""
import pytest
import torch

import mmvit_ext  # noqa: F401
from mmvit_ext.backbones.dinov3 import _dinov3
from mmvit_ext.models import EoMT
from mmvit_ext.models.eomt_peers import TransformersEoMT, transformers_eomt

import transformers  # noqa: E402  (test-only dependency of every stack)

HAS_EOMT = hasattr(transformers, 'EomtDinov3ForUniversalSegmentation')

DIM, DEPTH, HEADS, QUERIES, CLASSES, BLOCKS = 64, 4, 4, 5, 6, 3


def _refused() -> None:
    """A stack whose transformers has no EoMT: the peer is refused, naming the version."""
    tiny = EoMT(dict(embed_dims=32, depth=2, num_heads=2, patch_size=16), CLASSES, QUERIES,
                num_blocks=1, img_size=32)
    with pytest.raises(ValueError, match=f'transformers {transformers.__version__} has no EoMT'):
        transformers_eomt(tiny)


def _pair(form: str):
    torch.manual_seed(0)
    arch = (dict(embed_dims=DIM, depth=DEPTH, num_heads=HEADS, patch_size=16, layer_scale=0.5)
            if form == 'dinov2' else dict(_dinov3(DIM, DEPTH, HEADS), norm_eps=1e-6, rope=dict(
                base=100.0, normalize='separate', rescale_coords=2.0)))
    ours = EoMT(arch, CLASSES, QUERIES, num_blocks=BLOCKS, img_size=64, reg_tokens=4)
    peer = transformers_eomt(ours)  # its weights now in ours
    with torch.no_grad():  # perturbed, so that no tensor is at its initial constant
        for param in peer.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    ours.load_state_dict(peer.model.state_dict())
    return ours, peer


def _diff(ours_out, peer_out) -> float:
    return max((a[-1] - b[-1]).abs().max().item() for a, b in zip(ours_out, peer_out))


@pytest.mark.parametrize('form', ['dinov2', 'dinov3'])
def test_same_logits_as_transformers(form):
    """Eval with every block's probability 0 (a trained model) and 1; training with annealing
    probabilities between, same seed (the DINOv3 form with the RoPE rescale augmentation, one
    draw per forward): the last prediction's mask and class logits <= 1e-5."""
    if not HAS_EOMT:
        return _refused()
    ours, peer = _pair(form)
    assert isinstance(peer, TransformersEoMT)
    assert type(peer.model).__name__ == ('EomtForUniversalSegmentation' if form == 'dinov2'
                                         else 'EomtDinov3ForUniversalSegmentation')
    x = torch.randn(2, 3, 64, 64)
    for mode, probs in (('eval', [0.0] * BLOCKS), ('eval', [1.0] * BLOCKS),
                        ('train', [1.0, 0.5, 0.0]), ('train', [0.3, 0.9, 1.0])):
        ours.train(mode == 'train')
        peer.model.train(mode == 'train')
        ours.attn_mask_probs.copy_(torch.tensor(probs))
        peer.model.attn_mask_probs.copy_(torch.tensor(probs))
        torch.manual_seed(1)
        expected = peer.model(pixel_values=x)
        torch.manual_seed(1)
        with torch.no_grad():
            out = ours(x)
        assert _diff(out, ([expected.masks_queries_logits], [expected.class_queries_logits])) \
            <= 1e-5, (form, mode, probs)
    ours.eval(), peer.eval()
    with torch.no_grad():
        assert _diff(ours(x, annealed=True), peer(x, annealed=True)) <= 1e-5


def test_the_peer_refuses_per_block_outputs():
    if not HAS_EOMT:
        return _refused()
    ours, peer = _pair('dinov2')
    with pytest.raises(ValueError, match='last prediction only'):
        peer(torch.randn(1, 3, 64, 64), all_blocks=True)
