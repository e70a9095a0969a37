"""The fp64 FMA chain (FP64 DMMA on Ampere/Ada/Hopper, AMD CDNA2/3 f64 MFMA): ``s = fma(a_k,
b_k, s)`` in k order. The numpy reference (Dekker + round-to-odd, exact rationals outside their
range) and the native kernel (the hardware's fused multiply-add) against an exact-rational
oracle of IEEE fusedMultiplyAdd, on inputs where the product alone underflows or overflows,
exact cancellations, signed zeros and special values; the native kernel must run (a spy)."""

from __future__ import annotations

import importlib
import math
from fractions import Fraction

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.backends.native import kernels as native_kernels

nbk = importlib.import_module("precision_lab.gemm.native_backend")
ACC = pl.tensor_core("h100", "fp64", out_format="fp64")
KW = {"input_format": "fp64", "accumulator": ACC, "out_format": "fp64"}


def _fma(x: float, y: float, s: float) -> float:
    """IEEE fusedMultiplyAdd in float64 (round to nearest even), from exact rationals."""
    if not (math.isfinite(x) and math.isfinite(y)):
        with np.errstate(invalid="ignore", over="ignore"):
            return float(np.float64(x) * np.float64(y) + np.float64(s))
    if not math.isfinite(s):
        return s  # (a finite product, however large, leaves an infinity as it is)
    exact = Fraction(x) * Fraction(y) + Fraction(s)
    if exact == 0:  # the sign of an exact zero: -0 only for -0 + -0
        both_neg = math.copysign(1, x) * math.copysign(1, y) < 0 and math.copysign(1, s) < 0
        return -0.0 if (x == 0 or y == 0) and both_neg else 0.0
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


def _oracle(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    out = np.empty((a.shape[0], b.shape[1]))
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            s = float(c[i, j])
            for k in range(a.shape[1]):
                s = _fma(float(a[i, k]), float(b[k, j]), s)
            out[i, j] = s
    return out


def _inputs(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    m, k, n = 4, 9, 5
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    c = rng.standard_normal((m, n))
    if kind == "wide":
        a *= 2.0 ** rng.integers(-300, 300, (m, k))
        b *= 2.0 ** rng.integers(-300, 300, (k, n))
    elif kind == "tiny":  # products below 2**-969 (Dekker's error term underflows), subnormals
        a *= 2.0 ** rng.integers(-540, -480, (m, k))
        b *= 2.0 ** rng.integers(-560, -500, (k, n))
        c *= 2.0**-1040
    elif kind == "huge":  # products beyond float64 alone; sums that overflow, then stay inf
        a *= 2.0 ** rng.integers(500, 520, (m, k))
        b *= 2.0 ** rng.integers(500, 515, (k, n))
        c *= 2.0**1020
    elif kind == "cancel":  # exact cancellations to zero
        c = -(a[:, :1] * b[:1, :])
        a[:, 1:] = 0.0
    elif kind == "zeros":  # signed zeros only: the sign rules of exact zero sums
        a = rng.choice([-0.0, 0.0], (m, k))
        b = rng.choice([-0.0, 0.0, 1.0, -2.0], (k, n))
        c = rng.choice([-0.0, 0.0], (m, n))
    elif kind == "special":  # inf and NaN inputs, inf meeting -inf
        a[0, 2], a[1, 3], b[4, 1], c[2, 2] = np.inf, np.nan, -np.inf, np.inf
    return a, b, c


KINDS = ("normal", "wide", "tiny", "huge", "cancel", "zeros", "special")


@pytest.mark.parametrize("kind", KINDS)
def test_reference_is_ieee_fma(kind):
    a, b, c = _inputs(kind, np.random.default_rng(KINDS.index(kind)))
    got = pl.gemm(a, b, c, backend="numpy", **KW)
    want = _oracle(a, b, c)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    assert got[~nan].view(np.uint64).tolist() == want[~nan].view(np.uint64).tolist()


@pytest.mark.skipif(not native_kernels.available(), reason="the native extension is not built")
@pytest.mark.parametrize("kind", KINDS)
def test_native_equals_the_reference(kind, monkeypatch):
    calls = []
    run = nbk.gemm_fma64
    monkeypatch.setattr(nbk, "gemm_fma64", lambda *a, **k: calls.append(1) or run(*a, **k))
    a, b, c = _inputs(kind, np.random.default_rng(KINDS.index(kind)))
    want = pl.gemm(a, b, c, backend="numpy", **KW)
    got = pl.gemm(a, b, c, backend="native", **KW)
    assert got.view(np.uint64).tolist() == want.view(np.uint64).tolist()
    assert calls == [1]


@pytest.mark.skipif(not native_kernels.available(), reason="the native extension is not built")
def test_native_batches_and_other_rules(monkeypatch):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 3, 70)), rng.standard_normal((70, 6))
    c = rng.standard_normal((3, 6))
    for acc in (ACC, pl.Accumulator("fp64", "nearest_even", zero_sign="positive")):
        kw = {**KW, "accumulator": acc}
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got = pl.gemm(a, b, c, backend="native", **kw)
        assert got.view(np.uint64).tolist() == want.view(np.uint64).tolist()
    # the zero-sign rule is not the chain's IEEE sign: the native kernel hands it back
    acc = pl.Accumulator("fp64", "nearest_even", zero_sign="positive")
    fp64 = pl.get_format("fp64")
    kw = {"input_format": fp64, "out_format": fp64, "input_rounding": "nearest_even"}
    assert nbk.gemm_fma64(a, b, c, accumulator=acc, **kw) is None


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_a_zero_product_keeps_the_sign_of_a_negative_zero(backend):
    # fma(+0, -1, -0) = (-0) + (-0) = -0 (IEEE 754 6.3); the reference's two-sum gave +0
    # (found by MMA-Sim's CDNA3 f64 MFMA, tests/gemm/test_mmasim_amd.py, subnormal inputs)
    if backend == "native" and not native_kernels.available():
        pytest.skip("the native extension is not built")
    # rows: 0 * -tiny + -0, then 0 * -1 + -0: -0; -2**-1200 underflows to -0, then + 0 * -1:
    # -0; -0 * -tiny + -0 = +0, then 0 * -1 + +0: +0
    a = np.array([[0.0, 0.0], [2.0**-600, 0.0], [-0.0, 0.0]])
    b = np.array([[-(2.0**-600)], [-1.0]])
    c = np.array([[-0.0], [0.0], [-0.0]])
    got = pl.gemm(a, b, c, backend=backend, **KW)
    want = _oracle(a, b, c)
    assert np.signbit(want).ravel().tolist() == [True, True, False]
    assert got.view(np.uint64).tolist() == want.view(np.uint64).tolist()
