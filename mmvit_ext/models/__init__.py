"""Whole networks built on our trunks (beyond a backbone's feature contract), registered in the
``mmvit_ext`` scope. The mmseg / mmdet wrappers (``eomt_seg``, ``eomt_det``) import their
toolbox and are imported by configs (``custom_imports``), not here."""
from .eomt import (EoMT, EoMTSemanticOutputs, ScaleBlock, masked_block, num_scale_blocks,
                   semantic_scores)

__all__ = ['EoMT', 'EoMTSemanticOutputs', 'ScaleBlock', 'masked_block', 'num_scale_blocks',
           'semantic_scores']
