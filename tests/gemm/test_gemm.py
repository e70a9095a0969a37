"""Tests of the inner-product model and the numpy reference gemm against exact oracles.

The oracle rounds exact ``fractions.Fraction`` values with its own few lines (not the core), and
re-implements each summation order from the specification in
:mod:`precision_lab.gemm.accumulator`.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
from cpu_backends import cpu_backend  # noqa: F401  (every test runs on numpy and native)
from referee import fr_round

import precision_lab as pl
from precision_lab.core.exact import Rounder, round_sum

RNG = np.random.default_rng(20240611)


# ----- an independent oracle ---------------------------------------------------------------------
def fr(x: float) -> Fraction:
    return Fraction(float(x))


def exact_products(a: np.ndarray, b: np.ndarray, i: int, j: int) -> list[Fraction]:
    return [fr(a[i, k]) * fr(b[k, j]) for k in range(a.shape[1])]


def oracle_sequential(ps, c, fmt, mode):
    s = c
    for p in ps:
        s = fr_round(s + p, fmt, mode)
    return s


def oracle_pairwise(ps, c, fmt, mode):
    vals = list(ps)
    first = True
    if len(vals) == 1:
        vals = [fr_round(vals[0], fmt, mode)]
    while len(vals) > 1:
        nxt = [fr_round(vals[i] + vals[i + 1], fmt, mode) for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
        first = False
    del first
    return fr_round(c + vals[0], fmt, mode)


def oracle_blocked(ps, c, fmt, mode, block):
    total = c
    for j in range(0, len(ps), block):
        bs = Fraction(0)
        for p in ps[j : j + block]:
            bs = fr_round(bs + p, fmt, mode)
        total = fr_round(total + bs, fmt, mode)
    return total


def _expo(x: Fraction, emin: int) -> int:
    ax = abs(x)
    e = ax.numerator.bit_length() - ax.denominator.bit_length()
    while Fraction(2) ** e > ax:
        e -= 1
    while Fraction(2) ** (e + 1) <= ax:
        e += 1
    return max(e, emin)


def oracle_block_fma(a_row, b_col, c, n, bits, fin, acc_fmt, mode, addend="in_block",
                     block_mode="toward_zero"):  # fmt: skip
    r = c
    for j in range(0, len(a_row), n):
        terms = []
        for x, y in zip(a_row[j : j + n], b_col[j : j + n], strict=True):
            if x != 0 and y != 0:
                terms.append((fr(x) * fr(y), _expo(fr(x), fin.emin) + _expo(fr(y), fin.emin)))
        if addend == "in_block" and r != 0:
            terms.append((r, _expo(r, acc_fmt.emin)))
        if not terms:
            x_sum = Fraction(0)
        else:
            unit = Fraction(2) ** (max(e for _, e in terms) - bits)
            x_sum = sum(
                (math.trunc(t / unit) * unit for t, _ in terms), Fraction(0)
            )  # fmt: skip
        if addend == "in_block":
            r = fr_round(x_sum, acc_fmt, mode)
        else:
            r = fr_round(r + fr_round(x_sum, acc_fmt, block_mode), acc_fmt, mode)
    return r


def rand_on(fmt: str, shape, lo=-2.0, hi=2.0) -> np.ndarray:
    return pl.round_to(RNG.uniform(lo, hi, shape), fmt).astype(np.float64)


FP32 = pl.get_format("fp32")


# ----- properties of the issue -------------------------------------------------------------------
@pytest.mark.parametrize("out", ["fp32", "bf16", "fp16"])
def test_53_bit_accumulator_gives_the_exactly_rounded_dot_product(out):
    # e4m3 products are multiples of 2**-18 below 2**18: every partial sum is exact in 53 bits
    a, b = rand_on("e4m3", (3, 64), -8, 8), rand_on("e4m3", (64, 4), -8, 8)
    c = rand_on(out, (3, 4))
    d = pl.gemm(a, b, c, input_format="e4m3", accumulator=pl.Accumulator("fp64"), out_format=out)
    fout = pl.get_format(out)
    for i in range(3):
        for j in range(4):
            exact = fr(c[i, j]) + sum(exact_products(a, b, i, j))
            assert fr(d[i, j]) == fr_round(exact, fout)


@pytest.mark.parametrize("fmt", ["fp16", "tf32", "bf16"])  # fp16: float32 fast path
def test_fp32_sequential_equals_a_plain_float32_loop(fmt):
    a, b = rand_on(fmt, (4, 40)), rand_on(fmt, (40, 3))
    c = rand_on("fp32", (4, 3))
    d = pl.gemm(a, b, c, input_format=fmt, accumulator=pl.Accumulator("fp32"))
    for i in range(4):
        for j in range(3):
            s = np.float32(c[i, j])
            for k in range(40):
                s = np.float32(s + np.float32(a[i, k] * b[k, j]))  # products exact in fp32
            assert d[i, j] == s


@pytest.mark.parametrize("acc_name", ["bf16", "fp16", "e8m13", "fp32"])
@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero", "up", "down"])
def test_sequential_narrow_accumulators_round_each_exact_step_once(acc_name, mode):
    acc_fmt = pl.FloatFormat(8, 13) if acc_name == "e8m13" else pl.get_format(acc_name)
    a, b = rand_on("bf16", (2, 30)), rand_on("bf16", (30, 3))
    c = rand_on("fp32", (2, 3))
    acc = pl.Accumulator(acc_fmt, rounding=mode)
    d = pl.gemm(a, b, c, input_format="bf16", accumulator=acc, out_format="fp32")
    for i in range(2):
        for j in range(3):
            want = oracle_sequential(exact_products(a, b, i, j), fr(c[i, j]), acc_fmt, mode)
            assert fr(d[i, j]) == fr_round(want, FP32)


def test_no_double_rounding_through_float32():
    # 1 + (2**-8 + 2**-30) is above the bf16 tie 1 + 2**-8; adding in float32 first would lose
    # the 2**-30 and then tie to even (down to 1)
    a = np.array([[1.0]])
    b = np.array([[2.0**-8 + 2.0**-30]])
    for order in ("sequential", "pairwise"):  # (blocked rounds the block sum first)
        acc = pl.Accumulator("bf16", order=order, block=4)
        d = pl.gemm(a, b, np.ones((1, 1)), input_format="fp32", accumulator=acc)
        assert d[0, 0] == 1.0 + 2.0**-7, order
    assert np.float32(1.0) + np.float32(b[0, 0]) == np.float32(1.0 + 2.0**-8)


@pytest.mark.parametrize("order", ["pairwise", "blocked"])
@pytest.mark.parametrize("k", [1, 7, 16, 33])
def test_pairwise_and_blocked_orders(order, k):
    a, b = rand_on("e4m3", (2, k), -4, 4), rand_on("e4m3", (k, 2), -4, 4)
    c = rand_on("fp32", (2, 2))
    fmt = pl.get_format("bf16")
    acc = pl.Accumulator("bf16", order=order, block=5 if order == "blocked" else None)
    d = pl.gemm(a, b, c, input_format="e4m3", accumulator=acc)
    for i in range(2):
        for j in range(2):
            ps = exact_products(a, b, i, j)
            if order == "pairwise":
                want = oracle_pairwise(ps, fr(c[i, j]), fmt, "nearest_even")
            else:
                want = oracle_blocked(ps, fr(c[i, j]), fmt, "nearest_even", 5)
            assert fr(d[i, j]) == want


@pytest.mark.parametrize("promote", [64, 100, 1000])
def test_promotion_with_n_at_least_k_equals_no_promotion(promote):
    a, b = rand_on("e4m3", (3, 64), 0, 1), rand_on("e4m3", (64, 5), 0, 1)
    base = pl.tensor_core("h100", "e4m3")
    d0 = pl.gemm(a, b, input_format="e4m3", accumulator=base)
    d1 = pl.gemm(a, b, input_format="e4m3", accumulator=base.replace(promote_every=promote))
    np.testing.assert_array_equal(d0, d1)
    acc = pl.Accumulator("bf16")
    d2 = pl.gemm(a, b, input_format="e4m3", accumulator=acc)
    d3 = pl.gemm(a, b, input_format="e4m3", accumulator=acc.replace(promote_every=promote))
    np.testing.assert_array_equal(d2, d3)


def test_promotion_every_n_adds_partial_sums_into_fp32():
    k, n = 96, 32
    a, b = rand_on("e4m3", (2, k), 0, 1), rand_on("e4m3", (k, 2), 0, 1)
    c = rand_on("fp32", (2, 2))
    acc = pl.Accumulator("fp16", rounding="toward_zero", promote_every=n)
    d = pl.gemm(a, b, c, input_format="e4m3", accumulator=acc)
    f16 = pl.get_format("fp16")
    for i in range(2):
        for j in range(2):
            ps = exact_products(a, b, i, j)
            w = fr(c[i, j])
            for s in range(0, k, n):
                w = fr_round(w + oracle_sequential(ps[s : s + n], Fraction(0), f16, "toward_zero"),
                             FP32)  # fmt: skip
            assert fr(d[i, j]) == w


def test_promotion_reduces_the_h100_fp8_error_on_long_sums():
    a, b = rand_on("e4m3", (4, 4096), 0, 1), rand_on("e4m3", (4096, 4), 0, 1)
    exact = a @ b  # float64: e4m3 products and their sums are exact here
    tc = pl.tensor_core("h100", "e4m3")
    e0 = np.abs(pl.gemm(a, b, input_format="e4m3", accumulator=tc) - exact).max()
    e1 = np.abs(
        pl.gemm(a, b, input_format="e4m3", accumulator=tc.replace(promote_every=128)) - exact
    ).max()
    assert e0 / np.abs(exact).max() > 3e-3
    assert e1 * 10 < e0


# ----- block FMA against the Fraction oracle -----
@pytest.mark.parametrize(
    ("fin", "acc", "kw"),
    [
        ("fp16", "fp32", {"block": 8, "align_bits": 24, "rounding": "toward_zero"}),
        ("bf16", "fp32", {"block": 16, "align_bits": 25, "rounding": "toward_zero"}),
        ("e5m2", "e8m13", {"block": 32, "align_bits": 13, "rounding": "toward_zero"}),
        ("fp16", "fp16", {"block": 4, "align_bits": 23, "rounding": "nearest_even"}),
        ("e4m3", "fp32", {"block": 32, "align_bits": 25, "addend": "after_block"}),
        ("e4m3", "bf16", {"block": 3, "align_bits": 5, "rounding": "up"}),
    ],
)
def test_block_fma_matches_the_specification(fin, acc, kw):
    acc_fmt = pl.FloatFormat(8, 13) if acc == "e8m13" else pl.get_format(acc)
    model = pl.Accumulator(acc_fmt, order="block_fma", **kw)
    k = 70
    a, b = rand_on(fin, (3, k), -3, 3), rand_on(fin, (k, 2), -3, 3)
    a[0, :5] = 0.0  # zero products take no part in the alignment
    a[1, 7] = pl.get_format(fin).smallest_subnormal  # a subnormal input
    c = rand_on("fp16" if acc == "fp16" else "fp32", (3, 2))
    d = pl.gemm(a, b, c, input_format=fin, accumulator=model, out_format="fp32")
    fi = pl.get_format(fin)
    for i in range(3):
        for j in range(2):
            want = oracle_block_fma(a[i], b[:, j], fr(pl.round_to(c[i, j], "fp32")),
                                    kw["block"], kw["align_bits"], fi, acc_fmt,
                                    model.rounding, model.addend, model.block_rounding)  # fmt: skip
            assert fr(d[i, j]) == fr_round(want, FP32)


# ----- special values -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "acc",
    [
        pl.Accumulator(),
        pl.Accumulator("bf16"),
        pl.tensor_core("h100", "e5m2"),
        pl.Accumulator("fp16", order="pairwise"),
    ],
    ids=["fp32", "bf16", "h100-fp8", "pairwise"],
)
def test_nan_and_inf_propagate_as_ieee(acc):
    a = np.ones((5, 4))
    b = np.ones((4, 2))
    a[0, 1] = np.inf  # row 0: +inf
    a[1, 1] = np.inf
    a[1, 2] = -np.inf  # row 1: inf - inf = NaN
    a[2, 3] = np.nan  # row 2: NaN
    b[1, 1] = 0.0  # column 1: inf * 0 = NaN in rows 0 and 1
    c = np.zeros((5, 2))
    c[3, 0] = -np.inf  # (3, 0): -inf
    d = pl.gemm(a, b, c, input_format="e5m2", accumulator=acc, out_format="fp32")
    assert d[0, 0] == np.inf and np.isnan(d[0, 1])
    assert np.isnan(d[1]).all() and np.isnan(d[2]).all()
    assert d[3, 0] == -np.inf and d[3, 1] == 3.0
    assert d[4].tolist() == [4.0, 3.0]


@pytest.mark.parametrize(
    ("mode", "overflow", "want"),
    [
        ("nearest_even", "ieee", np.inf),
        ("nearest_even", "saturate", 65504.0),
        ("toward_zero", "ieee", 65504.0),
        ("up", "ieee", np.inf),
    ],
)
def test_accumulator_overflow_follows_the_overflow_switch(mode, overflow, want):
    a = np.full((1, 4), 256.0)
    b = np.full((4, 1), 128.0)  # 4 * 32768 > 65504
    acc = pl.Accumulator("fp16", rounding=mode, overflow=overflow)
    d = pl.gemm(a, b, input_format="fp16", accumulator=acc, out_format="fp32")
    assert d[0, 0] == want


# ----- stochastic rounding ----------------------------------------------------------------------
def test_stochastic_accumulation_is_reproducible_and_seeded():
    a, b = rand_on("e4m3", (8, 512), 0, 1), rand_on("e4m3", (512, 8), 0, 1)
    acc = pl.Accumulator("bf16", rounding="stochastic", seed=7)
    d1 = pl.gemm(a, b, input_format="e4m3", accumulator=acc)
    d2 = pl.gemm(a, b, input_format="e4m3", accumulator=acc)
    d3 = pl.gemm(a, b, input_format="e4m3", accumulator=acc.replace(seed=8))
    np.testing.assert_array_equal(d1, d2)
    assert (d1 != d3).any()
    exact = a @ b
    rne = pl.gemm(a, b, input_format="e4m3", accumulator=acc.replace(rounding="rne"))
    # stochastic rounding does not stagnate: it is much closer to the exact sums than RNE
    assert np.abs(d1 - exact).mean() * 2 < np.abs(rne - exact).mean()


def test_one_stochastic_step_uses_the_cores_random_words():
    a = rand_on("fp16", (16, 1))
    b = rand_on("fp16", (1, 16))
    acc = pl.Accumulator("e4m3", rounding="stochastic", seed=99)
    d = pl.gemm(a, b, input_format="fp16", accumulator=acc, out_format="fp32")
    want = pl.round_to(a @ b, "e4m3", rounding="stochastic", seed=99)  # event 0: word i
    np.testing.assert_array_equal(d, want)


def test_stochastic_fraction_is_exact_beyond_float64():
    # x = 1 + 2**-60 is not a float64; in bf16 its fraction is 2**-53, floor(f * 2**64) = 2**11
    s, t = np.array([1.0, 1.0]), np.array([2.0**-60, 2.0**-60])
    words = np.array([2**64 - 2**11, 2**64 - 2**11 - 1], dtype=np.uint64)
    r = round_sum(s, t, Rounder("bf16", "stochastic"), words)
    assert r.tolist() == [1.0 + 2.0**-7, 1.0]


# ----- scales -------------------------------------------------------------------------------------
def test_per_tensor_power_of_two_scales_scale_the_result():
    a, b = rand_on("e4m3", (3, 40)), rand_on("e4m3", (40, 4))
    acc = pl.Accumulator()
    d0 = pl.gemm(a, b, input_format="e4m3", accumulator=acc)
    d1 = pl.gemm(a, b, input_format="e4m3", accumulator=acc, scale_a=0.25, scale_b=8.0)
    np.testing.assert_array_equal(d1, d0 * 2.0)


def test_blockwise_scales_deepseek_style():
    m, k, n = 3, 256, 130
    a, b = rand_on("e4m3", (m, k)), rand_on("e4m3", (k, n))
    sa = RNG.uniform(0.5, 2, (m, 2))  # 1x128 activation tiles
    sb = RNG.uniform(0.5, 2, (2, 2))  # 128x128 weight blocks
    acc = pl.tensor_core("h100", "e4m3")
    d = pl.gemm(a, b, input_format="e4m3", accumulator=acc, scale_a=sa, scale_b=sb)
    sa32, sb32 = pl.round_to(sa, "fp32"), pl.round_to(sb, "fp32")
    for i, j in [(0, 0), (2, 129), (1, 77)]:
        w = Fraction(0)
        for blk in range(2):
            ks = slice(128 * blk, 128 * (blk + 1))
            part = pl.gemm(a[i : i + 1, ks], b[ks, j : j + 1], input_format="e4m3",
                           accumulator=acc)[0, 0]  # fmt: skip
            sig = fr_round(fr(sa32[i, blk]) * fr(sb32[blk, j // 128]), FP32)
            w = fr_round(w + fr(part) * sig, FP32)
        assert fr(d[i, j]) == w


def test_mx_style_1x32_scales():
    a, b = rand_on("e4m3", (2, 96)), rand_on("e4m3", (96, 3))
    sa = 2.0 ** RNG.integers(-3, 3, (2, 3))
    sb = 2.0 ** RNG.integers(-3, 3, (3, 3))
    d = pl.gemm(a, b, input_format="e4m3", scale_a=sa, scale_b=sb, scale_block=32)
    a_s = a * np.repeat(sa, 32, axis=1)
    b_s = b * np.repeat(sb, 32, axis=0)
    np.testing.assert_allclose(d, a_s @ b_s, rtol=1e-6)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"scale_a": -1.0}, "scale_a must be positive"),
        ({"scale_b": np.ones((3, 1))}, "scale_b: the K axis"),
        ({"scale_a": np.ones(4)}, "scale_a must be a scalar or at least 2-D"),
    ],
)
def test_bad_scales(kw, match):
    a, b = np.ones((4, 256)), np.ones((256, 4))
    with pytest.raises(ValueError, match=match):
        pl.gemm(a, b, input_format="e4m3", **kw)


# ----- gemm API -----
def test_batches_broadcast_like_matmul():
    a = rand_on("bf16", (2, 1, 3, 5))
    b = rand_on("bf16", (4, 5, 2))
    d = pl.gemm(a, b, input_format="bf16", accumulator="fp32")
    assert d.shape == np.matmul(a, b).shape == (2, 4, 3, 2)
    for i in range(2):
        for j in range(4):
            np.testing.assert_array_equal(d[i, j], pl.gemm(a[i, 0], b[j], input_format="bf16"))


def test_inputs_are_rounded_not_modified_and_any_layout_works():
    a = RNG.uniform(-1, 1, (6, 8))
    a_copy = a.copy()
    b = np.asfortranarray(RNG.uniform(-1, 1, (8, 3))).astype(">f8")
    b.flags.writeable = False
    d = pl.gemm(a[::2], b, input_format="e4m3")
    np.testing.assert_array_equal(a, a_copy)
    want = pl.gemm(pl.round_to(a[::2], "e4m3"), pl.round_to(b.astype("<f8"), "e4m3"),
                   input_format="e4m3", input_rounding="exact")  # fmt: skip
    np.testing.assert_array_equal(d, want)
    assert d.dtype == np.float32
    assert pl.gemm(a, a.T, input_format="bf16", out_format="fp64").dtype == np.float64


def test_blas_order_is_float32_matmul():
    a, b = rand_on("bf16", (5, 64)), rand_on("bf16", (64, 7))
    d = pl.gemm(a, b, input_format="bf16", accumulator=pl.Accumulator(order="blas"))
    np.testing.assert_array_equal(d, np.matmul(a.astype(np.float32), b.astype(np.float32)))


def test_products_rounded_to_a_product_format():
    a, b = rand_on("bf16", (2, 20)), rand_on("bf16", (20, 2))
    acc = pl.Accumulator("fp32", product_format="bf16", product_rounding="toward_zero")
    d = pl.gemm(a, b, input_format="bf16", accumulator=acc)
    bf = pl.get_format("bf16")
    for i in range(2):
        for j in range(2):
            ps = [fr_round(p, bf, "toward_zero") for p in exact_products(a, b, i, j)]
            assert fr(d[i, j]) == oracle_sequential(ps, Fraction(0), FP32, "nearest_even")


def test_empty_and_k_zero():
    assert pl.gemm(np.ones((0, 3)), np.ones((3, 2)), input_format="fp16").shape == (0, 2)
    d = pl.gemm(np.ones((2, 0)), np.ones((0, 2)), np.full((2, 2), 3.0), input_format="fp16")
    np.testing.assert_array_equal(d, np.full((2, 2), 3.0))


def test_accumulator_is_a_dataclass():
    acc = pl.Accumulator("bf16", promote_every=128)
    assert dataclasses.replace(acc, rounding="rtz").rounding == "toward_zero"
    assert acc == pl.Accumulator(pl.get_format("bfloat16"), promote_every=128)
    assert "promoted every 128" in acc.describe()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: pl.gemm(np.ones((2, 3)), np.ones((4, 2)), input_format="fp16"),
            r"shape mismatch: a is \(2, 3\).*b is \(4, 2\)",
        ),
        (
            lambda: pl.gemm(np.ones(3), np.ones((3, 2)), input_format="fp16"),
            "a must be at least 2-D",
        ),
        (
            lambda: pl.gemm(np.ones((2, 3)), np.ones(3), input_format="fp16"),
            "b must be at least 2-D",
        ),
        (
            lambda: pl.gemm(
                np.full((2, 3), 0.1), np.ones((3, 2)), input_format="e4m3", input_rounding="exact"
            ),
            r"a has 6 value\(s\) not on the e4m3 grid",
        ),
        (
            lambda: pl.gemm(np.ones((2, 3)), np.ones((3, 2)), np.ones((3, 3)), input_format="fp16"),
            "c of shape",
        ),
        (lambda: pl.gemm(np.ones((2, 3)), np.ones((3, 2)), input_format="fp8"), "input_format"),
        (lambda: pl.gemm(np.ones((2, 3)), np.ones((3, 2)), input_format="fp64"), "at most 26"),
        (
            lambda: pl.gemm(np.ones((2, 3)), np.ones((3, 2)), input_format="fp16", backend="gpu"),
            "backend must be one of",
        ),
        (lambda: pl.Accumulator(order="random"), "order must be one of"),
        (lambda: pl.Accumulator(order="block_fma", block=8), "align_bits"),
        (lambda: pl.Accumulator(rounding="nearest"), None),
        (lambda: pl.Accumulator(rounding="fast"), "rounding"),
        (lambda: pl.Accumulator("int8"), "format must be a floating-point format"),
        (lambda: pl.Accumulator(pl.FloatFormat(11, 52), rounding="rtz"), "at most 51"),
        (lambda: pl.Accumulator(order="blas", format="bf16"), "order='blas'"),
    ],
)
def test_clear_errors(call, match):
    if match is None:
        call()  # an accepted alias
        return
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_integer_inputs_are_refused():
    with pytest.raises(TypeError, match="a must hold floating-point numbers"):
        pl.gemm(np.ones((2, 2), dtype=np.int64), np.ones((2, 2)), input_format="fp16")


def test_blas_order_float32_fast_path_equals_the_general_path(monkeypatch):
    """order='blas' takes a float32-only path; it must give what the float64 model path gives."""
    from precision_lab.gemm import reference

    rng = np.random.default_rng(11)
    acc = pl.Accumulator(order="blas")
    cases = [
        ((64, 100), (100, 30), None, "fp16", "fp32"),
        ((3, 17, 64), (64, 9), (17, 9), "bf16", "fp16"),
        ((5, 8), (8, 4), (4,), "e4m3", "bf16"),
    ]
    for shape_a, shape_b, c_shape, fin, fout in cases:
        a = (rng.standard_normal(shape_a) * rng.choice([1e-3, 1, 1e3], shape_a)).astype(np.float32)
        b = rng.standard_normal(shape_b)
        c = None if c_shape is None else rng.standard_normal(c_shape)
        fast = pl.gemm(a, b, c, input_format=fin, accumulator=acc, out_format=fout)
        with monkeypatch.context() as mp:
            mp.setattr(reference, "_blas_fast_path_applies", lambda *args: False)
            slow = pl.gemm(a, b, c, input_format=fin, accumulator=acc, out_format=fout)
        assert fast.dtype == slow.dtype and fast.shape == slow.shape
        np.testing.assert_array_equal(fast, slow)
