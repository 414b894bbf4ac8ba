"""Timing on an NVIDIA GPU: median CUDA-event time of a callable, and the card's measured copy bandwidth."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def cuda_time_ms(fn: Callable[[], object], *, iters: int = 20, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` on the current stream, in milliseconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbps(size_bytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read plus bytes written per second), in GB/s."""
    src = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), iters=10)
    return 2 * size_bytes / (ms / 1e3) / 1e9
