"""Per-thread scratch arrays: temporaries that repeated calls reuse instead of allocating.

A large numpy array is fresh memory from the C allocator, and glibc hands memory above its
thresholds back to the system when it is freed, so the next array of that size pays a page fault
per 4 KiB page as it is first written. On this project's 2-core AMD EPYC VM that was a quarter of
a block-scaled GEMM of a (512, 128) by (128, 384) operand (``perf``: 24% of the samples in the
kernel's page-fault handler, 3.4 ms a call; 2.5 ms with the allocator told to keep its memory).
Temporaries that do not outlive a call (packed operands, operands times their scales, chunk
buffers) come from here instead; results that the caller keeps are never scratch.

>>> a = scratch(np.float32, 4, "doc")
>>> a.shape, scratch(np.float32, 3, "doc").base is a.base
((4,), True)
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

import numpy as np

__all__ = ["SCRATCH_LIMIT", "scratch"]

#: the largest scratch array kept per thread and key, in bytes: larger requests get a fresh
#: array (so a one-off large call leaves no large buffer behind)
SCRATCH_LIMIT = 1 << 25

_TLS = threading.local()


def scratch(dtype: Any, n: int, key: Hashable, *, least: int = 0) -> np.ndarray:
    """A 1-D array of ``n`` elements of ``dtype`` (uninitialised) that belongs to this thread and
    ``key`` until the next call with the same ``key`` in this thread, which may return the same
    memory: a caller is done with it before that call, and each caller has a key of its own (a
    tuple naming the module and the use). The buffer kept holds at least ``least`` elements;
    requests above :data:`SCRATCH_LIMIT` bytes are allocated fresh and not kept."""
    dt = np.dtype(dtype)
    if n * dt.itemsize > SCRATCH_LIMIT:
        return np.empty(n, dtype=dt)
    cache = _TLS.__dict__.setdefault("buffers", {})
    k = (dt.str, key)
    buf = cache.get(k)
    if buf is None or buf.size < n:
        buf = cache[k] = np.empty(max(n, least), dtype=dt)
    return buf[:n]  # type: ignore[no-any-return]
