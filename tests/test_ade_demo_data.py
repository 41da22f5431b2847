"""The built-in ADE20K-format demo set: layout, classes, the reduce_zero_label convention, and
mmseg's own ADE20KDataset / pipeline reading it unchanged."""
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mmvit_ext.datasets import (SCENE_CLASSES, demo_ade_ready, generate_demo_ade,
                                render_parsing_scene)
from tool_runner import ROOT, tool_process

SIZE = (96, 128)


@pytest.fixture(scope='module')
def ade(tmp_path_factory):
    root = tmp_path_factory.mktemp('demo_ade') / 'ADEChallengeData2016'
    summary = generate_demo_ade(root, num_train=24, num_val=6, img_size=SIZE, seed=3)
    return root, summary


def test_layout_and_label_convention(ade):
    root, summary = ade
    assert len(SCENE_CLASSES) >= 8
    for split, n in (('training', 24), ('validation', 6)):
        images = sorted((root / 'images' / split).glob('*.jpg'))
        annotations = sorted((root / 'annotations' / split).glob('*.png'))
        assert len(images) == len(annotations) == n == summary[split]['images']
        assert [p.stem for p in images] == [p.stem for p in annotations]
        for image_path, ann_path in zip(images, annotations):
            image, label = Image.open(image_path), Image.open(ann_path)
            assert image.mode == 'RGB' and image.size == (SIZE[1], SIZE[0])
            assert label.mode == 'L' and label.size == image.size
            assert np.asarray(label).max() <= len(SCENE_CLASSES)  # 0 = other, 1..K
    shares = summary['training']['pixel_share']
    assert list(shares) == ['other', *SCENE_CLASSES]
    assert all(shares[c] > 0 for c in SCENE_CLASSES) and 0 < shares['other'] < 0.3
    assert sum(shares.values()) == pytest.approx(1, abs=1e-3)
    assert demo_ade_ready(root, num_train=24, num_val=6, img_size=SIZE, seed=3)
    assert not demo_ade_ready(root, num_train=25)
    assert not demo_ade_ready(root.parent / 'missing')


def test_regions_are_textured_and_irregular():
    """Every class region carries texture (pixel spread), and boundaries are not straight:
    the label changes along many rows at many different columns."""
    rng = np.random.default_rng(0)
    stds, boundary_cols = {}, set()
    for _ in range(20):
        image, label = render_parsing_scene(rng, (128, 128))
        for k in range(1, len(SCENE_CLASSES) + 1):
            if (label == k).sum() > 200:
                stds.setdefault(k, []).append(image[label == k].astype(float).std())
        changes = np.nonzero(np.diff(label.astype(int), axis=1))
        boundary_cols.update(changes[1].tolist())
    assert set(stds) == set(range(1, len(SCENE_CLASSES) + 1))
    assert min(np.median(v) for v in stds.values()) > 15  # not flat colour
    assert len(boundary_cols) > 100


def test_deterministic_by_seed(tmp_path):
    a = generate_demo_ade(tmp_path / 'a', num_train=3, num_val=2, img_size=(64, 64), seed=1)
    b = generate_demo_ade(tmp_path / 'b', num_train=3, num_val=2, img_size=(64, 64), seed=1)
    generate_demo_ade(tmp_path / 'c', num_train=3, num_val=2, img_size=(64, 64), seed=2)
    ann = 'annotations/training/ADE_demo_train_000001.png'
    assert a == b
    assert (tmp_path / 'a' / ann).read_bytes() == (tmp_path / 'b' / ann).read_bytes()
    assert (tmp_path / 'a' / ann).read_bytes() != (tmp_path / 'c' / ann).read_bytes()


def test_mmseg_ade20k_dataset_reads_it_unchanged(ade):
    """mmseg's ADE20KDataset with the shipped ADE20K pipeline settings: labels 1..K become
    0..K-1 and 0 becomes the ignore index 255 (reduce_zero_label)."""
    from mmengine.registry import init_default_scope
    from mmseg.datasets import ADE20KDataset
    init_default_scope('mmseg')
    root, _ = ade
    dataset = ADE20KDataset(
        data_root=str(root), data_prefix=dict(img_path='images/validation',
                                              seg_map_path='annotations/validation'),
        pipeline=[dict(type='LoadImageFromFile'),
                  dict(type='LoadAnnotations', reduce_zero_label=True),
                  dict(type='PackSegInputs')])
    assert len(dataset) == 6 and dataset.reduce_zero_label
    assert dataset.metainfo['classes'][0] == 'wall' and len(dataset.metainfo['classes']) == 150
    for index in range(len(dataset)):
        sample = dataset[index]
        raw = np.asarray(Image.open(dataset.get_data_info(index)['seg_map_path']))
        got = sample['data_samples'].gt_sem_seg.data[0].numpy()
        expected = np.where(raw == 0, 255, raw.astype(np.int64) - 1)
        assert (got == expected).all()
        assert sample['inputs'].shape == (3, *SIZE)


def _iou_metrics(preds_path, num_classes: int) -> dict:
    """mIoU / aAcc (in %) from tools/test.py's dumped predictions and the label PNGs they name,
    as mmseg defines them: per-class intersection and union summed over images, IoU averaged
    over the classes with a non-empty union, label 0 ignored and v read as class v - 1."""
    import pickle
    samples = pickle.loads(Path(preds_path).read_bytes())
    intersect = np.zeros(num_classes)
    union = np.zeros(num_classes)
    labelled = 0
    for sample in samples:
        pred = np.asarray(sample['pred_sem_seg']['data']).reshape(-1)
        raw = np.asarray(Image.open(sample['seg_map_path'])).reshape(-1).astype(np.int64)
        keep = raw != 0
        label, pred = raw[keep] - 1, pred[keep]
        labelled += keep.sum()
        hit = label[pred == label]
        intersect += np.bincount(hit, minlength=num_classes)[:num_classes]
        union += np.bincount(pred, minlength=num_classes)[:num_classes] + \
            np.bincount(label, minlength=num_classes)[:num_classes] - \
            np.bincount(hit, minlength=num_classes)[:num_classes]
    present = union > 0
    return dict(mIoU=100 * float((intersect[present] / union[present]).mean()),
                aAcc=100 * float(intersect.sum() / labelled), images=len(samples))


def _test_tool(*args: str) -> subprocess.CompletedProcess:
    return tool_process('tools/test.py', *args, timeout=900)


def test_shipped_upernet_config_evaluates_on_a_generated_dir(ade, tmp_path):
    """tools/test.py with the shipped 150-class UperNet Swin-T ADE20K config, pointed at the
    generated directory by --cfg-options only (data root, test resize, loader workers; the model
    is the config's own, randomly initialised): mmseg's IoUMetric runs over every val image.
    The metrics it logs equal mIoU and aAcc computed here, in numpy, from the predictions it
    dumped and the generated label PNGs (150 classes, 0 -> ignored, v -> v - 1): the generated
    labels reach the metric as written. A directory without the layout is refused with one line
    naming the missing folders."""
    from mmvit_ext.utils import build_model
    root, _ = ade
    config = 'configs/upernet_swin_t_512x512_160k_ade20k.py'
    torch.manual_seed(0)
    model = build_model(config, pretrained=False)  # random weights: nothing to download
    checkpoint = tmp_path / 'upernet_swin_t_random.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, checkpoint)
    options = ['test_dataloader.num_workers=1', 'test_dataloader.persistent_workers=False',
               f'test_dataloader.dataset.pipeline.1.scale=({SIZE[1]},{SIZE[0]})']

    preds = tmp_path / 'preds.pkl'
    result = _test_tool(config, str(checkpoint), '--work-dir', str(tmp_path / 'eval'),
                        '--out', str(preds),
                        '--cfg-options', f'test_dataloader.dataset.data_root={root}', *options)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert 'Iter(test) [6/6]' in result.stdout + result.stderr
    from mmvit_ext.utils.demo_report import latest_test_metrics
    metrics = latest_test_metrics(tmp_path / 'eval')
    expected = _iou_metrics(preds, num_classes=150)
    print(f"random UperNet on the generated set: mIoU {metrics['mIoU']:.2f} (recomputed "
          f"{expected['mIoU']:.2f}), aAcc {metrics['aAcc']:.2f} ({expected['aAcc']:.2f})")
    # the metric rounds to 2 decimals
    assert abs(metrics['mIoU'] - expected['mIoU']) <= 0.01
    assert abs(metrics['aAcc'] - expected['aAcc']) <= 0.01
    assert expected['images'] == 6

    empty = tmp_path / 'not_ade'
    empty.mkdir()
    result = _test_tool(config, str(checkpoint), '--cfg-options',
                        f'test_dataloader.dataset.data_root={empty}', *options)
    errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert len(errors) == 1 and 'data_prefix: folders' in errors[0]
    assert f"'{empty}/images/validation', '{empty}/annotations/validation' not found" in errors[0]
    assert 'ADEChallengeData2016 layout' in errors[0]


def test_new_tools_have_help_with_an_example():
    for tool in ('make_ade_demo_data.py', 'summarize_seg_demo.py'):
        result = tool_process(f'tools/{tool}', '--help', timeout=300)
        assert result.returncode == 0 and 'Example' in result.stdout, tool


def test_prechecks_of_the_demo_config():
    """tools/train.py's channel pre-check compares the backbone with the module reading it: the
    FPN neck here (the decode head reads the neck), the decode head in UperNet (no neck), none
    in EoMT."""
    from mmengine.config import Config
    from mmvit_ext.utils.config_checks import neck_channel_mismatch
    cfg = Config.fromfile(str(ROOT / 'configs/demo/fpn_pvtv2_b0_ade_demo.py'))
    assert neck_channel_mismatch(cfg) == []
    cfg.model.neck.in_channels = [64, 128, 320, 512]
    (problem,) = neck_channel_mismatch(cfg)
    assert 'model.neck.in_channels=[64, 128, 320, 512]' in problem
    assert 'use in_channels=[32, 64, 160, 256]' in problem
    upernet = Config.fromfile(str(ROOT / 'configs/upernet_swin_t_512x512_160k_ade20k.py'))
    assert neck_channel_mismatch(upernet) == []
    upernet.model.decode_head.in_channels = [32, 64, 160, 256]
    (problem,) = neck_channel_mismatch(upernet)
    assert 'use in_channels=[96, 192, 384, 768]' in problem
    # EoMT's head reads the network's predictions, no channel list: nothing to compare
    eomt = Config.fromfile(str(ROOT / 'configs/demo/eomt_vit_t6_ade_demo.py'))
    assert 'in_channels' not in eomt.model.decode_head and neck_channel_mismatch(eomt) == []
