"""DINOv3 on VisionTransformer: presets, parameter counts, and parity with the test-side
reference (tests/dinov3_reference.py, the official semantics on the official keys) through
every load path; timm / transformers parity where the installed versions have DINOv3."""
import pytest
import torch
from torch import nn

import mmvit_ext  # noqa: F401
import dinov3_reference as ref
from mmvit_ext.backbones.dinov3 import DINOV3_ARCHS, README_PARAMS
from mmvit_ext.backbones.vit import VisionTransformer
from mmvit_ext.converters import CheckpointError, save_state_dict
from vit_peers import dinov3_ours

TOL = 1e-4
HUB = {names[0]: preset for names, preset in DINOV3_ARCHS.items()}


def official_count(name: str) -> int:
    """Parameters of the official DinoVisionTransformer of a hub arch, from its structure:
    patch embed, cls / storage / mask tokens, per block two norms, qkv (+ bias), proj, two
    LayerScales and the FFN, the final norm, and local_cls_norm where untied."""
    a = HUB[name]
    dim, depth = a['embed_dims'], a['depth']
    hidden = int(dim * a['mlp_ratio'])
    if a['ffn'] == 'mlp':
        ffn = 2 * dim * hidden + hidden + dim
    else:
        d = int(hidden * 2 / 3)
        d += -d % (64 if a['ffn'] == 'swiglu64' else 8)
        ffn = 3 * dim * d + 2 * d + dim
    block = 4 * dim + 3 * dim * dim + (3 * dim if a.get('qkv_bias', True) else 0) \
        + dim * dim + dim + 2 * dim + ffn
    norms = 2 * dim * (1 + bool(a.get('local_cls_norm')))
    return 3 * 16 * 16 * dim + dim + dim + 4 * dim + dim + depth * block + norms


@pytest.mark.parametrize('name', sorted(README_PARAMS))
def test_every_hub_arch_builds_on_meta_with_the_official_parameter_count(name):
    with torch.device('meta'):
        model = VisionTransformer(arch=name, out_type='cls_token')
    ours = sum(p.numel() for p in model.parameters())
    # ours holds neither the pretraining's mask_token nor its local_cls_norm
    dropped = model.embed_dims * (1 + 2 * bool(HUB[name].get('local_cls_norm')))
    assert ours + dropped == official_count(name)
    # the README's rounded figures (ViT-L: 303.2M, quoted as 300M); the 7B's to the million
    millions = official_count(name) / 1e6
    assert abs(millions - README_PARAMS[name]) <= max(1, 0.015 * millions), millions
    if name == 'dinov3_vit7b16':
        assert official_count(name) // 10 ** 6 == 6716
    assert model.register_tokens.shape[1] == 4 and model.patch_size == 16
    assert model.pos_embed is None and model.rope_embed.periods.dtype == torch.float32
    assert model.norm.eps == 1e-5 and model.blocks[0].norm1.eps == 1e-5


def test_aliases_and_ffn_widths():
    widths = {}
    for alias in ('dinov3-s', 'dinov3-s+', 'dinov3-b', 'dinov3-l', 'dinov3-h+', 'dinov3-7b'):
        with torch.device('meta'):
            model = VisionTransformer(arch=alias, out_type='cls_token')
        widths[alias] = model.blocks[0].mlp.fc2.in_features
    # Mlp 4x; SwiGLU int(dim * ratio * 2/3) rounded up to 8 (64 for the 7B's swiglu64)
    assert widths == {'dinov3-s': 1536, 'dinov3-s+': 1536, 'dinov3-b': 3072, 'dinov3-l': 4096,
                      'dinov3-h+': 5120, 'dinov3-7b': 8192}
    with torch.device('meta'):
        seven = VisionTransformer(arch='dinov3_vit7b16', out_type='cls_token')
    assert seven.blocks[0].attn.qkv.bias is None


def test_rope_periods_are_the_official_float32_buffer():
    model = VisionTransformer(arch='dinov3-b', out_type='cls_token')
    head = 64
    want = 100.0 ** (2 * torch.arange(head // 4, dtype=torch.float32) / (head // 2))
    assert torch.equal(model.rope_embed.periods, want)
    assert 'rope_embed.periods' in model.state_dict()


CONFIGS = {
    'mlp': ref.TINY,
    'swiglu, untied cls norm': dict(ref.TINY, ffn_layer='swiglu', ffn_ratio=6.0,
                                    untie_cls_and_patch_norms=True),
    'swiglu64, no qkv bias, local_cls_norm (7B-like)': dict(
        ref.TINY, ffn_layer='swiglu64', ffn_ratio=3.0, qkv_bias=False,
        untie_global_and_local_cls_norm=True),
    'no storage tokens': dict(ref.TINY, n_storage_tokens=0),
}


def _ours_via_init_cfg(cfg: dict, state: dict, tmp_path, **extra) -> nn.Module:
    path = tmp_path / 'official.pth'
    torch.save(state, path)
    model = VisionTransformer(**{k: v for k, v in dict(dinov3_ours(cfg), **extra).items()
                                 if k != 'type'},
                              init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert 'official DINOv3' in model.load_report.layout
    return model.eval()


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_reference_parity_through_init_cfg(name, tmp_path):
    cfg = CONFIGS[name]
    state = ref.official_state_dict(cfg, seed=3)
    model = _ours_via_init_cfg(cfg, state, tmp_path)
    classifier = _ours_via_init_cfg(cfg, state, tmp_path, out_type='cls_token', out_indices=-1)
    for size in ((64, 64), (48, 80), (112, 32)):  # any grid, not only square
        x = torch.randn(2, 3, *size)
        want = ref.get_intermediate_layers(state, cfg, x, range(cfg['depth']))
        with torch.no_grad():
            got, cls = model(x), classifier(x)[0]
        diff = max((g - w).abs().max().item() for g, (w, _) in zip(got, want))
        assert diff <= TOL, (name, size, diff)
        assert (cls - want[-1][1]).abs().max().item() <= TOL


def test_a_loaded_bias_mask_is_honoured(tmp_path):
    cfg = ref.TINY
    state = ref.official_state_dict(cfg, seed=4)
    for key in [k for k in state if k.endswith('bias_mask')]:
        state[key] = torch.ones_like(state[key])  # the k bias is now computed
    x = torch.randn(1, 3, 64, 48)
    want = ref.get_intermediate_layers(state, cfg, x, range(cfg['depth']))
    for mask_k_bias in (True, False):  # a model without the buffer folds the mask into the bias
        arch = dict(dinov3_ours(cfg)['arch'], mask_k_bias=mask_k_bias)
        model = _ours_via_init_cfg(cfg, state, tmp_path, arch=arch)
        with torch.no_grad():
            got = model(x)
        assert max((g - w).abs().max().item() for g, (w, _) in zip(got, want)) <= TOL


def test_hf_key_bias_and_plain_load_paths(tmp_path):
    """transformers with a k bias (``key_bias=True``) computes it; load_state_dict and
    mmengine's load_checkpoint (load_from / --resume) convert a whole model's backbone."""
    from mmengine.runner.checkpoint import load_checkpoint
    cfg = ref.TINY
    state = ref.official_state_dict(cfg, seed=5)
    unmasked = {k: (torch.ones_like(v) if k.endswith('bias_mask') else v)
                for k, v in state.items()}
    x = torch.randn(1, 3, 80, 64)
    build = {k: v for k, v in dinov3_ours(cfg).items() if k != 'type'}
    for source, reference in ((ref.official_to_hf(unmasked, key_bias=True), unmasked),
                              (ref.official_to_timm(state), state), (state, state)):
        want = ref.get_intermediate_layers(reference, cfg, x, range(cfg['depth']))
        plain = VisionTransformer(**build)
        plain.load_state_dict(source)
        holder = nn.Module()
        holder.backbone = VisionTransformer(**build)
        path = tmp_path / 'whole.pth'
        torch.save({'state_dict': {f'backbone.{k}': v for k, v in source.items()}, 'meta': {}},
                   path)
        load_checkpoint(holder, str(path), map_location='cpu', strict=True)
        for model in (plain.eval(), holder.backbone.eval()):
            with torch.no_grad():
                got = model(x)
            assert max((g - w).abs().max().item() for g, (w, _) in zip(got, want)) <= TOL


def test_non_zero_qkv_bias_into_a_bias_free_model_is_refused(tmp_path):
    cfg = ref.TINY
    state = ref.official_state_dict(cfg, seed=6)
    arch = dict(dinov3_ours(cfg)['arch'], qkv_bias=False)
    with pytest.raises(CheckpointError, match='non-zero qkv bias'):
        _ours_via_init_cfg(cfg, state, tmp_path, arch=arch)


def test_our_layout_round_trips_and_traces_at_any_size(tmp_path):
    cfg = ref.TINY
    state = ref.official_state_dict(cfg, seed=7)
    model = _ours_via_init_cfg(cfg, state, tmp_path)
    save_state_dict(model.state_dict(), tmp_path / 'ours.pth')
    again = VisionTransformer(**{k: v for k, v in dinov3_ours(cfg).items() if k != 'type'})
    again.load_state_dict(torch.load(tmp_path / 'ours.pth')['state_dict'])
    assert again.load_report.layout.startswith('mmvit_ext')
    traced = torch.jit.trace(again.eval(), torch.randn(1, 3, 64, 64), check_trace=False)
    x = torch.randn(1, 3, 48, 96)  # another grid than traced: RoPE from the run-time grid
    with torch.no_grad():
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(traced(x), model(x)))


def test_rope_arch_refuses_windows_with_a_reason():
    with pytest.raises(Exception, match='RoPE'):
        VisionTransformer(arch='dinov3-s', with_cls_token=False, reg_tokens=0, window_size=14)


def test_timm_dinov3_parity():
    timm = pytest.importorskip('timm')
    if not timm.list_models('vit_small_patch16_dinov3*'):
        pytest.skip(f'timm {timm.__version__} has no vit_*_dinov3 (added in timm 1.0.20); '
                    f'the reference tests carry the parity')
    model = timm.create_model('vit_small_patch16_dinov3', pretrained=False, num_classes=0,
                              depth=2).eval()
    ours = VisionTransformer(arch=dict(HUB['dinov3_vits16'], depth=2), out_type='cls_token',
                             out_indices=-1)
    ours.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        assert (ours.eval()(x)[0] - model.forward_features(x)[:, 0]).abs().max() <= TOL


def test_hf_dinov3_parity():
    transformers = pytest.importorskip('transformers')
    if not hasattr(transformers, 'DINOv3ViTModel'):
        pytest.skip(f'transformers {transformers.__version__} has no DINOv3ViTModel (added in '
                    f'4.56); the reference tests carry the parity')
    config = transformers.DINOv3ViTConfig(hidden_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=256,
                                          num_register_tokens=4, layer_norm_eps=1e-5)
    model = transformers.DINOv3ViTModel(config).eval()
    ours = VisionTransformer(arch=dict(HUB['dinov3_vits16'], embed_dims=64, depth=2, num_heads=2),
                             out_type='cls_token', out_indices=-1)
    ours.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        assert (ours.eval()(x)[0] - model(x).pooler_output).abs().max() <= TOL
