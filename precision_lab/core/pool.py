"""Chunked work on all CPU cores: the thread pool behind the numpy kernels.

:func:`for_chunks` calls ``work(start, stop)`` over ``range(n)`` in chunks, spread over a shared
thread pool (numpy releases the GIL in the kernels). The pool is

* **fork-safe**: a child created by ``os.fork`` (multiprocessing's "fork" start method) cannot
  use the parent's worker threads, which do not exist in it; it gets a fresh pool on first use
  (``os.register_at_fork``), instead of waiting forever for workers that are gone;
* **interruptible**: the workers check a cancel flag before each chunk. When the caller's wait is
  interrupted (Ctrl-C raises KeyboardInterrupt in the main thread) or one chunk raises, the flag
  is set, the chunks not yet started are skipped, the running ones finish, and the exception
  reaches the caller.

:func:`use_workers` sets the number of threads for the calls of the current thread (or asyncio
task) only: ``with use_workers(1):`` runs every chunk inline in the caller. Code that is itself
one of many parallel tasks (a Dask task of :mod:`precision_lab.verify.sweep` or
:mod:`precision_lab.verify.grid`) uses it so that tasks x pool threads do not oversubscribe the
cores.

>>> out = []
>>> for_chunks(10, lambda lo, hi: out.append((lo, hi)), chunk=4)
>>> out
[(0, 4), (4, 8), (8, 10)]
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextvars import ContextVar
from typing import TypeVar

__all__ = ["CHUNK", "WORKERS", "current_workers", "for_chunks", "run_together", "use_workers"]

#: elements per chunk: the temporaries of one chunk stay in the core's L2 cache
CHUNK = 1 << 15
#: threads that share the chunks of a large array
WORKERS = os.cpu_count() or 1

#: seconds between the caller's checks for Ctrl-C while it waits (see _collect)
_POLL = 0.1

_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()
_TLS = threading.local()
_T = TypeVar("_T")
#: the thread count chosen by use_workers for this thread / asyncio task (None: WORKERS)
_OVERRIDE: ContextVar[int | None] = ContextVar("precision_lab_workers", default=None)


def current_workers() -> int:
    """Threads that :func:`for_chunks` would use for a call made here (at most ``WORKERS``).

    >>> with use_workers(1):
    ...     current_workers()
    1
    """
    n = _OVERRIDE.get()
    return WORKERS if n is None else min(n, WORKERS)


@contextlib.contextmanager
def use_workers(n: int) -> Iterator[None]:
    """Use at most ``n`` threads for the chunked calls of this thread (or asyncio task).

    Other threads are not affected (a ContextVar holds the setting), and the shared pool is not
    resized: ``n=1`` runs every chunk inline in the calling thread; larger ``n`` splits a call
    over ``min(n, WORKERS)`` ranges of the pool.

    >>> import threading
    >>> seen = set()
    >>> with use_workers(1):
    ...     for_chunks(1 << 20, lambda lo, hi: seen.add(threading.get_ident()), chunk=1 << 10)
    >>> seen == {threading.get_ident()}
    True
    """
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        raise ValueError(f"n must be an integer >= 1 (threads per call), got {n!r}")
    token = _OVERRIDE.set(n)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def _pool(workers: int) -> ThreadPoolExecutor:
    """The shared pool, created on first use (and again in the child of a fork)."""
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="precision_lab")
        return _POOL


def _after_fork_in_child() -> None:
    """The child of a fork has none of the parent's threads: forget their pool and lock."""
    global _POOL, _LOCK, _TLS
    _POOL = None
    _LOCK = threading.Lock()  # it may have been held by another thread of the parent
    _TLS = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _collect(futures: list[Future[None]]) -> None:
    """Wait for every job, in order; a job's exception is raised as soon as it is reached.

    The wait wakes up every ``_POLL`` seconds: a SIGINT that reaches the main thread while it
    is not blocked can otherwise stay unhandled until the wait ends (CPython 3.11 lets another
    thread clear the "signal pending" check; taking the GIL back after a timed wait restores it).
    A failing job sets the cancel flag itself, so the others stop without waiting for this loop.
    """
    for f in futures:
        while True:
            try:  # (not f.result: a job may raise TimeoutError itself)
                f.exception(timeout=_POLL)
                break
            except FutureTimeout:
                continue
        f.result()


def _drain(futures: list[Future[None]]) -> None:
    """After a cancel: wait until the running jobs have stopped, ignoring their errors."""
    for f in futures:
        if not f.cancel():
            f.exception()


def for_chunks(n: int, work: Callable[[int, int], None], chunk: int | None = None) -> None:
    """Call ``work(start, stop)`` over ``range(n)`` in chunks, on all cores for large n.

    The workers take the chunks in order, one at a time, so a core that other work delays takes
    fewer of them (with one fixed range per core, the call waited for the slowest core: a native
    H100-model GEMM on two cores ran at 1.3 to 3.3 GMAC/s from call to call). An exception in any
    chunk, or a KeyboardInterrupt while the caller waits, stops the chunks not yet started and is
    re-raised. Calls from inside a chunk (nested) run inline, and so do all calls under
    ``use_workers(1)``.
    """
    chunk = chunk or CHUNK
    workers = current_workers()
    # inside a pool worker (nested call), run inline: waiting on the pool there could deadlock
    if n <= 4 * chunk or workers <= 1 or getattr(_TLS, "in_pool", False):
        for i in range(0, n, chunk):
            work(i, min(i + chunk, n))
        return
    starts = iter(range(0, n, chunk))
    take = threading.Lock()  # (next() on a shared iterator, also without a GIL)
    cancel = threading.Event()
    tls = _TLS

    def run() -> None:
        tls.in_pool = True
        try:
            while not cancel.is_set():
                with take:
                    i = next(starts, n)
                if i >= n:
                    return
                work(i, min(i + chunk, n))
        except BaseException:
            cancel.set()
            raise
        finally:
            tls.in_pool = False

    pool = _pool(WORKERS)  # (sized for every caller, whatever use_workers says here)
    futures: list[Future[None]] = []
    try:
        for _ in range(min(workers, -(-n // chunk))):
            futures.append(pool.submit(run))
        _collect(futures)
    except BaseException:
        cancel.set()
        _drain(futures)
        raise


def run_together(*tasks: Callable[[], _T]) -> list[_T]:
    """Run independent tasks at the same time and return their results in order.

    The first task runs in the caller, the others on the pool; all of them inline (one after
    the other) under ``use_workers(1)`` or when called from inside a chunk or task. Calls made
    inside a task run inline, like nested :func:`for_chunks` calls. An exception in a task is
    raised after the others have finished.

    >>> run_together(lambda: 1, lambda: 2)
    [1, 2]
    """
    if len(tasks) < 2 or current_workers() <= 1 or getattr(_TLS, "in_pool", False):
        return [t() for t in tasks]
    tls = _TLS

    def run(task: Callable[[], _T]) -> _T:
        tls.in_pool = True
        try:
            return task()
        finally:
            tls.in_pool = False

    pool = _pool(WORKERS)
    futures = [pool.submit(run, t) for t in tasks[1:]]
    try:
        first = run(tasks[0])
        _collect(futures)  # type: ignore[arg-type]
    except BaseException:
        _drain(futures)  # type: ignore[arg-type]
        raise
    return [first, *(f.result() for f in futures)]
