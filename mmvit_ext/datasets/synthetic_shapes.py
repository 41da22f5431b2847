"""Built-in demo data: a COCO-format instance-segmentation set of synthetic scenes.

Every scene has a muted, noisy gradient background and 1-4 large shapes (5 classes) that may
occlude each other. The set is easy on purpose, so a detector trained from scratch on a CPU
learns it in minutes: each class has its own hue (the demo config's palette, jittered in
brightness and tone), objects span 10-25 % of the shorter side in radius, and a placement that
would hide more than 25 % of an earlier object is resampled. Pixels are painted from a
per-pixel instance map rasterised the way COCO tools decode polygons, so masks are exact: an
unoccluded object is annotated by its polygon, an occluded one by the RLE of its visible pixels.
Deterministic by seed.
"""
import json
import math
from pathlib import Path
from typing import Dict, List, Tuple, Union

import numpy as np
from PIL import Image

from .ready import is_ready, write_ready

CLASSES = ('circle', 'square', 'triangle', 'star', 'hexagon')
# the class hues, as configs/demo/mask_rcnn_pvtv2_b2_demo.py draws them
CLASS_COLOURS = ((220, 20, 60), (0, 128, 255), (60, 180, 75), (255, 165, 0), (145, 30, 180))
MIN_VISIBLE = 0.75  # an occluded object keeps at least this fraction of its pixels
RADIUS_RANGE = (0.1, 0.25)  # object radius as a fraction of the shorter image side
VERSION = 3  # bump when the generator's output changes, so stale sets are rewritten


def shape_polygon(kind: str, cx: float, cy: float, radius: float, angle: float
                  ) -> List[Tuple[float, float]]:
    """Vertices of a shape inscribed in a circle of ``radius`` around (cx, cy)."""
    if kind == 'star':
        radii = [radius if i % 2 == 0 else radius * 0.45 for i in range(10)]
        steps = 10
    else:
        steps = {'circle': 32, 'square': 4, 'triangle': 3, 'hexagon': 6}[kind]
        radii = [radius] * steps
    return [(cx + r * math.cos(angle + 2 * math.pi * i / steps),
             cy + r * math.sin(angle + 2 * math.pi * i / steps)) for i, r in enumerate(radii)]


def _raster(polygon: List[Tuple[float, float]], size: Tuple[int, int]) -> np.ndarray:
    """Rasterise exactly as COCO tools (and mmdet's poly2mask) decode a polygon annotation."""
    from pycocotools import mask as mask_utils
    flat = [c for xy in polygon for c in xy]
    return mask_utils.decode(mask_utils.frPyObjects([flat], size[0], size[1]))[..., 0].astype(bool)


def _background(rng: np.random.Generator, size: Tuple[int, int]) -> np.ndarray:
    """A low-saturation gradient with pixel noise: no hue competes with the objects'."""
    h, w = size
    c0, c1 = (rng.uniform(60, 200) + rng.uniform(-15, 15, 3) for _ in range(2))
    t = (np.linspace(0, 1, w)[None, :] * math.cos(rng.uniform(0, math.pi)) +
         np.linspace(0, 1, h)[:, None] * math.sin(rng.uniform(0, math.pi)))
    t = (t - t.min()) / max(t.max() - t.min(), 1e-6)
    img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    return img + rng.normal(0, rng.uniform(3, 10), (h, w, 3))


def _texture(rng: np.random.Generator, size: Tuple[int, int], colour: np.ndarray) -> np.ndarray:
    """Solid, striped, checkered or noisy fill in the object's colour (shading of at most 20 %)."""
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w]
    style = rng.integers(4)
    if style == 1:
        period = rng.uniform(4, 10)
        gain = 0.8 + 0.2 * (np.sin((xx * math.cos(rng.uniform(0, 3)) + yy) / period) > 0)
    elif style == 2:
        cell = int(rng.integers(3, 8))
        gain = 0.8 + 0.2 * (((xx // cell) + (yy // cell)) % 2)
    elif style == 3:
        gain = rng.uniform(0.85, 1.0, (h, w))
    else:
        gain = np.ones((h, w))
    return colour[None, None, :] * gain[..., None]


def _class_colour(rng: np.random.Generator, kind: int) -> np.ndarray:
    """The class hue, jittered in brightness and per channel."""
    colour = np.array(CLASS_COLOURS[kind], dtype=float) * rng.uniform(0.8, 1.1)
    return np.clip(colour + rng.uniform(-20, 20, 3), 0, 255)


def render_scene(rng: np.random.Generator, size: Tuple[int, int], max_objects: int = 4):
    """One image (H, W, 3) uint8, the instance map (H, W) int (0 = background) and the
    objects ``[(class_index, polygon)]`` in drawing order (instance id = position + 1)."""
    h, w = size
    image = _background(rng, size)
    instance_map = np.zeros(size, dtype=np.int32)
    objects: List[Tuple[int, List[Tuple[float, float]]]] = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(20):
            kind = int(rng.integers(len(CLASSES)))
            radius = rng.uniform(*RADIUS_RANGE) * min(h, w)
            cx, cy = rng.uniform(radius, w - radius), rng.uniform(radius, h - radius)
            polygon = shape_polygon(CLASSES[kind], cx, cy, radius, rng.uniform(0, 2 * math.pi))
            mask = _raster(polygon, size)
            if mask.sum() < 40:
                continue
            trial = np.where(mask, len(objects) + 1, instance_map)
            earlier_ok = all((trial == i + 1).sum() >= MIN_VISIBLE * _raster(p, size).sum()
                             for i, (_, p) in enumerate(objects))
            if earlier_ok:
                instance_map = trial
                objects.append((kind, polygon))
                colour = _class_colour(rng, kind)
                image = np.where(mask[..., None], _texture(rng, size, colour), image)
                break
    return np.clip(image, 0, 255).astype(np.uint8), instance_map, objects


def _annotation(instance_map: np.ndarray, index: int, kind: int,
                polygon: List[Tuple[float, float]], size: Tuple[int, int]) -> dict:
    from pycocotools import mask as mask_utils
    visible = instance_map == index + 1
    ys, xs = np.nonzero(visible)
    bbox = [float(xs.min()), float(ys.min()), float(xs.max() - xs.min() + 1),
            float(ys.max() - ys.min() + 1)]
    full = _raster(polygon, size)
    if visible.sum() == full.sum():  # unoccluded: the exact polygon
        segmentation: Union[list, dict] = [[c for xy in polygon for c in xy]]
    else:  # occluded: run-length encoding of exactly the visible pixels
        rle = mask_utils.encode(np.asfortranarray(visible.astype(np.uint8)))
        segmentation = {'size': list(rle['size']), 'counts': rle['counts'].decode('ascii')}
    return dict(category_id=kind + 1, bbox=bbox, area=float(visible.sum()),
                segmentation=segmentation, iscrowd=0)


def generate_demo_coco(root: Union[str, Path], num_train: int = 128, num_val: int = 24,
                       img_size: Tuple[int, int] = (192, 192), seed: int = 0) -> Dict[str, dict]:
    """Write ``root/{train,val}/*.png`` and ``root/annotations/instances_{train,val}.json``.

    Returns per-split counts of images, annotations and annotations per class.
    """
    root = Path(root)
    (root / 'annotations').mkdir(parents=True, exist_ok=True)
    summary = {}
    for split, count, split_seed in (('train', num_train, seed), ('val', num_val, seed + 10007)):
        rng = np.random.default_rng(split_seed)
        (root / split).mkdir(exist_ok=True)
        images, annotations = [], []
        for image_id in range(1, count + 1):
            image, instance_map, objects = render_scene(rng, tuple(img_size))
            name = f'{image_id:06d}.png'
            Image.fromarray(image).save(root / split / name)
            images.append(dict(id=image_id, file_name=name, height=img_size[0], width=img_size[1]))
            for index, (kind, polygon) in enumerate(objects):
                ann = _annotation(instance_map, index, kind, polygon, tuple(img_size))
                annotations.append(dict(id=len(annotations) + 1, image_id=image_id, **ann))
        coco = dict(images=images, annotations=annotations,
                    categories=[dict(id=i + 1, name=n, supercategory='shape')
                                for i, n in enumerate(CLASSES)])
        (root / 'annotations' / f'instances_{split}.json').write_text(json.dumps(coco))
        per_class = {n: sum(a['category_id'] == i + 1 for a in annotations)
                     for i, n in enumerate(CLASSES)}
        summary[split] = dict(images=len(images), annotations=len(annotations),
                              per_class=per_class)
    write_ready(root, VERSION, num_train=num_train, num_val=num_val, img_size=img_size,
                seed=seed)
    return summary


def demo_data_ready(root: Union[str, Path], **settings) -> bool:
    """True when ``root`` holds a finished set made with these settings."""
    return is_ready(root, VERSION, **settings)
