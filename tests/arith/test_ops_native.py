"""precision_lab.ops on the compiled extension (add, sub, mul, fma) against the numpy path.

The extension must give the numpy path's bits: exhaustively on all E4M3 and E5M2 operand pairs
(every deterministic mode, both overflow and subnormal switches), and on hypothesis-drawn
float32 / bfloat16 / float16 operands near ties, overflow and subnormal boundaries. Stochastic
rounding is checked against the core itself (``round_to`` of the exact float64 result with the
same seed: the same (seed, flat index) words), since the numpy path serves those operands from
round_to as well.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision_lab as pl
from precision_lab.arith import ops
from precision_lab.backends import native
from precision_lab.core.rounding import ROUNDING_MODES

pytestmark = pytest.mark.skipif(
    native.ext is None, reason=f"precision_lab.backends._native: {native.WHY}"
)

DETERMINISTIC = [m for m in ROUNDING_MODES if not m.startswith("stochastic")]
OPS = ("add", "sub", "mul", "fma")


def both(op: str, args: tuple[Any, ...], fmt: str, **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    """(native result, numpy result); asserts the native path really served the first."""
    fast = ops.elementwise._native_path(
        op,
        args,
        fmt,
        kw.get("rounding", "nearest_even"),
        kw.get("overflow", "ieee"),
        kw.get("subnormals", "keep"),
        kw.get("seed"),
    )
    assert fast is not None
    with pl.use_backend("numpy"):
        ref = getattr(ops, op)(*args, fmt, **kw)
    return fast, ref


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bits, except that the sign of a NaN result is not compared: IEEE 754 (6.3) leaves
    it unspecified for arithmetic, and numpy's own float64 NaN sign depends on the SIMD path."""
    if not (a.dtype == b.dtype == np.float32 and a.shape == b.shape):
        return False
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b))) and np.array_equal(
        np.where(nan, 0, a.view(np.uint32)), np.where(nan, 0, b.view(np.uint32))
    )


def all_pairs(dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    v = np.arange(256, dtype=np.uint8).view(dtype)
    x, y = np.meshgrid(v, v)
    return x, y


@pytest.mark.parametrize(
    "fmt,dtype", [("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)]
)
@pytest.mark.parametrize("op", OPS)
def test_exhaustive_pairs_deterministic(fmt: str, dtype: Any, op: str) -> None:
    x, y = all_pairs(dtype)
    args = (x, y, y.T) if op == "fma" else (x, y)
    for mode in DETERMINISTIC:
        for overflow in ("ieee", "saturate"):
            for subnormals in ("keep", "flush"):
                a, b = both(op, args, fmt, rounding=mode, overflow=overflow, subnormals=subnormals)
                assert same_bits(a, b), (op, mode, overflow, subnormals)


def exact_float64(op: str, args: tuple[np.ndarray, ...]) -> np.ndarray:
    """The exact result of FP8 operands in float64 (sums and products of FP8 values are exact)."""
    a = [np.asarray(v, dtype=np.float64) for v in args]
    with np.errstate(all="ignore"):
        if op == "add":
            return a[0] + a[1]
        if op == "sub":
            return a[0] - a[1]
        if op == "mul":
            return a[0] * a[1]
        return a[0] * a[1] + a[2]


@pytest.mark.parametrize(
    "fmt,dtype", [("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)]
)
@pytest.mark.parametrize("op", OPS)
def test_exhaustive_pairs_stochastic_match_the_core(fmt: str, dtype: Any, op: str) -> None:
    x, y = all_pairs(dtype)
    args = (x, y, y.T) if op == "fma" else (x, y)
    exact = exact_float64(op, args)
    for overflow in ("ieee", "saturate"):
        for subnormals in ("keep", "flush"):
            kw = dict(rounding="stochastic", overflow=overflow, subnormals=subnormals, seed=11)
            with pl.use_backend("numpy"):
                ref = pl.round_to(exact, fmt, **kw).astype(np.float32)
                if subnormals == "flush":  # operands are flushed first
                    flushed = [pl.round_to(v, fmt, subnormals="flush") for v in args]
                    ref = pl.round_to(exact_float64(op, tuple(flushed)), fmt, **kw)
                    ref = ref.astype(np.float32)
            with pl.use_backend("native"):
                got = getattr(ops, op)(*args, fmt, **kw)
            nan = np.isnan(ref)
            assert np.array_equal(np.isnan(got), nan)
            # IEEE zero signs of exact zero sums are the ops' rule, not round_to's
            ok = np.where(ref == 0, got == 0, got.view(np.uint32) == ref.view(np.uint32))
            assert (ok | nan).all(), (op, overflow, subnormals)


def test_stochastic_bf16_matches_numpy_path_and_is_unbiased() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(50_000).astype(ml_dtypes.bfloat16)
    y = (rng.standard_normal(50_000) * 2.0**-9).astype(ml_dtypes.bfloat16)
    for op in ("add", "mul"):
        a, b = both(op, (x, y), "bf16", rounding="stochastic", seed=5)
        assert same_bits(a, b)
    # the same (seed, flat index) words however the call is cut
    a = ops.add(x, y, "bf16", rounding="stochastic", seed=5)
    assert same_bits(ops.add(x[:777], y[:777], "bf16", rounding="stochastic", seed=5), a[:777])
    # unbiased: 1 + 2**-10 (an eighth of bf16's quantum at 1) rounds up with probability 1/8
    one = np.ones(40_000, dtype=ml_dtypes.bfloat16)
    tiny = np.full(40_000, 2.0**-10, dtype=ml_dtypes.bfloat16)
    r = ops.add(one, tiny, "bf16", rounding="stochastic", seed=9)
    assert set(np.unique(r).tolist()) == {1.0, 1.0078125}
    p = float(np.mean(r > 1.0))
    assert abs(p - 0.125) < 5 * (0.125 * 0.875 / 40_000) ** 0.5


def test_far_apart_stochastic_sums_fall_back_to_numpy() -> None:
    # 1 + 2**-60: the TwoSum error is not zero, so the extension declines (numpy serves)
    x = np.array([1.0, 2.0], dtype=np.float32)
    y = np.array([2.0**-60, 1.0], dtype=np.float32)
    o = pl.rounding.check_options("stochastic", "ieee", "keep", 1, None)
    assert native.elementwise("add", [x, y], pl.get_format("bf16"), o, False) is None
    r = ops.add(x, y, "bf16", rounding="stochastic", seed=1)
    with pl.use_backend("numpy"):
        assert same_bits(r, ops.add(x, y, "bf16", rounding="stochastic", seed=1))


def bf16_near(kind: str) -> st.SearchStrategy[float]:
    """float32 values near bf16's ties, overflow threshold and subnormal boundary."""
    m = st.integers(0, 2**16 - 1)
    if kind == "tie":  # bf16 value plus half a quantum, give or take a float32 ulp
        base = st.integers(0x3F00, 0x43FF)
        return st.builds(
            lambda b, d, s: float(np.uint32((b << 16) + 0x8000 + d).view(np.float32)) * s,
            base, st.integers(-2, 2), st.sampled_from([1.0, -1.0]),
        )  # fmt: skip
    if kind == "overflow":
        return st.builds(
            lambda k: float(np.uint32(0x7F7F0000 + k).view(np.float32)), st.integers(0, 0xFFFF)
        )
    return st.builds(
        lambda k: float(np.uint32(k).view(np.float32)), st.integers(0, 0x00FFFFFF)
    ).map(lambda v: v) | m.map(lambda k: float(np.uint32(0x00800000 + k).view(np.float32)))


operand = st.one_of(bf16_near("tie"), bf16_near("overflow"), bf16_near("subnormal"),
                    st.floats(width=32, allow_nan=True))  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    xs=st.lists(operand, min_size=1, max_size=12),
    ys=st.lists(operand, min_size=12, max_size=12),
    fmt=st.sampled_from(["bf16", "fp16", "e5m2", "tf32", "fp32"]),
    mode=st.sampled_from(DETERMINISTIC),
    overflow=st.sampled_from(["ieee", "saturate"]),
    subnormals=st.sampled_from(["keep", "flush"]),
    op=st.sampled_from(OPS),
)
def test_hypothesis_float32_operands(
    xs: list[float], ys: list[float], fmt: str, mode: str, overflow: str, subnormals: str, op: str
) -> None:
    n = len(xs)
    x = np.array(xs, dtype=np.float32)
    y = np.array(ys[:n], dtype=np.float32)
    z = np.array(ys[::-1][:n], dtype=np.float32)
    args = (x, y, z) if op == "fma" else (x, y)
    a, b = both(op, args, fmt, rounding=mode, overflow=overflow, subnormals=subnormals)
    assert same_bits(a, b)


@settings(max_examples=60, deadline=None)
@given(
    xs=st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=16),
    ys=st.lists(st.integers(0, 0xFFFF), min_size=16, max_size=16),
    fmt=st.sampled_from(["bf16", "fp16", "e4m3", "e3m2"]),
    mode=st.sampled_from(DETERMINISTIC),
    overflow=st.sampled_from(["ieee", "saturate"]),
    subnormals=st.sampled_from(["keep", "flush"]),
    op=st.sampled_from(OPS),
    dtype=st.sampled_from([ml_dtypes.bfloat16, np.float16]),
)
def test_hypothesis_16_bit_operands(
    xs: list[int], ys: list[int], fmt: str, mode: str, overflow: str, subnormals: str, op: str,
    dtype: Any,
) -> None:  # fmt: skip
    n = len(xs)
    x = np.array(xs, dtype=np.uint16).view(dtype)
    y = np.array(ys[:n], dtype=np.uint16).view(dtype)
    z = np.array(ys[::-1][:n], dtype=np.uint16).view(dtype)
    args = (x, y, z) if op == "fma" else (x, y)
    a, b = both(op, args, fmt, rounding=mode, overflow=overflow, subnormals=subnormals)
    assert same_bits(a, b)


def test_broadcasting_and_layouts() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2].astype(">f4")
    y = np.float32(0.3) * np.ones((2, 1, 2), dtype=np.float32)
    a, b = both("mul", (x, y), "bf16", rounding="up")
    assert a.shape == (2, 3, 2) and same_bits(a, b)


@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_operands_of_the_format_own_dtype_are_flushed_too(backend: str) -> None:
    # a bf16 subnormal operand is flushed to zero under subnormals="flush" (as a float32 one
    # is), so 1 + tiny rounded up stays 1; kept, it moves 1 up by an ulp
    tiny = np.array([2.0**-130], dtype=ml_dtypes.bfloat16)
    one = np.ones(1, dtype=ml_dtypes.bfloat16)
    with pl.use_backend(backend):
        flushed = ops.add(one, tiny, "bf16", rounding="up", subnormals="flush")
        kept = ops.add(one, tiny, "bf16", rounding="up")
        as_f32 = ops.add(one.astype(np.float32), tiny.astype(np.float32), "bf16",
                         rounding="up", subnormals="flush")  # fmt: skip
    assert flushed.tolist() == as_f32.tolist() == [1.0]
    assert kept.tolist() == [1.0078125]
