"""The official DINOv3 ADE20K segmentor (adapter + Mask2Former head) as the shipped mmseg config
builds it, at tiny widths with the official head structure (16 heads, FFN 4096, 6 + 9 layers,
100 queries): against the test-side official reference (tests/dinov3_m2f_reference.py), its
state dict in the official layout (``segmentation_model.0`` / ``.1``) loaded through init_cfg,
``load_from`` (mmengine's Runner with ``mmvit_ext.ModelLayoutHook``) and the mmseg checkpoint of
tools/convert_checkpoint.py; mmseg's predict in whole and slide mode against the official semantic
inference; the published evaluation (slide + TTA) stepped; the converters pure, idempotent and
leaving no tensor out. Budget: ~25 s of CPU on the shared 2-core machine."""
import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from mmengine.config import Config, ConfigDict
from mmengine.runner import Runner
from mmengine.runner.checkpoint import load_checkpoint
from mmseg.structures import SegDataSample

import dinov3_reference as ref
from dinov3_adapter_reference import DINOv3AdapterReference
from dinov3_m2f_reference import M2FHeadReference, official_segmentor_state_dict
from mmvit_ext.converters import CheckpointError
from mmvit_ext.converters.dinov3_m2f import (convert_official_dinov3_m2f_head,
                                             convert_official_dinov3_segmentor_model)
from mmvit_ext.heads import DINOv3Mask2FormerHead
from mmvit_ext.utils import build_model
from test_vit_adapter_reference import _perturbed
from vit_peers import dinov3_ours

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / 'configs/mmseg/mask2former_dinov3_vit7b16_adapter_512x512_160k_ade20k.py'
TOL = 1e-4
TRUNK = dict(ref.TINY, depth=4)
ADAPTER = dict(conv_inplane=8, n_points=4, deform_num_heads=2, deform_ratio=0.5)
HIDDEN, CLASSES = 32, 5  # GroupNorm(32) needs 32 channels at least
SIZE = (64, 96)


def _tiny_config(backbone_init=None, head_init=None, path: Path = CONFIG) -> Config:
    """A shipped config's model, widths cut (trunk, hidden dim, classes); structure kept."""
    cfg = Config.fromfile(str(path))
    model = cfg.model
    model.backbone.update(arch=dinov3_ours(TRUNK)['arch'], interaction_indexes=[0, 1, 2, 3],
                          drop_path_rate=0.0, sync_bn=False, init_cfg=backbone_init, **ADAPTER)
    head = model.decode_head
    head.update(in_channels=[TRUNK['embed_dim']] * 4, feat_channels=HIDDEN,
                out_channels=HIDDEN, num_classes=CLASSES, init_cfg=head_init)
    head.loss_cls.class_weight = [1.0] * CLASSES + [0.1]
    encoder = head.pixel_decoder.encoder.layer_cfg
    encoder.self_attn_cfg.embed_dims = encoder.ffn_cfg.embed_dims = HIDDEN
    head.pixel_decoder.positional_encoding.num_feats = HIDDEN // 2
    head.positional_encoding.num_feats = HIDDEN // 2
    for part in ('self_attn_cfg', 'cross_attn_cfg', 'ffn_cfg'):
        head.transformer_decoder.layer_cfg[part].embed_dims = HIDDEN
    return cfg


def _build(**inits):
    torch.manual_seed(0)
    return build_model(_tiny_config(**inits), scope='mmseg')


@pytest.fixture(scope='module')
def official(tmp_path_factory):
    """(trunk state, adapter reference, head reference, dir with the two official files)."""
    trunk = ref.official_state_dict(TRUNK, seed=21)
    torch.manual_seed(1)
    adapter = _perturbed(DINOv3AdapterReference(TRUNK['embed_dim'], [0, 1, 2, 3], **ADAPTER), 22)
    head = _perturbed(M2FHeadReference(TRUNK['embed_dim'], HIDDEN, CLASSES), 23)
    root = tmp_path_factory.mktemp('m2f')
    torch.save(trunk, root / 'trunk.pth')
    torch.save(official_segmentor_state_dict(adapter, head), root / 'segmentor.pth')
    return trunk, adapter, head, root


def _reference_scores(official, x: torch.Tensor) -> torch.Tensor:
    trunk, adapter, head, _ = official
    with torch.no_grad():
        return head.predict(adapter(x, trunk, TRUNK), x.shape[-2:])


def _samples(x: torch.Tensor, pad: bool = True) -> list:
    shape = tuple(x.shape[-2:])
    meta = dict(img_shape=shape, ori_shape=shape, **(dict(pad_shape=shape) if pad else {}))
    return [SegDataSample(metainfo=dict(meta)) for _ in range(x.shape[0])]


@pytest.fixture(scope='module')
def via_init_cfg(official):
    root = official[3]
    model = _build(backbone_init=[dict(type='Pretrained', checkpoint=str(root / 'trunk.pth')),
                                  dict(type='Pretrained', checkpoint=str(root / 'segmentor.pth'))],
                   head_init=dict(type='Pretrained', checkpoint=str(root / 'segmentor.pth')))
    model.init_weights()
    return model.eval()


def test_predict_equals_the_official_semantic_inference(official, via_init_cfg):
    head = via_init_cfg.decode_head
    assert type(head) is DINOv3Mask2FormerHead
    assert 'head part' in head.load_report.layout and not head.load_report.missing
    assert len(head.load_report.loaded) == len(official[2].state_dict())  # no tensor left out
    x = torch.randn(2, 3, *SIZE)
    want = _reference_scores(official, x)
    with torch.no_grad():
        samples = via_init_cfg.predict(x, _samples(x))
    got = torch.stack([s.seg_logits.data for s in samples])
    diff = (got - want).abs().max().item()
    print(f'm2f segmentor vs official reference: max abs diff {diff:.2e} (scores up to '
          f'{want.abs().max().item():.2f})')
    assert got.shape == (2, CLASSES, *SIZE) and diff <= TOL
    labels = torch.stack([s.pred_sem_seg.data[0] for s in samples])
    assert torch.equal(labels, want.argmax(1))


def _official_slide(official, x: torch.Tensor, crop: int, stride: int) -> torch.Tensor:
    """``slide_inference``: each crop predicted at its size, summed, divided by the counts."""
    _, _, h, w = x.shape
    preds, count = x.new_zeros(1, CLASSES, h, w), x.new_zeros(1, 1, h, w)
    for row in range(max(h - crop + stride - 1, 0) // stride + 1):
        for col in range(max(w - crop + stride - 1, 0) // stride + 1):
            y2, x2 = min(row * stride + crop, h), min(col * stride + crop, w)
            y1, x1 = max(y2 - crop, 0), max(x2 - crop, 0)
            preds[:, :, y1:y2, x1:x2] += _reference_scores(official, x[:, :, y1:y2, x1:x2])
            count[:, :, y1:y2, x1:x2] += 1
    return preds / count


def test_slide_inference_resizes_each_crop_as_the_official(official, via_init_cfg):
    """mmseg's slide mode with the crop's masks at the crop's size (not the whole pad_shape)."""
    model = copy.deepcopy(via_init_cfg)
    model.test_cfg = ConfigDict(mode='slide', crop_size=(64, 64), stride=(32, 32))
    x = torch.randn(1, 3, *SIZE)
    with torch.no_grad():
        got = model.predict(x, _samples(x))[0].seg_logits.data
    diff = (got[None] - _official_slide(official, x, 64, 32)).abs().max().item()
    assert diff <= TOL, diff


def test_load_from_and_converted_mmseg_checkpoint(official, via_init_cfg, tmp_path):
    """load_from through mmengine's Runner (the config's ModelLayoutHook converts the file), the
    trunk from the backbone's init_cfg first; then the mmseg checkpoint
    tools/convert_checkpoint.py writes with ``--trunk``, loaded strictly alone."""
    root = official[3]
    want = via_init_cfg.state_dict()  # loaded from the official files and equal to them
    model = _build(backbone_init=dict(type='Pretrained', checkpoint=str(root / 'trunk.pth')))
    model.init_weights()
    runner = Runner(model=model, work_dir=str(tmp_path / 'run'),
                    load_from=str(root / 'segmentor.pth'),
                    custom_hooks=[dict(type='mmvit_ext.ModelLayoutHook')],
                    default_scope='mmseg')
    runner.load_or_resume()
    assert 'no trunk' in model.backbone.load_report.layout
    _assert_same_weights(model, want)

    tool = _convert_tool()
    out = tmp_path / 'mmseg_m2f.pth'
    summary = tool.convert(str(root / 'segmentor.pth'), str(out), trunk=str(root / 'trunk.pth'))
    assert 'official DINOv3 segmentor' in summary and '0 dropped' in summary, summary
    fresh = _build()
    load_checkpoint(fresh, str(out), map_location='cpu', strict=True)
    assert fresh.backbone.load_report.layout.startswith('mmvit_ext')
    assert fresh.decode_head.load_report.layout == 'mmseg Mask2FormerHead'
    _assert_same_weights(fresh, want)


def _assert_same_weights(model, want: dict) -> None:
    got = model.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), [
        k for k in want if not torch.equal(got[k], want[k])][:5]


def _convert_tool():
    spec = importlib.util.spec_from_file_location('convert_checkpoint',
                                                  ROOT / 'tools/convert_checkpoint.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_converters_pure_idempotent_and_complete(official, via_init_cfg):
    _, adapter, head, root = official
    raw = torch.load(root / 'segmentor.pth')
    keys = sorted(raw)
    whole = convert_official_dinov3_segmentor_model(raw)
    assert sorted(raw) == keys and len(whole) == len(raw)  # input untouched, nothing dropped
    again = convert_official_dinov3_segmentor_model(whole)
    assert again.keys() == whole.keys() and all(again[k] is whole[k] for k in whole)
    ours = via_init_cfg.decode_head.state_dict()
    head_part = {k[len('decode_head.'):]: v for k, v in whole.items()
                 if k.startswith('decode_head.')}
    assert head_part.keys() == ours.keys()  # every head tensor, exactly the model's
    assert convert_official_dinov3_m2f_head(head_part).keys() == head_part.keys()
    with pytest.raises(CheckpointError, match='no rule'):
        convert_official_dinov3_m2f_head({**head.state_dict(),
                                          'predictor.extra_proj.weight': torch.zeros(1)})


def test_head_refuses_a_partial_head(official, tmp_path):
    _, _, head, _ = official
    partial = {k: v for k, v in head.state_dict().items() if 'transformer_ffn_layers.8' not in k}
    torch.save(partial, tmp_path / 'partial.pth')
    model = _build(head_init=dict(type='Pretrained', checkpoint=str(tmp_path / 'partial.pth')))
    with pytest.raises(CheckpointError, match='unloaded'):
        model.decode_head.init_weights()


def test_head_is_mmsegs_modules_unchanged(via_init_cfg):
    """The official function from mmdet's modules: what the converter maps onto."""
    from mmdet.models.layers import Mask2FormerTransformerDecoder, MSDeformAttnPixelDecoder
    head = via_init_cfg.decode_head
    assert type(head.pixel_decoder) is MSDeformAttnPixelDecoder
    assert type(head.transformer_decoder) is Mask2FormerTransformerDecoder
    assert head.pixel_decoder.num_encoder_levels == 3 and len(head.pixel_decoder.lateral_convs) == 1
    assert head.pixel_decoder.input_convs[0].conv.bias is not None  # the official 1x1 has one
    assert head.num_queries == 100 and len(head.transformer_decoder.layers) == 9
    ffn = head.transformer_decoder.layers[0].ffn.layers[0][0]
    assert ffn.out_features == 4096
    assert head.transformer_decoder.layers[0].cross_attn.num_heads == 16


TTA_CONFIG = ROOT / 'configs/mmseg/mask2former_dinov3_vit7b16_adapter_896_slide_tta_ade20k.py'
SCALE = 14  # the evaluation's sizes / 14 (short sides 59 .. 70, stride 42), 68 px crops:
CROP = 68  # one crop per view but the largest, which slides 2 x 2


def _official_crops(height: int, width: int, crop: int, stride: int) -> list:
    """The crop boxes of the slide formula (official ``slide_inference``, mmseg's alike)."""
    boxes = []
    for row in range(max(height - crop + stride - 1, 0) // stride + 1):
        for col in range(max(width - crop + stride - 1, 0) // stride + 1):
            y2, x2 = min(row * stride + crop, height), min(col * stride + crop, width)
            boxes.append((y2 - max(y2 - crop, 0), x2 - max(x2 - crop, 0)))
    return boxes


def test_published_evaluation_config_slides_and_averages_ten_views(tmp_path):
    """The 896 / 596 slide with five TTA short sides and flips (mmseg's SegTTAModel) at the
    tiny widths, sizes / 14 (tests/test_configs.py steps the config's train and val steps)."""
    from mmengine.dataset import pseudo_collate
    from mmseg.registry import DATASETS, MODELS
    from mmvit_ext.datasets import generate_demo_ade
    assert Config.fromfile(str(TTA_CONFIG)).model.test_cfg == dict(
        mode='slide', crop_size=(896, 896), stride=(596, 596))
    cfg = _tiny_config(path=TTA_CONFIG)
    assert cfg.tta_short_sides == [832, 864, 896, 940, 985]
    head = cfg.model.decode_head  # the evaluation's mechanics: a shallower head will do
    head.update(num_queries=10)
    head.pixel_decoder.encoder.num_layers = head.transformer_decoder.num_layers = 1
    cfg.model.test_cfg.update(crop_size=(CROP, CROP), stride=(596 // SCALE,) * 2)
    sides = [side // SCALE for side in cfg.tta_short_sides]
    for resize, side in zip(cfg.tta_pipeline[1].transforms[0], sides):
        resize.scale = (16 * side, side)
    generate_demo_ade(tmp_path, num_train=1, num_val=1, img_size=(64, 64), seed=0)
    dataset = DATASETS.build(dict(
        cfg.test_dataloader.dataset, data_root=str(tmp_path), pipeline=cfg.tta_pipeline,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation')))
    torch.manual_seed(0)
    model = build_model(cfg, scope='mmseg').eval()
    crops = []
    model.backbone.register_forward_hook(lambda m, args, out: crops.append(args[0].shape[-2:]))
    tta = MODELS.build(dict(cfg.tta_model, module=model))
    with torch.no_grad():
        result = tta.test_step(pseudo_collate([dataset[0]]))[0]
    assert tuple(result.pred_sem_seg.data.shape[-2:]) == tuple(result.ori_shape) == (64, 64)
    want = []
    for side in sides:  # each short side, unflipped and flipped: 10 views
        height = width = side
        want += 2 * _official_crops(height, width, CROP, 596 // SCALE)
    assert sorted(tuple(c) for c in crops) == sorted(want)
    assert len(want) == 16  # the largest view, and its flip, slide (2 x 2 crops)


def test_hidden_dims_sets_every_head_width():
    """The ViT-L / ViT-B configs' one-number head width (``hidden_dims``)."""
    from mmseg.registry import MODELS
    from mmengine.registry import DefaultScope
    cfg = Config.fromfile(str(ROOT / 'configs/mmseg/'
                                     'mask2former_dinov3_vitb16_adapter_512x512_160k_ade20k.py'))
    assert cfg.model.decode_head.hidden_dims == 768
    assert cfg.model.backbone.interaction_indexes == [2, 5, 8, 11]
    with DefaultScope.overwrite_default_scope('mmseg'):
        head = MODELS.build(ConfigDict(cfg.model.decode_head, in_channels=[32] * 4, hidden_dims=64,
                                 num_classes=CLASSES, loss_cls=ConfigDict(
                                     cfg.model.decode_head.loss_cls,
                                     class_weight=[1.0] * CLASSES + [0.1])))
    encoder = head.pixel_decoder.encoder.layers[0]
    decoder = head.transformer_decoder.layers[0]
    assert head.pixel_decoder.input_convs[0].conv.out_channels == 64
    assert encoder.self_attn.embed_dims == decoder.cross_attn.embed_dims == 64
    assert encoder.ffn.layers[0][0].out_features == decoder.ffn.layers[0][0].out_features == 128
    assert head.pixel_decoder.postional_encoding.num_feats == 32
    assert head.decoder_positional_encoding.num_feats == 32
