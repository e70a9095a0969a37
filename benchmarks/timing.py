"""Timing helpers shared by the benchmark scripts (run them as ``python benchmarks/bench_*.py``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` calls of ``fn`` (seconds), after one warm-up call."""
    fn()  # warm up (thread pool, caches, compiled kernels)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rate(fn: Callable[[], object], n: int, repeat: int) -> float:
    """Million elements per second of ``fn`` processing ``n`` elements (median of ``repeat``)."""
    return n / median_time(fn, repeat) / 1e6
