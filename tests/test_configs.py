"""Every config in configs/ trains one step and predicts once on the built-in data.

Each config is used as shipped: its model, its optim_wrapper (built with mmengine's
``build_optim_wrapper``, so constructors and paramwise rules run), its dataset type and pipeline.
Only data roots / annotation files and image sizes are overridden (the sizes in the pipeline's
resize / crop transforms and the segmentor's pad size, and the two-stage detectors' proposal /
RoI sample counts, which set the cost of a CPU step: 50 proposals and 32 sampled RoIs per image
instead of 1000 and 512; a trunk too big for this machine, the 7B, at 1/16 of its width, its
neck and heads alike, ``BIG_TRUNK``), and the backbone's ``init_cfg`` is set to None: no weights are at hand
here, loading is tested in test_load_paths / test_layouts. AmpOptimWrapper needs an accelerator;
on CPU those configs step through mmvit_ext's CPU bf16 one (as tools/train.py runs them there),
with mmcv's ops kept in float32 (mmvit_ext.engine.precision). Budget: see the README's model-zoo note.
The panoptic configs read the built-in COCO set in COCO's panoptic form (every shape a thing, the
rest one stuff segment: mmvit_ext.datasets.write_coco_panoptic).
"""
import copy
import importlib.util
import logging
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.logging import MMLogger
from mmengine.device import is_cuda_available
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

from mmvit_ext.engine import CpuAmpOptimWrapper, amp_on_cpu, keep_ops_float32
from mmvit_ext.backbones import VisionTransformer
from mmvit_ext.registry import MODELS
from mmvit_ext.utils import build_model, task_scope

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / 'configs').rglob('*.py')
                 if '_base_' not in p.parts)
DEMO_CLASSES = ('circle', 'square', 'triangle', 'star', 'hexagon')
DEMO_STUFF = 'background'  # the panoptic form's one stuff class: what no shape covers
# Small sizes the models take: 64 px detector inputs (mmdet pads to 32), 64 px crops.
DET_SCALE, DET_CROP = (64, 64), (32, 48)
SEG_SCALE, SEG_CROP = (128, 64), (64, 64)
CLS_CROP, CLS_EDGE = 64, 72
# A trunk past this many parameters (about 12 dim^2 per block) steps at 1/16 of its width, its
# depth, heads and block structure kept, and every width of the neck and heads that follow it
# scaled alike: the DINOv3 ViT-7B's float32 weights alone (26.9 GB) exceed this machine's memory,
# and a plain ViT-L (0.3 B) with a Mask2Former head or EoMT's queries takes minutes a step on
# 2 cores; ViT-B (86 M) and smaller, and the other families' presets below 2e9, step at their
# width.
BIG_TRUNK, BIG_TRUNK_SHRINK = 2e8, 16


def test_configs_found():
    """The walk sees every task (top-level, mmdet/, mmseg/, mmpretrain/, demo/)."""
    scopes = [p.split('/')[1] for p in CONFIGS if p.count('/') == 2]
    assert {'mmdet', 'mmseg', 'mmpretrain', 'demo'} <= set(scopes)
    assert len(CONFIGS) >= 70


@pytest.fixture(scope='session')
def demo_roots(tmp_path_factory):
    """Tiny COCO / ADE20K / ImageNet-style sets, written once per session."""
    from mmvit_ext.datasets import generate_demo_ade, generate_demo_coco, write_coco_panoptic
    import mmcv
    root = tmp_path_factory.mktemp('config_data')
    generate_demo_coco(root / 'coco', num_train=2, num_val=1, img_size=(96, 128), seed=0)
    write_coco_panoptic(root / 'coco', stuff_name=DEMO_STUFF)  # for the panoptic configs
    generate_demo_ade(root / 'ade', num_train=2, num_val=1, img_size=(64, 96), seed=0)
    imagenet = root / 'imagenet'  # ImageNet layout with meta/{train,val}.txt ("file label")
    (imagenet / 'meta').mkdir(parents=True)
    for split in ('train', 'val'):
        (imagenet / split).mkdir()
        lines = []
        for index, image in enumerate(sorted((root / 'coco' / 'train').glob('*.png'))):
            mmcv.imwrite(mmcv.imread(str(image)), str(imagenet / split / f'{index}.JPEG'))
            lines.append(f'{index}.JPEG {index * 7}')
        (imagenet / 'meta' / f'{split}.txt').write_text('\n'.join(lines) + '\n')
    return root


def _shrink(node, scope: str) -> int:
    """Shrink the size arguments of every transform under ``node`` in place; returns how many."""
    changed = 0
    if isinstance(node, (list, tuple)):
        return sum(_shrink(item, scope) for item in node)
    if not isinstance(node, dict):
        return 0
    kind = node.get('type', '')
    if scope == 'mmdet':
        if 'scale' in node:
            node['scale'], changed = DET_SCALE, changed + 1
        if 'scales' in node:
            node['scales'], changed = [DET_SCALE], changed + 1
        if kind == 'RandomCrop':
            node['crop_size'], changed = DET_CROP, changed + 1
    elif scope == 'mmseg':
        if kind in ('Resize', 'RandomResize'):
            node['scale'], changed = SEG_SCALE, changed + 1
        if kind == 'RandomCrop':
            node['crop_size'], changed = SEG_CROP, changed + 1
    else:
        if kind in ('RandomResizedCrop', 'ResizeEdge'):
            node['scale'] = CLS_CROP if kind == 'RandomResizedCrop' else CLS_EDGE
            changed += 1
        if kind == 'CenterCrop':
            node['crop_size'], changed = CLS_CROP, changed + 1
    return changed + sum(_shrink(v, scope) for k, v in node.items() if k != 'type')


def _fewer_proposals(model: dict) -> None:
    """Proposal and RoI-sample counts of a two-stage detector cut to a CPU step's size."""
    train, test = model.get('train_cfg') or {}, model.get('test_cfg') or {}
    if 'rpn_proposal' in train:
        train['rpn_proposal'].update(nms_pre=200, max_per_img=50)
        stages = train['rcnn'] if isinstance(train['rcnn'], list) else [train['rcnn']]
        for stage in stages:
            stage['sampler']['num'] = 32
    if 'rpn' in test:
        test['rpn'].update(nms_pre=200, max_per_img=50)
        test['rcnn']['max_per_img'] = 20


# every width of the neck and heads, narrowed with a big trunk
HEAD_WIDTHS = ('in_channels', 'channels', 'feat_channels', 'out_channels', 'embed_dims',
               'feedforward_channels', 'num_feats', 'hidden_dims')


def _narrow(node, scale: int) -> None:
    """Divide every width under ``node`` (:data:`HEAD_WIDTHS`) by ``scale``, in place."""
    if isinstance(node, (list, tuple)):
        for item in node:
            _narrow(item, scale)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in HEAD_WIDTHS and isinstance(value, int):
                node[key] = value // scale
            elif key in HEAD_WIDTHS and isinstance(value, (list, tuple)):
                node[key] = [v // scale for v in value]
            else:
                _narrow(value, scale)


def _shrink_big_trunk(model: dict) -> None:
    """A trunk over :data:`BIG_TRUNK` parameters cut to 1/16 of its width (module docstring),
    the neck and heads narrowed alike."""
    backbone = model.backbone
    cls = MODELS.get(backbone.type)
    zoo = getattr(cls, 'arch_zoo', None) or VisionTransformer.arch_zoo  # EoMT: the ViT presets
    arch = backbone.get('arch')
    if not isinstance(arch, str) or arch not in zoo:
        return
    preset = dict(zoo[arch])
    depth = preset.get('depth')  # plain trunks; the pyramids' stages are far below the bound
    bound = BIG_TRUNK if zoo is VisionTransformer.arch_zoo else 2e9  # CaiT-M48 steps as it is
    if not isinstance(depth, int) or 12 * preset['embed_dims'] ** 2 * depth <= bound:
        return
    backbone.arch = dict(preset, embed_dims=preset['embed_dims'] // BIG_TRUNK_SHRINK)
    for part in ('neck', 'decode_head', 'auxiliary_head', 'rpn_head', 'roi_head'):
        _narrow(model.get(part), BIG_TRUNK_SHRINK)


def _dataset_cfg(cfg: Config, split: str, scope: str, roots: Path) -> dict:
    """The config's own dataset for ``split``, pointed at the demo data, sizes shrunk."""
    dataset = copy.deepcopy(cfg[f'{split}_dataloader'].dataset)
    train = split == 'train'
    if scope == 'mmdet' and dataset.type == 'CocoPanopticDataset':
        sub = 'train' if train else 'val'
        dataset.update(data_root=str(roots / 'coco'),
                       metainfo=dict(classes=DEMO_CLASSES + (DEMO_STUFF,)),
                       ann_file=f'annotations/panoptic_{sub}.json',
                       data_prefix=dict(img=f'{sub}/', seg=f'annotations/panoptic_{sub}/'))
    elif scope == 'mmdet':
        dataset.update(data_root=str(roots / 'coco'), metainfo=dict(classes=DEMO_CLASSES),
                       ann_file=f'annotations/instances_{"train" if train else "val"}.json',
                       data_prefix=dict(img='train/' if train else 'val/'))
    elif scope == 'mmseg':
        sub = 'training' if train else 'validation'
        dataset.update(data_root=str(roots / 'ade'),
                       data_prefix=dict(img_path=f'images/{sub}', seg_map_path=f'annotations/{sub}'))
    else:
        dataset.update(data_root=str(roots / 'imagenet'), split='train' if train else 'val')
    assert _shrink(dataset.pipeline, scope) >= 1, 'no size found to shrink in the pipeline'
    return dataset


def _batch(cfg: Config, split: str, scope: str, roots: Path) -> dict:
    datasets = __import__(f'{scope}.registry', fromlist=['DATASETS']).DATASETS
    dataset = datasets.build(_dataset_cfg(cfg, split, scope, roots))
    # one image (a step's cost, not its statistics); two for a segmentor's train step, whose
    # pyramid-pooling BatchNorm sees a 1x1 map per image
    count = 2 if scope == 'mmseg' and split == 'train' else 1
    return pseudo_collate([dataset[i] for i in range(count)])


def _prepared(path: str, roots: Path):
    """``(cfg, scope, model, optim_wrapper, train_batch, val_batch)`` of a config as shipped,
    data and sizes cut to a CPU step (the module docstring). An ``AmpOptimWrapper`` becomes
    mmvit_ext's CPU bf16 one, as tools/train.py makes it without CUDA; mmcv's ops get float32
    as the run hooks draw it (Fp32OpsHook)."""
    cfg = Config.fromfile(str(ROOT / path))
    assert cfg.model.backbone.type.startswith('mmvit_ext.')
    cfg.model.backbone.init_cfg = None
    _shrink_big_trunk(cfg.model)
    cfg.model.setdefault('data_preprocessor', cfg.get('data_preprocessor'))  # as the Runner does
    scope = task_scope(cfg)
    if scope == 'mmseg':  # pad / crop size of the segmentor follows the crop
        cfg.model.data_preprocessor.size = SEG_CROP
    _fewer_proposals(cfg.model)
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    amp_on_cpu(optim_cfg)
    __import__(f'{scope}.datasets')
    torch.manual_seed(0)
    model = build_model(cfg, scope=scope)
    keep_ops_float32(model)
    with DefaultScope.overwrite_default_scope(scope):
        logger = MMLogger.get_current_instance()
        level, logger.level = logger.level, logging.WARNING  # one INFO line per tensor otherwise
        try:
            optim_wrapper = build_optim_wrapper(model, optim_cfg)
        finally:
            logger.setLevel(level)
        train_batch = _batch(cfg, 'train', scope, roots)
        val_batch = _batch(cfg, 'val', scope, roots)
    return cfg, scope, model, optim_wrapper, train_batch, val_batch


def _panopticapi_stand_in(monkeypatch) -> None:
    """mmdet's LoadPanopticAnnotations takes ``rgb2id`` from panopticapi, which installs from
    git only and is not here (a run needs it, CocoPanopticMetric too): where it is missing, a
    module with COCO's formula, ``id = R + 256 G + 256^2 B``, stands in for this step."""
    if importlib.util.find_spec('panopticapi') is None:
        module = types.ModuleType('panopticapi')
        module.utils = types.SimpleNamespace(
            rgb2id=lambda rgb: rgb.astype(np.int64) @ np.array([1, 256, 256 ** 2]))
        monkeypatch.setitem(sys.modules, 'panopticapi', module)


def _backbone_dtypes(model) -> list:
    """A list that collects, per backbone call, the narrowest dtype of its outputs (the DINOv3
    adapter, as the official one, gives float32 maps beside bfloat16 ones under autocast)."""
    seen = []
    model.backbone.register_forward_hook(
        lambda m, a, out: seen.append(min((o.dtype for o in out), key=lambda d: d.itemsize)))
    return seen


@pytest.mark.parametrize('path', CONFIGS)
def test_config_trains_one_step_and_predicts(path, demo_roots, monkeypatch):
    _panopticapi_stand_in(monkeypatch)
    cfg, scope, model, optim_wrapper, train_batch, val_batch = _prepared(path, demo_roots)
    amp = cfg.optim_wrapper.get('type') == 'AmpOptimWrapper'
    assert isinstance(optim_wrapper, CpuAmpOptimWrapper) == (amp and not is_cuda_available())
    dtypes = _backbone_dtypes(model)

    # the backbone trains, unless the config freezes all of it (frozen DINOv2 features): then
    # it stays as it was and the first trainable parameter after it (the head) trains
    frozen = all(not p.requires_grad for p in model.backbone.parameters())
    backbone = dict(model.backbone.named_parameters())
    name, first = next((n, p) for n, p in model.named_parameters()
                       if p.requires_grad and (frozen or n.startswith('backbone.')))
    snapshot = {n: p.detach().clone() for n, p in backbone.items()} if frozen else {}
    before = first.detach().clone()
    model.train()
    log_vars = model.train_step(train_batch, optim_wrapper)
    assert torch.isfinite(log_vars['loss']) and log_vars['loss'] > 0, log_vars
    # an AMP config's step ran under autocast (bf16 on CPU), the others in float32
    assert dtypes == [torch.bfloat16 if amp else torch.float32], dtypes
    assert not torch.equal(before, first.detach()), f'{name} not updated'
    assert all(torch.equal(v, backbone[n]) for n, v in snapshot.items()), 'frozen backbone changed'

    model.eval()
    with torch.no_grad():
        predictions = model.val_step(val_batch)
    assert len(predictions) == len(val_batch['inputs'])
    sample = predictions[0]
    if scope == 'mmdet':
        test_cfg = cfg.model.get('test_cfg') or {}
        if test_cfg.get('panoptic_on'):  # Mask2Former's fusion head, at the image's size
            assert tuple(sample.pred_panoptic_seg.sem_seg.shape[-2:]) == tuple(sample.ori_shape)
        if test_cfg.get('instance_on', True):
            assert 'bboxes' in sample.pred_instances
            assert sample.pred_instances.bboxes.shape[-1] == 4
        if 'mask_head' in cfg.model.get('roi_head', {}):
            assert 'masks' in sample.pred_instances
    elif scope == 'mmseg':
        assert tuple(sample.pred_sem_seg.data.shape[-2:]) == tuple(sample.ori_shape)
    else:
        assert sample.pred_score.shape == (cfg.model.head.num_classes,)
        assert np.isclose(float(sample.pred_score.sum()), 1.0, atol=1e-4)


# one config per head we ship: Mask R-CNN, Cascade Mask R-CNN, RetinaNet, UperNet, semantic FPN
AUTOCAST_CONFIGS = ('configs/mask_rcnn_pvtv2_b2.py',
                    'configs/mmdet/cascade_mask_rcnn_swin_t_fpn_ms_3x_coco.py',
                    'configs/retinanet_pvtv2_b2_fpn_1x_coco.py',
                    'configs/upernet_swin_t_512x512_160k_ade20k.py',
                    'configs/mmseg/fpn_pvtv2_b2_512x512_40k_ade20k.py')


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
@pytest.mark.parametrize('path', AUTOCAST_CONFIGS)
def test_whole_model_autocast_trains_and_predicts(path, dtype, demo_roots):
    """The whole loss forward under CPU autocast (the region CUDA AMP autocasts: heads, RPN,
    RoI extraction and NMS included), backward, then prediction under autocast."""
    cfg, scope, model, _, train_batch, val_batch = _prepared(path, demo_roots)
    model.init_weights()  # as the Runner does (heads' priors: float16 has no loss scaler here)
    dtypes = _backbone_dtypes(model)
    model.train()
    start = time.perf_counter()
    data = model.data_preprocessor(train_batch, True)
    with torch.autocast('cpu', dtype=dtype):
        losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    loss.backward()
    seconds = time.perf_counter() - start
    assert dtypes == [dtype] and loss.dtype == torch.float32
    assert torch.isfinite(loss) and loss > 0, losses
    grads = [p.grad for p in model.backbone.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    print(f'AUTOCAST {path} {dtype}: loss {loss.item():.3f}, {seconds:.2f} s')
    model.eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=dtype):
        predictions = model.val_step(val_batch)
    assert len(predictions) == len(val_batch['inputs'])
    if scope == 'mmdet':
        assert predictions[0].pred_instances.bboxes.dtype == torch.float32


def test_bf16_without_the_float32_boundary_fails_in_mmcv(demo_roots):
    """Why the boundary exists: mmcv's NMS refuses the bf16 scores a whole-model autocast makes."""
    cfg = Config.fromfile(str(ROOT / 'configs/mmdet/mask_rcnn_pvtv2_b0_fpn_1x_coco.py'))
    cfg.model.backbone.init_cfg = None
    _fewer_proposals(cfg.model)
    model = build_model(cfg, scope='mmdet').train()
    with DefaultScope.overwrite_default_scope('mmdet'):
        data = model.data_preprocessor(_batch(cfg, 'train', 'mmdet', demo_roots), True)
    with pytest.raises(RuntimeError, match='BFloat16'), torch.autocast('cpu', dtype=torch.bfloat16):
        model(**data, mode='loss')


def test_recipes_exclude_norms_and_tables_from_weight_decay():
    cfg = Config.fromfile(str(ROOT / 'configs/mask_rcnn_swin_t_fpn_1x_coco.py'))
    keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
    assert keys['norm'].decay_mult == 0 and keys['relative_position_bias_table'].decay_mult == 0
    assert cfg.optim_wrapper.optimizer.type == 'AdamW' and cfg.optim_wrapper.optimizer.lr == 1e-4
    pvt = Config.fromfile(str(ROOT / 'configs/mask_rcnn_pvtv2_b2.py'))
    assert pvt.optim_wrapper.optimizer == dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                                               weight_decay=1e-4)
    assert pvt.train_cfg.max_epochs == 12 and pvt.auto_scale_lr.base_batch_size == 16
    assert pvt.model.backbone.init_cfg.checkpoint == 'checkpoints/pvt_v2_b2.pth'
    ms3x = Config.fromfile(str(ROOT / 'configs/mmdet/mask_rcnn_swin_t_fpn_ms_3x_coco.py'))
    assert ms3x.train_cfg.max_epochs == 36 and ms3x.param_scheduler[1].milestones == [27, 33]
    vit = Config.fromfile(str(ROOT / 'configs/mask_rcnn_deepvit_s_fpn_1x_coco.py'))
    assert vit.optim_wrapper.constructor == 'mmvit_ext.LayerDecayOptimWrapperConstructor'
    assert 0.7 <= vit.optim_wrapper.paramwise_cfg.layer_decay_rate <= 0.8
    fpn = Config.fromfile(str(ROOT / 'configs/mmseg/fpn_pvtv2_b2_512x512_40k_ade20k.py'))
    assert fpn.param_scheduler[-1].type == 'PolyLR' and fpn.train_cfg.max_iters == 40000


def test_plain_vit_mask_rcnn_trains_one_step_at_512():
    """One Mask R-CNN step at 512x512 on CPU (the size the windowed trunk is built for)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    torch.manual_seed(0)
    model = build_model(ROOT / 'configs/mask_rcnn_deepvit_s_fpn_1x_coco.py', pretrained=False)
    model.init_weights()
    model.train()
    images, samples = [], []
    for _ in range(2):
        images.append(torch.rand(3, 512, 512) * 255)
        sample = DetDataSample(metainfo=dict(img_shape=(512, 512), ori_shape=(512, 512),
                                             pad_shape=(512, 512), scale_factor=(1.0, 1.0),
                                             batch_input_shape=(512, 512)))
        masks = np.zeros((2, 512, 512), dtype=np.uint8)
        masks[0, 40:200, 60:260] = 1
        masks[1, 300:480, 200:420] = 1
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor([[60., 40., 260., 200.], [200., 300., 420., 480.]]),
            labels=torch.tensor([1, 7]), masks=BitmapMasks(masks, 512, 512))
        samples.append(sample)
    data = model.data_preprocessor(dict(inputs=images, data_samples=samples), training=True)
    before = {k: v.detach().clone() for k, v in model.backbone.named_parameters()}
    losses = model(**data, mode='loss')
    total = sum(v.sum() if isinstance(v, torch.Tensor) else sum(v) for k, v in losses.items()
                if 'loss' in k)
    assert torch.isfinite(total) and total > 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    total.backward()
    optimizer.step()
    changed = sum(not torch.equal(before[k], v) for k, v in model.backbone.named_parameters())
    assert changed == len(before), f'only {changed} of {len(before)} backbone tensors updated'
