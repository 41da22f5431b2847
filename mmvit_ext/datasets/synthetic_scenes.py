"""Built-in demo data: a scene-parsing set in the ADE20K (``ADEChallengeData2016``) layout.

Every scene is a partition of the image into 3-7 regions with irregular boundaries (Voronoi
cells in a smoothly warped plane); each region is filled with the texture of one of ten classes
(stripes at three angles, checkers, dots, crosshatch, rings, waves, blobs, fine grain), each with
its own two-colour scheme jittered per region, so a model needs both colour and texture (the
period, angle and phase vary per region) to tell them apart. With probability 0.35 one region
is "other": a noisy colour gradient labelled 0.

Annotations follow ADE20K: ``uint8`` PNG, 0 = other / unlabelled, classes 1..K; mmseg's
``reduce_zero_label=True`` turns them into 0..K-1 and 0 into the ignore index 255, so mmseg's
``ADE20KDataset`` loads the set unchanged. Deterministic by seed.
"""
import math
from pathlib import Path
from typing import Dict, Tuple, Union

import numpy as np
from PIL import Image

from .ready import is_ready, write_ready

SCENE_CLASSES = ('hstripes', 'vstripes', 'dstripes', 'checkers', 'dots', 'crosshatch',
                 'rings', 'waves', 'blobs', 'grain')
# two colours per class (foreground, background), jittered per region
SCENE_PALETTE = ((230, 60, 50), (40, 110, 230), (250, 200, 40), (30, 30, 30), (60, 190, 80),
                 (170, 60, 200), (250, 140, 30), (20, 180, 190), (120, 80, 40), (200, 200, 200))
_SECOND_COLOUR = ((90, 20, 20), (210, 220, 250), (60, 40, 10), (240, 240, 240), (10, 60, 20),
                  (240, 220, 250), (40, 30, 120), (10, 60, 70), (220, 180, 120), (90, 90, 110))
OTHER_PROB = 0.35
VERSION = 1  # bump when the generator's output changes, so stale sets are rewritten
SPLITS = ('training', 'validation')


def _stripes(xx: np.ndarray, yy: np.ndarray, angle: float, period: float, phase: float
             ) -> np.ndarray:
    return (np.sin((xx * math.cos(angle) + yy * math.sin(angle)) * 2 * math.pi / period
                   + phase) > 0).astype(np.float64)


def _smooth_noise(rng: np.random.Generator, size: Tuple[int, int], cell: int) -> np.ndarray:
    """Value noise in [0, 1]: a coarse random grid bilinearly upsampled."""
    h, w = size
    grid = rng.uniform(0, 1, (h // cell + 2, w // cell + 2))
    up = Image.fromarray((grid * 255).astype(np.uint8)).resize(
        ((w // cell + 2) * cell, (h // cell + 2) * cell), Image.BILINEAR)
    return np.asarray(up, dtype=np.float64)[:h, :w] / 255


def texture(rng: np.random.Generator, label: int, size: Tuple[int, int]) -> np.ndarray:
    """The (H, W) mix weight in [0, 1] of class ``label`` (1..K) between its two colours."""
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    jitter = rng.uniform(-0.2, 0.2)  # angle, radians
    period = rng.uniform(6, 10)
    phase = rng.uniform(0, 2 * math.pi)
    name = SCENE_CLASSES[label - 1]
    if name == 'hstripes':
        return _stripes(xx, yy, math.pi / 2 + jitter, period, phase)
    if name == 'vstripes':
        return _stripes(xx, yy, jitter, period, phase)
    if name == 'dstripes':
        return _stripes(xx, yy, math.pi / 4 + jitter, period, phase)
    if name == 'checkers':
        cell = rng.integers(4, 8)
        return (((xx + rng.integers(cell)) // cell + (yy + rng.integers(cell)) // cell) % 2)
    if name == 'dots':
        spacing = rng.uniform(7, 11)
        dx = (xx + rng.uniform(0, spacing)) % spacing - spacing / 2
        dy = (yy + rng.uniform(0, spacing)) % spacing - spacing / 2
        return (dx ** 2 + dy ** 2 < (0.3 * spacing) ** 2).astype(np.float64)
    if name == 'crosshatch':
        spacing = rng.integers(6, 10)
        return (((xx + rng.integers(spacing)) % spacing < 2) |
                ((yy + rng.integers(spacing)) % spacing < 2)).astype(np.float64)
    if name == 'rings':
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        return (np.sin(np.hypot(xx - cx, yy - cy) * 2 * math.pi / period + phase) > 0) * 1.0
    if name == 'waves':  # smooth sinusoidal bands, wavy along their length
        wave = yy + 4 * np.sin(xx * 2 * math.pi / rng.uniform(20, 30) + phase)
        return 0.5 + 0.5 * np.sin(wave * 2 * math.pi / (period * 1.5))
    if name == 'blobs':
        return (_smooth_noise(rng, size, int(rng.integers(8, 14))) > 0.5) * 1.0
    return rng.uniform(0, 1, size)  # grain: per-pixel noise


def _regions(rng: np.random.Generator, size: Tuple[int, int], count: int) -> np.ndarray:
    """(H, W) region index in [0, count): Voronoi cells of a smoothly warped plane."""
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    warp = 0.12 * min(h, w)
    for _ in range(2):
        fy, fx, py, px = rng.uniform(1.5, 4), rng.uniform(1.5, 4), *rng.uniform(0, 6.3, 2)
        xx_new = xx + warp * np.sin(yy / h * fy * math.pi + py)
        yy = yy + warp * np.sin(xx / w * fx * math.pi + px)
        xx, warp = xx_new, warp / 2
    seeds = rng.uniform((0, 0), (h, w), (count, 2))
    dist = (yy[None] - seeds[:, :1, None]) ** 2 + (xx[None] - seeds[:, 1:, None]) ** 2
    return dist.argmin(0)


def _other(rng: np.random.Generator, size: Tuple[int, int]) -> np.ndarray:
    """An unlabelled region: a noisy colour gradient (as the COCO demo's background)."""
    h, w = size
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = (np.linspace(0, 1, w)[None, :] * rng.uniform()
         + np.linspace(0, 1, h)[:, None] * rng.uniform())
    t = t / max(t.max(), 1e-6)
    return c0 * (1 - t[..., None]) + c1 * t[..., None] + rng.normal(0, 12, (h, w, 3))


def render_parsing_scene(rng: np.random.Generator, size: Tuple[int, int]
                         ) -> Tuple[np.ndarray, np.ndarray]:
    """One image (H, W, 3) uint8 and its label map (H, W) uint8: 0 = other, 1..K = classes."""
    count = int(rng.integers(3, 8))
    regions = _regions(rng, size, count)
    labels = rng.integers(1, len(SCENE_CLASSES) + 1, count)
    if rng.uniform() < OTHER_PROB:
        labels[rng.integers(count)] = 0
    image = np.zeros((*size, 3))
    for index, label in enumerate(labels):
        inside = regions == index
        if label == 0:
            fill = _other(rng, size)
        else:
            mix = texture(rng, int(label), size)[..., None]
            fg = np.array(SCENE_PALETTE[label - 1]) + rng.uniform(-25, 25, 3)
            bg = np.array(_SECOND_COLOUR[label - 1]) + rng.uniform(-25, 25, 3)
            fill = fg * mix + bg * (1 - mix) + rng.normal(0, 6, (*size, 3))
        image[inside] = fill[inside]
    label_map = labels[regions].astype(np.uint8)
    return np.clip(image, 0, 255).astype(np.uint8), label_map


def generate_demo_ade(root: Union[str, Path], num_train: int = 128, num_val: int = 32,
                      img_size: Tuple[int, int] = (128, 128), seed: int = 0) -> Dict[str, dict]:
    """Write ``root/images/{training,validation}/*.jpg`` and
    ``root/annotations/{training,validation}/*.png``; ``root`` is the ``ADEChallengeData2016``
    directory itself.

    Returns per split the image count and the pixel share of every class (``other`` = label 0).
    """
    root = Path(root)
    summary = {}
    for split, count, split_seed in (('training', num_train, seed),
                                     ('validation', num_val, seed + 10007)):
        rng = np.random.default_rng(split_seed)
        for kind in ('images', 'annotations'):
            (root / kind / split).mkdir(parents=True, exist_ok=True)
        pixels = np.zeros(len(SCENE_CLASSES) + 1, dtype=np.int64)
        for index in range(1, count + 1):
            image, label_map = render_parsing_scene(rng, tuple(img_size))
            name = f'ADE_demo_{split[:5]}_{index:06d}'  # ADE_train_... / ADE_valid_... style
            Image.fromarray(image).save(root / 'images' / split / f'{name}.jpg', quality=95)
            Image.fromarray(label_map).save(root / 'annotations' / split / f'{name}.png')
            pixels += np.bincount(label_map.ravel(), minlength=len(pixels))
        share = pixels / max(pixels.sum(), 1)
        summary[split] = dict(images=count, pixel_share={
            name: round(float(s), 4) for name, s in zip(('other', *SCENE_CLASSES), share)})
    write_ready(root, VERSION, num_train=num_train, num_val=num_val, img_size=img_size,
                seed=seed)
    return summary


def demo_ade_ready(root: Union[str, Path], **settings) -> bool:
    """True when ``root`` holds a finished ADE-format demo set made with these settings."""
    return is_ready(root, VERSION, **settings)
