"""Regression tests of issue 10, "Wrong results and crashes to fix": one test (or a few) per item,
named ``test_item<N>_...``. Each failed before its fix."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import warnings

import ml_dtypes
import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core import pool as _parallel
from precision_lab.core import rounding
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


def _round_bf16(x: np.ndarray) -> np.ndarray:
    return pl.round_to(x, "bf16")


@pytest.mark.skipif(
    "fork" not in __import__("multiprocessing").get_all_start_methods(), reason="needs fork"
)
def test_item1_multiprocessing_fork_pool(monkeypatch):
    """The issue's scenario: a multiprocessing 'fork' pool after round_to used the threads."""
    import multiprocessing

    monkeypatch.setattr(_parallel, "WORKERS", 2)
    x = np.linspace(-3, 3, 10**6, dtype=np.float32)
    expected = pl.round_to(x, "bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with multiprocessing.get_context("fork").Pool(1) as pool:
            got = pool.apply_async(_round_bf16, (x,)).get(timeout=60)  # hung before
    np.testing.assert_array_equal(got, expected)


def _gated_work(monkeypatch):
    """Two workers, and work whose chunks record themselves and block until the gate opens (10 s
    at most): it opens when for_chunks drains the running jobs, after setting its cancel flag."""
    monkeypatch.setattr(_parallel, "WORKERS", 2)
    ran: list[int] = []
    started = threading.Semaphore(0)
    gate = threading.Event()
    real_drain = _parallel._drain

    def work(lo: int, hi: int) -> None:
        ran.append(lo)
        started.release()
        gate.wait(timeout=10)

    def drain(futures):
        gate.set()
        real_drain(futures)

    monkeypatch.setattr(_parallel, "_drain", drain)
    return ran, started, work


def test_item1_interrupt_stops_remaining_chunks(monkeypatch):
    """KeyboardInterrupt in the caller's wait stops the chunks the workers have not started."""
    ran, started, work = _gated_work(monkeypatch)

    def collect(futures):  # the caller's wait, interrupted by Ctrl-C once both workers run
        assert started.acquire(timeout=10) and started.acquire(timeout=10)
        raise KeyboardInterrupt

    monkeypatch.setattr(_parallel, "_collect", collect)
    with pytest.raises(KeyboardInterrupt):
        _parallel.for_chunks(64 * 100, work, chunk=100)
    assert sorted(ran) == [0, 100]  # one chunk per worker, the 62 others never ran
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
    ran, _, work = _gated_work(monkeypatch)
    main = threading.main_thread().ident
    assert main is not None

    def interrupting_work(lo: int, hi: int) -> None:
        if lo == 0:
            signal.pthread_kill(main, signal.SIGINT)
        work(lo, hi)

    with pytest.raises(KeyboardInterrupt):
        _parallel.for_chunks(64 * 100, interrupting_work, chunk=100)
    assert len(ran) <= 2 and 0 in ran


def test_item1_worker_error_stops_other_workers(monkeypatch):
    """An exception in one worker stops the others' remaining chunks and reaches the caller."""
    ran, _, work = _gated_work(monkeypatch)

    def failing(lo: int, hi: int) -> None:
        if lo == 0:
            raise ZeroDivisionError("chunk 0")
        work(lo, hi)

    with pytest.raises(ZeroDivisionError, match="chunk 0"):
        _parallel.for_chunks(64 * 100, failing, chunk=100)
    assert set(ran) <= {100}  # (the other worker's first chunk, if it started one)


def test_item1_work_raising_timeout_error(monkeypatch):
    """A chunk's own TimeoutError reaches the caller (the caller's wait polls with timeouts)."""
    monkeypatch.setattr(_parallel, "WORKERS", 2)

    def work(lo: int, hi: int) -> None:
        if lo == 3200:
            raise TimeoutError("from the work")

    with pytest.raises(TimeoutError, match="from the work"):
        _parallel.for_chunks(6400, work, chunk=100)


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


# ---------------------------------------------------------------- item 4: underflow_stats


def _stats_oracle(g: np.ndarray, fmt: str, scale: float) -> dict[str, float]:
    """Fractions and relative errors from Fractions: the exact S*g, its rounding by the core (from
    the exact product as a float64, which it is for a power-of-two S without underflow), and
    exact sums; IEEE overflow = the unbounded rounding beyond fmt.max."""
    from fractions import Fraction

    f = pl.get_format(fmt)
    x = [Fraction(float(v)) for v in g.astype(np.float64)]
    xs = [v * Fraction(scale) for v in x]
    q = [float(pl.round_to(np.float64(v), f)) if abs(v) < 2**1024 else math.inf for v in xs]
    nz = [i for i, v in enumerate(x) if v != 0]
    zero = sum(q[i] == 0 for i in nz)
    sub = sum(0 < abs(q[i]) < f.smallest_normal for i in nz)
    over = [i for i in nz if abs(xs[i]) > f.max and not abs(q[i]) <= f.max]
    keep = [i for i in nz if i not in over]
    l1d = sum(abs(Fraction(q[i]) - xs[i]) for i in keep)
    l1x = sum(abs(xs[i]) for i in keep)
    l2d = sum((Fraction(q[i]) - xs[i]) ** 2 for i in keep)
    l2x = sum(xs[i] ** 2 for i in keep)
    n = max(len(nz), 1)
    return {
        "zero_fraction": zero / n,
        "subnormal_fraction": sub / n,
        "overflow_fraction": len(over) / n,
        "rel_l1_error": float(l1d / l1x) if l1x else 0.0,
        "rel_l2_error": _sqrt(l2d / l2x) if l2x else 0.0,
    }


def _sqrt(r) -> float:
    """sqrt of a positive Fraction, also where the Fraction itself is beyond float64's range."""
    k = (r.numerator.bit_length() - r.denominator.bit_length()) // 2
    return math.ldexp(math.sqrt(float(r / 4**k if k >= 0 else r * 4**-k)), k)


@pytest.mark.parametrize(
    ("values", "fmt", "scale"),
    [
        ([1e-310, 1.0], "fp16", 1.0),  # a float64 subnormal: was OverflowError
        ([1e-310, -3e-320, 5e-324], "fp64", 1.0),
        ([1e170, 1.0, 1e-3], "fp16", 1.0),  # was ZeroDivisionError
        ([1e170, -1e-300], "fp16", 1.0),
        ([1.0, 0.5, 3e-5], "fp16", 2.0**1020),  # scale products overflow float64
        ([1e-150, 3.3e-150], "bf16", 1.0),  # squares underflow: rel_l2 was 0.0, is 1.0
        ([1e150, 3.3e150, -7e149], "bf16", 1.0),  # squares overflow
        ([1e300, 1.5e300, 1.7e308], "fp64", 1.0),
        ([2.0**-1074, 2.0**-1000, 1.0], "e4m3", 2.0**-60),
        ([1e-30, 3e-38, 7.0], "e5m2", 2.0**100),
    ],
)
def test_item4_underflow_stats_extreme_values(values, fmt, scale):
    g = np.array(values, dtype=np.float64)
    st = pl.underflow_stats(g, fmt, scale)
    ref = _stats_oracle(g, fmt, scale)
    for key, want in ref.items():
        assert getattr(st, key) == pytest.approx(want, rel=1e-12, abs=0), key


def test_item4_rel_l2_tiny_values_is_one():
    st = pl.underflow_stats(np.array([1e-150, 3.3e-150]), "bf16")
    assert st.zero_fraction == 1.0 and st.rel_l1_error == 1.0 and st.rel_l2_error == 1.0


def test_item4_huge_scale():
    """scale=1e308 (not a power of two): the products overflow float64; no ZeroDivisionError."""
    st = pl.underflow_stats(np.array([1.0, 2.0, 1e-320]), "fp16", scale=1e308)
    assert st.overflow_fraction == pytest.approx(2 / 3)
    assert st.zero_fraction == pytest.approx(1 / 3)
    assert st.rel_l1_error == 1.0 and st.rel_l2_error == 1.0


@pytest.mark.parametrize("seed", range(4))
def test_item4_underflow_stats_random_wide_range(seed):
    """Magnitudes over float64's whole range, several chunks: against the exact sums."""
    rng = np.random.default_rng(seed)
    n = 3000
    g = np.ldexp(rng.uniform(0.5, 1.0, n), rng.integers(-1074, 1024, n)) * rng.choice([-1, 1], n)
    g[:5] = [0.0, -0.0, 5e-324, -1.7e308, 1.0]
    scale = 2.0 ** int(rng.integers(-40, 40))
    st = pl.underflow_stats(g, "bf16", scale)
    ref = _stats_oracle(g, "bf16", scale)
    for key, want in ref.items():
        assert getattr(st, key) == pytest.approx(want, rel=1e-12, abs=0), key


# ------------------------------------------- item 13 (part): error_stats with NaN and extremes


def test_item13_error_stats_agreeing_nan_and_inf_are_not_errors():
    """As numpy.testing.assert_allclose(equal_nan=True): NaN against NaN and inf against the same
    inf are exact; the other positions give the statistics."""
    ref = np.array([np.nan, 1.0, np.inf, -np.inf, 4.0])
    app = np.array([np.nan, 1.0 + 2**-20, np.inf, -np.inf, 4.0])
    st = pl.error_stats(app, ref)
    fin = pl.error_stats(app[[1, 4]], ref[[1, 4]])
    assert st.n == 5
    assert st.max_abs == fin.max_abs == 2**-20
    assert st.max_rel == fin.max_rel and st.max_ulp == fin.max_ulp
    assert st.normwise == fin.normwise == pytest.approx(2**-20 / math.sqrt(17), rel=1e-15)
    assert st.snr_db == fin.snr_db
    both_nan = pl.error_stats(np.array([np.nan]), np.array([np.nan]))
    assert both_nan.max_abs == 0 and both_nan.normwise == 0 and both_nan.snr_db == math.inf
    # disagreement propagates: NaN where the approximation lost the value
    bad = pl.error_stats(np.array([np.nan, 1.0]), np.array([2.0, 1.0]))
    assert math.isnan(bad.max_abs) and math.isnan(bad.normwise)
    assert pl.error_stats(np.array([np.inf]), np.array([-np.inf])).max_abs == math.inf


@pytest.mark.parametrize("mag", [1e-160, 1e-310, 1e160, 1e300])
def test_item13_error_stats_norms_of_extreme_values(mag):
    """normwise and snr_db from scaled sums: no underflow or overflow of the squares."""
    from fractions import Fraction

    ref = np.array([1.0, -3.0, 2.5]) * mag
    app = ref * (1 + np.array([2.0**-30, 0.0, -(2.0**-25)]))
    st = pl.error_stats(app, ref)
    num = sum((Fraction(a) - Fraction(r)) ** 2 for a, r in zip(app, ref, strict=True))
    den = sum(Fraction(r) ** 2 for r in ref)
    assert num > 0
    assert st.normwise == pytest.approx(_sqrt(num / den), rel=1e-12)
    assert st.snr_db == pytest.approx(10 * math.log10(den / num), rel=1e-12)


# ------------------------------------------------- item 13 (part): pick_loss_scale's margin


def _largest_k(amax: float, fmax: float, margin: int) -> int:
    """The largest k with amax * 2**k <= fmax / 2**margin, with Fractions."""
    from fractions import Fraction

    k = -3000
    while Fraction(amax) * Fraction(2) ** (k + 1) <= Fraction(fmax) / Fraction(2) ** margin:
        k += 1
    return k


@pytest.mark.parametrize(
    ("amax", "fmt", "margin"),
    [(1.0, "fp16", 1), (1e-310, "fp16", 0), (1.7e308, "e4m3", 3), (3e-5, "bf16", 40)],
)
def test_item13_pick_loss_scale_exact_k(amax, fmt, margin):
    c = pl.pick_loss_scale(np.array([amax, amax / 3]), fmt, margin=margin, scale_dtype="float64")
    k = min(_largest_k(amax, float(pl.get_format(fmt).max), margin), 1023)
    assert c.log2_scale == k and c.scale == math.ldexp(1.0, k)
    assert math.isfinite(c.headroom_log2)


def test_item13_pick_loss_scale_huge_margin():
    """margin=2000 was 'math domain error': the scale it asks for is below float64's range."""
    with pytest.raises(ValueError, match="margin"):
        pl.pick_loss_scale(np.ones(3), "fp16", margin=2000, scale_dtype="float64")
    with pytest.raises(ValueError, match="margin"):
        pl.pick_loss_scale(
            np.ones(3), "fp16", margin=2000, target_underflow=0.1, scale_dtype="float64"
        )
    # a large negative margin only asks for a huge scale: the largest power of two float64 has
    big = pl.pick_loss_scale(np.ones(3), "fp16", margin=-2000, scale_dtype="float64")
    assert big.log2_scale == 1023 and big.capped


def test_item13_pick_loss_scale_target_extreme_gradients():
    """target_underflow with gradients near float64's ends: no overflow in the search."""
    g = np.array([1e308, 1e-300, 3e-200])
    c = pl.pick_loss_scale(g, "fp16", target_underflow=0.5, scale_dtype="float64")
    assert c.rule in ("underflow", "underflow-unmet")
    assert pl.underflow_stats(g, "fp16", c.scale).zero_fraction == c.zero_fraction


# ---------------------------------------------------------------- item 5: wide input formats


def test_item5_gemm_refuses_formats_whose_products_leave_float64():
    """FloatFormat(11, 10) was 'math domain error': its products overflow/underflow float64."""
    a = np.ones((2, 3))
    for fmt in (pl.FloatFormat(11, 10), pl.FloatFormat(11, 2), (pl.FloatFormat(11, 2), "fp16")):
        with pytest.raises(ValueError, match=r"input_format.*float64's range"):
            pl.gemm(a, a.T, input_format=fmt, accumulator="fp64", out_format="fp64")


def test_item5_gemm_wide_exponent_format_within_range():
    """A 10-exponent-bit format (values below 2**512, subnormals to 2**-515): products are exact
    in float64, and the fp64 sequential accumulation is Python's float addition in order."""
    f = pl.FloatFormat(10, 5)
    rng = np.random.default_rng(5)
    a = pl.round_to(np.ldexp(rng.standard_normal((3, 8)), rng.integers(-516, 511, (3, 8))), f)
    b = pl.round_to(np.ldexp(rng.standard_normal((8, 4)), rng.integers(-516, 511, (8, 4))), f)
    a[0, :2], b[:2, 0] = f.max, [f.max, -f.smallest_subnormal]
    d = pl.gemm(a, b, input_format=f, accumulator="fp64", out_format="fp64")
    for i in range(3):
        for j in range(4):
            s = 0.0
            for k in range(8):
                s += float(a[i, k]) * float(b[k, j])
            assert d[i, j] == s


# ------------------------------------------------- item 2: block formats beyond float32's range


def _with_huge_block(bf: pl.blocks.BlockFormat, huge: float) -> tuple[np.ndarray, tuple]:
    """float64 x: one ordinary block (or tile), then one holding ``huge``; and that block's
    index. The ordinary block is x[ordinary]."""
    rng = np.random.default_rng(1)
    if len(bf.block_shape) == 2:
        r, c = bf.block_shape
        x = rng.standard_normal((r, 2 * c))
        x[3, c + 5] = huge
        return x, (slice(None), slice(0, c))
    n = bf.block_shape[0]
    x = rng.standard_normal(2 * n)
    x[n + 3] = huge
    return x, (slice(0, n),)


@pytest.mark.parametrize("name", pl.blocks.known_block_formats())
@pytest.mark.parametrize("huge", [1e300, -1e300, 3.5e38, np.inf])
def test_item2_blocks_with_values_beyond_float32(name, huge):
    """A float64 value whose block scale the format cannot represent (MX: E8M0 stops at 2**127;
    FP32 scales; NVFP4: the FP32 per-tensor arithmetic, where it is infinite) makes its block
    NaN, like an infinity; the other block is as if alone. 1e300 gave 2688 with nvfp4."""
    bf = pl.get_block_format(name)
    x, ordinary = _with_huge_block(bf, huge)
    other = tuple(
        slice(s.stop, None) if s.stop is not None else s for s in ordinary
    )  # the huge block
    fake = pl.round_to_blocks(x, bf)
    q = pl.quantize_blocks(x, bf)
    deq = pl.dequantize_blocks(q)
    alone = pl.round_to_blocks(x[ordinary], bf)
    finite_scale = {
        "floor": lambda a: math.frexp(a)[1] - 1 - bf.element_emax <= bf.scale.emax,
        "ceil": lambda a: math.frexp(a / bf.element_max)[1] <= bf.scale.emax,
        "amax": lambda a: (
            abs(a) <= float(np.finfo(np.float32).max)  # nvfp4: FP32 arithmetic
            if bf.tensor_scale
            else float(pl.round_to(abs(a) / bf.element_max, bf.scale)) <= bf.scale.max
        ),
    }["amax" if bf.tensor_scale else bf.scale_rule]
    np.testing.assert_array_equal(fake, deq)
    if math.isfinite(huge) and finite_scale(abs(huge)):  # MX and FP32 scales reach 3.5e38
        assert np.isfinite(fake).all()
        return
    assert np.isnan(fake[other]).all() and np.isnan(deq[other]).all()
    assert np.isnan(q.scales.reshape(-1)[-1])
    np.testing.assert_array_equal(fake[ordinary], alone)
    np.testing.assert_array_equal(deq[ordinary], alone)
    assert np.isfinite(alone).all()


def test_item2_nvfp4_just_below_float32_max_is_finite():
    x = np.array([1.0] * 16 + [float(np.finfo(np.float32).max)] + [0.0] * 15)
    r = pl.round_to_blocks(x, "nvfp4")
    assert np.isfinite(r).all() and r[16] == pytest.approx(float(np.finfo(np.float32).max), 0.5)


# ---------------------------------------------------------------- item 7: calibrate


def test_item7_calibrate_scale_beyond_float32_is_refused():
    """[1e308, -1e308] gave scale inf silently: the scale (float32) cannot be represented."""
    for kwargs in ({}, {"symmetric": False}, {"method": "entropy", "num_bins": 256}):
        with pytest.raises(ValueError, match=r"scale.*float32"):
            pl.calibrate(np.array([1e308, -1e308]), "int8", **kwargs)
    with pytest.raises(ValueError, match=r"scale.*float32"):
        pl.calibrate(np.array([1e308, -1e308]), "uint8", symmetric=False)  # (hi - lo) overflows
    # the largest amax that still fits: scale <= float32 max, never clipping
    big = float(np.finfo(np.float32).max) * 127
    c = pl.calibrate(np.array([big, -big]), "int8")
    assert np.isfinite(c.scale) and float(c.scale) * 127 >= big
    a = pl.calibrate(np.array([-1e40, 3e40]), "uint8", symmetric=False)
    assert np.isfinite(a.scale) and a.clip_min <= -1e40 and a.clip_max >= 3e40


@pytest.mark.parametrize("method", ["entropy", "mse", "percentile"])
def test_item7_calibrate_num_bins_range(method):
    x = np.random.default_rng(0).standard_normal(100)
    low = 2 if method == "entropy" else 1
    with pytest.raises(ValueError, match=rf"num_bins.*{low}\.\."):
        pl.calibrate(x, "int8", method=method, num_bins=low - 1, start_bin=1)
    with pytest.raises(ValueError, match=r"num_bins.*\.\.16777216"):
        pl.calibrate(x, "int8", method=method, num_bins=2**24 + 1)
    c = pl.calibrate(x, "int8", method=method, num_bins=low, start_bin=1)  # was IndexError
    assert 0 <= float(c.amax) <= np.abs(x).max()  # (percentile: the lower edge, 0 with 1 bin)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"method": "percentile", "percentile": "99"}, "percentile"),
        ({"method": "percentile", "percentile": None}, "percentile"),
        ({"method": "percentile", "percentile": True}, "percentile"),
        ({"method": "entropy", "num_bins": 256.0}, "num_bins"),
        ({"method": "entropy", "start_bin": "1"}, "start_bin"),
        ({"method": "mse", "stride": 1.5}, "stride"),
        ({"symmetric": "no"}, "symmetric"),
        ({"narrow_range": 1}, "narrow_range"),
    ],
)
def test_item7_calibrate_argument_types(kwargs, name):
    """Wrong types are a TypeError naming the argument, before any work (percentile="99" was a
    TypeError from inside numpy's searchsorted)."""
    with pytest.raises(TypeError, match=name):
        pl.calibrate(np.ones(10), "int8", **kwargs)


def _quadratic_entropy_oracle(hist, edges, nbins, start_bin, stride):
    """The former implementation of ``quantization._amax_entropy`` (O(num_bins) per candidate:
    O(num_bins**2) in all), kept as the oracle of the fast one."""
    bins = hist.astype(np.float64)
    bins[0] = bins[1]
    tail = np.concatenate([np.cumsum(bins[::-1])[::-1], [0.0]])
    best_i, best_kl = -1, np.inf
    for i in range(start_bin, len(bins) + 1, stride):
        space = np.linspace(0, i, num=nbins + 1)
        groups = np.digitize(np.arange(i), space) - 1
        b = bins[:i]
        nonzero = b != 0
        sums = np.bincount(groups[nonzero], weights=b[nonzero], minlength=nbins)
        counts = np.bincount(groups[nonzero], minlength=nbins)
        avg = sums / np.maximum(counts, 1)
        q = np.where(nonzero, avg[groups], 0.0)
        p = b.copy()
        p[-1] += tail[i]
        p_sum, q_sum = p.sum(), q.sum()
        if p_sum == 0 or q_sum == 0:
            continue
        p, q = p / p_sum, q / q_sum
        pos = p > 0
        kl = np.inf if np.any(pos & (q == 0)) else float(np.sum(p[pos] * np.log(p[pos] / q[pos])))
        if kl <= best_kl:
            best_i, best_kl = i, kl
    return float(edges[best_i]) if best_i >= 0 else float(edges[-1])


def _entropy_samples(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    kind = seed % 5
    n = 20000
    if kind == 0:
        return rng.standard_normal(n)
    if kind == 1:
        return np.concatenate([rng.laplace(0, 1, n), [40.0, -35.0]])
    if kind == 2:  # ReLU: many exact zeros
        return np.maximum(rng.standard_normal(n), 0.0)
    if kind == 3:  # sparse histogram: few distinct values, long runs of empty bins
        return rng.choice([0.1, 0.5, 3.0, 7.0, 50.0], n, p=[0.4, 0.3, 0.2, 0.09, 0.01])
    return np.concatenate([rng.standard_normal(n), rng.normal(30, 1, n // 50)])  # bimodal


@pytest.mark.parametrize("seed", range(10))
def test_item7_entropy_fast_equals_quadratic(seed):
    """The O(num_bins + candidates * levels) entropy calibration picks exactly the threshold of
    the former quadratic implementation."""
    from precision_lab.quant import integer as quantization

    x = np.abs(_entropy_samples(seed))
    rng = np.random.default_rng(100 + seed)
    num_bins = int(rng.choice([130, 512, 2048]))
    nbins = int(rng.choice([8, 128, 129]))
    start_bin = int(rng.integers(1, 128))
    stride = int(rng.choice([1, 1, 3]))
    hist, edges = np.histogram(x, bins=num_bins, range=(0.0, float(x.max())))
    want = _quadratic_entropy_oracle(hist, edges, nbins, start_bin, stride)
    got = quantization._amax_entropy(hist, edges, nbins, start_bin, stride)
    assert got == want, (num_bins, nbins, start_bin, stride)


def test_item7_entropy_degenerate_histograms():
    from precision_lab.quant import integer as quantization

    edges = np.linspace(0, 1, 9)
    for hist in (
        np.array([0, 0, 0, 0, 0, 0, 0, 5]),  # everything in the last bin: all candidates skipped
        np.array([3, 0, 0, 0, 0, 0, 0, 0]),
        np.array([0, 1, 0, 1, 0, 1, 0, 1]),
        np.array([4, 4, 4, 4, 4, 4, 4, 4]),  # ties of the divergence: the largest i wins
        np.array([1, 2]),
    ):
        e = edges[: hist.size + 1]
        for nbins in (1, 2, 3, 16):
            for start in range(1, hist.size + 1):
                want = _quadratic_entropy_oracle(hist, e, nbins, start, 1)
                assert quantization._amax_entropy(hist, e, nbins, start, 1) == want


# ---------------------------------------- item 13 (part): zero_point range, > 32 dimensions


@pytest.mark.parametrize(
    ("zero_point", "shown"),
    [
        (np.uint64(2**63), "9223372036854775808"),  # was reported as -9223372036854775808
        (np.uint64(2**64 - 1), "18446744073709551615"),
        (2**70, "1180591620717411303424"),
        (np.array([0, 2**63], dtype=np.uint64), "9223372036854775808"),
        (-129, "-129"),
        (np.int64(-(2**63)), "-9223372036854775808"),
    ],
)
def test_item13_quantize_zero_point_out_of_range(zero_point, shown):
    x = np.ones((3, 2))
    axis = 1 if np.ndim(zero_point) else None
    with pytest.raises(
        ValueError, match=rf"zero_point must lie in -128\.\.127 for int8, got {shown}"
    ):
        pl.quantize(x, "int8", 1.0, zero_point=zero_point, axis=axis)
    if np.max(zero_point) >= 2**63:  # dequantize has no format: int64's range
        with pytest.raises(ValueError, match=rf"zero_point must lie in .* \(int64\), got {shown}"):
            pl.dequantize(np.ones((3, 2), np.int8), 1.0, zero_point=zero_point, axis=axis)


def test_item13_quantize_zero_point_unsigned_edges():
    assert pl.quantize([1.0], "uint8", 1.0, zero_point=np.uint64(255)).tolist() == [255]
    assert pl.quantize([-1.0], "int8", 1.0, zero_point=np.int8(-128)).tolist() == [-128]
    with pytest.raises(TypeError, match="zero_point"):
        pl.quantize([1.0], "int8", 1.0, zero_point=1.5)


@pytest.mark.parametrize("ndim", [33, 40, 62])
def test_item13_more_than_32_dimensions(ndim):
    """quantize, dequantize, calibrate and gemm on arrays of more than 32 dimensions, as round_to
    (np.broadcast_shapes stops at 32)."""
    rng = np.random.default_rng(ndim)
    x = rng.standard_normal((1,) * (ndim - 1) + (3,))
    q = pl.quantize(x, "int8", [0.01, 0.02, 0.03], axis=-1)
    np.testing.assert_array_equal(
        q.reshape(-1), pl.quantize(x.reshape(1, 3), "int8", [0.01, 0.02, 0.03], axis=-1).reshape(-1)
    )
    assert pl.dequantize(q, 0.5).shape == x.shape
    assert pl.calibrate(x, "int8", axis=-1).scale.shape == (3,)
    a = pl.round_to(rng.standard_normal((1,) * (ndim - 2) + (2, 3)), "bf16")
    b = pl.round_to(rng.standard_normal((3, 4)), "bf16")
    for acc in (pl.Accumulator("fp32"), pl.Accumulator("fp32", order="blas")):
        d = pl.gemm(a, b, input_format="bf16", accumulator=acc)
        assert d.shape == (1,) * (ndim - 2) + (2, 4)
        flat = pl.gemm(a.reshape(2, 3), b, input_format="bf16", accumulator=acc)
        np.testing.assert_array_equal(d.reshape(2, 4), flat)


def _next_beyond(target, factor: int, up: bool) -> float:
    """The float64 x nearest target / factor with x * factor just above (up) or below target."""
    from fractions import Fraction

    x = float(target / factor)
    while (Fraction(x) * factor > target) != up:
        x = float(np.nextafter(x, 1.0 if up else 0.0))
    return x


@pytest.mark.parametrize("scale", [3, 5, 7])
def test_item4_non_power_of_two_scale_rounds_the_exact_product(scale):
    """S * g is rounded once from its exact value: float64's product of x * 3 can land exactly
    on fp16's tie 2**-25 (or on the smallest subnormal) and double-round."""
    from fractions import Fraction

    q = Fraction(1, 2**24)  # fp16's smallest subnormal
    above_tie = _next_beyond(q / 2, scale, up=True)  # x*S just above the tie: rounds up to q
    below_q = _next_beyond(q, scale, up=False)  # x*S just below q: toward_zero gives 0
    s = float(scale)
    assert pl.underflow_stats(np.array([above_tie]), "fp16", s).zero_fraction == 0.0
    assert pl.underflow_stats(np.array([-above_tie]), "fp16", s).zero_fraction == 0.0
    assert pl.underflow_stats(np.array([below_q]), "fp16", s, rounding="rtz").zero_fraction == 1.0
    assert pl.underflow_stats(np.array([below_q]), "fp16", s, rounding="up").subnormal_fraction == 1
    # products below float64's range keep their sign and non-zero-ness (directed modes)
    tiny = np.array([1e-320, -1e-320])
    assert pl.underflow_stats(tiny, "fp16", 1e-10, rounding="up").zero_fraction == 0.5
    assert pl.underflow_stats(tiny, "fp16", 2.0**-60, rounding="down").zero_fraction == 0.5


@pytest.mark.parametrize("k", [-1000, -600, 0, 600, 1000])
def test_item7_mse_calibration_any_magnitude(k):
    """The mse search on a histogram whose edges are scaled by 2**k picks the threshold scaled by
    2**k: no overflowing centres or squares (1e300 warned and broke the search) and no squares
    underflowing to 0 (for 1e-300 every candidate had error 0 and the first one won)."""
    from precision_lab.quant import integer as quantization

    x = np.abs(np.random.default_rng(7).laplace(0, 1, 4000))
    hist, edges = np.histogram(x, bins=256, range=(0.0, float(x.max())))
    want = quantization._amax_mse(hist, edges, 127, -127, 16, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = quantization._amax_mse(hist, np.ldexp(edges, k), 127, -127, 16, 1)
    assert got == math.ldexp(want, k)
    assert want > edges[17]  # (not the first candidate)


def test_item7_mse_calibration_subnormal_data():
    x = np.abs(np.random.default_rng(7).laplace(0, 1, 4000))
    want = float(pl.calibrate(x, "int8", method="mse", num_bins=256, start_bin=16).amax)
    got = float(pl.calibrate(x * 1e-310, "int8", method="mse", num_bins=256, start_bin=16).amax)
    assert got == pytest.approx(want * 1e-310, rel=1e-3)


def test_item2_mx_value_beyond_float32_output_is_inf():
    """float32 input, ceil rule: 3.2964854e38 gets the scale 2**120 and the element 256, so its
    MX value is 2**128: rounded once to the float32 result, that is inf (as decoding it)."""
    x = np.zeros(32, dtype=np.float32)
    x[-1] = np.float32(3.2964854295465914e38)
    bf = pl.get_block_format("mxfp8_e4m3", scale_rule="ceil")
    q = pl.quantize_blocks(x, bf)
    assert float(q.scales[0]) == 2.0**120 and float(q.element_values()[-1]) == 256.0
    assert pl.round_to_blocks(x, bf)[-1] == np.inf == pl.dequantize_blocks(q)[-1]
    assert pl.round_to_blocks(x.astype(np.float64), bf)[-1] == 2.0**128  # float64 holds it


def _threads_used(n: int = 64 * 100) -> set[int]:
    """The threads that ran the chunks of one for_chunks call (of 64 chunks)."""
    seen: set[int] = set()
    lock = threading.Lock()

    def work(lo: int, hi: int) -> None:
        with lock:
            seen.add(threading.get_ident())
        time.sleep(0.001)  # (so that each pool thread gets a range)

    _parallel.for_chunks(n, work, chunk=100)
    return seen


def test_use_workers_one_runs_inline_in_this_thread_only(monkeypatch):
    """use_workers(1) keeps this thread's calls inline; another thread still uses the pool,
    and the setting ends with the block."""
    monkeypatch.setattr(_parallel, "WORKERS", 2)
    me = threading.get_ident()
    assert me not in _threads_used()  # the pool's threads, not the caller
    other: list[set[int]] = []
    with _parallel.use_workers(1):
        assert _parallel.current_workers() == 1
        assert _threads_used() == {me}
        t = threading.Thread(target=lambda: other.append(_threads_used()))
        t.start()
        t.join()
    assert other and other[0] and t.ident not in other[0]  # the other thread: the pool
    assert _parallel.current_workers() == 2
    assert me not in _threads_used()


def test_use_workers_results_identical_and_argument_checked(monkeypatch):
    monkeypatch.setattr(_parallel, "WORKERS", 2)
    x = np.linspace(-500, 500, 1 << 20, dtype=np.float32)
    pooled = pl.encode(x, "e4m3", overflow="saturate")
    with _parallel.use_workers(1):
        np.testing.assert_array_equal(pl.encode(x, "e4m3", overflow="saturate"), pooled)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n must be an integer >= 1"):
            with _parallel.use_workers(bad):
                pass
