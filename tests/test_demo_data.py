"""The built-in demo set: valid COCO, exact masks, deterministic."""
import json

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

from mmvit_ext.datasets import CLASSES, demo_data_ready, generate_demo_coco, render_scene


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp('demo')
    summary = generate_demo_coco(root, num_train=64, num_val=6, img_size=(96, 128), seed=3)
    return root, summary


def test_coco_files_load_and_counts_match(demo):
    root, summary = demo
    for split, n in (('train', 64), ('val', 6)):
        coco = COCO(str(root / 'annotations' / f'instances_{split}.json'))
        assert len(coco.getImgIds()) == n == summary[split]['images']
        assert len(coco.getAnnIds()) == summary[split]['annotations'] > n
        assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(CLASSES)
        for img in coco.loadImgs(coco.getImgIds()):
            assert Image.open(root / split / img['file_name']).size == (128, 96)
    assert all(v > 0 for v in summary['train']['per_class'].values())
    assert demo_data_ready(root, num_train=64, num_val=6, img_size=(96, 128), seed=3)
    assert not demo_data_ready(root, num_train=65)


def test_boxes_inside_images_and_masks_exact(demo):
    """annToMask of every annotation equals the visible pixels of its object exactly (polygons
    for unoccluded objects, RLE for occluded ones), and the box is the mask's tight box."""
    root, _ = demo
    coco = COCO(str(root / 'annotations' / 'instances_train.json'))
    rng = np.random.default_rng(3)  # the train split's seed: re-render the scenes
    ious, kinds = [], set()
    for img in coco.loadImgs(coco.getImgIds()):
        _, instance_map, objects = render_scene(rng, (96, 128))
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img['id']))
        assert len(anns) == len(objects)
        for index, ann in enumerate(anns):
            x, y, w, h = ann['bbox']
            assert 0 <= x and 0 <= y and x + w <= 128 and y + h <= 96 and ann['area'] > 0
            mask = coco.annToMask(ann).astype(bool)
            visible = instance_map == index + 1
            ious.append((mask & visible).sum() / (mask | visible).sum())
            ys, xs = visible.nonzero()
            assert [x, y, w, h] == [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]
            kinds.add(type(ann['segmentation']).__name__)
    assert min(ious) == 1.0, min(ious)
    assert kinds == {'list', 'dict'}  # polygons and, for occluded objects, RLE


def test_deterministic_by_seed(tmp_path):
    a = generate_demo_coco(tmp_path / 'a', num_train=4, num_val=2, img_size=(64, 64), seed=1)
    b = generate_demo_coco(tmp_path / 'b', num_train=4, num_val=2, img_size=(64, 64), seed=1)
    generate_demo_coco(tmp_path / "c", num_train=4, num_val=2, img_size=(64, 64), seed=2)
    ann = 'annotations/instances_train.json'
    assert a == b
    assert (tmp_path / 'a' / ann).read_text() == (tmp_path / 'b' / ann).read_text()
    assert (tmp_path / 'a/train/000001.png').read_bytes() == (tmp_path / 'b/train/000001.png').read_bytes()
    assert json.loads((tmp_path / 'a' / ann).read_text()) != json.loads((tmp_path / 'c' / ann).read_text())
