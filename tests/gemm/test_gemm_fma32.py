"""The native fp32 FMA GEMM (native_backend._fma32_gemm, fma32.inc) gives the reference bits.

The fp32 sequential round-to-nearest-even model is computed there by ``s = fmaf(a, b, s)`` on
float32 values. Each test compares with the numpy reference (``backend="numpy"``), checks that the
fast kernel itself ran where it should (not only the general kernels it falls back to), and where
the answer is known independently (signs of zero, subnormal products, overflow) asserts it too.
The instruction-set builds other than this process's one run in a subprocess.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from fpenv import ftz_daz
from hypothesis import given, settings
from hypothesis import strategies as st

import precision_lab as pl
from precision_lab.core.pool import use_workers

native_kernels = importlib.import_module("precision_lab.backends.native.kernels")
native_backend = importlib.import_module("precision_lab.gemm.native_backend")

pytestmark = pytest.mark.skipif(
    not native_kernels.available(), reason="precision_lab.backends._native_kernels is not built"
)
FP32 = pl.Accumulator("fp32")
F = pl.get_format


def bits(x: np.ndarray) -> np.ndarray:
    return x.view({4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def fast(a, b, c=None, fmt="fp32", acc=FP32, out="fp32", rounding="nearest_even"):
    """The fp32 FMA kernel alone (None where it hands the call to the general kernels)."""
    fa = F(fmt)
    return native_backend._fma32_gemm(
        np.asarray(a), np.asarray(b), c, fa, fa, acc, F(out), rounding
    )


def check(a, b, c=None, fmt="fp32", acc=FP32, out="fp32", expect_fast=True, **kw):
    """Numpy reference == native (and == the fast kernel, which must have run if expect_fast)."""
    ref = pl.gemm(a, b, c, input_format=fmt, accumulator=acc, out_format=out, backend="numpy",
                  **kw)  # fmt: skip
    nat = pl.gemm(a, b, c, input_format=fmt, accumulator=acc, out_format=out, backend="native",
                  **kw)  # fmt: skip
    assert np.array_equal(bits(ref), bits(nat))
    got = fast(a, b, c, fmt, acc, out, kw.get("input_rounding", "nearest_even"))
    if expect_fast:
        assert got is not None, "the fp32 FMA kernel did not run"
    if got is not None:
        assert np.array_equal(bits(ref), bits(got))
    return ref


def test_the_kernel_covers_the_model_and_nothing_else():
    e4m3, fp32 = F("e4m3"), F("fp32")
    assert native_backend.fma32_applies(FP32, e4m3, e4m3, fp32)
    assert native_backend.fma32_applies(FP32.replace(overflow="saturate"), e4m3, e4m3, F("bf16"))
    for acc in (
        FP32.replace(rounding="toward_zero"),
        FP32.replace(subnormals="flush"),
        FP32.replace(promote_every=32),
        FP32.replace(product_format="bf16"),
        pl.Accumulator("bf16"),
        FP32.replace(order="pairwise"),
    ):
        assert not native_backend.fma32_applies(acc, e4m3, e4m3, fp32)
    assert not native_backend.fma32_applies(FP32, e4m3, e4m3, F("fp64"))
    assert native_backend._ext.fma32_tile()[0] >= 1


def test_signed_zeros_follow_ieee():
    """-0 + -0 = -0, every other exact zero sum is +0 (round to nearest), c = -0 kept at K = 0."""
    cases = [  # (a row, b column, c, expected sign bit)
        ([-1.0], [0.0], None, 0),  # +0 + -0
        ([-1.0], [0.0], -0.0, 1),  # -0 + -0
        ([1.0], [0.0], -0.0, 0),  # -0 + +0
        ([1.5, -1.5], [2.0, 2.0], -0.0, 0),  # exact cancellation
        ([-1.0, -1.0], [0.0, 0.0], -0.0, 1),
        ([], [], -0.0, 1),  # K = 0: d = c
    ]
    for a, b, c, sign in cases:
        a2 = np.array([a], np.float32).reshape(1, len(a))
        b2 = np.array(b, np.float32).reshape(len(b), 1)
        cc = None if c is None else np.full((1, 1), c, np.float32)
        d = check(a2, b2, cc)
        assert d[0, 0] == 0.0 and int(np.signbit(d[0, 0])) == sign, (a, b, c)


def test_subnormal_results_are_rounded_gradually():
    a = np.array([[2.0**-70, 3 * 2.0**-80, -(2.0**-75)]], np.float32)
    b = np.array([[2.0**-70], [1.5 * 2.0**-72], [2.0**-74]], np.float32)
    d = check(a, b)
    # each step rounded to float32's subnormal grid (multiples of 2**-149), in k order
    s = np.float32(0)
    for k in range(3):
        exact = float(s) + float(a[0, k]) * float(b[k, 0])
        s = np.float32(round(exact / 2.0**-149) * 2.0**-149)
    assert d[0, 0] == s and d[0, 0] != 0 and abs(d[0, 0]) < np.finfo(np.float32).tiny


@pytest.mark.parametrize("overflow", ["ieee", "saturate"])
def test_overflow_follows_the_accumulators_switch(overflow):
    acc = FP32.replace(overflow=overflow)
    big = np.float32(2.0**120)
    a = np.array([[big, big, -big], [1.0, 2.0, 3.0]], np.float32)
    b = np.array([[2.0**7], [2.0**7], [2.0**7]], np.float32)
    d = check(a, b, acc=acc, expect_fast=False)
    top = np.finfo(np.float32).max
    # row 0: 2**127 + 2**127 overflows; then -2**127 (IEEE: inf stays; saturate: max - 2**127)
    assert d[0, 0] == (np.inf if overflow == "ieee" else np.float32(float(top) - 2.0**127))
    assert d[1, 0] == 6 * 2.0**7
    assert fast(a, b, acc=acc) is None  # an inf accumulator sends the call to the general path


@pytest.mark.parametrize(
    "acc",
    [FP32, FP32.replace(rounding="down"), pl.Accumulator("bf16", rounding="nearest_away")],
    ids=lambda a: a.describe(),
)
def test_an_accumulator_that_overflowed_stays_infinite(acc):
    """Regression: the general tile kernel's two-sum turned inf + (-0) into NaN after an
    accumulator overflowed its format (the sum check assumed finite accumulators)."""
    a = np.array([[-2.3490776e19, -9.58366e18, 1.0]], np.float32)
    b = np.array([[1.7870283e19], [0.0], [3.0]], np.float32)
    d = check(a, b, fmt="bf16", acc=acc, expect_fast=False)
    assert d[0, 0] == -np.inf


def test_inf_and_nan_inputs_take_the_general_path():
    rng = np.random.default_rng(5)
    a = pl.round_to(rng.standard_normal((7, 30)), "e4m3").astype(np.float32)
    b = pl.round_to(rng.standard_normal((30, 9)), "e4m3").astype(np.float32)
    c = rng.standard_normal((7, 9)).astype(np.float32)
    a[0, 3], b[4, 2], c[3, 3], c[4, 4] = np.inf, -np.inf, np.nan, -np.inf
    a[2, 5], b[5, 6] = np.inf, 0.0  # inf * 0
    a[5, 7] = np.nan
    for acc in (FP32, FP32.replace(overflow="saturate")):
        check(a, b, c, fmt="e4m3", acc=acc, expect_fast=False)
        assert fast(a, b, c, "e4m3", acc) is None


def test_off_grid_inputs_with_exact_rounding_raise_as_before():
    a = np.array([[0.3]], np.float32)
    with pytest.raises(ValueError, match="not on the e4m3 grid"):
        pl.gemm(a, a, input_format="e4m3", input_rounding="exact", backend="native")
    assert fast(a, a, fmt="e4m3", rounding="exact") is None
    for x, y in [(np.zeros((0, 1), np.float32), a), (a, np.zeros((1, 0), np.float32))]:
        with pytest.raises(ValueError, match="not on the e4m3 grid"):  # (an empty result too)
            pl.gemm(x, y, input_format="e4m3", input_rounding="exact", backend="native")


@pytest.mark.parametrize(
    ("m", "k", "n"), [(1, 1, 1), (1, 0, 5), (13, 1, 1), (25, 67, 33), (12, 32, 32), (31, 5, 97)]
)
def test_ragged_shapes(m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal((m, n))
    check(a, b, fmt="e4m3")
    check(a, b, c, fmt="bf16", out="bf16")


def test_non_contiguous_inputs_batches_and_thread_counts():
    rng = np.random.default_rng(11)
    big = rng.standard_normal((3, 40, 90)).astype(np.float32)
    a = big[:, ::3, 1::2]  # (3, 14, 45), strided
    b = np.asarray(rng.standard_normal((2, 1, 77, 45)), np.float64).transpose(0, 1, 3, 2)
    c = rng.standard_normal((14, 1))  # broadcast along N and the batch
    want = None
    for workers in (1, 2, 3):
        with use_workers(workers):
            d = check(a, b, c, fmt="e5m2", out="fp16")
        assert d.shape == (2, 3, 14, 77)
        want = d if want is None else want
        assert np.array_equal(bits(want), bits(d))


def test_rows_split_over_many_chunks(monkeypatch):
    """Chunk boundaries inside and across batch entries (each chunk packs its own rows of A)."""
    rng = np.random.default_rng(2)
    a = pl.round_to(rng.standard_normal((7, 5, 40)), "e4m3")
    b = pl.round_to(rng.standard_normal((40, 70)), "e4m3")
    ref = pl.gemm(a, b, input_format="e4m3", backend="numpy")
    monkeypatch.setattr(native_backend._parallel, "current_workers", lambda: 7)  # (5 tiles)
    monkeypatch.setattr(native_backend, "_PARALLEL_MACS", 0)
    monkeypatch.setattr(native_backend, "_PACKED_A", 40)  # one tile per work item
    got = fast(a, b, fmt="e4m3")
    assert got is not None and np.array_equal(bits(ref), bits(got))
    got = fast(a.astype(np.float32), b.astype(np.float32), fmt="e4m3")  # (rounded as packed)
    assert got is not None and np.array_equal(bits(ref), bits(got))


def test_long_sums_cross_the_k_blocks():
    """K past the kernel's K blocks (256 / 512 / 1024 for AVX-512 / AVX2 / baseline): the
    accumulators stored between blocks and loaded back give the same bits."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((2, 13, 1100)).astype(np.float32)
    b = rng.standard_normal((1100, 37)).astype(np.float32)
    c = rng.standard_normal((13, 37))
    d = check(a, b, c, fmt="bf16")  # (bf16 products: every step rounds)
    assert np.all(d != 0)


def test_output_formats_and_out_rounding():
    rng = np.random.default_rng(3)
    a = pl.round_to(rng.standard_normal((9, 50)) * 30, "e4m3")
    b = pl.round_to(rng.standard_normal((50, 18)) * 30, "e4m3")
    c = rng.standard_normal((9, 18)) * 100
    for out, mode in [("fp16", "nearest_even"), ("bf16", "toward_zero"), ("e5m2", "stochastic"),
                      ("fp32", "stochastic"), ("fp32", "up")]:  # fmt: skip
        acc = FP32.replace(out_rounding=mode, seed=7)
        check(a, b, c, fmt="e4m3", acc=acc, out=out)


def test_the_sse_control_register_is_the_kernels_own():
    """Flush-to-zero and denormals-are-zero set by the caller (fast-math libraries do) change
    nothing: the kernel runs in the default environment and gives the caller's back."""
    a = np.array([[2.0**-70, 2.0**-60]], np.float32)
    b = np.array([[2.0**-70], [2.0**-80]], np.float32)
    ref = pl.gemm(a, b, input_format="fp32", backend="numpy")
    with ftz_daz(), use_workers(1):
        got = fast(a, b)
    assert got is not None and np.array_equal(bits(ref), bits(got)) and ref[0, 0] != 0


FORMATS = ["e4m3", "e5m2", "bf16", "fp16", "fp32"]


@st.composite
def gemm_case(draw):
    fmt = draw(st.sampled_from(FORMATS))
    m, k, n = draw(st.integers(1, 15)), draw(st.integers(0, 40)), draw(st.integers(1, 40))
    fmax = float(F(fmt).max)
    # exponents spread over the format (subnormal products, cancellation, near-overflow sums)
    lo = max(F(fmt).emin - F(fmt).mantissa_bits, -149)
    hi = min(int(np.log2(fmax)), 127)
    center = draw(st.integers(lo, hi))
    width = draw(st.integers(0, 12))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)

    def values(shape):
        e = np.clip(center + rng.integers(-width, width + 1, shape), lo, hi)
        v = rng.uniform(1, 2, shape) * 2.0 ** e.astype(np.float64)
        v *= rng.choice([-1.0, 1.0], shape)
        v[rng.random(shape) < 0.1] = 0.0
        v[rng.random(shape) < 0.05] *= -1.0  # signed zeros among them
        return np.asarray(pl.round_to(v, fmt), np.float32)

    a, b = values((m, k)), values((k, n))
    if k >= 2 and draw(st.booleans()):  # exact cancellation: pairs a*b and -a*b
        a[:, 1] = -a[:, 0]
        b[1] = b[0]
    c = draw(st.sampled_from([None, "values", "negzero"]))
    if c == "values":
        c = values((m, n))
    elif c == "negzero":
        c = np.full((m, n), -0.0, np.float32)
    acc = draw(st.sampled_from([FP32, FP32.replace(overflow="saturate")]))
    return fmt, a, b, c, acc


@settings(max_examples=120, deadline=None)
@given(gemm_case())
def test_random_cases_match_the_reference(case):
    fmt, a, b, c, acc = case
    ref = pl.gemm(a, b, c, input_format=fmt, accumulator=acc, backend="numpy")
    nat = pl.gemm(a, b, c, input_format=fmt, accumulator=acc, backend="native")
    assert np.array_equal(bits(ref), bits(nat))
    got = fast(a, b, c, fmt, acc)
    if np.isfinite(ref).all() and acc.overflow == "ieee":
        assert got is not None  # finite IEEE results: the FMA kernel's own
    if got is not None:
        assert np.array_equal(bits(ref), bits(got))


_ISA_SCRIPT = """
import importlib, numpy as np, precision_lab as pl
nk = importlib.import_module("precision_lab.backends.native.kernels")
nb = importlib.import_module("precision_lab.gemm.native_backend")
assert nk.isa() == {isa!r}, nk.isa()
rng = np.random.default_rng(4)
cases = [((13, 70, 37), "e4m3", 1.0), ((2, 0, 3), "bf16", 1.0), ((5, 9, 1), "fp32", 2.0**-60),
         ((7, 1100, 20), "e4m3", 1.0)]  # (K blocks of 512 / 1024)
for (m, k, n), fmt, scale in cases:  # (fp32: subnormal sums)
    a = pl.round_to(rng.standard_normal((3, m, k)) * scale, fmt)
    b = pl.round_to(rng.standard_normal((k, n)) * scale, fmt)
    c = -np.zeros((m, n)) if k == 0 else rng.standard_normal((m, n)) * 2.0**-125
    x = pl.gemm(a, b, c, input_format=fmt, backend="numpy")
    f = pl.get_format(fmt)
    y = nb._fma32_gemm(a, b, c, f, f, pl.Accumulator(), pl.get_format("fp32"), "nearest_even")
    assert y is not None and np.array_equal(x.view(np.uint32), y.view(np.uint32)), (m, k, n)
a = (rng.standard_normal((2, 30, 50)) * 2.0 ** rng.integers(-12, 6, (2, 30, 50))).astype("f4")
b = (rng.standard_normal((50, 40)) * 2.0 ** rng.integers(-12, 6, (50, 40))).astype("f4")
a[0, :, 0], e4m3 = -0.0, pl.get_format("e4m3")
for mode in ("nearest_even", "up", "odd", "exact"):  # float32: rounded by the packs (grid32)
    if mode == "exact":
        a, b = pl.round_to(a, e4m3), pl.round_to(b, e4m3)
    x = pl.gemm(a, b, input_format=e4m3, input_rounding=mode, backend="numpy")
    y = nb._fma32_gemm(a, b, None, e4m3, e4m3, pl.Accumulator(), pl.get_format("fp32"), mode)
    assert y is not None and np.array_equal(x.view(np.uint32), y.view(np.uint32)), mode
print("ok")
"""


@pytest.mark.parametrize(("env", "isa"), [("avx2", "avx2+fma"), ("baseline", "baseline")])
def test_other_instruction_set_builds_match(env, isa):
    if native_kernels.isa() == "baseline" and env != "baseline":
        pytest.skip("this CPU has no AVX2")
    r = subprocess.run(
        [sys.executable, "-c", _ISA_SCRIPT.format(isa=isa)],
        env=dict(os.environ, PRECISION_LAB_NATIVE_ISA=env),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_run_together_runs_tasks_on_two_threads_and_inline_under_one_worker():
    import threading

    from precision_lab.core.pool import run_together

    barrier = threading.Barrier(2, timeout=10)  # both tasks must be running at the same time

    def task(v):
        barrier.wait()
        return v, threading.get_ident()

    with use_workers(2):
        (x, t1), (y, t2) = run_together(lambda: task(1), lambda: task(2))
    assert (x, y) == (1, 2) and t1 != t2
    with use_workers(1):
        got = run_together(lambda: threading.get_ident(), lambda: threading.get_ident())
    assert got == [threading.get_ident()] * 2
    with pytest.raises(ZeroDivisionError), use_workers(2):
        run_together(lambda: 1, lambda: 1 // 0)


def test_input_dtypes_scalar_c_and_input_rounding_modes():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((6, 21))
    b = rng.standard_normal((21, 35))
    check(a.astype(np.float16), b.astype(np.float16), -0.0, fmt="e4m3")
    check(a, b.astype(np.float32), 0.375, fmt="bf16", input_rounding="toward_zero")
    check(a, b, fmt="e5m2", input_rounding="stochastic", expect_fast=False)
    assert fast(a, b, fmt="e5m2", rounding="stochastic") is None


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "bf16", "fp16", "e4m3fnuz"])
@pytest.mark.parametrize(
    "mode", ["nearest_even", "nearest_away", "toward_zero", "up", "down", "odd", "exact"]
)
def test_float32_inputs_are_put_on_the_grid_in_every_mode(fmt, mode):
    """Float32 inputs put on the grid (or checked, 'exact') on the fast path: raw values across
    the format's range (subnormal range, ties, beyond max) and signed zeros."""
    rng = np.random.default_rng(zlib.crc32(f"{fmt} {mode}".encode()))
    f = F(fmt)
    top = min(int(np.log2(float(f.max))) + 2, 60)  # (products stay below float32's max)
    e = rng.integers(f.emin - f.mantissa_bits - 2, top, (2, 9, 33))
    v = rng.uniform(1, 2, e.shape) * 2.0 ** e.astype(np.float64) * rng.choice([-1, 1], e.shape)
    v[:, :, 0] = -0.0
    v = v.astype(np.float32)
    if mode == "exact":  # values on the grid (its subnormals, -0) go through the check
        v = np.asarray(pl.round_to(v, fmt), np.float32)
        v[~np.isfinite(v)] = 1.0
    a, b = v[0], v[1].T.copy()
    check(a, b, fmt=fmt, input_rounding=mode, expect_fast=False)
    if mode == "exact":
        assert fast(a, b, fmt=fmt, rounding=mode) is not None


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16", "e4m3"])
@pytest.mark.parametrize(("k", "n"), [(1, 1), (37, 16), (64, 45), (130, 3), (1100, 20)])
def test_transposed_b_is_packed_as_it_is(fmt, k, n):
    """A B given as the transpose of a C-contiguous array (a weight's w.T) is packed from its
    rows (``b_trans``: no numpy copy): the numpy reference's bits, for every input rounding and
    ``"exact"``, one and two workers, batched, with a bias."""
    rng = np.random.default_rng(k * 100 + n)
    a = rng.standard_normal((2, 13, k)).astype(np.float32)
    w = (rng.standard_normal((2, n, k)) * 4).astype(np.float32)
    b = np.swapaxes(w, -1, -2)  # (2, k, n), the transposed view
    assert native_backend._is_transposed(b, (2, k, n)) or min(k, n) < 2
    c = rng.standard_normal((13, n)).astype(np.float32)
    for workers in (1, 2):
        with use_workers(workers):
            check(a, b, c, fmt=fmt)
            check(a, b, fmt=fmt, input_rounding="up")
            on = pl.round_to(b, fmt)  # (exact: on the grid; off it, the general path raises)
            check(pl.round_to(a, fmt), np.swapaxes(np.ascontiguousarray(np.swapaxes(on, -1, -2)),
                  -1, -2), fmt=fmt, input_rounding="exact")  # fmt: skip
