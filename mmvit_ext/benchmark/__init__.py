"""Timing, memory and FLOP measurement, and same-weights peers from mmdet and timm."""
from .measure import (Measurement, PeakMemory, count_flops, matmul_peak, measure_interleaved)
from .compare import agreement_size, check_peers
from .peers import PEER_FAMILIES, build_peers

__all__ = ['Measurement', 'PeakMemory', 'count_flops', 'matmul_peak', 'measure_interleaved',
           'PEER_FAMILIES', 'build_peers', 'agreement_size', 'check_peers']
