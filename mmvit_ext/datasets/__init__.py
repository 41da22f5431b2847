"""Built-in demo data."""
from .coco_panoptic import write_coco_panoptic
from .synthetic_scenes import (SCENE_CLASSES, SCENE_PALETTE, demo_ade_ready, generate_demo_ade,
                               render_parsing_scene)
from .synthetic_shapes import CLASSES, demo_data_ready, generate_demo_coco, render_scene

__all__ = ['CLASSES', 'SCENE_CLASSES', 'SCENE_PALETTE', 'demo_ade_ready', 'demo_data_ready',
           'generate_demo_ade', 'generate_demo_coco', 'render_parsing_scene', 'render_scene',
           'write_coco_panoptic']
