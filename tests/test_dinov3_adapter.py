"""The DINOv3 adapter form (``ViTAdapter(arch='dinov3_*')``): against the test-side official
reference (tests/dinov3_adapter_reference.py) through init_cfg, from the adapter's own state dict
and from a segmentor checkpoint's backbone part; the frozen trunk keeps nothing for backward
(measured with saved-tensor hooks against the trunk trained); bf16 autocast end to end; bad
arguments. Budget: ~15 s on the 2-core CPU."""
from typing import List, Tuple

import pytest
import torch

import dinov3_reference as ref
from dinov3_adapter_reference import DINOv3AdapterReference
from mmvit_ext.backbones import ViTAdapter
from mmvit_ext.backbones.dinov3_adapter import DINOv3Adapter, official_interaction_indexes
from mmvit_ext.backbones.vocabulary import ConfigError
from mmvit_ext.layers import MSDeformAttn
from test_vit_adapter_reference import _perturbed
from vit_peers import dinov3_ours

TOL = 1e-4
CFG = dict(ref.TINY, depth=4)
INDEXES = [0, 1, 2, 3]
ADAPTER = dict(conv_inplane=8, n_points=4, deform_num_heads=2, deform_ratio=0.5)


def _arch() -> dict:
    return dinov3_ours(CFG)['arch']


def _ours(**kwargs) -> DINOv3Adapter:
    options = dict(ADAPTER, interaction_indexes=INDEXES, drop_path_rate=0.0)
    return ViTAdapter(arch=_arch(), **dict(options, **kwargs))


def _reference(seed: int) -> DINOv3AdapterReference:
    # every weight and statistic off its init, as the czczup form's reference test does
    return _perturbed(DINOv3AdapterReference(CFG['embed_dim'], INDEXES, **ADAPTER), seed)


def _pretrained(*paths) -> DINOv3Adapter:
    model = _ours(init_cfg=[dict(type='Pretrained', checkpoint=str(p)) for p in paths])
    model.init_weights()
    return model.eval()


def _max_diff(got, want) -> float:
    return max((g - w).abs().max().item() for g, w in zip(got, want))


def test_dinov3_arch_builds_the_official_form():
    model = ViTAdapter(arch='dinov3_vits16')
    assert type(model) is DINOv3Adapter and isinstance(model, ViTAdapter)
    assert model.interaction_indexes == (2, 5, 8, 11)
    assert official_interaction_indexes(24) == (4, 11, 17, 23)
    assert official_interaction_indexes(40) == (9, 19, 29, 39)  # the 7B's, as the official
    assert not any(hasattr(block, 'injector') for block in model.interactions)
    assert [block.extra_extractors is not None for block in model.interactions] == \
        [False, False, False, True]
    heads = {m.num_heads for m in model.modules() if isinstance(m, MSDeformAttn)}
    assert heads == {16} and model.interactions[0].extractor.attn.value_proj.out_features == 192
    trunk = {n for n, _ in model.named_parameters()
             if n.startswith(('cls_token', 'register_tokens', 'patch_embed', 'blocks', 'norm.'))}
    assert trunk and all(not p.requires_grad for n, p in model.named_parameters() if n in trunk)
    assert all(p.requires_grad for n, p in model.named_parameters() if n not in trunk)
    model.train()
    assert not model.blocks[0].training and model.spm.training
    assert type(ViTAdapter(arch='s')) is ViTAdapter  # other trunks: the czczup form


def test_shapes_any_input_size():
    model = _ours().eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 70, 50))  # padded to 96 x 64, cropped back
    assert [tuple(o.shape) for o in outs] == [(1, 32, 18, 13), (1, 32, 9, 7), (1, 32, 5, 4),
                                              (1, 32, 3, 2)]


def test_official_adapter_state_dict_through_init_cfg(tmp_path):
    trunk = ref.official_state_dict(CFG, seed=5)
    reference = _reference(seed=6)
    path = tmp_path / 'dinov3_adapter.pth'
    torch.save(reference.official_state_dict(trunk), path)
    model = _pretrained(path)
    assert 'official DINOv3_Adapter' in model.load_report.layout
    for size in ((64, 96), (96, 64), (128, 128)):
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            diff = _max_diff(model(x), reference(x, trunk, CFG))
        assert diff <= TOL, (size, diff)


def test_official_segmentor_checkpoint_backbone_part(tmp_path):
    """The released m2f files: the adapter under ``segmentation_model.0.``, the head under
    ``.1.``, no trunk; the trunk from its own file first."""
    trunk = ref.official_state_dict(CFG, seed=7)
    reference = _reference(seed=8)
    segmentor = {f'segmentation_model.0.{k}': v for k, v in reference.state_dict().items()}
    segmentor['segmentation_model.1.predictor.class_embed.weight'] = torch.randn(151, 16)
    torch.save(trunk, tmp_path / 'dinov3_trunk.pth')
    torch.save(segmentor, tmp_path / 'dinov3_m2f_head.pth')
    model = _pretrained(tmp_path / 'dinov3_trunk.pth', tmp_path / 'dinov3_m2f_head.pth')
    assert 'DINOv3 segmentor' in model.load_report.layout
    assert any(k.startswith('blocks.') for k in model.load_report.expected_missing)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        assert _max_diff(model(x), reference(x, trunk, CFG)) <= TOL
    ours = tmp_path / 'ours.pth'  # and ours round-trips as our layout
    torch.save(model.state_dict(), ours)
    again = _pretrained(ours)
    assert 'mmvit_ext DINOv3 adapter' in again.load_report.layout
    with torch.no_grad():
        assert _max_diff(again(x), model(x)) == 0


@pytest.mark.parametrize('kwargs, words', [
    (dict(interaction_indexes=[[0, 1], [2, 3]]), 'single block indexes'),
    (dict(interaction_indexes=[0, 1, 2, 4]), 'blocks 0..3'),
    (dict(interaction_indexes=[0, 2, 1, 3]), 'must increase'),
    (dict(interaction_indexes=[1, 2, 3]), 'needs 4 interaction_indexes'),
    (dict(init_values=1e-6), 'init_values'),
    (dict(window_size=14), 'window_size'),
    (dict(trunk_autocast='int8'), 'trunk_autocast'),
])
def test_bad_arguments(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        _ours(**kwargs)
    _ours(interaction_indexes=[1, 3], add_vit_feature=False)  # any count without the ViT maps


def _saved_for_backward(model: DINOv3Adapter, x: torch.Tensor) -> Tuple[int, List[tuple]]:
    """Bytes and shapes of the tensors autograd keeps for backward in one forward."""
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outs = model(x)
    sum(o.float().square().mean() for o in outs).backward()
    unique = {t.untyped_storage().data_ptr(): t for t in saved}.values()
    return sum(t.untyped_storage().nbytes() for t in unique), [tuple(t.shape) for t in saved]


def test_frozen_trunk_keeps_no_activations():
    """Saved-tensor bytes of one training step: the frozen trunk (official) against the same
    adapter with the trunk trained (``freeze_trunk=False``); trunk tensors are the ones with the
    5 prefix tokens + h*w patches."""
    x = torch.randn(2, 3, 128, 128)
    tokens = 5 + 8 * 8
    frozen = _ours(with_cp=False).train()
    trained = _ours(with_cp=False, freeze_trunk=False).train()
    trained.load_state_dict(frozen.state_dict())
    frozen_bytes, frozen_shapes = _saved_for_backward(frozen, x)
    trained_bytes, trained_shapes = _saved_for_backward(trained, x)
    assert not any(tokens in shape for shape in frozen_shapes)
    assert sum(tokens in shape for shape in trained_shapes) >= 4 * 4  # several per block
    assert trained_bytes > frozen_bytes
    assert all(p.grad is None for p in frozen.blocks.parameters())
    assert all(p.grad is not None for p in trained.blocks.parameters())
    assert frozen.spm.fc1.weight.grad is not None


def test_with_cp_same_gradients():
    x = torch.randn(1, 3, 64, 64)
    grads = []
    for with_cp in (False, True):
        torch.manual_seed(0)
        model = _ours(with_cp=with_cp).train()
        sum(o.square().mean() for o in model(x)).backward()
        grads.append(model.interactions[-1].extra_extractors[1].attn.value_proj.weight.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_bf16_autocast_end_to_end():
    model = _ours().train()
    x = torch.randn(2, 3, 64, 96)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(x)
        loss = sum(o.float().square().mean() for o in outs)
    loss.backward()
    assert all(torch.isfinite(o).all() for o in outs)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    # as the official forward under autocast: the float32 level embedding promotes the prior
    # tokens (levels 1-3), level 0 is the transposed conv's
    assert [o.dtype for o in outs] == [torch.bfloat16] + [torch.float32] * 3


def test_registered_by_name_and_built_from_vit_adapter_through_the_registry():
    """``type='mmvit_ext.DINOv3Adapter'`` builds it; ``ViTAdapter(arch='dinov3_*')`` finds it
    in the registry, and vit_adapter.py imports nothing from dinov3_adapter.py (no circle)."""
    import ast
    import inspect
    from mmvit_ext.backbones import vit_adapter
    from mmvit_ext.registry import MODELS
    assert MODELS.get('DINOv3Adapter') is DINOv3Adapter
    by_name = MODELS.build(dict(type='DINOv3Adapter', arch=_arch(), **ADAPTER))
    by_arch = MODELS.build(dict(type='ViTAdapter', arch=_arch(), **ADAPTER))
    assert type(by_name) is type(by_arch) is DINOv3Adapter
    assert type(ViTAdapter(arch=_arch(), **ADAPTER)) is DINOv3Adapter
    imported = {node.module for node in ast.walk(ast.parse(inspect.getsource(vit_adapter)))
                if isinstance(node, ast.ImportFrom)}
    assert not any('dinov3_adapter' in (name or '') for name in imported), imported
    early = MODELS.build(dict(type='DINOv3Adapter', arch=_arch(), out_indices=(2,), **ADAPTER))
    assert early.up is None and early.norm1 is None and early.spm.fc1 is None
    with pytest.raises(ConfigError, match='frozen_stages=2 with freeze_trunk=True'):
        DINOv3Adapter(arch=_arch(), frozen_stages=2, **ADAPTER)
