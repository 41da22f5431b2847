"""Timing, memory and FLOP measurement, and peer implementations holding our weights (each
family's own, asked from the registry)."""
from .measure import (Measurement, PeakMemory, count_flops, matmul_peak, measure_interleaved,
                      profile_run)
from .compare import agreement_size, check_peers
from .peers import build_peers, has_peers, load_peer, peer_families

__all__ = ['Measurement', 'PeakMemory', 'count_flops', 'matmul_peak', 'measure_interleaved',
           'profile_run', 'build_peers', 'has_peers', 'load_peer', 'peer_families',
           'agreement_size', 'check_peers']
