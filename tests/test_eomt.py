"""EoMT on our trunk against the official semantics (tests/eomt_reference.py): every block's
mask and class logits, DINOv2 form on timm's DINOv2-with-registers ViT and DINOv3 form on the
official DINOv3 layout, weights perturbed, eval and train with fixed mask probabilities and
seed; probability 0 is the plain-ViT pass; bad settings raise."""
import re

import pytest
import torch

import mmvit_ext  # noqa: F401
import dinov3_reference as dinov3_ref
from eomt_reference import RefMaskModule, dinov3_eomt, timm_eomt
from mmvit_ext.errors import ConfigError
from mmvit_ext.models import EoMT

TOL = 1e-4
NUM_CLASSES, NUM_Q = 5, 6


def _perturb(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)


def _mask_module(model: EoMT, patch: int) -> RefMaskModule:
    head = RefMaskModule(model.encoder.embed_dims, NUM_CLASSES, NUM_Q, patch)
    _perturb(head, 1)
    own = {k: v for k, v in model.state_dict().items()
           if not k.startswith('encoder.') and k != 'attn_mask_probs'}
    assert set(own) == set(head.state_dict())  # the official names
    model.load_state_dict(head.state_dict(), strict=False)
    return head


def _compare(ours, ref) -> float:
    (masks, classes), (ref_masks, ref_classes) = ours, ref
    assert masks.shape[0] == len(ref_masks) and classes.shape[0] == len(ref_classes)
    return max(max((m - r).abs().max().item() for m, r in zip(masks, ref_masks)),
               max((c - r).abs().max().item() for c, r in zip(classes, ref_classes)))


def _timm_dinov2():
    timm = pytest.importorskip('timm')
    vit = timm.models.vision_transformer.VisionTransformer(
        img_size=56, patch_size=14, embed_dim=32, depth=4, num_heads=2, reg_tokens=4,
        no_embed_class=True, init_values=1e-5, num_classes=0)
    _perturb(vit, 0)
    return vit


@pytest.mark.parametrize('mode,probs', [('eval', (1.0, 0.5, 0.3)), ('train', (0.0, 0.5, 1.0))])
def test_dinov2_form_matches_the_official_function(mode, probs):
    vit = _timm_dinov2()
    model = EoMT(dict(embed_dims=32, depth=4, num_heads=2, patch_size=14, layer_scale=1e-5),
                 NUM_CLASSES, NUM_Q, num_blocks=3, img_size=56, reg_tokens=4)
    model.encoder.load_state_dict(vit.state_dict())
    head = _mask_module(model, 14)
    model.attn_mask_probs.copy_(torch.tensor(probs))
    for m in (model, vit, head):
        m.train(mode == 'train')
    x = torch.randn(2, 3, 56, 56)
    torch.manual_seed(7)
    ours = model(x, all_blocks=True)
    torch.manual_seed(7)
    ref = timm_eomt(vit, head, x, 3, probs)
    assert ours[0].shape == (4, 2, NUM_Q, 8, 8) and ours[1].shape == (4, 2, NUM_Q, 6)
    diff = _compare(ours, ref)
    print(f'EoMT DINOv2 form {mode} {probs}: max abs diff {diff:.2e}')
    assert diff <= TOL


def test_dinov3_form_matches_the_official_function():
    cfg = dict(dinov3_ref.TINY, depth=4)
    sd = dinov3_ref.official_state_dict(cfg, seed=3)
    arch = dict(embed_dims=32, depth=4, num_heads=2, patch_size=16, layer_scale=1e-5,
                reg_tokens=4, norm_eps=1e-5, rope=dict(base=100.0), mask_k_bias=True)
    model = EoMT(arch, NUM_CLASSES, NUM_Q, num_blocks=2, img_size=64)
    model.encoder.load_state_dict(sd)
    head = _mask_module(model, 16)
    probs = (1.0, 0.4)
    model.attn_mask_probs.copy_(torch.tensor(probs))
    x = torch.randn(2, 3, 64, 48)  # a 4 x 3 grid: RoPE rows and columns differ
    for mode in ('eval', 'train'):
        model.train(mode == 'train')
        torch.manual_seed(5)
        ours = model(x, all_blocks=True)
        torch.manual_seed(5)
        ref = dinov3_eomt(sd, cfg, head, x, 2, probs)
        assert ours[0].shape == (3, 2, NUM_Q, 16, 12)
        diff = _compare(ours, ref)
        print(f'EoMT DINOv3 form {mode}: max abs diff {diff:.2e}')
        assert diff <= TOL


def test_probability_zero_is_the_plain_vit_pass():
    """All probabilities 0: no mask is built, and the last prediction equals the one of the
    unmasked network (queries attending freely) bit for bit; eval returns the last only."""
    model = EoMT(dict(embed_dims=32, depth=3, num_heads=2), NUM_CLASSES, NUM_Q, num_blocks=2,
                 img_size=32).eval()
    _perturb(model, 2)
    model.attn_mask_probs.zero_()
    plain = EoMT(dict(embed_dims=32, depth=3, num_heads=2), NUM_CLASSES, NUM_Q, num_blocks=2,
                 img_size=32, masked_attn=False).eval()
    plain.load_state_dict(model.state_dict())
    calls = []
    model.attn_bias = lambda *args: calls.append(args)
    x = torch.randn(1, 3, 48, 32)
    masks, classes = model(x)
    ref_masks, ref_classes = plain(x)
    assert masks.shape == (1, 1, NUM_Q, 12, 8) and not calls
    assert torch.equal(masks, ref_masks) and torch.equal(classes, ref_classes)
    # with probability 1 the masks change the result
    del model.attn_bias
    model.attn_mask_probs.fill_(1.0)
    assert not torch.allclose(model(x)[0], masks)


def test_bad_settings_raise():
    tiny = dict(embed_dims=32, depth=3, num_heads=2)
    with pytest.raises(ConfigError, match='num_blocks'):
        EoMT(tiny, NUM_CLASSES, NUM_Q, num_blocks=4)
    with pytest.raises(ConfigError, match='num_queries'):
        EoMT(tiny, NUM_CLASSES, 0)
    with pytest.raises(ConfigError, match='window_size'):
        EoMT(tiny, NUM_CLASSES, NUM_Q, window_size=7)


# ---- published layouts -------------------------------------------------------------------------
def _timm_to_hf_eomt(vit_state: dict, head_state: dict) -> dict:
    """transformers ``EomtForUniversalSegmentation`` names (its modeling_eomt.py modules) of a
    timm DINOv2-with-registers trunk and the official mask module."""
    out = {'embeddings.cls_token': vit_state['cls_token'],
           'embeddings.register_tokens': vit_state['reg_token'],
           'embeddings.position_embeddings.weight': vit_state['pos_embed'][0],
           'layernorm.weight': vit_state['norm.weight'], 'layernorm.bias': vit_state['norm.bias'],
           'query.weight': head_state['q.weight'], 'criterion.empty_weight': torch.ones(6)}
    for kind in ('weight', 'bias'):
        out[f'embeddings.patch_embeddings.projection.{kind}'] = \
            vit_state[f'patch_embed.proj.{kind}']
        out[f'class_predictor.{kind}'] = head_state[f'class_head.{kind}']
        for i, j in ((1, 0), (2, 2), (3, 4)):
            out[f'mask_head.fc{i}.{kind}'] = head_state[f'mask_head.{j}.{kind}']
    for key, value in head_state.items():
        if key.startswith('upscale.'):
            _, i, rest = key.split('.', 2)
            out[f'upscale_block.block.{i}.{rest.replace("norm.", "layernorm2d.")}'] = value
    for key, value in vit_state.items():
        if not key.startswith('blocks.'):
            continue
        _, i, rest = key.split('.', 2)
        if rest.startswith('attn.qkv.'):
            for name, part in zip('qkv', value.chunk(3)):
                out[f'layers.{i}.attention.{name}_proj.{rest.rsplit(".", 1)[1]}'] = part
            continue
        rest = rest.replace('attn.proj.', 'attention.out_proj.')
        rest = rest.replace('ls1.gamma', 'layer_scale1.lambda1').replace('ls2.gamma',
                                                                         'layer_scale2.lambda1')
        out[f'layers.{i}.{rest}'] = value
    return out


def test_official_and_transformers_layouts_load_on_every_path(tmp_path):
    """The tue-mps ``pytorch_model.bin`` keys (DINOv2 form: timm's trunk under
    ``network.encoder.backbone``) and transformers' EoMT keys give the reference outputs,
    through ``load_state_dict`` and ``init_cfg`` (Pretrained); idempotent conversion."""
    from mmvit_ext.converters.eomt import convert_eomt
    vit = _timm_dinov2().eval()
    arch = dict(embed_dims=32, depth=4, num_heads=2, patch_size=14, layer_scale=1e-5)
    model = EoMT(arch, NUM_CLASSES, NUM_Q, num_blocks=3, img_size=56, reg_tokens=4).eval()
    model.encoder.load_state_dict(vit.state_dict())
    head = _mask_module(model, 14)
    x = torch.randn(1, 3, 56, 56)
    probs = (1.0, 1.0, 0.0)
    model.attn_mask_probs.copy_(torch.tensor(probs))
    expected = timm_eomt(vit, head, x, 3, probs)
    official = {f'network.encoder.backbone.{k}': v for k, v in vit.state_dict().items()}
    official.update({f'network.{k}': v for k, v in head.state_dict().items()})
    official.update({'network.attn_mask_probs': torch.tensor(probs),
                     'network.encoder.pixel_mean': torch.zeros(1, 3, 1, 1),
                     'network.encoder.pixel_std': torch.ones(1, 3, 1, 1),
                     'criterion.empty_weight': torch.ones(NUM_CLASSES + 1)})
    hf = _timm_to_hf_eomt(vit.state_dict(), head.state_dict())
    hf['attn_mask_probs'] = torch.tensor(probs)
    for name, state in (('official', official), ('transformers', hf)):
        converted = convert_eomt(state)
        assert convert_eomt(converted).keys() == converted.keys()  # idempotent
        fresh = EoMT(arch, NUM_CLASSES, NUM_Q, num_blocks=3, img_size=56, reg_tokens=4).eval()
        fresh.load_state_dict(state)
        assert _compare(fresh(x, all_blocks=True), expected) <= TOL, name
        path = tmp_path / f'{name}.bin'
        torch.save(state, path)
        loaded = EoMT(arch, NUM_CLASSES, NUM_Q, num_blocks=3, img_size=56, reg_tokens=4,
                      init_cfg=dict(type='Pretrained', checkpoint=str(path))).eval()
        loaded.init_weights()
        assert torch.equal(loaded.attn_mask_probs, torch.tensor(probs))
        assert _compare(loaded(x, all_blocks=True), expected) <= TOL, name
    # a bare trunk checkpoint (the training configs' init_cfg) goes to the encoder
    torch.save(vit.state_dict(), tmp_path / 'trunk.pth')
    trunk_only = EoMT(arch, NUM_CLASSES, NUM_Q, num_blocks=3, img_size=56, reg_tokens=4,
                      init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'trunk.pth')))
    trunk_only.init_weights()
    assert all(torch.equal(v, model.encoder.state_dict()[k])
               for k, v in trunk_only.encoder.state_dict().items())


def test_official_dinov3_release_loads_as_deltas():
    """The DINOv3 form of the official checkpoint: transformers' DINOv3 trunk renamed by the
    official ``transformers_to_timm``, stored as deltas to the DINOv3 weights."""
    cfg = dict(dinov3_ref.TINY, depth=3)
    sd = dinov3_ref.official_state_dict(cfg, seed=4)
    arch = dict(embed_dims=32, depth=3, num_heads=2, patch_size=16, layer_scale=1e-5,
                reg_tokens=4, norm_eps=1e-5, rope=dict(base=100.0), mask_k_bias=True)
    model = EoMT(arch, NUM_CLASSES, NUM_Q, num_blocks=2, img_size=32).eval()
    model.encoder.load_state_dict(sd)
    head = _mask_module(model, 16)
    x = torch.randn(1, 3, 48, 32)
    expected = dinov3_eomt(sd, cfg, head, x, 2, (0.0, 0.0))  # a trained model's probabilities
    trained = dinov3_ref.official_to_hf(sd)
    pretrained = {k: v + 0.3 * torch.randn_like(v) for k, v in trained.items()}
    official = {}  # transformers_to_timm: embeddings -> patch_embed, layer -> blocks
    for key, value in trained.items():
        renamed = re.sub(r'^layer\.', 'blocks.', re.sub(r'^embeddings\.', 'patch_embed.', key))
        official[f'network.encoder.backbone.{renamed}'] = value - pretrained[key]
    official.update({f'network.{k}': v for k, v in head.state_dict().items()})
    official['network.attn_mask_probs'] = torch.zeros(2)
    fresh = EoMT(arch, NUM_CLASSES, NUM_Q, num_blocks=2, img_size=32).eval()
    fresh.encoder.load_state_dict(pretrained)
    fresh.load_trunk_deltas(official)
    assert _compare(fresh(x, all_blocks=True), expected) <= TOL


def test_semantic_export_with_dynamic_sizes_and_compile_without_breaks(tmp_path):
    """A trained (annealed) EoMT as a semantic ONNX graph with dynamic batch, height and width,
    checked in ONNX Runtime at sizes the export never saw; and one dynamo graph in eval."""
    from mmvit_ext import deploy
    from mmvit_ext.models import EoMTSemanticOutputs
    net = EoMT(dict(embed_dims=32, depth=3, num_heads=2), NUM_CLASSES, NUM_Q, num_blocks=2,
               img_size=32).eval()
    _perturb(net, 5)
    with pytest.raises(ConfigError, match='attn_mask_probs must be 0'):
        EoMTSemanticOutputs(net)
    net.attn_mask_probs.zero_()
    root = EoMTSemanticOutputs(net).eval()
    path = deploy.export_onnx(root, torch.randn(2, 3, 99, 131), tmp_path / 'eomt.onnx',
                              min_size=32)
    session = deploy.ort_session(path)
    for batch, height, width in ((1, 83, 51), (3, 48, 144)):
        inputs = torch.randn(batch, 3, height, width)
        assert deploy.max_relative_diff(root, session, inputs) <= 1e-4
        assert session.run(None, {'inputs': inputs.numpy()})[0].shape == (
            batch, NUM_CLASSES, height, width)
    compiled = torch.compile(root, backend='eager', fullgraph=True)  # raises on a graph break
    x = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        assert torch.allclose(compiled(x)[0], root(x)[0], atol=1e-5)


def test_rope_augmentation_is_one_draw_per_forward():
    """The official EoMT calls the trunk's RoPE once per forward (transformers'
    ``rope_embeddings(x)``): one coordinate augmentation for every block, where the bare DINOv3
    trunk draws once per block; with_cp, which would recompute blocks with fresh draws, is
    refused."""
    from unittest import mock

    import mmvit_ext.layers.rope as rope_module
    arch = dict(embed_dims=32, depth=3, num_heads=2, patch_size=16, reg_tokens=4,
                rope=dict(base=100.0, rescale_coords=2.0))
    model = EoMT(arch, NUM_CLASSES, NUM_Q, num_blocks=2, img_size=32).train()
    x = torch.randn(1, 3, 32, 32)
    with mock.patch.object(rope_module, 'augment_coords',
                           wraps=rope_module.augment_coords) as draws:
        model(x)
        assert draws.call_count == 1
        model.encoder(x)
        assert draws.call_count == 1 + 3  # the bare trunk: one per block
        model.eval()(x)
        assert draws.call_count == 4  # none in eval
    checkpointed = EoMT(arch, NUM_CLASSES, NUM_Q, num_blocks=2, img_size=32, with_cp=True).train()
    with pytest.raises(ConfigError, match='with_cp'):
        checkpointed(x)
