"""The DINOv3 recipe configs (linear probe, Mask R-CNN with the simple pyramid, the 7B under FSDP)
and the big trunks' memory dials, measured at tiny widths with the real block structure (each
preset's depth, heads, FFN kind and tokens; 4 channels per head): the linear probe's frozen
trunk saves no tensor for backward, the head is the official BatchNorm + 1x1 conv, the whole
segmentor steps under bf16 autocast, and with_cp on the ViT-L / H+ blocks saves what it selects
with the plain run's gradients. Step tests of every config at tiny sizes: test_configs.py."""
import re
from pathlib import Path
from typing import Callable, Dict

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.structures import PixelData

from mmvit_ext.backbones import VisionTransformer
from mmvit_ext.backbones.dinov3 import dinov3_arch_zoo
from mmvit_ext.engine.fsdp import backbone_block_policy
from mmvit_ext.utils import build_model

ROOT = Path(__file__).resolve().parents[1]
LINEAR = {'dinov3_vitl16': 'configs/mmseg/dinov3_vitl16_linear_frozen_512x512_40k_ade20k.py',
          'dinov3_vit7b16': 'configs/mmseg/dinov3_vit7b16_linear_frozen_512x512_40k_ade20k.py'}
FSDP = 'configs/fsdp/dinov3_vit7b16_linear_fsdp_512x512_40k_ade20k.py'
DETECTOR = 'configs/mmdet/mask_rcnn_dinov3_vitl16_simple_pyramid_1x_coco.py'
ADAPTER = 'configs/mmseg/mask2former_dinov3_vit7b16_adapter_512x512_160k_ade20k.py'
ZOO = (ROOT / 'docs/model_zoo.md').read_text()


def _tiny_arch(name: str) -> dict:
    """Preset ``name`` with 4 channels per head: depth, heads, FFN kind and tokens kept."""
    preset = dict(dinov3_arch_zoo()[name])
    return dict(preset, embed_dims=4 * preset['num_heads'])


def _tiny_segmentor(name: str, **backbone: object):
    """The linear-probe config of preset ``name`` at its tiny width, built in mmseg."""
    cfg = Config.fromfile(str(ROOT / LINEAR[name]))
    arch = _tiny_arch(name)
    cfg.model.backbone.update(init_cfg=None, arch=arch, **backbone)
    cfg.model.decode_head.in_channels = [arch['embed_dims']]
    cfg.model.decode_head.norm_cfg = dict(type='BN', requires_grad=True)  # one process here
    torch.manual_seed(0)
    return build_model(cfg, scope='mmseg'), arch


def _saved_bytes(run: Callable[[], object], model: torch.nn.Module) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``run`` runs, the
    parameters of ``model`` left out (they are held anyway): the activations kept."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: Dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in params:
            seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(seen.values())


@pytest.mark.parametrize('name', sorted(LINEAR))
def test_linear_probe_trunk_is_frozen_whole_and_saves_nothing_for_backward(name):
    model, arch = _tiny_segmentor(name)
    backbone = model.backbone.train()
    assert backbone.out_indices == (arch['depth'] - 1,) and backbone.out_norm
    assert not [n for n, p in backbone.named_parameters() if p.requires_grad]
    x = torch.randn(2, 3, 64, 48)
    frozen = _saved_bytes(lambda: backbone(x), backbone)
    trainable, _ = _tiny_segmentor(name, peer='mmseg', frozen_stages=-1)
    control = _saved_bytes(lambda: trainable.backbone.train()(x), trainable)
    print(f'{name} tiny trunk saved for backward: frozen {frozen} B, trainable {control} B')
    assert frozen == 0 and control > 0


def test_linear_head_is_batchnorm_then_one_1x1_conv():
    model, arch = _tiny_segmentor('dinov3_vitl16')
    head = model.decode_head.eval()
    assert isinstance(head.bn, torch.nn.BatchNorm2d) and head.bn.num_features == arch['embed_dims']
    assert head.conv_seg.kernel_size == (1, 1) and head.conv_seg.in_channels == arch['embed_dims']
    assert head.dropout.p == 0.1 and head.num_classes == 150
    with torch.no_grad():
        head.bn.running_mean.uniform_(-1, 1)
        head.bn.running_var.uniform_(0.5, 2)
        feats = model.extract_feat(torch.randn(1, 3, 64, 48))
        expected = F.conv2d((feats[0] - head.bn.running_mean[:, None, None])
                            / (head.bn.running_var[:, None, None] + head.bn.eps).sqrt()
                            * head.bn.weight[:, None, None] + head.bn.bias[:, None, None],
                            head.conv_seg.weight, head.conv_seg.bias)
        torch.testing.assert_close(head(feats), expected)
    from mmvit_ext.heads import BNLinearHead
    with pytest.raises(ValueError, match='channels must be the summed in_channels'):
        BNLinearHead(in_channels=[8, 8], channels=8, num_classes=3, in_index=[0, 1],
                     input_transform='resize_concat', norm_cfg=dict(type='BN'))


def test_linear_probe_steps_under_bf16_autocast_end_to_end():
    from mmseg.structures import SegDataSample
    model, _ = _tiny_segmentor('dinov3_vitl16')
    model.train()
    # every block's projections and the head's conv compute in bf16 (the residual stream and
    # the norms stay float32, as autocast keeps them)
    blocks = model.backbone.blocks
    dtypes = []
    for module in ([m for b in blocks for m in (b.attn.proj, b.mlp.fc2)]
                   + [model.decode_head.conv_seg]):
        module.register_forward_hook(lambda m, a, out: dtypes.append(out.dtype))
    samples = []
    for _ in range(2):
        sample = SegDataSample(metainfo=dict(img_shape=(64, 48), pad_shape=(64, 48),
                                             ori_shape=(64, 48)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, 64, 48)))
        samples.append(sample)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        losses = model.loss(torch.randn(2, 3, 64, 48), samples)
    loss = sum(v for k, v in losses.items() if 'loss' in k)
    loss.backward()
    assert dtypes == [torch.bfloat16] * (2 * len(blocks) + 1)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    head_grads = [p.grad for p in model.decode_head.parameters() if p.requires_grad]
    assert head_grads and all(g is not None and torch.isfinite(g).all() for g in head_grads)
    model.eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        logits = model.predict(torch.randn(1, 3, 64, 48), samples[:1])
    assert logits[0].pred_sem_seg.data.shape == (1, 64, 48)


def _grads_and_saved(model: VisionTransformer, x: torch.Tensor):
    model.zero_grad()
    outs = []
    saved = _saved_bytes(lambda: outs.extend(model(x)), model)
    sum(o.square().mean() for o in outs).backward()
    return saved, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize('name', ['dinov3_vitl16', 'dinov3_vith16plus'])
def test_checkpointing_dial_on_the_large_trunks(name):
    """with_cp on the DINOv3 blocks (H+: SwiGLU): whole blocks save least, the first half of
    the blocks about half, one part (attn / mlp) of every block less than none; all give the
    plain run's gradients."""
    arch = _tiny_arch(name)
    depth = arch['depth']
    common = dict(arch=arch, out_indices=(depth - 1,), simple_pyramid=False, window_size=None,
                  drop_path_rate=0.0)
    torch.manual_seed(0)
    plain = VisionTransformer(**common).train()
    if name == 'dinov3_vith16plus':
        mlp = plain.blocks[0].mlp
        assert mlp.fc1.out_features == 2 * mlp.fc2.in_features  # SwiGLU: gate and value
    x = torch.randn(1, 3, 48, 32)
    saved = {'none': None}
    saved['none'], reference = _grads_and_saved(plain, x)
    settings = {'all': True, 'half': depth // 2, 'attn': 'attn', 'mlp': 'mlp',
                'half mlp': dict(blocks=depth // 2, part='mlp')}
    for key, setting in settings.items():
        model = VisionTransformer(**common, with_cp=setting).train()
        model.load_state_dict(plain.state_dict())
        saved[key], grads = _grads_and_saved(model, x)
        assert grads.keys() == reference.keys(), key
        torch.testing.assert_close(torch.cat([g.flatten() for g in grads.values()]),
                                   torch.cat([reference[n].flatten() for n in grads]),
                                   rtol=1e-4, atol=1e-6, msg=key)
    print(f'{name} tiny trunk saved for backward (bytes):', saved)
    assert saved['all'] < saved['half'] < saved['none']
    assert 0.35 < (saved['none'] - saved['half']) / (saved['none'] - saved['all']) < 0.65
    assert saved['attn'] < saved['none'] and saved['mlp'] < saved['none']
    assert saved['mlp'] < saved['half mlp'] < saved['none']


def test_fsdp_config_is_the_7b_probe_sharded_per_block_in_bf16():
    cfg = Config.fromfile(str(ROOT / FSDP))
    probe = Config.fromfile(str(ROOT / LINEAR['dinov3_vit7b16']))
    assert cfg.model == probe.model and cfg.optim_wrapper == probe.optim_wrapper
    assert cfg.runner_type == 'FlexibleRunner' and cfg.strategy.type == 'FSDPStrategy'
    wrapper = cfg.strategy.model_wrapper
    assert wrapper.auto_wrap_policy.type == 'mmvit_ext.backbone_block_policy'
    assert wrapper.mixed_precision == dict(param_dtype='bfloat16', reduce_dtype='float32',
                                           buffer_dtype='float32')
    model, arch = _tiny_segmentor('dinov3_vit7b16')
    for module in model.modules():
        backbone_block_policy(module, True, 0)
    units = [m for m in model.modules() if backbone_block_policy(m, False, 0)]
    assert len(units) == arch['depth'] == 40 and units == list(model.backbone.blocks)


def test_detector_config_is_the_simple_pyramid_with_layer_decay():
    cfg = Config.fromfile(str(ROOT / DETECTOR))
    backbone, neck = cfg.model.backbone, cfg.model.neck
    assert backbone.arch == 'dinov3_vitl16' and backbone.simple_pyramid and not backbone.window_size
    assert cfg.optim_wrapper.constructor == 'mmvit_ext.LayerDecayOptimWrapperConstructor'
    assert cfg.optim_wrapper.paramwise_cfg.layer_decay_rate == 0.8
    arch = _tiny_arch('dinov3_vitl16')
    args = {k: v for k, v in backbone.items() if k != 'type'}
    tiny = VisionTransformer(**dict(args, arch=arch, init_cfg=None))
    outs = tiny(torch.randn(1, 3, 64, 96))
    dims = arch['embed_dims']
    assert [o.shape[1] for o in outs] == [c * dims // 1024 for c in neck.in_channels]
    assert [96 // o.shape[-1] for o in outs] == [4, 8, 16, 32]


@pytest.mark.parametrize('path', [*LINEAR.values(), FSDP, DETECTOR])
def test_config_and_model_zoo_name_the_weights_and_the_published_figure(path):
    cfg = Config.fromfile(str(ROOT / path))
    weights = Path(cfg.model.backbone.init_cfg.checkpoint).name
    assert re.fullmatch(r'dinov3_vit(l16|7b16)_pretrain_lvd1689m-[0-9a-f]{8}\.pth', weights)
    comment = '\n'.join(line for line in (ROOT / path).read_text().splitlines()
                        if line.startswith('#'))
    row = next(line for line in ZOO.splitlines() if line.startswith(f'| `{path}` |'))
    assert weights in comment and weights in row
    figures = re.findall(r'(\d+\.\d) (?:box )?m(?:IoU|AP)', comment)
    assert figures and all(figure in row for figure in figures), (figures, row)


def test_model_zoo_has_the_adapter_mask2former_row():
    row = next(line for line in ZOO.splitlines() if line.startswith(f'| `{ADAPTER}` |'))
    assert '63.0' in row and 'dinov3_vit7b16_ade20k_m2f_head-bf307cb1.pth' in row
