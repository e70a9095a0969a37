"""Formats and input conversion at the edges (issue 10, items 6 and 10-14).

Each test is named after what it pins down; the oracles are independent of the core: exact
``fractions.Fraction`` arithmetic, the format's value list, and numpy's own conversions.
"""

from __future__ import annotations

import bisect
import math
import os
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import precision_lab as pl
from precision_lab.core.formats import FloatFormat, IntFormat
from precision_lab.core.inputs import as_input
from precision_lab.core.rounding import ROUNDING_MODES, _fits_float32

pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning"),
]

DETERMINISTIC = [m for m in ROUNDING_MODES if not m.startswith("stochastic")]
ALL_HALF = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


# ----------------------------------------------------------------- item 6: fmt=None is refused
def _train_config(**kw):
    from precision_lab.training.config import TrainConfig

    return TrainConfig(**kw)


def _format_entries():
    x = np.ones((2, 2))
    acc = pl.Accumulator()
    return {
        "round_to fmt": lambda: pl.round_to(x, None),
        "encode fmt": lambda: pl.encode(x, None),
        "decode fmt": lambda: pl.decode(np.zeros(2, np.uint8), None),
        "quantize fmt": lambda: pl.quantize(x, None, 1.0),
        "calibrate fmt": lambda: pl.calibrate(x, None),
        "get_format fmt": lambda: pl.get_format(None),
        "Accumulator format": lambda: pl.Accumulator(None),
        "gemm out_format": lambda: pl.gemm(
            x, x, input_format="bf16", accumulator=acc, out_format=None
        ),
        "gemm input_format": lambda: pl.gemm(x, x, input_format=None, accumulator=acc),
        "tensor_core input_format": lambda: pl.tensor_core("h100", None),
        "underflow_stats fmt": lambda: pl.underflow_stats(x, None),
        "pick_loss_scale fmt": lambda: pl.pick_loss_scale(x, None),
        "DelayedScaling fmt": lambda: pl.scaling.DelayedScaling(fmt=None),
        "round_to_blocks element": lambda: pl.BlockFormat("b", None, "e8m0", (32,), "floor"),
        "BlockFormat scale": lambda: pl.BlockFormat("b", "e4m3", None, (32,), "floor"),
        "TrainConfig forward_format": lambda: _train_config(forward_format=None),
    }


# (tensor_core's out_format takes None: its default, fp32 or the one output of a named
# instruction that has no fp32 one, e.g. vfmadd231ph's fp16; test_tensor_core checks that)
@pytest.mark.parametrize("entry", list(_format_entries()))
def test_format_none_is_a_type_error_naming_the_argument(entry):
    argument = entry.split()[-1]
    with pytest.raises(TypeError, match=rf"{argument}.*got None"):
        _format_entries()[entry]()


# ------------------------------------ item 10: float32 and float64 paths agree, monotonically
def test_zero_less_unsigned_format_float32_equals_float64():
    """e8m0-like with bias 130 and without NaN: negative numbers, -0 and 0 go to the least value
    2**-130 from float32 as from float64 (float32 gave 2**-126, the working dtype's minimum)."""
    f = FloatFormat(
        8,
        0,
        bias=130,
        nan="none",
        has_inf=False,
        has_subnormals=False,
        has_zero=False,
        signed=False,
    )
    x = np.array([-1.0, -0.0, 0.0, 3e-45, 1e-40, 2.0**-131, -np.inf], dtype=np.float32)
    want = [2.0**-130] * 6 + [2.0**-130]
    for mode in DETERMINISTIC:
        r32 = pl.round_to(x, f, rounding=mode)
        r64 = pl.round_to(x.astype(np.float64), f, rounding=mode)
        assert r32.tolist() == r64.tolist() == want, mode


@st.composite
def custom_formats(draw):
    e = draw(st.integers(0, 8))
    m = draw(st.integers(0, 5))
    nan = draw(st.sampled_from(["ieee", "fn", "fnuz", "none"]))
    has_inf = draw(st.booleans()) if nan != "ieee" else True
    has_zero = draw(st.booleans())
    signed = draw(st.booleans()) if has_zero else False
    has_sub = draw(st.booleans()) if has_zero else False
    if e == 0:
        has_zero = has_sub = True
    bias = draw(st.integers(-20, 150))
    try:
        f = FloatFormat(
            e,
            m,
            bias=bias,
            nan=nan,
            has_inf=has_inf and nan != "none",
            has_subnormals=has_sub,
            has_zero=has_zero,
            signed=signed,
        )
    except ValueError:
        assume(False)
    assume(_fits_float32(f))
    return f


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return bool(np.array_equal(a64, b64, equal_nan=True)) and bool(
        (np.signbit(a64) == np.signbit(b64))[~np.isnan(a64)].all()
    )


def _monotone(x: np.ndarray, r: np.ndarray) -> bool:
    order = np.argsort(x.astype(np.float64), kind="stable")
    rs = r.astype(np.float64)[order]
    rs = rs[~np.isnan(rs)]
    return bool((rs[1:] >= rs[:-1]).all())


@settings(max_examples=int(os.environ.get("PL_EXAMPLES", 60)), deadline=None)
@given(fmt=custom_formats(), data=st.data())
def test_float32_and_float64_paths_agree_on_random_formats(fmt, data):
    xs = data.draw(st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=40))
    x32 = np.array(xs, dtype=np.float32)
    for mode in DETERMINISTIC:
        for overflow in ("ieee", "saturate"):
            kw = {"rounding": mode, "overflow": overflow}
            r32 = pl.round_to(x32, fmt, **kw)
            r64 = pl.round_to(x32.astype(np.float64), fmt, **kw)
            assert _same(r32, r64), (fmt, kw, x32, r32, r64)


@settings(max_examples=int(os.environ.get("PL_EXAMPLES", 25)), deadline=None)
@given(fmt=custom_formats())
def test_float32_and_float64_paths_agree_on_every_float16_and_are_monotone(fmt):
    x32 = ALL_HALF.astype(np.float32)
    finite = np.isfinite(x32)
    for mode in DETERMINISTIC:
        r32 = pl.round_to(x32, fmt, rounding=mode)
        r64 = pl.round_to(x32.astype(np.float64), fmt, rounding=mode)
        assert _same(r32, r64), (fmt, mode)
        if fmt.signed:
            assert _monotone(x32[finite], r32[finite]), (fmt, mode)
        else:  # negative inputs of unsigned formats are NaN or the least value
            pos = finite & ~np.signbit(x32)
            assert _monotone(x32[pos], r32[pos]), (fmt, mode)


# ----------------------------------------------- item 11: constructor fields are type-checked
@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("exponent_bits", True),
        ("exponent_bits", None),
        ("exponent_bits", 4.0),
        ("exponent_bits", "4"),
        ("mantissa_bits", False),
        ("mantissa_bits", 3.0),
        ("bias", 7.0),
        ("bias", "7"),
        ("bias", True),
        ("has_inf", "yes"),
        ("has_inf", 0),
        ("has_subnormals", 1),
        ("has_zero", None),
        ("signed", "true"),
        ("nan", None),
        ("name", 3),
    ],
)
def test_float_format_rejects_wrong_field_types_naming_the_field(field, bad):
    kw = {"exponent_bits": 4, "mantissa_bits": 3, "nan": "fn", "has_inf": False, field: bad}
    with pytest.raises(TypeError, match=field):
        FloatFormat(**kw)


@pytest.mark.parametrize(
    ("field", "bad"),
    [("bits", True), ("bits", 8.0), ("bits", None), ("signed", None), ("signed", 1), ("name", 1)],
)
def test_int_format_rejects_wrong_field_types_naming_the_field(field, bad):
    kw = {"bits": 8, field: bad}
    with pytest.raises(TypeError, match=field):
        IntFormat(**kw)


def test_formats_accept_numpy_integers_and_bools():
    f = FloatFormat(np.int64(4), np.uint8(3), bias=np.int32(7), nan="fn", has_inf=np.bool_(False))
    assert f == pl.get_format("e4m3") and hash(f) == hash(pl.get_format("e4m3"))
    assert type(f.exponent_bits) is int and type(f.bias) is int and type(f.has_inf) is bool
    i = IntFormat(np.int16(8), signed=np.bool_(True))
    assert i == pl.get_format("int8") and type(i.bits) is int
    assert float(pl.round_to(1.3, f)) == 1.25


def test_accumulator_accepts_numpy_integer_seeds_as_round_to_does():
    a = pl.Accumulator("bf16", "stochastic", seed=np.int64(5))
    assert a.seed == 5 and type(a.seed) is int
    assert a == pl.Accumulator("bf16", "stochastic", seed=5)
    x = np.linspace(-1, 1, 12).reshape(3, 4)
    g1 = pl.gemm(x, x.T, input_format="bf16", accumulator=a)
    g2 = pl.gemm(x, x.T, input_format="bf16", accumulator=pl.Accumulator("bf16", "sr", seed=5))
    np.testing.assert_array_equal(g1, g2)
    for bad in (True, 1.0, "5"):
        with pytest.raises((TypeError, ValueError), match="seed"):
            pl.Accumulator("bf16", "stochastic", seed=bad)


# ------------------------------------------------- item 12: ulp is the gap around |x|
SMALL = [f for f in pl.FORMATS.values() if isinstance(f, FloatFormat) and f.bits <= 8] + [
    FloatFormat(3, 2, nan="none", has_inf=False, has_subnormals=False),
    FloatFormat(4, 0, nan="fn", has_inf=False, has_subnormals=False, has_zero=False, signed=False),
    pl.formats.p3109(4, 4),
    pl.formats.p3109(6, 1, signed=False),
    pl.formats.p3109(5, 3, domain="finite"),
]


def _ulp_referee(fmt: FloatFormat, x: Fraction) -> Fraction:
    """The gap between the two grid values around |x|, from the sorted value list."""
    vals = sorted({Fraction(v) for v in fmt.values() if v >= 0})
    top = Fraction(fmt.max)
    # above max the grid goes on as if the exponent were unbounded
    if fmt.max >= fmt.smallest_normal:
        vals.append(top + Fraction(2) ** (fmt.emax - fmt.mantissa_bits))
    else:  # every value subnormal: the subnormal quantum
        vals.append(top + Fraction(fmt.smallest_subnormal))
    i = bisect.bisect_right(vals, abs(x))  # vals[i - 1] <= |x| < vals[i]
    i = min(max(i, 1), len(vals) - 1)  # below the least value / beyond: the extreme gaps
    return vals[i] - vals[i - 1]


@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_ulp_is_the_gap_around_x_exhaustively(fmt):
    v = np.unique(np.abs(fmt.values()))
    pts = np.concatenate([v, (v[:-1] + v[1:]) / 2, [0.0, fmt.max * 1.5, fmt.max * 4]])
    pts = np.concatenate([pts, -pts, [fmt.smallest_subnormal / 3]])
    got = fmt.ulp(pts)
    want = [float(_ulp_referee(fmt, Fraction(float(p)))) for p in pts]
    np.testing.assert_array_equal(got, want)


def test_ulp_of_zero_inf_nan_and_error_stats_at_zero():
    fp16 = pl.get_format("fp16")
    assert float(fp16.ulp(0.0)) == 2.0**-24 == fp16.smallest_subnormal
    assert float(fp16.ulp(-0.0)) == 2.0**-24
    assert math.isnan(float(fp16.ulp(np.nan)))
    assert float(fp16.ulp(np.inf)) == math.inf and float(fp16.ulp(-np.inf)) == math.inf
    assert fp16.ulp(np.ones((2, 3))).shape == (2, 3)
    # the fp64 grid agrees with Python's math.ulp
    xs = [0.0, 5e-324, 1e-310, 1.0, 3.5, 1e300, 1.7976931348623157e308]
    assert pl.get_format("fp64").ulp(xs).tolist() == [math.ulp(x) for x in xs]
    # a reference of 0 and an approximation one subnormal away: 1 ulp, not 2**-24 / eps
    e = pl.error_stats(np.array([2.0**-24], np.float16), np.array([0.0], np.float16))
    assert e.max_ulp == 1.0


# ------------------------------------------- item 13: masked arrays, one 0-d rule for all formats
def _masked_calls():
    m = np.ma.masked_array([1.0, 2.0, 3.0, 4.0], mask=[0, 1, 0, 0])
    q = np.ma.masked_array(np.array([1, 2], np.int8), mask=[0, 1])
    acc = pl.Accumulator()
    return {
        "round_to": lambda: pl.round_to(m, "bf16"),
        "encode": lambda: pl.encode(m, "e4m3"),
        "decode": lambda: pl.decode(q, "int8"),
        "quantize": lambda: pl.quantize(m, "int8", 0.1),
        "dequantize": lambda: pl.dequantize(q, 0.5),
        "round_to_blocks": lambda: pl.round_to_blocks(m, "mxfp8_e4m3"),
        "gemm": lambda: pl.gemm(m.reshape(2, 2), np.eye(2), input_format="bf16", accumulator=acc),
    }


@pytest.mark.parametrize("call", list(_masked_calls()))
def test_masked_arrays_are_refused_with_a_hint(call):
    with pytest.raises(TypeError, match=r"masked array.*\.filled\(.*\.data"):
        _masked_calls()[call]()


ZERO_D_FORMATS = [*pl.FORMATS, "p3109_k8p3se", "p3109_k4p4sf", "p3109_k6p1ue"]


@pytest.mark.parametrize("name", ZERO_D_FORMATS)
def test_zero_d_in_gives_zero_d_array_out_for_every_format(name):
    fmt = pl.get_format(name)
    for x in (1.5, np.float32(1.5), np.float64(1.5), np.array(1.5), np.array(1.5, np.float32), 2):
        for out in (pl.round_to(x, fmt), pl.encode(x, fmt)):
            assert type(out) is np.ndarray and out.shape == (), (name, x, type(out))
        code = pl.encode(x, fmt)
        for c in (code, code[()], int(code)):
            d = pl.decode(c, fmt)
            assert type(d) is np.ndarray and d.shape == (), (name, c, type(d))
            assert np.array_equal(d, pl.round_to(x, fmt), equal_nan=True)
    if isinstance(fmt, IntFormat):
        q = pl.quantize(np.float32(1.5), fmt, 0.5)
        assert type(q) is np.ndarray and q.shape == () and int(q) == 3
        d = pl.dequantize(q, 0.5)
        assert type(d) is np.ndarray and d.shape == () and float(d) == 1.5


# ---------------------------------------------------- item 14: integer and bool input
INT_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_and_bool_input_rounds_like_float64(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    lo, hi = max(info.min, -(2**53)), min(info.max, 2**53)
    x = np.concatenate(
        [
            rng.integers(lo, hi, 500, dtype=dtype, endpoint=True),
            np.array([lo, hi, 0, 1, 17, 100], dtype=dtype),
        ]
    )
    for fmt in ("bf16", "fp16", "e4m3", "e5m2", "int8", "uint4", "fp32", "p3109_k8p3se"):
        for mode in ROUNDING_MODES:
            want = pl.round_to(x.astype(np.float64), fmt, rounding=mode, seed=4)
            got = pl.round_to(x, fmt, rounding=mode, seed=4)
            assert got.dtype == np.float64
            np.testing.assert_array_equal(got, want)
            if fmt != "int8" and fmt != "uint4":
                enc = pl.encode(x, fmt, rounding=mode, seed=4)
                np.testing.assert_array_equal(enc, pl.encode(want, fmt))
    assert pl.round_to([1, 2, 3], "bf16").tolist() == [1.0, 2.0, 3.0]
    b = pl.round_to(np.array([True, False]), "e4m3")
    assert b.dtype == np.float64 and b.tolist() == [1.0, 0.0]
    assert pl.encode(True, "e4m3") == 0x38


def _big_integers(p: int) -> list[int]:
    """Integers of 54..64 bits around the grid of precision p: grid points, ties, +-1, random."""
    rng = np.random.default_rng(p)
    out = []
    for bits in range(54, 65):
        q = 1 << (bits - p)
        for _ in range(6):
            k = int(rng.integers(1 << (p - 1), 1 << p)) if p > 1 else 1
            base = k * q
            for v in (
                base,
                base + q // 2,
                base + q // 2 - 1,
                base + q // 2 + 1,
                base + 1,
                base + q - 1,
                base + int(rng.integers(0, q)),
            ):
                if v < 1 << 64:
                    out.append(v)
    return out


BIG_INT_FORMATS = [
    "bf16",
    "fp16",
    "e4m3",
    "e5m2",
    "fp32",
    "tf32",
    "fp64",
    "e8m0",
    "p3109_k8p1ue",
    FloatFormat(11, 51, has_subnormals=True),
]


@pytest.mark.parametrize("name", BIG_INT_FORMATS, ids=str)
def test_big_integers_are_rounded_once_from_the_exact_value(name):
    """int64/uint64 beyond 2**53: every deterministic mode and overflow switch against the Fraction
    referee (a conversion through float64 would double-round the ties of bf16/fp16/e4m3/fp32)."""
    from referee import DETERMINISTIC as REF_MODES
    from referee import referee_all, referee_formula

    fmt = pl.get_format(name)
    ints = _big_integers(fmt.precision)
    u = np.array(ints, dtype=np.uint64)
    signed = np.array([v for v in ints if v < 1 << 63], dtype=np.int64)
    signed = np.concatenate([signed, -signed, [-(2**63)]])
    small = fmt.bits <= 16
    for arr in (u, signed):
        exact = [Fraction(int(v)) for v in arr]
        for mode in REF_MODES:
            for overflow in ("ieee", "saturate"):
                got = pl.round_to(arr, fmt, rounding=mode, overflow=overflow)
                if small:
                    want = [referee_all(v, fmt)[mode, overflow] for v in exact]
                else:
                    want = [referee_formula(v, fmt, mode, overflow) for v in exact]
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {mode} {overflow}")
    # a tie of bf16 that float64 cannot hold: 2**60 + 2**52 + 1 is above the tie 2**60 + 2**52
    assert float(pl.round_to(np.uint64(2**60 + 2**52 + 1), "bf16")) == 2.0**60 + 2**53


def test_big_integers_stochastic_modes_use_the_exact_fraction():
    from precision_lab.core.random_words import random_words

    fmt = pl.get_format("bf16")
    ints = _big_integers(8)
    x = np.array(ints, dtype=np.uint64)
    for mode in ("stochastic", "stochastic_equal"):
        got = pl.round_to(x, fmt, rounding=mode, seed=99)
        words = random_words(99, x.size, 0)
        for v, g, w in zip(ints, got.tolist(), words.tolist(), strict=True):
            q = 1 << (v.bit_length() - 8)
            lo, rem = (v // q) * q, v % q
            if mode == "stochastic":
                up = rem != 0 and (rem * 2**64) // q + w >= 2**64
            else:
                up = rem != 0 and w >> 63 == 1
            assert g == float(lo + q * up), (v, mode)


# ----------------------------------------------- item 14: DLPack and array-API arrays
class _Namespace:
    """A minimal array namespace for :class:`_Wrapped` (what array_api_compat would give)."""

    @staticmethod
    def from_dlpack(x):
        return _Wrapped(np.from_dlpack(x))

    @staticmethod
    def asarray(x):
        return _Wrapped(np.asarray(x))


class _Wrapped:
    """A foreign array type that speaks DLPack and the array API, nothing else."""

    def __init__(self, a, device=1):
        self._a, self._device = a, device

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (self._device, 0)

    def __array_namespace__(self, api_version=None):
        return _Namespace


def test_dlpack_and_array_api_arrays_come_back_in_their_type():
    from precision_lab.core.inputs import as_input

    base = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    w = _Wrapped(base)
    arr, _ = as_input(w)
    assert np.shares_memory(arr, base)  # read without a copy
    r = pl.round_to(w, "e4m3")
    assert isinstance(r, _Wrapped)
    np.testing.assert_array_equal(r._a, pl.round_to(base, "e4m3"))
    c = pl.encode(w, "e4m3")
    assert isinstance(c, _Wrapped) and c._a.dtype == np.uint8
    d = pl.decode(c, "e4m3")
    assert isinstance(d, _Wrapped)
    np.testing.assert_array_equal(d._a, r._a)
    q = pl.quantize(w, "int8", 0.1)
    assert isinstance(q, _Wrapped)
    assert isinstance(pl.dequantize(q, 0.1), _Wrapped)
    assert isinstance(pl.round_to_blocks(_Wrapped(np.ones(32, np.float32)), "mxfp8_e4m3"), _Wrapped)
    g = pl.gemm(w, _Wrapped(base.T.copy()), input_format="bf16", accumulator=pl.Accumulator())
    assert isinstance(g, _Wrapped)
    want = pl.gemm(base, base.T, input_format="bf16", accumulator=pl.Accumulator())
    np.testing.assert_array_equal(g._a, want)
    # numpy's own DLPack export (an array read through DLPack comes back as numpy)
    r0 = pl.round_to(_Wrapped(np.array(2.3)), "bf16")
    assert isinstance(r0, _Wrapped) and r0._a.shape == ()
    np.testing.assert_array_equal(
        pl.round_to(np.from_dlpack(base), "bf16"), pl.round_to(base, "bf16")
    )


def test_gpu_arrays_without_cupy_get_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy fails
    with pytest.raises(TypeError, match=r"GPU.*CuPy"):
        pl.round_to(_Wrapped(np.ones(3), device=2), "bf16")


def test_torch_tensors_come_back_as_torch_tensors():
    torch = pytest.importorskip("torch")
    t = torch.linspace(-2, 2, 11, dtype=torch.float32)
    r = pl.round_to(t, "e4m3")
    assert isinstance(r, torch.Tensor) and r.dtype == torch.float32
    assert np.shares_memory(as_input(t)[0], t.numpy())  # read without a copy
    np.testing.assert_array_equal(r.numpy(), pl.round_to(t.numpy(), "e4m3"))
    assert isinstance(pl.round_to(torch.arange(5), "bf16"), torch.Tensor)
    # bfloat16 / float8 tensors (no numpy dtype in DLPack): read as ml_dtypes arrays
    import ml_dtypes

    b = torch.tensor([1.3, -2.7, 1e-3], dtype=torch.bfloat16)
    want = pl.round_to(b.float().numpy().astype(ml_dtypes.bfloat16), "e4m3")
    np.testing.assert_array_equal(pl.round_to(b, "e4m3").numpy(), want)
    codes = pl.encode(b, "bf16")
    assert codes.dtype == torch.uint16
    np.testing.assert_array_equal(codes.numpy(), b.view(torch.int16).numpy().view(np.uint16))
    f8 = torch.tensor([0.3, 448.0]).to(torch.float8_e4m3fn)
    np.testing.assert_array_equal(pl.round_to(f8, "e2m1").numpy(), [0.5, 6.0])  # 0.3125 -> 0.5
    d = pl.decode(torch.tensor([56, 64], dtype=torch.uint8), "e4m3")
    assert isinstance(d, torch.Tensor) and d.tolist() == [1.0, 2.0]
    g = pl.gemm(
        torch.ones(3, 4), torch.ones(4, 2), input_format="bf16", accumulator=pl.Accumulator()
    )
    assert isinstance(g, torch.Tensor) and g.tolist() == [[4.0, 4.0]] * 3
    r0 = pl.round_to(torch.tensor(1.3), "bf16")
    assert isinstance(r0, torch.Tensor) and r0.shape == ()


def test_jax_arrays_come_back_as_jax_arrays():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.linspace(-2, 2, 11, dtype=jnp.float32)
    r = pl.round_to(x, "e4m3")
    assert type(r).__module__.startswith(("jax", "jaxlib"))
    np.testing.assert_array_equal(np.asarray(r), pl.round_to(np.asarray(x), "e4m3"))
    b = x.astype(jnp.bfloat16)
    np.testing.assert_array_equal(
        np.asarray(pl.round_to(b, "e4m3")), pl.round_to(np.asarray(b), "e4m3")
    )
    ints = pl.round_to(jnp.arange(4), "bf16")
    assert type(ints).__module__.startswith(("jax", "jaxlib"))
    assert np.asarray(ints).tolist() == [0.0, 1.0, 2.0, 3.0]


# ============================== issue 12 item 3: nearest_zero, stochastic_equal, P3109 formats
def test_new_modes_are_appended_and_have_aliases():
    assert ROUNDING_MODES[:7] == (
        "nearest_even",
        "nearest_away",
        "toward_zero",
        "up",
        "down",
        "odd",
        "stochastic",
    )
    assert ROUNDING_MODES.index("nearest_zero") == 7
    assert ROUNDING_MODES.index("stochastic_equal") == 8
    from precision_lab.core.rounding import check_rounding

    assert check_rounding("rnz") == "nearest_zero" and check_rounding("SRE") == "stochastic_equal"


def test_nearest_zero_ties_go_toward_zero():
    x = np.array([1.0625, -1.0625, 1.0625 + 2**-20, 1.1875, 464.0, -464.0, 0.5, 2.0**-10])
    for dtype in (np.float32, np.float64):
        r = pl.round_to(x.astype(dtype), "e4m3", rounding="rnz")
        assert r.tolist() == [1.0, -1.0, 1.125, 1.125, 448.0, -448.0, 0.5, 0.0]
        r = pl.round_to(x.astype(dtype), "e4m3", rounding="rnz", overflow="saturate")
        assert r[4] == 448.0
    # beyond the tie above max it overflows like the other round-to-nearest modes
    assert math.isnan(float(pl.round_to(464.0001, "e4m3", rounding="nearest_zero")))
    assert float(pl.round_to(61440.0, "e5m2", rounding="rnz")) == 57344.0  # tie: toward zero
    assert float(pl.round_to(61441.0, "e5m2", rounding="rnz")) == math.inf
    assert pl.round_to([2.5, -2.5, 3.5, 2.6], "int8", rounding="rnz").tolist() == [2, -2, 3, 3]
    assert float(pl.round_to(192.0, "e8m0", rounding="rnz")) == 128.0
    assert pl.encode(np.float32(1.0625), "e4m3", rounding="rnz") == 0x38


@pytest.mark.parametrize("fmt", ["e4m3", "bf16", "e2m1", "e8m0", "int8", "p3109_k8p3se", "fp32"])
def test_stochastic_equal_goes_each_way_half_the_time(fmt):
    f = pl.get_format(fmt)
    n = 40000
    v = np.array([1.3, -1.3, 2.0**-8 * 1.7]) if f.is_float else np.array([2.3, -2.7, 0.4])
    if fmt == "e8m0":
        v = np.abs(v)
    for value in v:
        x = np.full(n, value)
        lo = pl.round_to(x[:1], f, rounding="toward_zero")[0]
        hi = pl.round_to(np.array([value]), f, rounding="up" if value > 0 else "down")[0]
        r = pl.round_to(x, f, rounding="stochastic_equal", seed=11)
        assert set(np.unique(r).tolist()) <= {lo, hi}
        frac = float(np.mean(r == hi))
        assert abs(frac - 0.5) < 0.01, (fmt, value, frac)  # 4 standard deviations
        # the choice is the top bit of the element's random word: float32 agrees with float64
        r32 = pl.round_to(x.astype(np.float32), f, rounding="sre", seed=11)
        if x.astype(np.float32)[0] == value:
            np.testing.assert_array_equal(r32, r)
    # exact values are never moved; the same seed gives the same result
    exact = pl.round_to(np.linspace(-2, 2, 101), f)
    np.testing.assert_array_equal(pl.round_to(exact, f, rounding="sre", seed=3), exact)
    x = np.linspace(-3, 3, 1001)
    a = pl.round_to(x, f, rounding="sre", seed=5)
    np.testing.assert_array_equal(a, pl.round_to(x, f, rounding="sre", seed=5))
    assert not np.array_equal(a, pl.round_to(x, f, rounding="sre", seed=6))


def test_stochastic_equal_uses_the_top_bit_of_the_word_of_each_flat_index():
    from precision_lab.core.random_words import random_words

    x = np.full((3, 50), 1.0625)  # inexact in e4m3: 1.0 or 1.125
    r = pl.round_to(x, "e4m3", rounding="stochastic_equal", seed=2**70 + 1, random_bits=1)
    up = (random_words(2**70 + 1, x.size, 0) >> np.uint64(63)).astype(bool).reshape(x.shape)
    np.testing.assert_array_equal(r, np.where(up, 1.125, 1.0))
    codes = pl.encode(x, "e4m3", rounding="sre", seed=2**70 + 1)
    np.testing.assert_array_equal(codes, np.where(up, 0x39, 0x38))


P3109_ALL = [
    (k, p, signed, domain)
    for k in range(3, 9)
    for p in range(1, k + 1)
    for signed in (True, False)
    for domain in ("extended", "finite")
]


def _p3109_id(case) -> str:
    k, p, signed, domain = case
    return f"k{k}p{p}{'s' if signed else 'u'}{domain[0]}"


def test_p3109_formats_by_name_and_parameters():
    f = pl.p3109(8, 3)
    assert f is not None and f.name == "p3109_k8p3se" and pl.get_format("P3109_K8P3SE") == f
    assert (f.exponent_bits, f.mantissa_bits, f.bias, f.signed) == (5, 2, 16, True)
    assert pl.encode(np.nan, f) == 0x80 and pl.encode(np.inf, f) == 0x7F
    assert pl.encode(-np.inf, f) == 0xFF and pl.encode(-0.0, f) == 0x00  # no -0
    assert pl.get_format("p3109_k8p4sf") == pl.get_format("e4m3fnuz")
    assert pl.get_format("p3109_k8p3sf") == pl.get_format("e5m2fnuz")
    u = pl.get_format("p3109_k8p3ue")
    assert (u.exponent_bits, u.bias, u.signed) == (6, 32, False)
    assert pl.encode(np.nan, u) == 0xFF and pl.encode(np.inf, u) == 0xFE
    k3p3 = pl.get_format("p3109_k3p3sf")  # no exponent bits: every value subnormal
    assert k3p3.values().tolist() == [-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5]
    assert pl.round_to([0.7, 0.75, 1.74, 1.76, -9.0], k3p3).tolist()[:3] == [0.5, 1.0, 1.5]
    assert pl.get_format("p3109_k8p1se").values()[-1] == 2.0**62  # p = 1: powers of two only
    with pytest.raises(ValueError, match="no positive finite value"):
        pl.p3109(2, 2)  # K2P2 extended: 0, +-inf and NaN only
    with pytest.raises(ValueError, match="1 <= p <= k"):
        pl.p3109(8, 9)
    with pytest.raises(ValueError, match="domain"):
        pl.p3109(8, 3, domain="ext")


def _gfloat_format(case):
    gf = pytest.importorskip("gfloat")
    from gfloat.formats import format_info_p3109

    k, p, signed, domain = case
    sign = gf.Signedness.Signed if signed else gf.Signedness.Unsigned
    dom = gf.Domain.Extended if domain == "extended" else gf.Domain.Finite
    return gf, format_info_p3109(k, p, sign, dom)


@pytest.mark.parametrize("case", P3109_ALL, ids=_p3109_id)
def test_p3109_decode_matches_gfloat_code_by_code(case):
    """Ported from gfloat's P3109 tests: every code of every P3109 format with k in 3..8."""
    gf, fi = _gfloat_format(case)
    fmt = pl.p3109(case[0], case[1], signed=case[2], domain=case[3])
    assert fmt.name == fi.name
    codes = np.arange(1 << fi.k)
    want = np.array([gf.decode_float(fi, int(c)).fval for c in codes])
    got = pl.decode(codes, fmt).astype(np.float64)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    assert got[~nan].tolist() == want[~nan].tolist()  # zeros: both +0 (no -0 in P3109)
    assert not np.signbit(got[got == 0]).any()
    finite = np.unique(want[np.isfinite(want)])
    np.testing.assert_array_equal(fmt.values(), finite)
    assert (fmt.max, fmt.smallest_subnormal) == (fi.max, fi.smallest_subnormal)


GFLOAT_MODES = {
    "nearest_even": "TiesToEven",
    "nearest_away": "TiesToAway",
    "toward_zero": "TowardZero",
    "up": "TowardPositive",
    "down": "TowardNegative",
}


def _p3109_inputs(fmt) -> np.ndarray:
    v = np.abs(fmt.values())
    v = np.unique(v)
    top = fmt.max + float(fmt.ulp(fmt.max))
    pts = np.concatenate([v, (v[:-1] + v[1:]) / 2, [(fmt.max + top) / 2, top, 3 * top]])
    pts = np.concatenate([pts, np.nextafter(pts, np.inf), np.nextafter(pts, 0), pts / 3])
    pts = np.concatenate([pts, [0.0, np.inf, np.nan, 1e-300]])
    return np.concatenate([pts, -pts]) if fmt.signed else pts


@pytest.mark.parametrize("case", P3109_ALL, ids=_p3109_id)
def test_p3109_round_and_encode_match_gfloat(case):
    """round_float/encode_float of gfloat (vectorised) against round_to/encode, every mode the
    two share, both overflow switches, float64 and float32 inputs, and stochastic rounding with
    gfloat's StochasticFastest fed the top ``n`` bits of our random words."""
    gf, fi = _gfloat_format(case)
    fmt = pl.p3109(case[0], case[1], signed=case[2], domain=case[3])
    x = _p3109_inputs(fmt)
    for mode, gmode in GFLOAT_MODES.items():
        for sat in (False, True):
            kw = {"rounding": mode, "overflow": "saturate" if sat else "ieee"}
            want = gf.round_ndarray(fi, x, getattr(gf.RoundMode, gmode), sat)
            got = pl.round_to(x, fmt, **kw)
            assert _same(got, want), (fmt, kw, x[~_eq(got, want)][:5])
            got32 = pl.round_to(x.astype(np.float32), fmt, **kw)
            want32 = gf.round_ndarray(
                fi, x.astype(np.float32).astype(np.float64), getattr(gf.RoundMode, gmode), sat
            )
            assert _same(got32, want32), (fmt, kw, "float32")
            np.testing.assert_array_equal(pl.encode(x, fmt, **kw), gf.encode_ndarray(fi, want))
    from precision_lab.core.random_words import random_words

    for nbits in (3, 8):
        words = random_words(7, x.size, 0)
        srbits = (words >> np.uint64(64 - nbits)).astype(np.int64)
        want = gf.round_ndarray(fi, x, gf.RoundMode.StochasticFastest, False, srbits, nbits)
        got = pl.round_to(x, fmt, rounding="stochastic", seed=7, random_bits=nbits)
        # gfloat adds the fraction and srbits / 2**n in float64, which rounds up to 1 when the
        # fraction has bits below 2**-53 (its documented bias); there the exact rule decides
        for i in np.flatnonzero(~_eq(got, want)):
            lo = pl.round_to(x[i : i + 1], fmt, rounding="toward_zero")[0]
            hi = pl.round_to(x[i : i + 1], fmt, rounding="down" if x[i] < 0 else "up")[0]
            f = (Fraction(abs(float(x[i]))) - abs(Fraction(float(lo)))) / abs(
                Fraction(float(hi)) - Fraction(float(lo))
            )
            up = f + Fraction(int(srbits[i]), 2**nbits) >= 1
            assert got[i] == (hi if up else lo), (fmt, x[i])
            assert float(f) + int(srbits[i]) * 2.0**-nbits == 1.0 and not up, (fmt, x[i])


def _eq(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a == b) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("case", P3109_ALL[::9], ids=_p3109_id)
def test_p3109_every_mode_matches_the_fraction_referee(case):
    """Grid points, midpoints and their neighbours and every 16th float16 pattern, every
    deterministic mode (nearest_zero and odd too, which gfloat lacks), both overflow switches,
    against tests/referee.py."""
    from referee import KEYS, referee_all

    fmt = pl.p3109(case[0], case[1], signed=case[2], domain=case[3])
    x = np.concatenate([_p3109_inputs(fmt), ALL_HALF[::16].astype(np.float64)])
    x = x[x.astype(np.float32).astype(np.float64) == x]  # float32 holds them too (or NaN)
    x = np.concatenate([x, [np.nan]]).astype(np.float32)
    table = [referee_all(float(v), fmt) for v in x]
    for mode, overflow in KEYS:
        want = np.array([row[mode, overflow] for row in table])
        for dtype in (np.float32, np.float64):
            got = pl.round_to(x.astype(dtype), fmt, rounding=mode, overflow=overflow)
            assert _same(got, want), (fmt, mode, overflow, dtype)


# ----- issue 32 item 8: what a new user reads off the package --------------------------------
def test_dir_shows_the_public_names_not_the_helpers():
    names = set(dir(pl))
    assert not names & {"Any", "ModuleType", "importlib", "sys"}
    assert set(pl.__all__) <= names and "sweep" in names  # moved modules are there too
    for n in names - set(pl.MOVED):
        getattr(pl, n)  # every name shown is there


def test_known_formats_lists_the_8bit_p3109_formats_and_every_one_has_the_common_api():
    names = pl.known_formats()
    for p in range(1, 9):
        for signed, s in ((True, "s"), (False, "u")):
            for domain in ("extended", "finite"):
                name = f"p3109_k8p{p}{s}{domain[0]}"
                assert name in names
                assert pl.get_format(name) == pl.p3109(8, p, signed=signed, domain=domain)
    for n in names:  # the loop a user writes: it must not crash on int8
        f = pl.get_format(n)
        assert isinstance(f.precision, int) and f.precision >= 1
        assert float(f.ulp(1.0)) > 0 and float(f.next_up(0.0)) > 0


@pytest.mark.parametrize("name", ["int8", "uint8", "int4", "uint4"])
def test_integer_precision_ulp_and_neighbours_against_the_value_list(name):
    """next_up / next_down against the enumerated values (the smallest value above, the
    largest below, NaN where there is none); ulp is 1; precision the magnitude's digits."""
    f = pl.get_format(name)
    vals = f.values()
    assert f.precision == int(f.max).bit_length() and 2**f.precision - 1 == max(f.max, -f.min - 1)
    x = np.concatenate([np.linspace(f.min - 3, f.max + 3, 97), vals, [-np.inf, np.inf, np.nan]])
    up, down = f.next_up(x), f.next_down(x)
    for xi, u, d in zip(x, up, down, strict=True):
        above, below = vals[vals > xi], vals[vals < xi]
        want_u = above.min() if above.size else np.nan
        want_d = below.max() if below.size else np.nan
        assert np.array_equal([u, d], [want_u, want_d], equal_nan=True), (xi, u, d)
    assert np.array_equal(f.ulp([0.0, 5.5, -1e9, np.inf]), [1.0, 1.0, 1.0, np.inf])
