"""precision_lab.ops against an independent Fraction referee (tests/referee.py).

Exhaustive: every pair of E4M3 and of E5M2 values (65,536 pairs each, NaN and inf included)
for add, sub, mul and div in every deterministic mode and both overflow switches (96 x 65,536
cases, each exact result a Fraction rounded by the referee, cached by value); sqrt of every
bf16, fp16, E4M3 and E5M2 value; fma on every E2M1 triple and on seeded E4M3/E5M2 triples.
Hypothesis draws bf16/fp16/fp32/fp64 operands (edge values first) and pairs built to land on
ties. Stochastic rounding: the two neighbours, with the right mean.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from referee import DETERMINISTIC, KEYS, OVERFLOWS, referee_all, referee_formula

import precision_lab as pl
from precision_lab.arith import ops
from precision_lab.verify import strategies as pls

F = Fraction
BINARY = {
    "add": (ops.add, lambda x, y: x + y),
    "sub": (ops.sub, lambda x, y: x - y),
    "mul": (ops.mul, lambda x, y: x * y),
    "div": (ops.div, lambda x, y: x / y),
}


def all_values(fmt: str) -> np.ndarray:
    f = pl.get_format(fmt)
    codes = np.arange(1 << f.bits, dtype=f.code_dtype)
    return pl.decode(codes, f).astype(np.float64)


def ieee(op: str, x: float, y: float) -> float:
    with np.errstate(all="ignore"):
        a, b = np.float64(x), np.float64(y)
        return float({"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[op])


def zero_sign(op: str, x: float, y: float, mode: str) -> float:
    """IEEE sign of an exact zero result."""
    sx, sy = math.copysign(1, x) < 0, math.copysign(1, y) < 0
    if op in ("mul", "div"):
        return -0.0 if sx != sy else 0.0
    if op == "sub":
        sy = not sy
    if x == 0 and y == 0 and sx == sy:
        return -0.0 if sx else 0.0
    return -0.0 if mode == "down" else 0.0


def _referee_cached(v: Fraction | float, fmt: pl.FloatFormat) -> dict[tuple[str, str], float]:
    # the sign is part of the key: -0.0 == 0.0 (and hashes alike) but rounds to -0
    return _referee_keyed(v, math.copysign(1.0, v) if isinstance(v, float) else 1.0, fmt)


@cache
def _referee_keyed(
    v: Fraction | float, sign: float, fmt: pl.FloatFormat
) -> dict[tuple[str, str], float]:
    return referee_all(v, fmt)


def expected_binary(op: str, fmt: str, x: float, y: float) -> dict[tuple[str, str], float]:
    f = pl.get_format(fmt)
    assert isinstance(f, pl.FloatFormat)
    if not (math.isfinite(x) and math.isfinite(y)) or (op == "div" and y == 0):
        return _referee_cached(ieee(op, x, y), f)
    exact = BINARY[op][1](F(x), F(y))
    if exact == 0:
        return {k: _referee_cached(zero_sign(op, x, y, k[0]), f)[k] for k in KEYS}
    return _referee_cached(exact, f)


@cache
def table(op: str, fmt: str) -> tuple[np.ndarray, np.ndarray, dict[tuple[str, str], np.ndarray]]:
    v = all_values(fmt)
    X, Y = (a.reshape(-1) for a in np.meshgrid(v, v, indexing="ij"))
    exp = {k: np.empty(X.size) for k in KEYS}
    for i, (x, y) in enumerate(zip(X.tolist(), Y.tolist(), strict=True)):
        for k, r in expected_binary(op, fmt, x, y).items():
            exp[k][i] = r
    return X, Y, exp


def same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    got = np.asarray(got, dtype=np.float64)
    return (np.isnan(got) & np.isnan(want)) | (
        (got == want) & (np.signbit(got) == np.signbit(want))
    )


def check(got: np.ndarray, want: np.ndarray, X: np.ndarray, Y: np.ndarray, what: str) -> None:
    ok = same(got, want)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise AssertionError(
            f"{what}: {int((~ok).sum())} mismatches, first x={X[i]!r} y={Y[i]!r}: "
            f"got {float(got.reshape(-1)[i])!r}, want {want[i]!r}"
        )


ALL = [(op, m, o) for op in BINARY for m, o in KEYS]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize(("op", "mode", "overflow"), ALL)
def test_exhaustive_pairs(fmt: str, op: str, mode: str, overflow: str) -> None:
    X, Y, exp = table(op, fmt)
    got = BINARY[op][0](X, Y, fmt, rounding=mode, overflow=overflow)
    check(got, exp[mode, overflow], X, Y, f"{op} {fmt} {mode} {overflow}")
    if op in ("add", "mul"):  # float32 and ml_dtypes operands take the float32 path
        for dt in (np.float32, _ml_dtype(fmt)):
            got = BINARY[op][0](X.astype(dt), Y.astype(dt), fmt, rounding=mode, overflow=overflow)
            check(got, exp[mode, overflow], X, Y, f"{op} {fmt} {mode} {overflow} {dt}")


def _ml_dtype(fmt: str) -> Any:
    import ml_dtypes

    return {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt]


# ----- sqrt: every 16-bit value ------------------------------------------------------------------
def sqrt_referee(x: float, fmt: pl.FloatFormat) -> dict[tuple[str, str], float]:
    if math.isnan(x) or x < 0:
        return _referee_cached(math.nan if x != 0 else x, fmt)
    if math.isinf(x) or x == 0:
        return _referee_cached(x, fmt)
    n = 300  # sqrt(x) to 2**-300: never within that of a grid point or midpoint unless on it
    scaled = F(x) * 4**n
    r = math.isqrt(math.floor(scaled))
    if r * r == scaled:
        return _referee_cached(F(r, 2**n), fmt)
    return _referee_cached(F(2 * r + 1, 2 ** (n + 1)), fmt)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3", "e5m2"])
def test_sqrt_every_value(fmt: str) -> None:
    f = pl.get_format(fmt)
    assert isinstance(f, pl.FloatFormat)
    v = all_values(fmt)
    exp = {k: np.empty(v.size) for k in KEYS}
    for i, x in enumerate(v.tolist()):
        for k, r in sqrt_referee(x, f).items():
            exp[k][i] = r
    for mode in DETERMINISTIC:
        got = ops.sqrt(v, fmt, rounding=mode)
        check(got, exp[mode, "ieee"], v, v, f"sqrt {fmt} {mode}")


# ----- fma ----------------------------------------------------------------------------------------
def fma_expected(x: float, y: float, z: float, f: pl.FloatFormat) -> dict[Any, float]:
    if not all(math.isfinite(v) for v in (x, y, z)):
        with np.errstate(all="ignore"):
            return _referee_cached(float(np.float64(x) * np.float64(y) + np.float64(z)), f)
    exact = F(x) * F(y) + F(z)
    if exact == 0:
        p_neg = (math.copysign(1, x) < 0) != (math.copysign(1, y) < 0)
        p = -0.0 if p_neg else 0.0
        if x * y != 0:  # a non-zero product cancelled by z
            p = 1.0
        return {k: _referee_cached(zero_sign("add", p, z, k[0]), f)[k] for k in KEYS}
    return _referee_cached(exact, f)


def check_fma(fmt: str, X: np.ndarray, Y: np.ndarray, Z: np.ndarray, modes: Any) -> None:
    f = pl.get_format(fmt)
    assert isinstance(f, pl.FloatFormat)
    exp = {k: np.empty(X.size) for k in KEYS}
    for i, (x, y, z) in enumerate(zip(X.tolist(), Y.tolist(), Z.tolist(), strict=True)):
        for k, r in fma_expected(x, y, z, f).items():
            exp[k][i] = r
    for mode, overflow in modes:
        got = ops.fma(X, Y, Z, fmt, rounding=mode, overflow=overflow)
        check(got, exp[mode, overflow], X, Y, f"fma {fmt} {mode} {overflow}")


def test_fma_every_e2m1_triple() -> None:
    v = all_values("e2m1")
    X, Y, Z = (a.reshape(-1) for a in np.meshgrid(v, v, v, indexing="ij"))
    check_fma("e2m1", X, Y, Z, KEYS)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fma_e4m3_triples(fmt: str) -> None:
    v = all_values(fmt)
    rng = np.random.default_rng(12)
    X, Y, Z = (v[rng.integers(0, v.size, 6000)] for _ in range(3))
    check_fma(fmt, X, Y, Z, KEYS)


def test_fma_is_single_rounded() -> None:
    a, b = 1.0 + 2.0**-10, 1.0 - 2.0**-10  # a * b = 1 - 2**-20 exactly
    assert float(ops.fma(a, b, -1.0, "fp16")) == -(2.0**-20)
    assert float(ops.sub(ops.mul(a, b, "fp16"), 1.0, "fp16")) == 0.0


# ----- wide formats: hypothesis ------------------------------------------------------------------
WIDE = ["bf16", "fp16", "fp32", "fp64"]


def wide_expected(exact: Fraction, f: pl.FloatFormat, mode: str, overflow: str) -> float:
    return referee_formula(exact, f, mode, overflow)  # type: ignore[arg-type]


def _tie_pair(draw: Any, fmt: str) -> tuple[float, float]:
    """x and a y that puts x + y on (or one value next to) a rounding midpoint of fmt."""
    f = pl.get_format(fmt)
    assert isinstance(f, pl.FloatFormat)
    x = draw(pls.values(fmt, allow_nan=False, allow_infinity=False))
    if x == 0:
        return x, draw(pls.values(fmt, allow_nan=False, allow_infinity=False))
    half = float(f.ulp(x)) / 2
    k = draw(st.integers(0, 3))
    y = math.copysign(half * 2.0**-k, draw(st.sampled_from([1.0, -1.0])))
    return x, float(pl.round_to(np.float64(y), f))


@st.composite
def pairs(draw: Any, fmt: str) -> tuple[float, float]:
    if draw(st.booleans()):
        return _tie_pair(draw, fmt)
    return (
        draw(pls.values(fmt, allow_nan=False, allow_infinity=False)),
        draw(pls.values(fmt, allow_nan=False, allow_infinity=False)),
    )


def dekker_operands(x: float, y: float) -> bool:
    return all(in_dekker_range(F(v)) for v in (x, y))


def in_dekker_range(v: Fraction) -> bool:
    return v == 0 or F(2) ** -960 <= abs(v) <= F(2) ** 990


@pytest.mark.parametrize("fmt", WIDE)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_wide_formats_against_referee(fmt: str, data: Any) -> None:
    f = pl.get_format(fmt)
    assert isinstance(f, pl.FloatFormat)
    x, y = data.draw(pairs(fmt))
    z = data.draw(pls.values(fmt, allow_nan=False, allow_infinity=False))
    mode = data.draw(st.sampled_from(DETERMINISTIC))
    overflow = data.draw(st.sampled_from(OVERFLOWS))
    dt = np.float64
    for op in BINARY:
        if op == "div" and y == 0:
            continue
        exact = BINARY[op][1](F(x), F(y))
        if exact == 0 or (fmt == "fp64" and not in_dekker_range(exact)):
            continue
        if fmt == "fp64" and op in ("mul", "div") and not dekker_operands(x, y):
            continue
        got = float(BINARY[op][0](dt(x), dt(y), f, rounding=mode, overflow=overflow))
        want = wide_expected(exact, f, mode, overflow)
        assert same(np.array(got), np.array(want)), (op, x, y, mode, overflow, got, want)
    exact = F(x) * F(y) + F(z)
    fp64_ok = in_dekker_range(exact) and in_dekker_range(F(x) * F(y)) and dekker_operands(x, y)
    if exact != 0 and (fmt != "fp64" or fp64_ok):
        got = float(ops.fma(dt(x), dt(y), dt(z), f, rounding=mode, overflow=overflow))
        want = wide_expected(exact, f, mode, overflow)
        assert same(np.array(got), np.array(want)), ("fma", x, y, z, mode, got, want)
    if x > 0:
        exp_sqrt = sqrt_exact(x)
        got = float(ops.sqrt(dt(x), f, rounding=mode, overflow=overflow))
        assert same(np.array(got), np.array(wide_expected(exp_sqrt, f, mode, overflow)))


def sqrt_exact(x: float) -> Fraction:
    n = 700
    scaled = F(x) * 4**n
    r = math.isqrt(math.floor(scaled))
    return F(r, 2**n) if r * r == scaled else F(2 * r + 1, 2 ** (n + 1))


# ----- stochastic rounding -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "x", "y", "fmt"),
    [
        ("add", 1.0, 2.0**-10, "bf16"),  # fraction 1/8 of an ulp
        ("mul", 1.125, 1.375, "e4m3"),  # 1.546875: 3/8 of the way from 1.5 to 1.625
        ("div", 1.0, 3.0, "bf16"),
        ("sqrt", 2.0, None, "fp16"),
        ("sub", -1.0, 2.0**-30, "fp32"),
        ("div", 1.0, 3.0, "fp64"),
        ("add", 1.0, 3 * 2.0**-55, "fp64"),
    ],
)
def test_stochastic_neighbours_and_mean(op: str, x: float, y: float | None, fmt: str) -> None:
    f = pl.get_format(fmt)
    assert isinstance(f, pl.FloatFormat)
    n = 4000
    if op == "sqrt":
        got = ops.sqrt(np.full(n, x), f, rounding="stochastic", seed=7)
        exact = sqrt_exact(x)
    else:
        fn, exact_fn = BINARY[op]
        got = fn(np.full(n, x), np.full(n, y), f, rounding="stochastic", seed=7)
        exact = exact_fn(F(x), F(y))
    lo = referee_formula(exact, f, "down")  # type: ignore[arg-type]
    hi = referee_formula(exact, f, "up")  # type: ignore[arg-type]
    assert lo < hi
    got = np.asarray(got, dtype=np.float64)
    assert set(np.unique(got).tolist()) <= {lo, hi}
    p = float((exact - F(lo)) / (F(hi) - F(lo)))
    mean_up = float((got == hi).mean())
    assert abs(mean_up - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-12
    again = ops.sqrt(np.full(n, x), f, rounding="sr", seed=7) if op == "sqrt" else None
    if again is not None:
        assert np.array_equal(again, got)


def test_stochastic_uses_flat_index_words() -> None:
    x = np.full((3, 50), 1.0)
    y = np.full((3, 50), 2.0**-10)
    whole = ops.add(x, y, "bf16", rounding="sr", seed=3)
    direct = pl.round_to(np.full(150, 1.0 + 2.0**-10), "bf16", rounding="sr", seed=3)
    assert np.array_equal(whole.reshape(-1), direct)


# ----- the rest ----------------------------------------------------------------------------------
def test_zero_signs_and_specials() -> None:
    assert math.copysign(1, float(ops.add(1.0, -1.0, "bf16"))) == 1
    assert math.copysign(1, float(ops.add(1.0, -1.0, "bf16", rounding="down"))) == -1
    assert math.copysign(1, float(ops.add(-0.0, -0.0, "bf16"))) == -1
    assert math.copysign(1, float(ops.add(0.0, 0.0, "bf16", rounding="down"))) == 1
    assert math.copysign(1, float(ops.fma(2.0, -3.0, 6.0, "fp16", rounding="down"))) == -1
    assert math.isnan(float(ops.div(0.0, 0.0, "fp16")))
    assert float(ops.div(-1.0, 0.0, "fp16")) == -math.inf
    assert float(ops.div(-1.0, 0.0, "fp16", overflow="saturate")) == -65504.0
    assert math.isnan(float(ops.mul(math.inf, 0.0, "bf16")))
    assert math.isnan(float(ops.sqrt(-1.0, "bf16")))
    assert math.copysign(1, float(ops.sqrt(-0.0, "bf16"))) == -1
    assert math.isnan(float(ops.add(448.0, 32.0, "e4m3")))  # overflow in a format without inf
    assert float(ops.add(448.0, 32.0, "e4m3", rounding="toward_zero")) == 448.0


def test_operands_are_rounded_to_the_format_first() -> None:
    # 1 + 2**-9 is not a bf16 value: it becomes 1.0 first, so the sum is exactly 1 + 1
    assert float(ops.add(1.0 + 2.0**-9, 1.0, "bf16", rounding="up")) == 2.0


def test_exact_and_faithful_functions() -> None:
    v = all_values("e4m3")
    v = v[np.isfinite(v)]
    assert np.array_equal(ops.neg(v, "e4m3"), -v)
    assert np.array_equal(ops.abs(v, "e4m3"), np.abs(v))
    assert ops.minimum(-0.0, 0.0, "bf16").tolist() == -0.0
    assert math.copysign(1, float(ops.minimum(0.0, -0.0, "bf16"))) == -1
    assert math.copysign(1, float(ops.maximum(-0.0, 0.0, "bf16"))) == 1
    assert ops.less([1.0, 2.0], [1.001, 3.0], "bf16").tolist() == [False, True]
    x = np.linspace(-4, 4, 101)
    for fn, ref in ((ops.exp, np.exp), (ops.tanh, np.tanh)):
        got = fn(x, "bf16")
        exact = ref(pl.round_to(x, "bf16").astype(np.float64))
        lo = pl.round_to(exact, "bf16", rounding="down")
        hi = pl.round_to(exact, "bf16", rounding="up")
        assert ((got == lo) | (got == hi)).all()
    assert float(ops.reciprocal(3.0, "bf16", rounding="up")) == float(
        ops.div(1.0, 3.0, "bf16", rounding="up")
    )
    assert float(ops.rsqrt(4.0, "bf16")) == 0.5
    assert float(ops.log(1.0, "bf16")) == 0.0


def test_dtypes_and_errors() -> None:
    assert ops.add(np.float32(1), np.float32(2), "bf16").dtype == np.float32
    assert ops.add(1.0, 2.0, "bf16").dtype == np.float64
    assert ops.add(1.0, 2.0, "fp64").dtype == np.float64
    with pytest.raises(ValueError, match="rounding"):
        ops.add(1.0, 2.0, "bf16", rounding="sideways")
    with pytest.raises(ValueError, match="integer format"):
        ops.add(1.0, 2.0, "int8")
    with pytest.raises(ValueError, match="broadcast"):
        ops.add(np.ones(3), np.ones(4), "bf16")
    with pytest.raises(TypeError, match="floating-point"):
        ops.add(np.ones(3, dtype=complex), 1.0, "bf16")
    ro = np.ones(3)
    ro.flags.writeable = False
    assert ops.mul(ro, ro[::-1], "e4m3").tolist() == [1.0, 1.0, 1.0]


# ----- reductions -------------------------------------------------------------------------------
def kahan_oracle(xs: list[float], fmt: pl.FloatFormat) -> float:
    """Kahan summation with every operation rounded by the referee (exact Fractions)."""

    def rnd(v: Fraction) -> Fraction:
        return F(referee_formula(v, fmt, "nearest_even"))  # type: ignore[arg-type]

    s = c = F(0)
    for x in xs:
        y = rnd(F(x) - c)
        t = rnd(s + y)
        c = rnd(rnd(t - s) - y)
        s = t
    return float(s)


def test_compensated_order_against_oracle() -> None:
    f = pl.get_format("bf16")
    assert isinstance(f, pl.FloatFormat)
    rng = np.random.default_rng(5)
    x = np.asarray(pl.round_to(rng.uniform(0, 1, (3, 300)), f), dtype=np.float64)
    acc = pl.Accumulator(f, order="compensated")
    got = ops.sum(x, accumulator=acc, axis=1)
    want = [kahan_oracle(row, f) for row in x.tolist()]
    assert got.tolist() == want
    assert ops.cumsum(x, accumulator=acc, axis=1)[:, -1].tolist() == want
    plain = ops.sum(x, accumulator=pl.Accumulator(f), axis=1)
    exact = [math.fsum(r) for r in x.tolist()]
    assert np.all(np.abs(got - exact) <= np.abs(plain - exact))
    d = pl.gemm(x, np.ones((300, 1)), input_format=f, accumulator=acc, out_format=f)
    assert d[:, 0].tolist() == want


def test_cumsum_matches_sum_for_every_prefix() -> None:
    rng = np.random.default_rng(6)
    x = np.asarray(pl.round_to(rng.uniform(-1, 1, 40), "fp16"), dtype=np.float64)
    for acc in (pl.Accumulator("fp16"), pl.Accumulator("fp16", rounding="sr", seed=4)):
        c = ops.cumsum(x, accumulator=acc)
        assert float(c[-1]) == float(ops.sum(x, accumulator=acc))
    c = ops.cumsum(x, accumulator="fp16")
    for k in (1, 7, 40):
        assert float(c[k - 1]) == float(ops.sum(x[:k], accumulator="fp16"))
    with pytest.raises(ValueError, match="not on the grid"):
        ops.sum(np.array([0.1]), accumulator="bf16")


def test_cupy_backend_refuses_compensated() -> None:
    from precision_lab.gemm import cupy_backend

    acc = pl.Accumulator("bf16", order="compensated")
    f = pl.get_format("bf16")
    with pytest.raises(NotImplementedError, match="compensated"):
        cupy_backend.kernel_plan(
            (2, 3),
            (3, 2),
            fa=f,
            fb=f,
            acc=acc,
            out_fmt=f,
            has_c=False,
            has_special=False,
            scales=None,
        )


def beyond_fp64(v: Fraction, mode: str, overflow: str) -> float:
    """IEEE 754 rounding of a real beyond the float64 range (|v| > DBL_MAX) onto fp64."""
    big = float(np.finfo(np.float64).max)
    neg = v < 0
    mag = abs(v)
    threshold = F(2) ** 1024 - F(2) ** 970  # DBL_MAX + half an ulp: the nearest-mode tie
    if mode in ("toward_zero", "odd") or (mode == "up" and neg) or (mode == "down" and not neg):
        to_inf = False
    elif mode in ("up", "down"):
        to_inf = True
    else:  # ties go to 2**1024 (even significand) in both nearest modes
        to_inf = mag >= threshold
    r = math.inf if to_inf and overflow == "ieee" else big
    return -r if neg else r


@pytest.mark.parametrize(("mode", "overflow"), KEYS)
def test_fp64_sums_beyond_float64_range(mode: str, overflow: str) -> None:
    big = float(np.finfo(np.float64).max)
    cases = [
        (big, big),
        (-big, -big),
        (big, big * 2**-53),
        (big, big * 2**-54),
        (-big, -big * 2**-52),
    ]
    for x, y in cases:
        got = float(ops.add(x, y, "fp64", rounding=mode, overflow=overflow))
        want = beyond_fp64(F(x) + F(y), mode, overflow)
        assert same(np.array(got), np.array(want)), (x, y, got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stochastic_sum_beyond_max_plus_one_quantum_overflows_like_round_to(dtype) -> None:
    """448 + 32 = 480 in e4m3: every stochastic rounding of the unbounded grid gives 480 or 512,
    both beyond max, so the result overflows (NaN) as round_to(480) does; round_sum used to
    clamp the truncation to max and return 448."""
    for seed in range(8):
        got = ops.add(dtype(448.0), dtype(32.0), "e4m3", rounding="stochastic", seed=seed)
        want = pl.round_to(np.float64(480.0), "e4m3", rounding="stochastic", seed=seed)
        assert np.isnan(got) and np.isnan(want)
        sat = ops.add(
            dtype(448.0), dtype(32.0), "e4m3", rounding="sr", seed=seed, overflow="saturate"
        )
        assert float(sat) == 448.0


def test_fp64_ties_toward_zero_and_away() -> None:
    """1 - 2**-54 is the midpoint of 1 - 2**-53 and 1: nearest_zero takes the smaller magnitude."""
    below = 1 - 2.0**-53
    assert float(ops.sub(1.0, 2.0**-54, "fp64", rounding="nearest_zero")) == below
    assert float(ops.add(-1.0, 2.0**-54, "fp64", rounding="nearest_zero")) == -below
    assert float(ops.sub(1.0, 2.0**-54, "fp64", rounding="nearest_away")) == 1.0
    assert float(ops.sub(1.0, 2.0**-54, "fp64")) == 1.0  # ties to even: 1.0 is even


@pytest.mark.parametrize(
    "acc",
    [
        pl.Accumulator("bf16", order="pairwise"),
        pl.Accumulator("fp16", order="blocked", block=8),
        pl.Accumulator("bf16", promote_every=16),
        pl.tensor_core("h100", "e4m3"),
    ],
    ids=["pairwise", "blocked", "promotion", "h100"],
)
def test_cumsum_under_every_order_is_the_sum_of_each_prefix(acc) -> None:
    x = pl.round_to(np.random.default_rng(5).uniform(-1, 1, (3, 40)), "e4m3").astype(np.float64)
    got = ops.cumsum(x.T, accumulator=acc, axis=0)  # along axis 0, back in place
    for i in range(40):
        want = ops.sum(x[:, : i + 1], accumulator=acc, axis=1)
        assert np.array_equal(got[i], want), i
    assert ops.cumsum(np.zeros((2, 0)), accumulator=acc, axis=1).shape == (2, 0)


def test_reductions_round_inputs_like_gemm():
    """Issue 22 item 9: dot told the user to pass input_rounding=, which it did not take, and
    refused off-grid inputs that gemm rounds. Now sum, dot and cumsum take gemm's
    input_rounding (default nearest_even) with input_format, and 'exact' refuses."""
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal(64), rng.standard_normal(64)
    acc = pl.Accumulator("fp32")
    want = pl.gemm(x[None], y[:, None], input_format="bf16", accumulator=acc)[0, 0]
    got = pl.ops.dot(x, y, input_format="bf16", accumulator=acc)
    assert got.view(np.uint32) == np.float32(want).view(np.uint32)
    xr, yr = pl.round_to(x, "bf16"), pl.round_to(y, "bf16")  # rounded first: the same bits
    assert pl.ops.dot(xr, yr, accumulator=acc) == got
    down = pl.ops.dot(x, y, input_format="bf16", accumulator=acc, input_rounding="down")
    xd, yd = pl.round_to(x, "bf16", rounding="down"), pl.round_to(y, "bf16", rounding="down")
    assert down == pl.ops.dot(xd, yd, accumulator=acc)
    for fn, args in ((pl.ops.dot, (x, y)), (pl.ops.sum, (x,)), (pl.ops.cumsum, (x,))):
        with pytest.raises(ValueError, match="not on the bf16 grid"):
            fn(*args, input_format="bf16", input_rounding="exact")
    s = pl.ops.sum(x, input_format="bf16", accumulator="bf16")
    assert s == pl.ops.sum(pl.round_to(x, "bf16"), accumulator="bf16")
    c = pl.ops.cumsum(x, input_format="bf16", accumulator="bf16")
    assert np.array_equal(c, pl.ops.cumsum(pl.round_to(x, "bf16"), accumulator="bf16"))
    assert c[-1] == s
