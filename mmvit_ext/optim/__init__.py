"""Optimizer-wrapper constructors registered in the ``mmvit_ext`` scope."""
from .layer_decay import LayerDecayOptimWrapperConstructor, find_layer_depth

__all__ = ['LayerDecayOptimWrapperConstructor', 'find_layer_depth']
