"""DINOv3's training-time RoPE coordinate augmentation (``rope=dict(shift_coords=...,
jitter_coords=..., rescale_coords=...)``) against the test-side reference written from the
official ``RopePositionEmbedding`` (tests/dinov3_reference.py): the same draws under the same
seed, per block as the official trunk, in training only."""
import pytest
import torch

import dinov3_reference as ref
from mmvit_ext.backbones.vit import VisionTransformer
from mmvit_ext.errors import ConfigError
from mmvit_ext.layers import RopeEmbedding
from vit_peers import dinov3_ours

TOL = 1e-4
AUGMENT = dict(shift_coords=0.2, jitter_coords=1.5, rescale_coords=2.0)


def _model(state: dict, rope: dict) -> VisionTransformer:
    cfg = {k: v for k, v in dinov3_ours(ref.TINY).items() if k != 'type'}
    model = VisionTransformer(**cfg, rope=rope)
    model.load_state_dict(state)
    return model


def _max_diff(got, want) -> float:
    return max((g - w).abs().max().item() for g, (w, _) in zip(got, want))


@pytest.mark.parametrize('rope', [AUGMENT, dict(rescale_coords=2.0)], ids=['all', 'rescale'])
def test_training_draws_equal_the_official_under_the_same_seed(rope):
    state = ref.official_state_dict(ref.TINY, seed=8)
    model = _model(state, rope).train()
    assert model.rope_embed.augments
    augment = dict(shift=rope.get('shift_coords'), jitter=rope.get('jitter_coords'),
                   rescale=rope.get('rescale_coords'))
    x = torch.randn(2, 3, 48, 80)
    blocks = range(ref.TINY['depth'])
    torch.manual_seed(5)
    got = model(x)
    torch.manual_seed(5)
    want = ref.get_intermediate_layers(state, ref.TINY, x, blocks, rope_augment=augment)
    assert _max_diff(got, want) <= TOL
    plain = ref.get_intermediate_layers(state, ref.TINY, x, blocks)
    assert _max_diff(got, plain) > 1e-2  # the augmentation moved the outputs
    torch.manual_seed(6)  # another seed, other draws
    assert _max_diff(model(x), want) > 1e-3
    with torch.no_grad():  # off in eval: the plain function, deterministic
        assert _max_diff(model.eval()(x), plain) <= TOL


def test_a_frozen_trunk_draws_nothing_and_bad_settings_raise():
    state = ref.official_state_dict(ref.TINY, seed=9)
    cfg = {k: v for k, v in dinov3_ours(ref.TINY).items() if k != 'type'}
    frozen = VisionTransformer(**cfg, rope=dict(rescale_coords=2.0),
                               frozen_stages=ref.TINY['depth']).train()
    assert not frozen.rope_embed.augments
    with pytest.raises(ConfigError, match='rope must be a dict with keys among'):
        VisionTransformer(**cfg, rope=dict(rescale=2.0))
    with pytest.raises(ConfigError, match='has none'):
        VisionTransformer(arch='s', rope=dict(rescale_coords=2.0))
    with pytest.raises(ValueError, match='jitter_coords must be None or a number >= 1'):
        RopeEmbedding(8, jitter_coords=0.5)
    assert 'rescale_coords=2.0' in repr(_model(state, dict(rescale_coords=2.0)).rope_embed)
