"""Hadamard rotations (precision_lab.quant.hadamard) against exact rational references.

The referee multiplies by Sylvester's matrix built from its recursion, in ``fractions.Fraction``,
and rounds with its own few lines of exact rounding onto a (precision, emin) grid; it shares no
code with the implementation beyond the random words of the core (the documented source of the
signs and of the stochastic rounding).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core.random_words import philox4x64, random_words
from precision_lab.quant.hadamard import hadamard, hadamard_matrix, random_signs

SIZES = (16, 32, 64, 128, 256)
GRID = {"fp32": (24, -126), "bf16": (8, -126), "fp16": (11, -14)}


def sylvester(n: int) -> list[list[int]]:
    h = [[1]]
    while len(h) < n:
        h = [row + row for row in h] + [row + [-v for v in row] for row in h]
    return h


def exact_transform(block: list[float], signs: list[float] | None) -> list[Fraction]:
    """H_n (s * x), exactly."""
    n = len(block)
    v = [Fraction(float(t)) * (1 if signs is None else int(signs[i])) for i, t in enumerate(block)]
    h = sylvester(n)
    return [sum((h[i][j] * v[j] for j in range(n)), Fraction(0)) for i in range(n)]


def round_frac(q: Fraction, fmt: str, mode: str, word: int | None = None) -> Fraction:
    """q rounded onto the (precision, emin) grid of fmt, without overflow (values stay small)."""
    p, emin = GRID[fmt]
    if q == 0:
        return q
    a = abs(q)
    e = math.floor(math.log2(a))
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    quantum = Fraction(2) ** (max(e, emin) - p + 1)
    m = a / quantum
    lo = math.floor(m)
    frac = m - lo
    neg = q < 0
    if mode == "nearest_even":
        up = frac > Fraction(1, 2) or (frac == Fraction(1, 2) and lo % 2 == 1)
    elif mode == "toward_zero":
        up = False
    elif mode == "up":
        up = frac > 0 and not neg
    elif mode == "down":
        up = frac > 0 and neg
    elif mode == "stochastic":
        assert word is not None
        up = frac > 0 and math.floor(frac * 2**64) + word >= 2**64
    else:
        raise AssertionError(mode)
    r = (lo + up) * quantum
    return -r if neg else r


def reference_in_format(
    block: list[float], signs: list[float] | None, inverse: bool, fmt: str, mode: str,
    words: list[list[int]] | None = None, offset: int = 0,
) -> list[Fraction]:  # fmt: skip
    """The documented butterfly, every operation rounded by round_frac."""
    n = len(block)
    v = [round_frac(Fraction(float(t)), fmt, "nearest_even") for t in block]
    if signs is not None and not inverse:
        v = [t * int(signs[i]) for i, t in enumerate(v)]
    stage, h = 0, 1
    while h < n:
        for g in range(0, n, 2 * h):
            for j in range(g, g + h):
                a, b = v[j], v[j + h]
                wa = None if words is None else words[stage][offset + j]
                wb = None if words is None else words[stage][offset + j + h]
                v[j], v[j + h] = round_frac(a + b, fmt, mode, wa), round_frac(a - b, fmt, mode, wb)
        h *= 2
        stage += 1
    lg = n.bit_length() - 1
    c = Fraction(2) ** -(lg // 2)
    if lg % 2:
        c *= round_frac(Fraction(2.0**-0.5), fmt, "nearest_even")
    v = [
        round_frac(t * c, fmt, mode, None if words is None else words[stage][offset + j])
        for j, t in enumerate(v)
    ]
    if signs is not None and inverse:
        v = [t * int(signs[i]) for i, t in enumerate(v)]
    return v


# ----- the matrix and the signs -----------------------------------------------------------------
@pytest.mark.parametrize("n", (1, 2, 4, 16, 256))
def test_hadamard_matrix_is_sylvester_and_orthogonal(n: int) -> None:
    h = hadamard_matrix(n)
    assert h.tolist() == sylvester(n)
    assert (h.astype(np.int64) @ h.T == n * np.eye(n, dtype=np.int64)).all()
    assert (h == h.T).all()


def test_random_signs_are_the_top_bits_of_the_core_words() -> None:
    s = random_signs(256, 12345)
    words = [philox4x64((i // 4, 0, 0, 0), (12345, 0))[i % 4] for i in range(256)]
    assert s.tolist() == [-1.0 if w >> 63 else 1.0 for w in words]
    assert 0.35 < (s < 0).mean() < 0.65
    assert (random_signs(256, 12346) != s).any()


# ----- exact ------------------------------------------------------------------------------------
def _data(rng: np.random.Generator, rows: int, n: int, kind: str) -> np.ndarray:
    if kind == "normal32":
        return rng.standard_normal((rows, n)).astype(np.float32)
    if kind == "wide32":  # magnitudes over 2**-60 .. 2**60: the float64 butterfly is not exact
        m = rng.standard_normal((rows, n))
        return np.ldexp(m, rng.integers(-60, 60, (rows, n))).astype(np.float32)
    if kind == "full64":
        return rng.standard_normal((rows, n))
    if kind == "tiny64":  # subnormal results
        return np.ldexp(rng.standard_normal((rows, n)), -1070)
    raise AssertionError(kind)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["normal32", "wide32", "full64", "tiny64"])
def test_exact_is_the_exact_transform_rounded_once(n: int, kind: str) -> None:
    rng = np.random.default_rng(n)
    x = _data(rng, 2, n, kind)
    seed = 99 if kind != "tiny64" else None
    y = hadamard(x, block=n, seed=seed)
    assert y.dtype == np.float64 and y.shape == x.shape
    signs = None if seed is None else random_signs(n, seed).tolist()
    lg = n.bit_length() - 1
    for r in range(x.shape[0]):
        hx = exact_transform(x[r].tolist(), signs)
        if lg % 2 == 0:  # c = 2**-k: the exact orthonormal value, correctly rounded
            want = [float(t / 2 ** (lg // 2)) for t in hx]
        else:  # documented: fl64(fl64(H s x) * 2**-k) * fl64(2**-0.5)
            want = [float(float(t / 2 ** (lg // 2)) * np.float64(2.0**-0.5)) for t in hx]
        assert y[r].tolist() == want


@pytest.mark.parametrize("n", (16, 64, 256))
def test_exact_inverse_restores_grid_data(n: int) -> None:
    """For n = 4**k, data on a narrow grid goes there and back exactly."""
    rng = np.random.default_rng(7)
    x = rng.integers(-1000, 1000, (3, 2 * n)).astype(np.float32) / 64
    y = hadamard(x, block=n, seed=5)
    assert (hadamard(y, block=n, seed=5, inverse=True) == x).all()
    assert not (hadamard(y, block=n, seed=6, inverse=True) == x).all()


def test_exact_norm_is_preserved_and_axis_is_honoured() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    y0 = hadamard(x, block=32, axis=0, seed=1)
    assert np.array_equal(y0, hadamard(x.T, block=32, seed=1).T)
    assert np.allclose((y0**2).sum(axis=0), (x.astype(np.float64) ** 2).sum(axis=0), rtol=1e-14)


def test_exact_infinities_follow_ieee() -> None:
    x = np.zeros(16)
    x[0], x[1] = np.inf, -np.inf
    y = hadamard(x, block=16)
    assert np.isnan(y[0]) and y[1] == np.inf
    one = np.zeros(16)
    one[3] = -np.inf
    z = hadamard(one, block=16)
    assert not np.isnan(z).any() and set(np.abs(z).tolist()) == {np.inf}


def test_exact_overflow_past_the_float64_butterfly_is_inf() -> None:
    """A row whose float64 butterfly is not exact (one subnormal beside values near the max)
    goes through Python integers; an exact result beyond float64's range is an infinity of its
    sign, as where the float64 butterfly serves (it raised OverflowError: the integer itself
    does not fit a float)."""
    x = np.full(16, 1.7e308)
    x[1] = 5e-324
    y = hadamard(x, block=16)
    hx = exact_transform(x.tolist(), None)
    assert y[0] == np.inf == hadamard(np.full(16, 1.7e308), block=16)[0]
    assert y[1:].tolist() == [float(t / 4) for t in hx[1:]]  # the finite ones: rounded once
    assert hadamard(-x, block=16)[0] == -np.inf


# ----- in a format ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["numpy", "auto"])
@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero", "up", "down"])
@pytest.mark.parametrize("n", (16, 32))
def test_format_arithmetic_rounds_every_butterfly(
    backend: str, fmt: str, mode: str, n: int
) -> None:
    rng = np.random.default_rng(11)
    x = _data(rng, 2, n, "normal32")
    x[1] = np.ldexp(x[1], rng.integers(-30, 30, n)).astype(np.float32)  # wide: many roundings
    with pl.use_backend(backend):
        y = hadamard(x, block=n, seed=4, arithmetic=fmt, rounding=mode)
        yi = hadamard(x, block=n, seed=4, arithmetic=fmt, rounding=mode, inverse=True)
    assert y.dtype == np.float32
    signs = random_signs(n, 4).tolist()
    for r in range(2):
        want = reference_in_format(x[r].tolist(), signs, False, fmt, mode)
        assert [Fraction(float(t)) for t in y[r]] == want
        want = reference_in_format(x[r].tolist(), signs, True, fmt, mode)
        assert [Fraction(float(t)) for t in yi[r]] == want


def test_stochastic_arithmetic_uses_the_documented_words() -> None:
    n, rows, seed = 16, 2, 2024
    x = _data(np.random.default_rng(5), rows, n, "normal32")
    y = hadamard(x, block=n, arithmetic="bf16", rounding="stochastic", rounding_seed=seed)
    total = rows * n
    words = [random_words(seed, total, t * total).tolist() for t in range(5)]
    for r in range(rows):
        want = reference_in_format(x[r].tolist(), None, False, "bf16", "stochastic", words, r * n)
        assert [Fraction(float(t)) for t in y[r]] == want
    again = hadamard(x, block=n, arithmetic="bf16", rounding="stochastic", rounding_seed=seed)
    assert np.array_equal(y, again)
    other = hadamard(x, block=n, arithmetic="bf16", rounding="stochastic", rounding_seed=seed + 1)
    assert not np.array_equal(y, other)


def test_native_fp32_equals_the_numpy_reference() -> None:
    """Bit for bit, every size, with and without signs, both directions, extreme exponents."""
    rng = np.random.default_rng(8)
    for n in (2, 4, 8, *SIZES, 1024):
        x = rng.standard_normal((40, n)).astype(np.float32)
        x[::3] = np.ldexp(x[::3], rng.integers(-140, 120, (len(x[::3]), n))).astype(np.float32)
        x[5, 0] = np.float32(3.0e38)
        x[6, :2] = np.float32(3.4e38)  # overflows to inf
        for seed in (None, 3):
            for inverse in (False, True):
                kw = dict(block=n, seed=seed, inverse=inverse, arithmetic="fp32")
                with pl.use_backend("numpy"):
                    ref = hadamard(x, **kw)  # type: ignore[arg-type]
                got = hadamard(x, **kw)  # type: ignore[arg-type]
                assert np.array_equal(got, ref, equal_nan=True)
                fin = np.isfinite(ref)
                assert np.array_equal(np.signbit(got[fin]), np.signbit(ref[fin]))


def test_fp32_error_is_measurable_and_small() -> None:
    x = _data(np.random.default_rng(9), 64, 128, "normal32")
    err = hadamard(x, block=128, arithmetic="fp32") - hadamard(x, block=128)
    assert 0 < np.abs(err).max() < 1e-5
    err16 = hadamard(x, block=128, arithmetic="bf16") - hadamard(x, block=128)
    assert np.abs(err16).max() > 100 * np.abs(err).max()


# ----- arguments --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"block": 24}, ValueError, "block must be a power of two"),
        ({"block": 8192}, ValueError, "block must be a power of two"),
        ({"block": 16.0}, TypeError, "block must be an int"),
        ({"block": 64}, ValueError, "not a multiple of block=64"),
        ({"arithmetic": "int8"}, ValueError, "arithmetic must be"),
        ({"arithmetic": "fp99"}, ValueError, "arithmetic must be"),
        ({"rounding": "up"}, ValueError, "need arithmetic='fp32'"),
        ({"rounding": "sideways", "arithmetic": "fp32"}, ValueError, "sideways"),
        ({"axis": 2}, ValueError, "out of range"),
    ],
)
def test_bad_arguments(kwargs: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        hadamard(np.zeros((2, 32)), **kwargs)


def test_integer_input_and_inputs_untouched() -> None:
    with pytest.raises(TypeError):
        hadamard(np.zeros(16, dtype=np.int32))
    x = np.arange(32, dtype=np.float32)
    x.flags.writeable = False
    hadamard(x, block=16, arithmetic="fp32", seed=1)
    assert (x == np.arange(32)).all()
    assert hadamard(np.zeros((0, 16)), block=16).shape == (0, 16)


# ----- a given sign vector (Transformer Engine's fixed 16 signs) --------------------------------
#: TE's get_wgrad_sign_vector() (transformer_engine/pytorch/tensor/nvfp4_tensor.py, NVIDIA/
#: TransformerEngine 01634950ba17e76ef8c73ef36039ea4588ef50fb), copied here as the oracle of the
#: library's constant
TE_SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]


def test_te_sign_vector_is_transformer_engines() -> None:
    from precision_lab.quant.hadamard import TE_NVFP4_SIGNS

    assert list(TE_NVFP4_SIGNS) == TE_SIGNS
    # TE's kernels take it as a 16-bit mask (get_sign_from_vector: bit i set where sign i is -1)
    assert sum(1 << i for i, v in enumerate(TE_NVFP4_SIGNS) if v == -1) == 0xD7E8


@pytest.mark.parametrize("inverse", [False, True])
def test_given_signs_are_te_rht_matrix_exactly(inverse: bool) -> None:
    """TE's RHT: rows times ``diag(s) @ H_16 * 0.25`` (``get_rht_matrix``); exact here, in
    Fractions (Sylvester's recursion), against ``hadamard(..., signs=TE_NVFP4_SIGNS)``; the
    inverse is ``s * (H y / 4)``."""
    from precision_lab.quant.hadamard import TE_NVFP4_SIGNS

    rng = np.random.default_rng(31)
    x = (rng.standard_normal((3, 32)) * 2.0 ** rng.integers(-30, 30, (3, 32))).astype(np.float32)
    y = hadamard(x, block=16, signs=TE_NVFP4_SIGNS, inverse=inverse)
    h = sylvester(16)
    for r in range(3):
        for b in range(2):
            v = [Fraction(float(t)) for t in x[r, 16 * b : 16 * b + 16]]
            if inverse:  # s_j * sum_i H_ji v_i / 4
                want = [TE_SIGNS[j] * sum(h[j][i] * v[i] for i in range(16)) / 4 for j in range(16)]
            else:  # sum_i v_i (diag(s) H)_ij / 4 = sum_i v_i s_i H_ij / 4
                want = [sum(v[i] * TE_SIGNS[i] * h[i][j] for i in range(16)) / 4 for j in range(16)]
            assert y[r, 16 * b : 16 * b + 16].tolist() == [float(w) for w in want]
    back = hadamard(y, block=16, signs=TE_NVFP4_SIGNS, inverse=not inverse)
    assert np.allclose(back, x, rtol=0, atol=2**-50 * float(np.abs(x).max()))


def test_given_signs_equal_the_seeded_ones_and_are_checked() -> None:
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    s = random_signs(32, 9)
    for kw in ({}, {"arithmetic": "fp32"}, {"arithmetic": "bf16", "inverse": True}):
        a = hadamard(x, block=32, seed=9, **kw)
        b = hadamard(x, block=32, signs=s.astype(np.int8), **kw)
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), kw
    with pytest.raises(ValueError, match="not both"):
        hadamard(x, block=32, seed=9, signs=s)
    with pytest.raises(ValueError, match=r"signs must have shape \(32,\).*got \(16,\)"):
        hadamard(x, block=32, signs=TE_SIGNS)
    bad = s.copy()
    bad[3] = 0.5
    with pytest.raises(ValueError, match=r"signs must be \+1 or -1, got 0\.5 at index 3"):
        hadamard(x, block=32, signs=bad)


@pytest.mark.parametrize("backend", ["auto", "numpy"])
def test_rotation32_is_the_exact_transform_rounded_to_float32(backend: str) -> None:
    """The recipes' rotation (quant.hadamard._rotation32: one native pass along any axis,
    padded) gives hadamard(...).astype(float32) bit for bit: blocks along the last and leading
    axes, partial groups of side-by-side blocks, wide exponent ranges (blocks that the native
    pass flags and recomputes), zeros, subnormals, inf and NaN, with and without signs."""
    from precision_lab.quant.hadamard import _rotation32

    rng = np.random.default_rng(11)
    cases = [((64, 40), 0), ((40, 64), 1), ((3, 48, 13), 1), ((2, 4, 32, 9), -2), ((37, 16), 0)]
    cases += [((5, 24), 1), ((7, 2, 40), -1)]  # (groups of fewer than 8 contiguous blocks)
    for shape, axis in cases:
        for n in (2, 8, 16, 32):
            for kind in range(3):
                x = rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))
                if kind == 1:  # exponents too far apart for exact float64 butterflies
                    x = x * np.exp2(rng.integers(-120, 100, shape))
                if kind == 2:
                    x.flat[::5] = 0.0
                    x.flat[1::7] = 1e-42  # float32 subnormals
                    x.flat[3], x.flat[17] = np.inf, np.nan
                x = x.astype(np.float32)
                for seed in (None, 4):
                    length = shape[axis]
                    padded = x
                    if length % n:
                        width = [(0, 0)] * x.ndim
                        width[axis] = (0, -length % n)
                        padded = np.pad(x, width)
                    with np.errstate(all="ignore"):
                        want = hadamard(padded, block=n, axis=axis, seed=seed).astype(np.float32)
                    with pl.use_backend(backend):
                        got = _rotation32(x, n, axis, seed)
                    assert got.dtype == np.float32 and got.shape == want.shape
                    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
                        shape, axis, n, kind, seed,
                    )  # fmt: skip
