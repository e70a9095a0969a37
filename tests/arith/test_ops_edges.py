"""Issue 19 (items 4-9): pl.ops at the edges of its domain, each checked against an independent
referee (exact Fraction arithmetic, or the other backend where the claim is agreement)."""

from __future__ import annotations

import math
import sys
import types
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import precision_lab as pl
from precision_lab import Accumulator, ops
from precision_lab.backends import native
from precision_lab.core.rounding import ROUNDING_MODES

DETERMINISTIC = [m for m in ROUNDING_MODES if not m.startswith("stochastic")]


# ----- item 6: formats without -0 ----------------------------------------------------------------
NO_NEG_ZERO = ["e4m3fnuz", "e5m2fnuz", "p3109_k8p3se", "p3109_k8p4se", "p3109_k6p3se"]


def _zero_sums(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Operand pairs on fmt's grid whose sums include exact zeros of every sign combination."""
    vals = np.unique(pl.round_to(np.linspace(-3, 3, 61), fmt))
    x, y = np.meshgrid(vals, vals)
    return x.ravel().astype(np.float32), y.ravel().astype(np.float32)


@pytest.mark.parametrize("fmt", NO_NEG_ZERO)
@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_formats_without_negative_zero_give_plus_zero(fmt: str, mode: str) -> None:
    assert not pl.get_format(fmt).has_negative_zero
    x, y = _zero_sums(fmt)
    results = []
    for backend in ("numpy", "native") if native.ext is not None else ("numpy",):
        with pl.use_backend(backend):
            for r in (
                ops.add(x, -x, fmt, rounding=mode),
                ops.sub(x, x, fmt, rounding=mode),
                ops.add(x, y, fmt, rounding=mode),
                ops.fma(x, y, -(x * y).astype(np.float32), fmt, rounding=mode),
                ops.sub(1.0, 1.0, fmt, rounding=mode),
            ):
                zero = r == 0
                assert not np.signbit(r[zero]).any(), (backend, mode)
            results.append(np.concatenate([ops.add(x, y, fmt, rounding=mode).ravel()]))
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    e = pl.emulate(x, fmt, rounding=mode)
    d = np.asarray(e - e)
    assert (d == 0).all() and not np.signbit(d).any()


def test_formats_with_negative_zero_keep_it_under_down() -> None:
    assert np.signbit(ops.sub(1.0, 1.0, "fp16", rounding="down"))
    assert np.signbit(ops.sub(np.float32([1.0]), np.float32([1.0]), "bf16", rounding="down")[0])


# ----- items 4 and 5: results beyond float64's exp / product range ---------------------------
@pytest.mark.parametrize(
    ("x", "fmt", "mode", "want"),
    [
        (1000.0, "bf16", "toward_zero", float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)),
        (800.0, "fp16", "down", 65504.0),
        (1000.0, "bf16", "up", math.inf),
        (-1000.0, "bf16", "up", 2.0**-133),
        (-1000.0, "bf16", "down", 0.0),
        (-1000.0, "fp64", "up", 5e-324),
        (710.0, "fp64", "toward_zero", 1.7976931348623157e308),
        (1e308, "fp64", "down", 1.7976931348623157e308),
        (-1e308, "fp64", "up", 5e-324),
    ],
)
def test_exp_overflow_and_underflow_in_directed_modes(x, fmt, mode, want) -> None:
    for backend in ("numpy", "native"):
        with pl.use_backend(backend):
            assert float(ops.exp(x, fmt, rounding=mode)) == want


def test_exp_far_range_matches_exact_bounds() -> None:
    # exp(x) for x in [700, 760] and [-760, -700] against Fraction bounds of e**x: the result
    # must be the rounding of a value within 2**-50 relative of it (faithful), so the
    # directed results bracket the true value and never change class
    xs = np.linspace(700, 760, 241)
    for fmt in ("fp64", "bf16", "fp32", "e5m2"):
        up = ops.exp(xs, fmt, rounding="up").astype(np.float64)
        dn = ops.exp(xs, fmt, rounding="down").astype(np.float64)
        tz = ops.exp(-xs, fmt, rounding="toward_zero").astype(np.float64)
        u2 = ops.exp(-xs, fmt, rounding="up").astype(np.float64)
        assert (dn <= up).all() and np.isfinite(dn).all()
        assert (tz == 0).all() or fmt == "fp64"
        assert (u2 > 0).all()
        # e**x > 2**1000 > max for x >= 700 except fp64: down gives max where exact > max
        mx = pl.get_format(fmt).max
        big = xs * math.log2(math.e) > math.log2(mx) + 1e-9
        assert (dn[big] == mx).all() and np.isinf(up[big]).all()


@pytest.mark.parametrize("fmt", ["fp64", pl.FloatFormat(11, 40), pl.FloatFormat(11, 20)])
@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_wide_products_and_quotients_at_any_magnitude(fmt, mode) -> None:
    """mul, div, reciprocal and fma of operands 2**±600 and 2**±1000 against Fractions: the
    referee is round_to of the exact value when it is a float64 (scaled back exactly), and
    the class (0, smallest, max, inf) beyond."""
    f = pl.get_format(fmt)
    rng = np.random.default_rng(5)
    sig = pl.round_to(1 + rng.random(64), f).astype(np.float64)
    for ea, eb in [(600, 600), (-600, -600), (1000, 30), (-1000, -60), (-1070, 1070), (-1040, 20)]:
        a = np.ldexp(sig, ea)
        with np.errstate(over="ignore"):
            b = np.ldexp(sig[::-1], eb) * np.where(rng.random(64) < 0.5, -1, 1)
        a, b = pl.round_to(a, f).astype(np.float64), pl.round_to(b, f).astype(np.float64)
        ok = (a != 0) & (b != 0) & np.isfinite(a) & np.isfinite(b)
        a, b = a[ok], b[ok]
        got = ops.mul(a, b, f, rounding=mode)
        quo = ops.div(a, b, f, rounding=mode)
        for x, y, g, gq in zip(a, b, got, quo, strict=True):
            want = _referee(Fraction(float(x)) * Fraction(float(y)), f, mode)
            assert g == want and np.signbit(g) == np.signbit(want), (x, y, g, want, mode)
            want = _referee(Fraction(float(x)) / Fraction(float(y)), f, mode)
            assert gq == want and np.signbit(gq) == np.signbit(want), (x, y, gq, want, mode)
    assert float(ops.fma(2.0**1000, 2.0**-900, 1.0, f)) == float(pl.round_to(2.0**100 + 1, f))
    assert float(ops.mul(1e300, 1e10, f, rounding="toward_zero")) == f.max
    assert float(ops.reciprocal(f.smallest_subnormal, f, rounding="toward_zero")) == f.max
    assert float(ops.mul(2.0**-600, 2.0**-600, f, rounding="up")) == f.smallest_subnormal
    # a product that underflows keeps its sign in an fma
    r = ops.fma(2.0**-600, -(2.0**-600), 0.0, f, rounding=mode)
    assert np.signbit(r) or (mode in ("up", "odd") and r == 0) or r < 0


def _referee(v: Fraction, f, mode: str) -> float:
    """The rounding of the exact v onto f: scale v by a power of two into float64's comfortable
    range, round there exactly (a Fraction is compared with the two neighbours), scale back."""
    sign = -1 if v < 0 else 1
    av = abs(v)
    q = Fraction(f.smallest_subnormal)
    mx = Fraction(f.max)
    # neighbours on f's grid: below av and above
    e = av.numerator.bit_length() - av.denominator.bit_length()
    while Fraction(2) ** e > av:
        e -= 1
    while Fraction(2) ** (e + 1) <= av:
        e += 1
    quantum = max(q, Fraction(2) ** (e - f.mantissa_bits))
    lo = (av // quantum) * quantum
    hi = lo + quantum
    if lo > mx:
        lo = mx
    exact = lo == av
    if mode in ("toward_zero",) or (mode == "down" and sign > 0) or (mode == "up" and sign < 0):
        r = lo
    elif mode in ("up", "down"):
        r = lo if exact else hi
    elif mode == "odd":
        r = lo if exact or (lo / quantum) % 2 == 1 else hi
    else:
        mid = (lo + hi) / 2
        if av < mid or exact:
            r = lo
        elif av > mid:
            r = hi
        else:
            r = {"nearest_even": lo if (lo / quantum) % 2 == 0 else hi,
                 "nearest_away": hi, "nearest_zero": lo}[mode]  # fmt: skip
    if r > mx:
        overflow_inf = mode not in ("toward_zero", "odd") and not (
            (mode == "down" and sign > 0) or (mode == "up" and sign < 0)
        )
        return sign * (math.inf if overflow_inf else float(mx))
    return math.copysign(float(r), sign)


# ----- item 7: accumulator sums, signs of zero and saturation -------------------------------
def test_sum_and_cumsum_signs_of_zero_follow_ieee() -> None:
    acc = Accumulator("fp16", rounding="down")
    assert np.signbit(ops.sum([1.0, -1.0], accumulator=acc))
    assert np.signbit(ops.add(1.0, -1.0, "fp16", rounding="down"))
    assert np.signbit(ops.cumsum([1.0, -1.0], accumulator=acc)[-1])
    assert np.signbit(ops.cumsum([-0.0], accumulator="bf16")[0])
    assert np.signbit(ops.sum([-0.0, -0.0], accumulator="bf16"))
    assert not np.signbit(ops.sum([-0.0, 0.0], accumulator="bf16"))
    assert not np.signbit(ops.sum([1.0, -1.0], accumulator="bf16"))
    for order in ("sequential", "pairwise", "compensated"):
        a = Accumulator("bf16", order=order)
        assert np.signbit(ops.sum([-0.0, -0.0, -0.0], accumulator=a)), order
        assert ops.cumsum([-0.0, -0.0], accumulator=a)[-1] == 0


def test_cumsum_saturates_like_sum() -> None:
    acc = Accumulator("fp16", overflow="saturate")
    x = [np.inf, 1.0, -np.inf]
    got = ops.cumsum(x, accumulator=acc)
    for i in range(3):
        want = ops.sum(x[: i + 1], accumulator=acc)
        assert got[i] == want or (np.isnan(got[i]) and np.isnan(want))
    assert got[0] == 65504.0


@pytest.mark.parametrize("order", ["sequential", "pairwise", "blocked", "compensated"])
def test_gemm_backends_agree_on_round_down_zero_sums(order) -> None:
    kw = {"block": 2} if order == "blocked" else {}
    acc = Accumulator("fp16", rounding="down", order=order, **kw)
    a = np.array([[1.0, -1.0, 2.0, -2.0], [0.0, 0.0, 0.0, 0.0], [-0.0, 0.0, -0.0, 0.0]])
    b = np.ones((4, 1))
    want = pl.gemm(a, b, input_format="fp16", accumulator=acc, out_format="fp16", backend="numpy")
    assert np.signbit(want[0, 0]) and np.signbit(want[2, 0])
    # +0 + (+0) stays +0; Kahan's correction term (+0) makes y = p - c a -0 under round-down
    assert np.signbit(want[1, 0]) == (order == "compensated")
    if native.ext is not None:
        got = pl.gemm(a, b, input_format="fp16", accumulator=acc, out_format="fp16",
                      backend="native")  # fmt: skip
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


# ----- item 8: integers, booleans, DLPack tensors ------------------------------------------
def test_integer_and_bool_operands() -> None:
    assert float(ops.add(1, 2, "bf16")) == 3.0
    assert ops.mul(np.array([3, 5]), True, "e4m3").tolist() == [3.0, 5.0]
    big = np.array([2**60 + 1])  # rounded exactly, as round_to does (not through float64 first)
    assert float(ops.add(big, 0, "fp64")[0]) == float(pl.round_to(big, "fp64")[0])
    assert float(ops.sum(np.array([1, 2, 3]))) == 6.0
    np.testing.assert_array_equal(np.asarray(pl.emulate(np.array([1, 2]), "bf16")), [1.0, 2.0])


_fake = types.ModuleType("faketorch")
_fake.int16 = np.int16  # type: ignore[attr-defined]
_fake.from_dlpack = np.from_dlpack  # type: ignore[attr-defined]
sys.modules.setdefault("faketorch", _fake)


class FakeTensor:
    """A torch-like CPU tensor of bfloat16: DLPack cannot carry bfloat16 to numpy, so the
    conversion goes through an int16 view (as for torch.bfloat16)."""

    __module__ = "faketorch"

    def __init__(self, a: np.ndarray) -> None:
        self._a = a
        self.dtype = "faketorch.bfloat16"

    def __dlpack__(self, **kw):
        if self._a.dtype == ml_dtypes.bfloat16:
            raise BufferError("bfloat16 is not a DLPack dtype numpy reads")
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)

    def view(self, dt):
        return FakeTensor(self._a.view(dt))


def test_torch_like_bfloat16_tensors_everywhere() -> None:
    a = np.linspace(-4, 4, 64).astype(ml_dtypes.bfloat16)
    t = FakeTensor(a)
    np.testing.assert_array_equal(ops.add(t, t, "bf16"), ops.add(a, a, "bf16"))
    np.testing.assert_array_equal(ops.exp(t, "bf16"), ops.exp(a, "bf16"))
    assert float(ops.sum(t, accumulator="bf16")) == float(ops.sum(a, accumulator="bf16"))
    np.testing.assert_array_equal(
        np.asarray(pl.emulate(t, "bf16")), np.asarray(pl.emulate(a, "bf16"))
    )
    q1 = pl.quantize_blocks(t, "mxfp8_e4m3")
    q2 = pl.quantize_blocks(a, "mxfp8_e4m3")
    np.testing.assert_array_equal(q1.codes, q2.codes)


# ----- item 9: the general numpy path in chunks ----------------------------------------------
@pytest.mark.parametrize("mode", ["nearest_even", "up", "odd", "stochastic", "stochastic_equal"])
def test_chunked_general_path_equals_one_call(mode, monkeypatch) -> None:
    """Large calls run chunk by chunk (ops.call.run); a broadcasting call runs as one. Both
    must agree bit for bit, stochastic words (keyed by the flat index) included.

    The chunk size is cut from 2**16 to 2**12 (``run`` reads ``CHUNK`` at each call): the same
    chunked path (more than 4 chunks, a partial last one, the worker pool), 16x fewer elements."""
    from precision_lab.arith.ops import call

    monkeypatch.setattr(call, "CHUNK", 1 << 12)
    n = 4 * call.CHUNK + 12345
    rng = np.random.default_rng(11)
    x = pl.round_to(rng.standard_normal(n), "bf16").astype(np.float32)
    y = pl.round_to(rng.standard_normal(n) + 3, "bf16").astype(np.float32)
    kw = {"rounding": mode, "seed": 7 if mode.startswith("stochastic") else None}
    with pl.use_backend("numpy"):
        for name, args in [
            ("div", (x, y, "bf16")),
            ("mul", (x.astype(np.float64), y, "fp64")),
            ("fma", (x, y, x, "e4m3")),
            ("add", (x, y.astype(np.float64), "fp16")),
        ]:
            fn = getattr(ops, name)
            chunked = fn(*args, **kw)
            one = fn(args[0][None, :], *args[1:], **kw)[0]  # broadcasting: a single call
            np.testing.assert_array_equal(chunked, one, err_msg=f"{name} {mode}")
        s1 = ops.sqrt(np.abs(x), "bf16", **kw)
        s2 = ops.sqrt(np.abs(x)[None, :], "bf16", **kw)[0]
        np.testing.assert_array_equal(s1, s2)


def test_sum_in_row_chunks_equals_dot_with_ones() -> None:
    rng = np.random.default_rng(3)
    a = pl.round_to(rng.standard_normal((600, 2000)), "bf16").astype(np.float32)
    for acc in (Accumulator("bf16"), Accumulator("fp16", order="pairwise", rounding="down")):
        got = ops.sum(a, axis=1, accumulator=acc)
        want = ops.dot(a, np.ones(2000), accumulator=acc)
        np.testing.assert_array_equal(got, want)


def _no_negative_zero_formats() -> list[str]:
    out = []
    p3109 = [f"p3109_k{k}p{p}s{d}" for k in range(3, 9) for p in range(1, k) for d in "ef"]
    for name in [*pl.FORMATS, *p3109]:
        f = pl.get_format(name)
        if isinstance(f, pl.FloatFormat) and f.signed and not f.has_negative_zero:
            if f.precision <= 24 and f.bits <= 16:
                out.append(name)
    return out


def test_every_format_without_negative_zero_agrees_between_backends() -> None:
    """Item 6 over every registered fnuz and P3109 format: exact zero sums are +0 in every
    mode, and the numpy path gives the native path's bits for add, sub and fma."""
    names = _no_negative_zero_formats()
    assert len(names) > 20
    rng = np.random.default_rng(2)
    for name in names:
        f = pl.get_format(name)
        codes = np.arange(1 << min(f.bits, 12), dtype=np.uint64).astype(f.code_dtype)
        vals = pl.decode(codes, f).astype(np.float64)
        pos = np.unique(vals[np.isfinite(vals) & (vals > 0)])
        pick = rng.choice(pos, size=min(12, pos.size), replace=False)
        v = np.concatenate([pick, -pick, [0.0]]).astype(np.float32)
        x, y = (a.ravel() for a in np.meshgrid(v, v))
        for mode in DETERMINISTIC:
            res = {}
            for backend in ("numpy", "native") if native.ext is not None else ("numpy",):
                with pl.use_backend(backend):
                    res[backend] = np.concatenate(
                        [
                            ops.add(x, y, f, rounding=mode),
                            ops.sub(x, y, f, rounding=mode),
                            ops.fma(x, y, -x, f, rounding=mode),
                        ]
                    )
                r = res[backend]
                assert not np.signbit(r[r == 0]).any(), (name, mode, backend)
            if len(res) == 2:
                np.testing.assert_array_equal(
                    res["numpy"].view(np.uint32), res["native"].view(np.uint32), f"{name} {mode}"
                )


def test_wide_products_stochastic_against_fractions() -> None:
    """Stochastic rounding of fp64 products beyond float64's range and in its subnormal range:
    the core's rule (away iff floor(f * 2**64) + word >= 2**64, word i of the seed), exactly."""
    from precision_lab.core.random_words import random_words

    rng = np.random.default_rng(9)
    sig = 1 + rng.random(200)
    a = np.ldexp(sig, rng.integers(-560, -512, 200))
    b = np.ldexp(sig[::-1], rng.integers(-560, -512, 200)) * -1
    got = ops.mul(a, b, "fp64", rounding="stochastic", seed=5)
    words = random_words(5, 200, 0)
    q = Fraction(2) ** -1074
    for x, y, g, w in zip(a, b, got, words, strict=True):
        v = abs(Fraction(float(x)) * Fraction(float(y)))
        u = v / q
        n = u.numerator // u.denominator
        frac = u - n
        away = (frac * 2**64).__floor__() + int(w) >= 2**64
        want = -float((n + int(away)) * q)
        assert g == want and np.signbit(g), (x, y, g, want)


@pytest.mark.skipif(native.ext is None, reason="needs the compiled extension")
@pytest.mark.parametrize(
    "fmt", ["bf16", "fp16", "e4m3", "e5m2", "fp32", "e4m3fnuz", "p3109_k8p3se"]
)
def test_native_div_and_sqrt_equal_the_numpy_path(fmt: str) -> None:
    """Item 9's native kernels for div, reciprocal and sqrt: served natively in deterministic
    modes, the numpy path's bits (itself checked against Fractions in test_ops.py), specials
    (0, inf, NaN, negative roots) and the overflow/subnormal switches included."""
    from precision_lab.arith.ops.fast_paths import _native_path

    rng = np.random.default_rng(4)
    vals = pl.round_to(np.ldexp(rng.random(3000) + 0.5, rng.integers(-30, 30, 3000)), fmt)
    vals = np.concatenate([vals, [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0]])
    x = (vals * np.where(rng.random(vals.size) < 0.5, -1, 1)).astype(np.float32)
    y = rng.permutation(x)
    for mode in ROUNDING_MODES:
        for overflow, subnormals in (("ieee", "keep"), ("saturate", "flush")):
            kw = {"rounding": mode, "overflow": overflow, "subnormals": subnormals, "seed": 3}
            for name, args in (("div", (x, y)), ("sqrt", (np.abs(x),)), ("sqrt", (x,))):
                fast = _native_path(name, args, fmt, mode, overflow, subnormals, 3)
                if not mode.startswith("stochastic"):
                    assert fast is not None, (name, mode)
                got = getattr(ops, name)(*args, fmt, **kw)
                with pl.use_backend("numpy"):
                    want = getattr(ops, name)(*args, fmt, **kw)
                same = (got == want) & (np.signbit(got) == np.signbit(want))
                same |= np.isnan(got) & np.isnan(want)
                assert same.all(), (name, mode, overflow, x[~same][:3], got[~same][:3])
            r1 = ops.reciprocal(y, fmt, **kw)
            with pl.use_backend("numpy"):
                r2 = ops.reciprocal(y, fmt, **kw)
            np.testing.assert_array_equal(r1, r2)
