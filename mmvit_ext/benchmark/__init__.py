"""Timing, memory and FLOP measurement, and same-weights peers from mmdet and timm."""
from .measure import (Measurement, PeakMemory, count_flops, matmul_peak, measure_interleaved,
                      profile_run)
from .compare import agreement_size, check_peers
from .peers import build_peers, load_peer, peer_families, register_peers

__all__ = ['Measurement', 'PeakMemory', 'count_flops', 'matmul_peak', 'measure_interleaved',
           'profile_run', 'build_peers', 'load_peer', 'peer_families', 'register_peers',
           'agreement_size', 'check_peers']
