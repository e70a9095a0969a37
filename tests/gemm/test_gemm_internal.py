"""reference.gemm_internal (the package's own GEMM entry, used by precision_lab.torch.simulate)
gives the numpy reference's bits, also where it folds a bias into the operands as one more K
step (reference._bias_as_k_term): compared bit for bit with ``gemm(backend="numpy")``, with
the signs of zero, subnormals, infinities, NaN and values that overflow the input format."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import precision_lab as pl

native_kernels = importlib.import_module("precision_lab.backends.native.kernels")
reference = importlib.import_module("precision_lab.gemm.reference")

pytestmark = pytest.mark.skipif(
    not native_kernels.available(), reason="precision_lab.backends._native_kernels is not built"
)
F = pl.get_format


def bits(x: np.ndarray) -> np.ndarray:
    # NaN compared as one pattern (the numpy reference canonicalises; the sign carries nothing)
    x = np.where(np.isnan(x), np.float32(np.nan), x).astype(np.float32)
    return x.view(np.uint32)


def operands(
    rng: np.random.Generator, m: int, k: int, n: int, special: bool
) -> tuple[np.ndarray, ...]:
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    if special:  # subnormals, signed zeros, exact cancellation
        a[0, :] = np.float32(2.0**-140)
        a[1, :] = -0.0
        b[:, 0] = -0.0
        a[2, 0], b[0, 1] = np.float32(3.0), np.float32(-3.0)
    return a, b


FORMATS = [("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16"), ("e4m3", "e4m3"), ("bf16", "fp32")]


@pytest.mark.parametrize(("fa", "fb"), FORMATS)
@pytest.mark.parametrize("where", ["row", "row2d", "column"])
@pytest.mark.parametrize("special", [False, True])
def test_bias_folded_matches_the_reference(fa: str, fb: str, where: str, special: bool) -> None:
    rng = np.random.default_rng(abs(hash((fa, fb, where, special))) % 2**32)
    m, k, n = 256, 40, 160  # (m * n above _BIAS_TERM_OUTPUTS: the fold runs)
    a, b = operands(rng, m, k, n, special)
    shape = {"row": (n,), "row2d": (1, n), "column": (m, 1)}[where]
    c = rng.standard_normal(shape).astype(np.float32)
    if special:
        c.reshape(-1)[:3] = [2.0**-130, 1e-45, -(2.0**-126)]
    fa_, fb_ = F(fa), F(fb)
    acc = pl.Accumulator()
    assert reference._fma32_route(acc, fa_, fb_, F("fp32"))
    folded = reference._bias_as_k_term(a, b, c, fa_, fb_, F("fp32"))
    assert (folded is not None) == (fa == fb == "fp32")  # (fp32 inputs alone are folded)
    got = reference.gemm_internal(a, b, c, fa_, fb_, acc, F("fp32"))
    fmt = fa if fa == fb else (fa, fb)
    want = pl.gemm(a, b, c, input_format=fmt, accumulator=acc, backend="numpy")
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize(
    "poison", ["negative_zero_c", "inf_c", "nan_c", "nan_a", "overflow_a", "overflow_sum"]
)
def test_declined_and_non_finite_cases_keep_the_reference_bits(poison: str) -> None:
    rng = np.random.default_rng(7)
    m, k, n = 256, 24, 160
    a, b = operands(rng, m, k, n, special=False)
    c = rng.standard_normal(n).astype(np.float32)
    fmt = F("fp32")
    if poison == "negative_zero_c":  # +0 + 1 * -0 would be +0: the fold declines
        c[5] = -0.0
        a[:, :] = 0.0
        b[:, 5] = -1.0  # every product of column 5 is -0: the sums stay -0
        assert reference._bias_as_k_term(a, b, c, fmt, fmt, F("fp32")) is None
    elif poison == "inf_c":
        c[3] = np.inf
    elif poison == "nan_c":
        c[3] = np.nan
    elif poison == "nan_a":
        a[4, 2] = np.nan
    elif poison == "overflow_a":  # a product beyond float32's range
        a[4, 2] = np.float32(3.4e38)
    else:  # a finite sum that overflows float32
        a[6, :], b[:, 7] = np.float32(1e30), np.float32(1e30)
    got = reference.gemm_internal(a, b, c, fmt, fmt, pl.Accumulator(), F("fp32"))
    want = pl.gemm(a, b, c, input_format=fmt, accumulator=pl.Accumulator(), backend="numpy")
    np.testing.assert_array_equal(bits(got), bits(want))
    if poison == "negative_zero_c":
        assert np.signbit(got[:, 5]).all() and (got[:, 5] == 0).all()  # -0 + (-0) = -0


def test_without_bias_and_batched_match_the_reference() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 33, 17)).astype(np.float32)
    b = rng.standard_normal((3, 17, 9)).astype(np.float32)
    fmt = F("fp16")
    got = reference.gemm_internal(a, b, None, fmt, fmt, pl.Accumulator(), F("fp32"))
    want = pl.gemm(a, b, input_format=fmt, backend="numpy")
    np.testing.assert_array_equal(bits(got), bits(want))
    # transposed views (the backward's operands) and a bias too small to fold
    at = np.ascontiguousarray(a[0].T).T
    c = rng.standard_normal(9).astype(np.float32)
    got = reference.gemm_internal(at, b[0], c, fmt, fmt, pl.Accumulator(), F("fp32"))
    want = pl.gemm(at, b[0], c, input_format=fmt, backend="numpy")
    np.testing.assert_array_equal(bits(got), bits(want))


def test_models_off_the_fma32_route_go_through_gemm() -> None:
    rng = np.random.default_rng(5)
    a, b = operands(rng, 64, 16, 32, special=False)
    c = rng.standard_normal(32).astype(np.float32)
    acc = pl.Accumulator("fp32", order="pairwise")
    assert not reference._fma32_route(acc, F("bf16"), F("bf16"), F("fp32"))
    got = reference.gemm_internal(a, b, c, F("bf16"), F("bf16"), acc, F("fp32"))
    want = pl.gemm(a, b, c, input_format="bf16", accumulator=acc, backend="numpy")
    np.testing.assert_array_equal(bits(got), bits(want))


STORES = ["fp16", "bf16", "e4m3", "e5m2", "tf32", "fp32", "e4m3fnuz", "e5m2fnuz", "e2m1", "e8m0"]
# (a custom format without subnormals, and P3109's: the kernel's header fallback for each)
STORES += ["nosub", "p3109_k8p3se"]


def _store_format(name: str) -> pl.FloatFormat:
    if name == "nosub":
        return pl.FloatFormat(5, 4, 15, has_subnormals=False, name="e5m4_nosub")
    return F(name)  # type: ignore[no-any-return]


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("case", ["plain", "bias", "folded", "transposed", "batched", "edges"])
def test_store_is_round_to_of_the_fp32_result(store: str, case: str) -> None:
    """``store=`` (the fp32 FMA kernel's rounded output rows, ``grid_out``) gives the bits of
    ``round_to`` applied to the fp32 result of the numpy reference: overflow to inf, subnormals,
    signed zeros, NaN and inf outputs (the general path), bias added before the rounding."""
    rng = np.random.default_rng(abs(hash((store, case))) % 2**32)
    m, k, n = (256, 24, 160) if case == "folded" else (37, 19, 23)
    a, b = operands(rng, m, k, n, special=case == "edges")
    c = rng.standard_normal(n).astype(np.float32) if case in ("bias", "folded") else None
    if case == "transposed":
        a = np.ascontiguousarray(a.T).T
    if case == "batched":
        a = rng.standard_normal((3, m, k)).astype(np.float32)
        b = rng.standard_normal((3, k, n)).astype(np.float32)
    if case == "edges":  # outputs past fp16/e4m3/e5m2's max, below their subnormals, inf, NaN
        a[3, :] *= np.float32(3e4)
        a[4, :] *= np.float32(2.0**-20)
        a[5, 0] = np.inf
        a[6, 0] = np.nan
    fmt, acc = _store_format(store), pl.Accumulator()
    got = reference.gemm_internal(a, b, c, F("fp32"), F("fp32"), acc, F("fp32"), store=fmt)
    fp32 = pl.gemm(a, b, c, input_format="fp32", accumulator=acc, backend="numpy")
    want = pl.round_to(fp32, fmt)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(bits(got), bits(want))
    if case == "edges" and store in ("fp16", "e4m3"):
        # (the cases are reached: e4m3 overflows to NaN, it has no infinity)
        assert not np.isfinite(got[3]).all() and (got[4] == 0).any()


@pytest.mark.parametrize("k", [0, 30])
def test_store_where_the_kernel_cannot_round_the_output(k: int) -> None:
    """An accumulator whose output rounding is stochastic (the kernel converts each output
    itself) and a GEMM without K (the output is the bias): the store still rounds once."""
    rng = np.random.default_rng(k)
    a = rng.standard_normal((40, k)).astype(np.float32)
    b = rng.standard_normal((k, 20)).astype(np.float32)
    c = (rng.standard_normal(20) * 1e5).astype(np.float32)
    acc = pl.Accumulator(out_rounding="stochastic", seed=3)
    fp32 = F("fp32")
    got = reference.gemm_internal(a, b, c, fp32, fp32, acc, fp32, store=F("bf16"))
    want = pl.round_to(
        pl.gemm(a, b, c, input_format=fp32, accumulator=acc, backend="numpy"), "bf16"
    )
    np.testing.assert_array_equal(bits(got), bits(want))


def test_store_needs_an_fp32_output() -> None:
    a = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="store needs out_fmt fp32"):
        reference.gemm_internal(
            a, a, None, F("fp32"), F("fp32"), pl.Accumulator(), F("bf16"), store=F("fp16")
        )
    params = np.zeros(300, np.int64)
    grid = np.array([5, 10, 15, 0, 15, 2, 0], np.int32)  # (mode 2: toward_zero)
    with pytest.raises(ValueError, match="grid_out needs mode 0"):
        native_kernels.ext.gemm_fma32(params, a, a, None, a, 1, 0, 0, None, 0, 0, grid)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 9),
    k=st.integers(0, 40),
    n=st.integers(1, 40),
    store=st.sampled_from(STORES),
    bias=st.booleans(),
    data=st.data(),
)
def test_store_on_any_operands(m: int, k: int, n: int, store: str, bias: bool, data) -> None:
    """Any float32 operands (random bit patterns: huge, tiny, subnormal, inf, NaN): the stored
    GEMM is round_to of the numpy reference's FP32 result, bit for bit (NaN as one pattern)."""
    vals = st.floats(width=32, allow_nan=True, allow_infinity=True)
    a = data.draw(arrays(np.float32, (m, k), elements=vals))
    b = data.draw(arrays(np.float32, (k, n), elements=vals))
    c = data.draw(arrays(np.float32, (n,), elements=vals)) if bias else None
    fmt, acc, fp32 = _store_format(store), pl.Accumulator(), F("fp32")
    with np.errstate(all="ignore"):
        got = reference.gemm_internal(a, b, c, fp32, fp32, acc, fp32, store=fmt)
        want = pl.round_to(
            pl.gemm(a, b, c, input_format=fp32, accumulator=acc, backend="numpy"), fmt
        )
    np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize("k", [1, 511, 512, 513, 1100, 1537])
def test_store_over_the_kernels_k_blocks(k: int) -> None:
    """K from 1 to three of the fp32 FMA kernel's K blocks (512) plus a ragged tail, bf16 and
    fp16 inputs, a bias: the stored outputs equal round_to of the numpy reference's result."""
    rng = np.random.default_rng(k)
    a = rng.standard_normal((13, k)).astype(np.float32)
    b = rng.standard_normal((k, 37)).astype(np.float32)
    c = rng.standard_normal(37).astype(np.float32)
    acc = pl.Accumulator()
    for fin, store in (("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "e4m3")):
        f = F(fin)
        got = reference.gemm_internal(a, b, c, f, f, acc, F("fp32"), store=F(store))
        fp32 = pl.gemm(a, b, c, input_format=fin, accumulator=acc, backend="numpy")
        np.testing.assert_array_equal(bits(got), bits(pl.round_to(fp32, store)))
