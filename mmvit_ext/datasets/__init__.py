"""Built-in demo data."""
from .synthetic_shapes import CLASSES, demo_data_ready, generate_demo_coco, render_scene

__all__ = ['CLASSES', 'demo_data_ready', 'generate_demo_coco', 'render_scene']
