"""The built-in ADE20K-format demo set: layout, classes, the reduce_zero_label convention, and
mmseg's own ADE20KDataset / pipeline reading it unchanged."""
import numpy as np
import pytest
from PIL import Image

from mmvit_ext.datasets import (SCENE_CLASSES, demo_ade_ready, generate_demo_ade,
                                render_parsing_scene)

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
