"""Analysis of what happens inside attention: capture maps, DeepViT / Refiner statistics."""
from .attention import (CollapseStats, attention_modules, capture, collapse_stats,
                        cross_head_similarity, cross_layer_similarity, feature_evolution,
                        nearest_layer_similarity, similar_block_ratio, trunk_blocks)

__all__ = ['CollapseStats', 'attention_modules', 'capture', 'collapse_stats',
           'cross_head_similarity', 'cross_layer_similarity', 'feature_evolution',
           'nearest_layer_similarity', 'similar_block_ratio', 'trunk_blocks']
