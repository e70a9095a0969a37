"""Regression tests of issue 10, "Wrong results and crashes to fix": one test (or a few) per item,
named ``test_item<N>_...``. Each failed before its fix."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import ml_dtypes
import numpy as np
import pytest

import precision_lab as pl
from precision_lab import _parallel, rounding
from precision_lab.scaling import has_inf_or_nan

# ---------------------------------------------------------------- item 1: fork and Ctrl-C


def _run_in_fork(child, timeout: float = 60.0) -> int:
    """Run ``child()`` in a forked process; its exit status (a deadlock fails, it does not hang)."""
    with warnings.catch_warnings():  # "fork() in a multi-threaded process" (Python >= 3.12)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            code = 0 if child() else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child did not finish within {timeout} s (deadlock in the pool?)")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_item1_fork_after_pool_use(monkeypatch):
    """A fork after the pool ran work: the child gets a fresh pool and finishes."""
    monkeypatch.setattr(_parallel, "WORKERS", 2)  # a real pool even on a one-core machine
    x = np.linspace(-3, 3, 10**6, dtype=np.float32)
    expected = pl.round_to(x, "bf16")  # uses the pool in the parent
    assert _parallel._POOL is not None

    def child() -> bool:
        return bool(np.array_equal(pl.round_to(x, "bf16"), expected))

    assert _run_in_fork(child) == 0
    # and the parent's pool still works
    np.testing.assert_array_equal(pl.round_to(x, "bf16"), expected)


def _gated_work():
    """Work whose chunks record themselves and block until ``gate`` opens (10 s at most)."""
    ran: list[int] = []
    started = threading.Semaphore(0)
    gate = threading.Event()

    def work(lo: int, hi: int) -> None:
        ran.append(lo)
        started.release()
        gate.wait(timeout=10)

    return ran, started, gate, work


def test_item1_interrupt_stops_remaining_chunks(monkeypatch):
    """KeyboardInterrupt in the caller's wait stops the chunks the workers have not started."""
    monkeypatch.setattr(_parallel, "WORKERS", 2)
    ran, started, gate, work = _gated_work()
    real_drain = _parallel._drain

    def collect(futures):  # the caller's wait, interrupted by Ctrl-C once both workers run
        assert started.acquire(timeout=10) and started.acquire(timeout=10)
        raise KeyboardInterrupt

    def drain(futures):  # the cancel flag is set by now: let the running chunks finish
        gate.set()
        real_drain(futures)

    monkeypatch.setattr(_parallel, "_collect", collect)
    monkeypatch.setattr(_parallel, "_drain", drain)
    with pytest.raises(KeyboardInterrupt):
        _parallel.for_chunks(64 * 100, work, chunk=100)
    assert sorted(ran) == [0, 3200]  # one chunk per worker, the 62 others never ran
    monkeypatch.undo()
    seen: list[int] = []
    _parallel.for_chunks(64 * 100, lambda lo, hi: seen.append(lo), chunk=100)
    assert sorted(seen) == list(range(0, 6400, 100))  # the pool still works


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread()
    or not hasattr(signal, "pthread_kill"),
    reason="needs to run in the main thread with pthread_kill",
)
def test_item1_sigint_stops_the_pool(monkeypatch):
    """A real SIGINT while the workers run: KeyboardInterrupt in the caller, the pool stops."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not handled by Python's default handler here")
    monkeypatch.setattr(_parallel, "WORKERS", 2)
    ran, _, gate, work = _gated_work()
    main = threading.main_thread().ident
    assert main is not None

    def interrupting_work(lo: int, hi: int) -> None:
        if lo == 0:
            signal.pthread_kill(main, signal.SIGINT)
        work(lo, hi)

    real_drain = _parallel._drain

    def drain(futures):
        gate.set()
        real_drain(futures)

    monkeypatch.setattr(_parallel, "_drain", drain)
    with pytest.raises(KeyboardInterrupt):
        _parallel.for_chunks(64 * 100, interrupting_work, chunk=100)
    assert len(ran) <= 2 and 0 in ran


def test_item1_worker_error_stops_other_workers(monkeypatch):
    """An exception in one worker stops the others' remaining chunks and reaches the caller."""
    monkeypatch.setattr(_parallel, "WORKERS", 2)
    ran, _, gate, work = _gated_work()

    def failing(lo: int, hi: int) -> None:
        if lo == 0:
            raise ZeroDivisionError("chunk 0")
        work(lo, hi)

    real_drain = _parallel._drain

    def drain(futures):
        gate.set()
        real_drain(futures)

    monkeypatch.setattr(_parallel, "_drain", drain)
    with pytest.raises(ZeroDivisionError, match="chunk 0"):
        _parallel.for_chunks(64 * 100, failing, chunk=100)
    assert set(ran) <= {3200}


def test_item1_for_chunks_still_importable_from_rounding():
    assert rounding.for_chunks is _parallel.for_chunks


# ---------------------------------------------------------------- item 3: has_inf_or_nan


_ML_FLOAT_NAMES = sorted(
    n for n in dir(ml_dtypes) if n.startswith(("float8", "float6", "float4", "bfloat16"))
)


@pytest.mark.parametrize("dtype", [*_ML_FLOAT_NAMES, "float16", "float32", "float64"])
def test_item3_has_inf_or_nan_every_float_dtype(dtype):
    """inf and NaN are found in ml_dtypes arrays (bfloat16, float8_*, ...) as in numpy floats."""
    dt = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    for special in (np.inf, -np.inf, np.nan):
        a = np.array([1.0, 0.5, special, 2.0]).astype(dt)
        # the referee: the same values widened to float64 (formats without inf hold NaN or max)
        expected = not np.isfinite(a.astype(np.float64)).all()
        assert has_inf_or_nan(np.ones(3, dt), a) is expected, (dtype, special)
        assert has_inf_or_nan(a[2:3].reshape(1, 1)) is expected
    assert has_inf_or_nan(np.array([1.0, 0.5, 2.0]).astype(dt)) is False
    big = np.array([float(ml_dtypes.finfo(dt).max)]).astype(dt)
    assert has_inf_or_nan(big) is False
