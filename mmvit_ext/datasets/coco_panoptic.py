"""A COCO instance set (the built-in demo set: ``generate_demo_coco``) in COCO's panoptic format,
for panoptic configs (mmdet's ``CocoPanopticDataset``): every instance a thing segment, the
pixels no instance covers one stuff segment per image."""
import json
from pathlib import Path
from typing import Sequence, Union

import numpy as np
from PIL import Image


def _instance_mask(ann: dict, height: int, width: int) -> np.ndarray:
    """An annotation's mask (polygons, or RLE as COCO stores it), as pycocotools decodes it."""
    from pycocotools import mask as mask_utils
    segm = ann['segmentation']
    if isinstance(segm, list):  # polygons
        rle = mask_utils.merge(mask_utils.frPyObjects(segm, height, width))
    elif isinstance(segm['counts'], list):  # uncompressed RLE
        rle = mask_utils.frPyObjects(segm, height, width)
    else:
        rle = segm
    return mask_utils.decode(rle).astype(bool)


def _segment(segment_id: int, category_id: int, mask: np.ndarray) -> dict:
    ys, xs = np.nonzero(mask)
    bbox = [int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1),
            int(ys.max() - ys.min() + 1)]
    return dict(id=segment_id, category_id=category_id, area=int(mask.sum()), bbox=bbox,
                iscrowd=0)


def write_coco_panoptic(root: Union[str, Path], splits: Sequence[str] = ('train', 'val'),
                        stuff_name: str = 'background') -> None:
    """From ``root/annotations/instances_{split}.json`` write ``panoptic_{split}.json`` and the
    segment maps ``panoptic_{split}/<image file stem>.png`` (RGB, ``id = R + 256 G + 256^2 B``,
    0 unlabelled) beside it. The instance categories become things; ``stuff_name`` is one stuff
    category (the next id) covering what no instance covers. Where instances overlap, the later
    annotation wins (the demo set's masks are disjoint: its visible pixels)."""
    annotations = Path(root) / 'annotations'
    for split in splits:
        coco = json.loads((annotations / f'instances_{split}.json').read_text())
        stuff_id = max(c['id'] for c in coco['categories']) + 1
        next_id = max((a['id'] for a in coco['annotations']), default=0) + 1
        maps = annotations / f'panoptic_{split}'
        maps.mkdir(parents=True, exist_ok=True)
        by_image = {image['id']: [] for image in coco['images']}
        for ann in coco['annotations']:
            by_image[ann['image_id']].append(ann)
        panoptic = []
        for image in coco['images']:
            height, width = image['height'], image['width']
            ids = np.zeros((height, width), dtype=np.int64)
            for ann in by_image[image['id']]:
                ids[_instance_mask(ann, height, width)] = ann['id']
            segments = [_segment(ann['id'], ann['category_id'], ids == ann['id'])
                        for ann in by_image[image['id']] if (ids == ann['id']).any()]
            if not ids.all():
                ids[ids == 0] = next_id
                segments.append(_segment(next_id, stuff_id, ids == next_id))
                next_id += 1
            rgb = np.stack([ids % 256, ids // 256 % 256, ids // 256 ** 2 % 256], axis=-1)
            name = Path(image['file_name']).with_suffix('.png').name
            Image.fromarray(rgb.astype(np.uint8)).save(maps / name)
            panoptic.append(dict(image_id=image['id'], file_name=name,
                                 segments_info=segments))
        categories = [dict(c, isthing=1) for c in coco['categories']]
        categories.append(dict(id=stuff_id, name=stuff_name, supercategory=stuff_name,
                               isthing=0))
        (annotations / f'panoptic_{split}.json').write_text(json.dumps(
            dict(images=coco['images'], annotations=panoptic, categories=categories)))
