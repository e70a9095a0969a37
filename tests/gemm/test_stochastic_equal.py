"""``stochastic_equal`` in the accumulator models (issue 19, item 14): every rounding of a GEMM
model may be the equal-probability stochastic mode, with the same bits on every backend.

The oracle is exact ``fractions.Fraction`` arithmetic with its own rounding (not the core) and
the counter-based random words of :mod:`precision_lab.core.random_words` (word ``e * T + i`` of
event ``e`` for output element ``i``, the specification in :mod:`precision_lab.gemm.accumulator`):
an inexact step goes away from zero iff the word's top bit is set. The native kernels are compared
with the numpy reference bit for bit here, the CUDA header in tests/backends/test_cuda_host.py.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from cpu_backends import cpu_backend  # noqa: F401  (every test runs on numpy and native)

import precision_lab as pl
from precision_lab.core.random_words import random_words

RNG = np.random.default_rng(20261203)


def fr_toward_zero(x: Fraction, fmt: pl.FloatFormat) -> tuple[Fraction, Fraction]:
    """(x rounded toward zero onto fmt, the quantum there); no overflow (tests stay in range)."""
    if x == 0:
        return Fraction(0), Fraction(0)
    ax = abs(x)
    e = ax.numerator.bit_length() - ax.denominator.bit_length()
    while Fraction(2) ** e > ax:
        e -= 1
    while Fraction(2) ** (e + 1) <= ax:
        e += 1
    q = Fraction(2) ** (max(e, fmt.emin) - fmt.mantissa_bits)
    t = math.floor(ax / q) * q
    return (t if x > 0 else -t), q


def oracle_sre(a: np.ndarray, b: np.ndarray, fmt: pl.FloatFormat, seed: int, bits: int | None):
    """Sequential sum with stochastic_equal steps: ``s = SRE(s + a_k b_k)``, event k."""
    m, k = a.shape
    n = b.shape[1]
    T = m * n
    words = [random_words(seed, T, e * T) for e in range(k)]
    out = np.empty((m, n))
    for i in range(m):
        for j in range(n):
            s = Fraction(0)
            for kk in range(k):
                x = s + Fraction(float(a[i, kk])) * Fraction(float(b[kk, j]))
                t, q = fr_toward_zero(x, fmt)
                w = int(words[kk][i * n + j])
                if bits is not None:
                    w &= ((1 << 64) - 1) ^ ((1 << (64 - bits)) - 1)
                s = t + (q if x > 0 else -q) if (x != t and w >> 63) else t
            out[i, j] = float(s)
    return out


def test_every_rounding_of_the_model_may_be_stochastic_equal():
    acc = pl.Accumulator("bf16", rounding="sre", seed=3)
    assert acc.rounding == "stochastic_equal" and acc.stochastic
    for field in ("promote_rounding", "product_rounding", "out_rounding"):
        a = pl.Accumulator("bf16", promote_every=8, product_format="e4m3", **{field: "sre"})
        assert getattr(a, field) == "stochastic_equal" and a.stochastic
    tc = pl.tensor_core("v100", "fp16").replace(addend="after_block", block_rounding="sre")
    assert tc.stochastic


@pytest.mark.parametrize(("fmt", "bits"), [("bf16", None), ("fp16", None), ("bf16", 1)])
def test_sequential_stochastic_equal_matches_the_exact_oracle(fmt: str, bits: int | None):
    a = pl.round_to(RNG.uniform(-2, 2, (4, 60)), "e4m3").astype(np.float64)
    b = pl.round_to(RNG.uniform(0, 2, (60, 5)), "e4m3").astype(np.float64)
    acc = pl.Accumulator(fmt, rounding="stochastic_equal", seed=2**65 + 7, random_bits=bits)
    got = pl.gemm(a, b, input_format="e4m3", accumulator=acc, out_format=fmt)
    want = oracle_sre(a, b, pl.get_format(fmt), 2**65 + 7, bits)
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), want)
    # not the other stochastic mode, and not nearest: the choice is a coin flip
    sr = pl.gemm(a, b, input_format="e4m3", accumulator=acc.replace(rounding="sr"), out_format=fmt)
    rn = pl.gemm(a, b, input_format="e4m3", accumulator=acc.replace(rounding="rne"), out_format=fmt)
    assert not np.array_equal(got, sr) and not np.array_equal(got, rn)


def test_stochastic_equal_goes_up_half_the_time():
    # 1 + 2**-12 in bf16: stochastic rounds up with probability 1/32, stochastic_equal 1/2
    a = np.ones((4000, 2))
    b = np.array([[1.0], [2.0**-12]])
    acc = pl.Accumulator("bf16", rounding="stochastic_equal", seed=11)
    d = np.asarray(pl.gemm(a, b, input_format="fp32", accumulator=acc, out_format="bf16"))
    assert set(np.unique(d).tolist()) == {1.0, 1.0078125}
    assert abs(float((d > 1).mean()) - 0.5) < 0.03


MODELS = [
    pl.Accumulator("bf16", "sre", seed=5),
    pl.Accumulator("fp16", "sre", order="pairwise", seed=3),
    pl.Accumulator("fp16", "sre", order="blocked", block=5, promote_every=12, seed=4),
    pl.Accumulator("bf16", "sre", promote_every=8, promote_rounding="sre", out_rounding="sre"),
    pl.Accumulator("bf16", product_format="e4m3", product_rounding="sre", seed=3),
    pl.Accumulator("bf16", "sre", seed=2**70 + 3, random_bits=3),
    pl.Accumulator("fp16", "sre", seed=1, overflow="saturate"),
    pl.tensor_core("v100", "fp16").replace(rounding="sre", seed=11),
    pl.tensor_core("h100", "e4m3").replace(rounding="sre", seed=2),
]


@pytest.mark.parametrize("acc", MODELS, ids=lambda a: a.describe()[:50])
@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
def test_native_gives_the_numpy_bits(acc, scale):
    fin = "fp16" if acc.name and "v100" in acc.name else "e4m3"
    a = RNG.standard_normal((5, 67)) * scale
    b = RNG.standard_normal((67, 7)) * scale
    c = RNG.standard_normal((5, 7)) * scale
    kw = {"input_format": fin, "accumulator": acc, "out_format": "bf16"}
    want = pl.gemm(a, b, c, backend="numpy", **kw)
    got = pl.gemm(a, b, c, backend="native", **kw)
    np.testing.assert_array_equal(want.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("mode", ["stochastic", "stochastic_equal"])
@pytest.mark.parametrize("overflow", ["ieee", "saturate"])
def test_stochastic_overflow_beyond_max_follows_the_switch(mode, overflow):
    # sums far beyond fp16's max + one quantum: inf under ieee (as round_to), max when saturating;
    # the native kernels kept max under ieee before the fix
    a = np.full((3, 8), 250.0)
    b = np.full((8, 2), 250.0)
    acc = pl.Accumulator("fp16", rounding=mode, overflow=overflow, seed=4)
    d = pl.gemm(a, b, input_format="fp16", accumulator=acc)
    want = np.inf if overflow == "ieee" else 65504.0
    assert (np.asarray(d) == want).all()
