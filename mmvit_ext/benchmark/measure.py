"""Measuring a backbone: median time (interleaved across models), peak memory, FLOPs."""
import contextlib
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

from ..utils.heap import trim_freed_memory

DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}


@dataclass
class Measurement:
    name: str
    times: Dict[str, List[float]] = field(default_factory=dict)  # mode -> seconds per run
    peak_mem: Dict[str, int] = field(default_factory=dict)       # mode -> bytes
    flops: Dict[str, int] = field(default_factory=dict)          # mode -> FLOPs per run

    def median(self, mode: str) -> float:
        return statistics.median(self.times[mode])


def _release_free_heap() -> None:
    """Give freed heap pages back to the OS (glibc ``malloc_trim``), so the next block's RSS
    growth is its own peak rather than hidden by memory an earlier run freed but kept."""
    import gc
    gc.collect()
    trim_freed_memory()  # not glibc: RSS growth is then a lower bound


class PeakMemory:
    """Peak memory growth inside the block: CUDA max-allocated, or CPU peak RSS sampled every
    millisecond by a thread, after returning freed heap pages to the OS."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0

    @staticmethod
    def _rss() -> int:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')

    def __enter__(self) -> 'PeakMemory':
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            _release_free_heap()
            self._base = self._rss()
            self._max = self._base
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._max = max(self._max, self._rss())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self._max, self._rss()) - self._base


def _loss(outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    return sum(o.float().mean() for o in outputs)


def run_once(model: nn.Module, x: torch.Tensor, mode: str, dtype: torch.dtype) -> None:
    """One forward (``fwd``, no grad) or forward + backward (``fwdbwd``) under autocast."""
    autocast = (torch.autocast(x.device.type, dtype=dtype) if dtype != torch.float32
                else contextlib.nullcontext())
    if mode == 'fwd':
        with torch.no_grad(), autocast:
            model(x)
    else:
        with autocast:
            loss = _loss(model(x))
        loss.backward()
        for p in model.parameters():
            p.grad = None


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def measure_interleaved(models: Dict[str, nn.Module], x: torch.Tensor, modes: Sequence[str],
                        dtype: torch.dtype, warmup: int = 2, repeat: int = 5,
                        on_progress: Optional[Callable[[str], None]] = None
                        ) -> Dict[str, Measurement]:
    """Median of ``repeat`` runs per model and mode, models interleaved run by run so that
    drifting clocks or a busy neighbour affect every model alike."""
    results = {name: Measurement(name) for name in models}
    for mode in modes:
        for name, model in models.items():
            for _ in range(warmup):
                run_once(model, x, mode, dtype)
            with PeakMemory(x.device) as mem:
                run_once(model, x, mode, dtype)
            results[name].peak_mem[mode] = mem.peak
            results[name].times[mode] = []
        for _ in range(repeat):
            for name, model in models.items():
                _sync(x.device)
                start = time.perf_counter()
                run_once(model, x, mode, dtype)
                _sync(x.device)
                results[name].times[mode].append(time.perf_counter() - start)
                if on_progress:
                    on_progress(f'{mode} {name}')
    return results


def profile_run(model: nn.Module, x: torch.Tensor, mode: str, dtype: torch.dtype,
                rows: int = 30) -> str:
    """One run under ``torch.profiler`` (CPU, and CUDA kernels on a CUDA input): the table of
    its ``rows`` most expensive ops / kernels by self time on the device that ran them."""
    from torch.profiler import ProfilerActivity, profile
    cuda = x.device.type == 'cuda'
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    _sync(x.device)
    with profile(activities=activities) as prof:
        run_once(model, x, mode, dtype)
        _sync(x.device)
    key = 'self_cuda_time_total' if cuda else 'self_cpu_time_total'
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def count_flops(model: nn.Module, x: torch.Tensor, mode: str) -> int:
    """FLOPs of one run: the forward counted by torch's FlopCounterMode with attention on its
    explicit (matmul) path so it is counted, and forward + backward taken as 3x the forward
    (the usual convention; the counter's convolution-backward formula ignores groups)."""
    from torch.utils.flop_counter import FlopCounterMode

    from .. import flags
    counter = FlopCounterMode(display=False)
    with flags.fused_attention(False), counter:
        run_once(model, x, 'fwd', torch.float32)
    forward = int(counter.get_total_flops())
    return forward if mode == 'fwd' else 3 * forward


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int = 2048, repeat: int = 10
                ) -> float:
    """Measured FLOP/s of a large square matmul: the machine's practical peak for ``dtype``."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float('inf')
    for _ in range(2):
        torch.matmul(a, b)
    _sync(device)
    for _ in range(repeat):
        start = time.perf_counter()
        torch.matmul(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best
