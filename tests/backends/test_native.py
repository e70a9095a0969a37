"""The compiled backend (precision_lab._native) against the numpy reference, bit for bit.

- round_to and encode for every format of at most 16 bits (the registry's and custom ones), every
  deterministic mode, both overflow and both subnormal switches, over all 65536 float16 and all
  65536 bfloat16 bit patterns, as float32 input, as float64 input and (the float16 ones) as
  float16 input; float64 edges (grid points, midpoints, neighbours) and random float64 patterns;
- wider float formats and integer formats on random inputs;
- hypothesis: custom formats, inputs at ties, around the overflow threshold and in the subnormal
  range, float32 and float64;
- stochastic rounding: the same bits as numpy whatever the seed, random_bits, chunk size,
  thread count and input dtype (float16/32/64); the extension's random words (any start, length,
  seed below 2**128) equal numpy's Philox4x64-10 and the plain-Python reference;
- decode of every code of every format of at most 16 bits (and random codes of wider ones), code
  dtypes of every width and sign, and the numpy backend's errors for bad codes;
- layouts: non-contiguous, big-endian, 0-d, empty and read-only inputs, never modified;
- the dispatch layer: backend_info, use_backend, PRECISION_LAB_BACKEND, a missing or stale build.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import tomllib
from fpenv import ftz_daz
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cuda_host import (
    DETERMINISTIC,
    INTS,
    SMALL_FLOATS,
    WIDE_FLOATS,
    X32,
    _edges64,
    _random64,
    _random_near,
    _same_bits,
)

import precision_lab as pl
from precision_lab import FloatFormat, decode, encode, round_to
from precision_lab.backends import dispatch, gpu, native
from precision_lab.backends.gpu import CUDA_DIR, format_args
from precision_lab.backends.native.sources import EXTENSIONS
from precision_lab.core import pool as _parallel
from precision_lab.core.random_words import philox4x64, random_words

pytestmark = [
    pytest.mark.skipif(native.ext is None, reason=f"precision_lab.backends._native: {native.WHY}"),
    pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning"),
]

SWITCHES = (("ieee", "keep"), ("saturate", "keep"), ("ieee", "flush"), ("saturate", "flush"))
X16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # every float16, as float16 input


def both(op, x, fmt, **kw) -> tuple[np.ndarray | Exception, np.ndarray | Exception]:
    """(native result, numpy result) of ``op(x, fmt, **kw)``; an exception stands for a result."""
    out = []
    for backend in ("native", "numpy"):
        with pl.use_backend(backend):
            try:
                out.append(op(x, fmt, **kw))
            except (ValueError, TypeError) as exc:
                out.append(exc)
    return out[0], out[1]


def check(op, x, fmt, what: str = "", **kw) -> None:
    got, want = both(op, x, fmt, **kw)
    if isinstance(want, Exception) or isinstance(got, Exception):
        assert type(got) is type(want) and str(got) == str(want), (what, got, want)
        return
    _same_bits(got, want, f"{op.__name__} {fmt} {what} {kw}", x)


def without_nan(x: np.ndarray, fmt) -> np.ndarray:
    return x if fmt.has_nan else x[~np.isnan(x)]


# ----- exhaustive over 16-bit patterns ------------------------------------------------------------
@pytest.mark.parametrize("name", list(SMALL_FLOATS))
def test_all_half_patterns(name: str) -> None:
    """Every fp16/bf16 pattern (float32 and float64 input), every fp16 (float16 input)."""
    fmt = SMALL_FLOATS[name]
    x64 = X32.astype(np.float64)
    for rounding_mode in DETERMINISTIC:
        for overflow, subnormals in SWITCHES[:3]:
            kw = {"rounding": rounding_mode, "overflow": overflow, "subnormals": subnormals}
            for x in (X32, x64, X16) if overflow == "ieee" else (X32, x64):
                check(round_to, x, fmt, **kw)
                check(encode, without_nan(x, fmt), fmt, **kw)
            if not fmt.has_nan:  # both refuse NaN with the same message
                check(encode, X32, fmt, **kw)


@pytest.mark.parametrize("name", list(SMALL_FLOATS))
def test_float64_edges_and_random(name: str) -> None:
    fmt = SMALL_FLOATS[name]
    x = np.concatenate([_edges64(fmt), _random64(3000, 1), _random_near(3000, -30, 30, 2, float)])
    for rounding_mode in DETERMINISTIC:
        for overflow, subnormals in SWITCHES[::3]:
            kw = {"rounding": rounding_mode, "overflow": overflow, "subnormals": subnormals}
            check(round_to, x, fmt, **kw)
            check(encode, without_nan(x, fmt), fmt, **kw)


@pytest.mark.parametrize("name", list(WIDE_FLOATS))
def test_wide_formats(name: str) -> None:
    fmt = WIDE_FLOATS[name]
    lo, hi = fmt.emin - fmt.mantissa_bits - 3, fmt.emax + 2
    x32 = np.concatenate([_random_near(5000, max(lo, -150), min(hi, 128), 3, np.float32), X32])
    x64 = np.concatenate(
        [_random_near(5000, max(lo, -1075), min(hi, 1023), 4, float), _random64(3000, 5)]
    )
    for rounding_mode in DETERMINISTIC:
        for overflow, subnormals in SWITCHES[::3]:
            kw = {"rounding": rounding_mode, "overflow": overflow, "subnormals": subnormals}
            for x in (x32, x64, X16):
                check(round_to, x, fmt, **kw)
                check(encode, without_nan(x, fmt), fmt, **kw)


@pytest.mark.parametrize("fmt", INTS, ids=str)
def test_integer_formats(fmt) -> None:
    x = np.concatenate([X32, _random_near(3000, -3, 40, 6, np.float32)])
    x64 = np.concatenate([x.astype(np.float64), _random64(2000, 7)])
    for rounding_mode in DETERMINISTIC:
        for inp in (x, x64, X16):
            check(round_to, inp, fmt, rounding=rounding_mode)
            check(encode, inp[~np.isnan(inp)], fmt, rounding=rounding_mode)
        check(encode, x, fmt, rounding=rounding_mode)  # NaN: the same ValueError


# ----- hypothesis: custom formats, ties, overflow threshold, subnormals --------------------------
@st.composite
def custom_formats(draw) -> FloatFormat:
    e = draw(st.integers(2, 8))
    m = draw(st.integers(0, min(10, 15 - e)))  # at most 16 bits: fmt.values() lists them
    nan = draw(st.sampled_from(["ieee", "fn", "fnuz", "none"]))
    if nan == "ieee" and m == 0:
        nan = "fn"
    kw = {
        "nan": nan,
        "has_inf": nan == "ieee",
        "has_subnormals": draw(st.booleans()) if m else False,
        "signed": draw(st.booleans()) if nan != "fnuz" else True,
    }
    if draw(st.booleans()):
        kw["bias"] = (1 << (e - 1)) - 1 + draw(st.integers(-2, 2))
    return FloatFormat(e, m, **kw)  # type: ignore[arg-type]


@st.composite
def tricky_inputs(draw, fmt: FloatFormat, dtype) -> np.ndarray:
    """Ties, their neighbours, the overflow threshold and subnormal-range values, both signs."""
    v = fmt.values()
    v = v[v >= 0]
    i = draw(st.integers(0, v.size - 2))
    lo, hi = float(v[i]), float(v[i + 1])
    top = fmt.max + float(fmt.ulp(fmt.max))
    pts = [lo, hi, (lo + hi) / 2, (fmt.max + top) / 2, top, fmt.smallest_subnormal / 2]
    pts.append(draw(st.floats(0, fmt.smallest_normal, allow_subnormal=True)))
    pts.append(draw(st.floats(lo, hi)))
    with np.errstate(over="ignore"):
        x = np.array(pts, dtype=np.float64).astype(dtype)
    steps = draw(st.integers(1, 3))
    x = np.concatenate([x, np.nextafter(x, np.inf * steps), np.nextafter(x, -np.inf)])
    return np.concatenate([x, -x])


@settings(max_examples=150, deadline=None)
@given(data=st.data(), fmt=custom_formats(), dtype=st.sampled_from([np.float32, np.float64]))
def test_hypothesis_custom_formats(data, fmt: FloatFormat, dtype) -> None:
    x = data.draw(tricky_inputs(fmt, dtype))
    for rounding_mode in DETERMINISTIC:
        for overflow, subnormals in SWITCHES:
            kw = {"rounding": rounding_mode, "overflow": overflow, "subnormals": subnormals}
            check(round_to, x, fmt, **kw)
            check(encode, x, fmt, **kw)


# ----- the fast paths outside the normal range (native/core.cpp, pl_low_fast) -------------------
BLOCK = native.ext.BLOCK if native.ext is not None else 1024
EDGE_FORMATS = ["fp16", "bf16", "e4m3", "e5m2", "e5m2fnuz", "e2m1", "e3m2_nosub", "e4m3_unsigned",
                "e5m0_fn_nosub", "p3109_k8p1ue"]  # fmt: skip


def _fixed_quantum(fmt: FloatFormat, working: str) -> bool:
    """Whether the fast path below the smallest normal applies (rounding._Plan's view of it)."""
    from precision_lab.core.rounding import _plan

    p = _plan(fmt, working, "nearest_even", "ieee", False)
    return p.fixed_quantum and not p.all_low


@pytest.mark.parametrize("name", list(SMALL_FLOATS))
def test_fast_paths_are_taken(name: str) -> None:
    """The exhaustive tests above run through the fast paths, not only the exact routine: every
    mode up to stochastic_equal (native.ext.FAST_MODES; the stochastic ones included) of every
    format with a fixed quantum below its smallest normal rounds such inputs on the low path;
    overflow has its path in those modes. The later modes (the few-bit SR variants) run the
    header's exact routine throughout: no fast path."""
    fmt = SMALL_FLOATS[name]
    assert native.ext.FAST_MODES == pl.ROUNDING_MODES.index("stochastic_equal") + 1
    for mode, rounding_mode in enumerate(pl.ROUNDING_MODES):
        fast = mode < native.ext.FAST_MODES
        for sat, flush in ((0, 0), (1, 0), (0, 1), (1, 1)):
            for itemsize, working in ((4, "float32"), (8, "float64")):
                low, over, over_codes = native.ext.fast_paths(
                    gpu.format_args(fmt), mode, sat, flush, itemsize
                )
                all_low = fmt.smallest_normal > fmt.max
                want_low = _fixed_quantum(fmt, working) and fast
                want_over = not all_low and fast
                assert (low, over, over_codes) == (want_low, want_over, want_over), (
                    fmt, rounding_mode, sat, flush, itemsize)  # fmt: skip


def _class_samples(fmt: FloatFormat, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """n float64 values of each class: below the smallest normal (ties, multiples of the smallest
    subnormal, neighbours, zeros), within the normal range, above the max (and inf), NaN."""
    q, sn, mx = fmt.smallest_subnormal, fmt.smallest_normal, fmt.max
    k = rng.integers(0, max(int(sn / q), 1) + 1, n).astype(float)
    low = np.concatenate([k * q, (k + 0.5) * q, rng.uniform(0, sn, n), [0.0, q / 2, q / 4]])
    low = np.nextafter(low, rng.choice([-np.inf, 0.0, np.inf], low.size))
    low = low[(low >= 0) & (low < sn)]
    mid = np.exp(rng.uniform(np.log(sn), np.log(mx), n))
    top = mx + float(fmt.ulp(mx))
    over = np.concatenate([rng.uniform(mx, 4 * mx, n), [(mx + top) / 2, top, np.inf]])
    over = np.nextafter(over, rng.choice([-np.inf, np.inf], over.size))
    over = over[over > mx]
    sign = lambda v: v * rng.choice([-1.0, 1.0], v.size)  # noqa: E731
    return {"low": sign(low), "mid": sign(mid), "over": sign(over), "nan": np.array([np.nan])}


def _blocks(fmt: FloatFormat, seed: int) -> np.ndarray:
    """Runs of blocks of one class, with intruders of the others, and mixed blocks: each kind of
    pass in native/core.cpp (ALL_LOW, ALL_OVER, LOW_IN, OVER_IN, FUSED, AFTER_FIRST) and its
    fallback when an element it does not cover turns up."""
    rng = np.random.default_rng(seed)
    c = _class_samples(fmt, rng, 300)

    def block(*parts: tuple[str, float]) -> np.ndarray:
        names = [p for p, _ in parts]
        share = np.array([w for _, w in parts])
        which = rng.choice(len(parts), BLOCK, p=share / share.sum())
        return np.array([rng.choice(c[names[w]]) for w in which])

    def intruded(base: str, other: str) -> np.ndarray:
        b = block((base, 1.0))
        b[rng.integers(0, BLOCK)] = rng.choice(c[other])
        return b

    seq = [block(("low", 1))] * 2 + [intruded("low", o) for o in ("mid", "over", "nan")]
    seq += [block(("low", 1)), block(("over", 1)), block(("over", 1))]
    seq += [intruded("over", o) for o in ("mid", "low", "nan")]
    seq += [block(("low", 3), ("mid", 1)), block(("low", 3), ("mid", 1)), intruded("low", "over")]
    seq += [block(("over", 3), ("mid", 1))] * 2 + [block(("over", 3), ("mid", 1), ("low", 1))]
    seq += [block(("low", 1), ("mid", 1), ("over", 1))] * 2 + [block(("mid", 1))]
    seq += [block(("mid", 50), ("low", 1), ("over", 1), ("nan", 1))]
    return np.concatenate(seq)[: len(seq) * BLOCK - 77]  # a partial last block


@pytest.mark.parametrize("name", EDGE_FORMATS)
def test_block_kinds_with_intruders(name: str) -> None:
    fmt = SMALL_FLOATS[name]
    x64 = _blocks(fmt, seed=len(name))
    with np.errstate(over="ignore"):
        inputs = [x64, x64.astype(np.float32)]
        if fmt.bits <= 8:
            inputs.append(x64.astype(np.float16))
    with _parallel.use_workers(1):  # one range: the block sequence as built
        for rounding_mode in DETERMINISTIC:
            for overflow, subnormals in SWITCHES:
                kw = {"rounding": rounding_mode, "overflow": overflow, "subnormals": subnormals}
                for x in inputs:
                    check(round_to, x, fmt, **kw)
                    check(encode, without_nan(x, fmt), fmt, **kw)


@st.composite
def edge_values(draw, fmt: FloatFormat) -> np.ndarray:
    """Values below the smallest normal, around the smallest subnormal and its half, around the
    overflow threshold (the max and halfway to the next binade step), ±0, ±inf and NaN."""
    q, sn, mx = fmt.smallest_subnormal, fmt.smallest_normal, fmt.max
    top = mx + float(fmt.ulp(mx))
    anchors = [q / 2, q, 1.5 * q, sn - q / 2, sn, mx, (mx + top) / 2, top, 0.0, np.inf, np.nan]
    pick = st.one_of(
        st.floats(0, sn, allow_subnormal=True),
        st.floats(0, 4 * q, allow_subnormal=True),
        st.floats(mx / 2, 2 * top),
        st.sampled_from(anchors),
    )
    v = np.array(draw(st.lists(pick, min_size=1, max_size=40)), dtype=np.float64)
    steps = np.array(draw(st.lists(st.integers(-2, 2), min_size=v.size, max_size=v.size)))
    v = np.where(steps > 0, np.nextafter(v, np.inf), np.where(steps < 0, np.nextafter(v, 0), v))
    signs = np.array(draw(st.lists(st.booleans(), min_size=v.size, max_size=v.size)))
    return np.where(signs, -v, v)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    fmt=st.one_of(st.sampled_from([SMALL_FLOATS[n] for n in EDGE_FORMATS]), custom_formats()),
    dtype=st.sampled_from([np.float32, np.float64]),
    run=st.sampled_from(["low", "over"]),
)
def test_hypothesis_edges_in_long_runs(data, fmt: FloatFormat, dtype, run: str) -> None:
    """Drawn edge values inside runs of blocks below the smallest normal or above the max, so that
    they meet each pass of the fast paths, float32 and float64 input."""
    v = data.draw(edge_values(fmt))
    fill = fmt.smallest_subnormal * 0.75 if run == "low" else fmt.max * 3
    with np.errstate(over="ignore"):
        x = np.concatenate([np.full(2 * BLOCK, fill), v, np.full(BLOCK - v.size, -fill), v])
        x = x.astype(dtype)
    with _parallel.use_workers(1):
        for rounding_mode in DETERMINISTIC:
            for overflow, subnormals in SWITCHES:
                kw = {"rounding": rounding_mode, "overflow": overflow, "subnormals": subnormals}
                check(round_to, x, fmt, **kw)
                check(encode, x, fmt, **kw)


# ----- stochastic rounding ----------------------------------------------------------------------
def _deep_low(fmt: FloatFormat, rng: np.random.Generator, n: int) -> np.ndarray:
    """float64 inputs of 2**-16 to 2**-8 quanta (random 53-bit significands): the discarded
    fraction's last bits lie 60 to 68 bits below the quantum, so the low path takes it by a left
    shift (d <= 64) or a right shift (d > 64), and rounds up with probability 2**-16 to 2**-8;
    and a few float64 subnormals."""
    qexp = int(np.frexp(fmt.smallest_subnormal)[1]) - 1
    sig = rng.integers(1 << 52, 1 << 53, n, dtype=np.int64).astype(np.float64)
    x = np.ldexp(sig, qexp - 52 - rng.integers(8, 17, n))
    x = np.concatenate([x, [5e-324, 2.5e-310, 1e-300]])
    return x * rng.choice([-1.0, 1.0], x.size)


@pytest.mark.parametrize("name", [n for n in EDGE_FORMATS if n != "p3109_k8p1ue"] + ["e4m3fnuz"])
def test_stochastic_low_path(monkeypatch, name: str) -> None:
    """Stochastic rounding below the smallest normal on the vectorised low path (pl_low_fast with
    the full random words): every block kind (runs of low inputs, intruders, mixed blocks, see
    _blocks), results that round up into the normal range, flush-to-zero, both overflow switches,
    float16/32/64 input, random_bits from 1 to exact; and float64 inputs whose discarded fraction
    reaches 60 to 68 bits below the quantum (_deep_low: rounded up now and then, so the comparison
    meets round-ups there). The same bits as the numpy reference."""
    fmt = SMALL_FLOATS.get(name) or pl.get_format(name)
    x64 = _blocks(fmt, seed=len(name) + 1)
    with np.errstate(over="ignore"):
        inputs = [x64.astype(np.float32), x64]
        if fmt.bits <= 8:
            inputs.append(x64.astype(np.float16))
    deep = _deep_low(fmt, np.random.default_rng(len(name)), 60_000)
    monkeypatch.setattr(_parallel, "WORKERS", 1)  # one range: the block sequence as built
    for mode in ("stochastic", "stochastic_equal"):
        for seed, random_bits in ((3, None), (2**64 + 5, 1), (11, 9)):
            for overflow, subnormals in SWITCHES:
                kw = {"rounding": mode, "seed": seed, "random_bits": random_bits,
                      "overflow": overflow, "subnormals": subnormals}  # fmt: skip
                for x in inputs:
                    check(round_to, x, fmt, **kw)
                    check(encode, without_nan(x, fmt), fmt, **kw)
            check(round_to, deep, fmt, rounding=mode, seed=seed, random_bits=random_bits)
    with pl.use_backend("numpy"):  # the deep inputs do round up sometimes (the path is tested)
        up = round_to(np.abs(deep[:60_000]), fmt, rounding="stochastic", seed=3)
    assert 0 < np.count_nonzero(up) < 1000


@pytest.mark.parametrize(
    ("seed", "random_bits"), [(0, None), ((1 << 64) + 99, 3), ((1 << 128) - 1, 1), (8, 52)]
)
@pytest.mark.parametrize("mode", ["stochastic", "stochastic_equal"])
def test_stochastic_same_bits_as_numpy(mode: str, seed: int, random_bits: int | None) -> None:
    kw = {"rounding": mode, "seed": seed, "random_bits": random_bits}
    for name in ("e4m3", "e5m2", "bf16", "e2m1", "e8m0", "fp16"):
        fmt = pl.get_format(name)
        for x in (X32, X32.astype(np.float64), X16):
            check(round_to, x, fmt, **kw)
            check(encode, without_nan(x, fmt), fmt, **kw)
    check(round_to, X32, pl.get_format("int8"), **kw)
    check(round_to, _random_near(3000, -10, 10, 8, float), WIDE_FLOATS["fp32"], **kw)


@pytest.mark.parametrize("chunk", [1, 999, 1 << 12, 1 << 20])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_stochastic_independent_of_chunks_and_threads(monkeypatch, chunk: int, workers: int):
    x = _random_near(50_001, -12, 10, 9, np.float32)
    x = x[:4001] if chunk == 1 else x
    with pl.use_backend("numpy"):
        want = round_to(x, "e4m3", rounding="sr", seed=42, random_bits=9)
        want_codes = encode(x, "e5m2", rounding="sr", seed=42)
    monkeypatch.setattr(native, "CHUNK", chunk)
    monkeypatch.setattr(_parallel, "WORKERS", workers)
    with pl.use_backend("native"):
        _same_bits(round_to(x, "e4m3", rounding="sr", seed=42, random_bits=9), want, "sr", x)
        _same_bits(encode(x, "e5m2", rounding="sr", seed=42), want_codes, "sr codes", x)


def _stochastic_blocks(fmt: FloatFormat, seed: int) -> np.ndarray:
    """Blocks of in-range values (some on the grid, some at ties) holding elements for the exact
    routine: a few (their random words recomputed one group each), many (the block's words
    generated in full, and the next block's before its addends), runs above the max (the overflow
    passes read the addends), NaN, ±inf, ±0 and inputs below the smallest normal."""
    rng = np.random.default_rng(seed)
    c = _class_samples(fmt, rng, 300)
    mid = c["mid"]
    grid = round_to(mid, fmt)
    c["grid"] = np.concatenate([grid, grid + 0.5 * fmt.ulp(grid), [0.0, -0.0]])
    c["nan"] = np.array([np.nan, np.inf, -np.inf])

    def block(base: str, **others: int) -> np.ndarray:
        b = rng.choice(c[base], BLOCK)
        for name, k in others.items():
            b[rng.choice(BLOCK, k, replace=False)] = rng.choice(c[name], k)
        return b

    seq = [block("mid", low=1, nan=1, over=1), block("mid", low=60, nan=9), block("mid", low=2)]
    seq += [block("grid", mid=300, low=1), block("over"), block("over")]
    seq += [block("over", mid=1, low=1, nan=1), block("over", mid=256), block("low")]
    seq += [block("mid", grid=200, over=3), block("mid", low=40)]
    return np.concatenate(seq)[: len(seq) * BLOCK - 333]


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "fp16"])
def test_stochastic_exact_routine_inside_fast_blocks(monkeypatch, name: str) -> None:
    """Stochastic rounding where the fast path's addends and the exact routine's full words meet
    (see _stochastic_blocks): the same bits as numpy for float32, float64 and float16 input,
    round_to and encode, seeds below 2**128, random_bits fewer and more than the bits dropped,
    chunks of odd sizes on 1 and 2 threads, and ranges starting inside a group of four words."""
    fmt = pl.get_format(name)
    x64 = _stochastic_blocks(fmt, seed=len(name))
    with np.errstate(over="ignore"):
        inputs = [x64.astype(np.float32), x64]
        if fmt.bits <= 8:
            inputs.append(x64.astype(np.float16))
    cases = [(0, None), (2**64 + 7, 5), (2**127 + 3, 13)]
    for mode in ("stochastic", "stochastic_equal"):
        for seed, random_bits in cases:
            kw = {"rounding": mode, "seed": seed, "random_bits": random_bits}
            for x in inputs:
                with pl.use_backend("numpy"):
                    want = round_to(x, fmt, **kw)
                    want_codes = encode(without_nan(x, fmt), fmt, **kw)
                for chunk, workers in ((BLOCK + 3, 1), (4001, 2)):
                    monkeypatch.setattr(native, "CHUNK", chunk)
                    monkeypatch.setattr(_parallel, "WORKERS", workers)
                    with pl.use_backend("native"):
                        what = f"{name} {kw} {x.dtype} chunk {chunk}"
                        _same_bits(round_to(x, fmt, **kw), want, what, x)
                        got_codes = encode(without_nan(x, fmt), fmt, **kw)
                        _same_bits(got_codes, want_codes, f"codes {what}", x)
                # one range [3, n - 2): it starts inside a group of four words
                bits = 64 if random_bits is None else random_bits
                got = np.zeros_like(x, dtype=want.dtype)
                native.ext.round_float(
                    x, x.itemsize, got, got.itemsize, format_args(fmt),
                    pl.rounding.ROUNDING_MODES.index(mode), 0, 0, seed & (2**64 - 1), seed >> 64,
                    bits, 3, x.size - 2,
                )  # fmt: skip
                _same_bits(got[3:-2], want[3:-2], f"{name} {kw} {x.dtype} range from 3", x[3:-2])


def _native_words(seed: int, n: int, start: int, random_bits: int) -> list[int]:
    out = np.empty(n, dtype=np.uint64)
    native.ext.random_words(out, seed & (2**64 - 1), seed >> 64, random_bits, start)
    return out.tolist()


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**128 - 1),
    start=st.one_of(st.integers(0, 40), st.integers(0, 2**62)),
    n=st.one_of(st.integers(0, 70), st.integers(0, 400)),
    random_bits=st.integers(1, 64),
)
def test_random_words_are_numpys_philox(seed: int, start: int, n: int, random_bits: int) -> None:
    """The words the rounding loops use (fill_words: round keys computed once, whole groups 32 at a
    time on AVX-512 and one at a time, the partial groups at both ends of a range) are numpy's
    Philox4x64-10 words of (seed, flat index), masked to their top random_bits bits."""
    keep = (2**64 - 1) ^ ((1 << (64 - random_bits)) - 1)
    want = [w & keep for w in random_words(seed, n, start).tolist()]
    assert _native_words(seed, n, start, random_bits) == want


def test_random_words_against_the_plain_python_philox() -> None:
    """Whole blocks at many counters and keys (counters past 2**32, keys with high bits set) equal
    the plain-Python Philox4x64-10, and a range longer than one native block (1024 words) starting
    inside a group equals numpy's words."""
    rng = np.random.default_rng(11)
    for _ in range(60):
        seed = int(rng.integers(0, 2**63)) * int(rng.integers(1, 2**63)) * 7 + int(rng.integers(9))
        seed %= 2**128
        group = int(rng.integers(0, 2**61)) >> int(rng.integers(0, 61))
        want = philox4x64((group, 0, 0, 0), (seed & (2**64 - 1), seed >> 64))
        assert _native_words(seed, 4, 4 * group, 64) == want, (seed, group)
    long = _native_words(2**64 + 3, 2 * native.ext.BLOCK + 5, 4097, 64)
    assert long == random_words(2**64 + 3, 2 * native.ext.BLOCK + 5, 4097).tolist()
    with pytest.raises(ValueError, match=r"random_bits must be in 1\.\.64, got 0"):
        _native_words(1, 4, 0, 0)


@pytest.mark.parametrize("path", [0, 1, 2], ids=["scalar", "avx2", "avx512"])
def test_every_generator_copy_gives_numpys_words(path: int) -> None:
    """Each copy of the whole-group generator (scalar MULX, AVX2 vectors beside MULX groups,
    AVX-512) that this build and CPU have gives numpy's Philox4x64-10 words, forced through
    random_words' path argument: ranges that start and end inside a group, shorter and longer
    than one loop of each copy (10 groups for AVX2, 32 for AVX-512), several native blocks, masked
    words, counters near 2**62 and seeds with high bits set. round_to uses the copy philox_paths()
    names (the other tests of this file check its stochastic results)."""
    have, auto = native.ext.philox_paths()
    assert 0 in have and auto == max(have)
    if path not in have:
        pytest.skip(f"generator copy {path} not in this build or CPU (have {have})")
    rng = np.random.default_rng(31)
    cases = [(1, 0, 40, 64), (2**64 + 3, 4097, 2 * native.ext.BLOCK + 5, 64), (5, 1, 999, 13)]
    cases += [(2**128 - 1, 2**62 + 2, 300, 64), (2**127 + 11, 3, 41, 1), (7, 6, 161, 64)]
    for _ in range(6):
        seed = int(rng.integers(0, 2**62)) * int(rng.integers(1, 2**62)) % 2**128
        start, n = int(rng.integers(0, 2**40)), int(rng.integers(0, 1500))
        cases.append((seed, start, n, int(rng.integers(1, 65))))
    for seed, start, n, bits in cases:
        keep = (2**64 - 1) ^ ((1 << (64 - bits)) - 1)
        want = [w & keep for w in random_words(seed, n, start).tolist()]
        out = np.empty(n, dtype=np.uint64)
        native.ext.random_words(out, seed & (2**64 - 1), seed >> 64, bits, start, path)
        assert out.tolist() == want, (path, seed, start, n, bits)
    with pytest.raises(ValueError, match=r"path must be -1 \(auto\) or a generator .* got 7"):
        native.ext.random_words(np.empty(4, dtype=np.uint64), 1, 0, 64, 0, 7)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_portable_build_gives_the_same_words(tmp_path) -> None:
    """core.cpp and its sibling units built as on other CPUs and compilers (no AVX-512 or AVX2
    path, no BMI2 copy, no __int128: the header's four-product fallback) give the same random
    words and stochastic results."""
    so = tmp_path / ("_native" + sysconfig.get_config_var("EXT_SUFFIX"))
    backends = Path(pl.__file__).parent / "backends"
    files = EXTENSIONS["precision_lab.backends._native"]
    units = [str(backends / f) for f in files if f.endswith(".cpp")]
    flags = ["-DPL_NO_AVX512", "-DPL_NO_AVX2", "-DPL_NO_CLONES", "-DPL_NO_INT128"]
    flags.append("-ffp-contract=off")
    include = f"-I{sysconfig.get_paths()['include']}"
    cmd = ["g++", "-std=c++17", "-O0", "-shared", "-fPIC", *flags, include, *units]
    subprocess.run([*cmd, "-o", str(so)], check=True, capture_output=True)
    spec = importlib.util.spec_from_file_location("portable._native", so)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.philox_paths() == ([0], 0)  # the scalar generator only
    for seed, start, n in [
        (2**64 + 3, 4097, 2 * mod.BLOCK + 5),
        (5, 1, 999),
        (2**128 - 1, 2**62, 300),
    ]:
        out = np.empty(n, dtype=np.uint64)
        mod.random_words(out, seed & (2**64 - 1), seed >> 64, 64, start)
        assert out.tolist() == random_words(seed, n, start).tolist(), (seed, start, n)
    seed = 2**70 + 5
    with pl.use_backend("numpy"):
        want = round_to(X32, "e4m3", rounding="stochastic", seed=seed)
    got = np.empty_like(X32)
    mode = pl.rounding.ROUNDING_MODES.index("stochastic")
    fmt = format_args(pl.get_format("e4m3"))
    mod.round_float(
        X32, 4, got, 4, fmt, mode, 0, 0, seed & (2**64 - 1), seed >> 64, 64, 3, X32.size
    )
    _same_bits(got[3:], want[3:], "portable build, stochastic", X32[3:])


# ----- decode -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SMALL_FLOATS))
def test_decode_every_code(name: str) -> None:
    fmt = SMALL_FLOATS[name]
    codes = np.arange(1 << fmt.bits, dtype=fmt.code_dtype)
    check(decode, codes, fmt)
    for dt in (np.int16, np.int32, np.uint32, np.int64, np.uint64):  # other code dtypes
        check(decode, codes.astype(dt), fmt)
    check(decode, codes[::-3], fmt)
    check(decode, codes.astype(">u4"), fmt)
    check(decode, np.array([1 << fmt.bits], dtype=np.uint32), fmt)  # out of range: same error
    check(decode, np.array([0, -1], dtype=np.int32), fmt)
    check(decode, np.array([0.0]), fmt)  # not integers: same TypeError


@pytest.mark.parametrize("fmt", [*WIDE_FLOATS.values(), *INTS], ids=str)
def test_decode_wide_and_integer_formats(fmt) -> None:
    rng = np.random.default_rng(10)
    codes = rng.integers(0, 1 << min(fmt.bits, 63), size=5000, dtype=np.uint64)
    codes = codes.astype(fmt.code_dtype)
    check(decode, codes, fmt)
    check(decode, codes.astype(np.int64), fmt)
    if fmt.bits < 64:
        check(decode, np.array([1 << fmt.bits], dtype=np.uint64), fmt)
        check(decode, np.array([-1], dtype=np.int64), fmt)


# ----- layouts ----------------------------------------------------------------------------------
def test_layouts_and_inputs_untouched() -> None:
    base = _random_near(6000, -12, 10, 11, np.float32).reshape(60, 100)
    cases = {
        "strided": base[::2, ::3],
        "transposed": base.T,
        "big-endian": base.astype(">f4"),
        "big-endian f64": base.astype(">f8")[:, ::2],
        "0-d": base[3, 4].copy().reshape(()),
        "empty": base[:0],
        "empty 2-d": np.empty((0, 5), dtype=np.float64),
        "float16 strided": base.astype(np.float16)[1::2],
        "scalar": float(base[0, 0]),
        "list": base[0, :5].tolist(),
    }
    for what, x in cases.items():
        if isinstance(x, np.ndarray):
            x.flags.writeable = False
            keep = x.copy()
        for fmt in ("e4m3", "bf16", "int8"):
            check(round_to, x, fmt, what)
            check(round_to, x, fmt, what, rounding="sr", seed=3)
            check(encode, x, fmt, what)
        codes = encode(x, "e4m3")
        check(decode, codes, "e4m3", what)
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, keep) and x.dtype == keep.dtype, what
    got = round_to(np.float32(1.3), "e4m3")
    assert got.shape == () and got.dtype == np.float32
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    codes.flags.writeable = False
    check(decode, codes.T, "e4m3")
    check(decode, codes[3, 4], "e4m3")


# ----- the dispatch layer -----------------------------------------------------------------------
def test_backend_info_reports_native() -> None:
    info = pl.backend_info()
    assert [info[op] for op in ("round_to", "encode", "decode")] == ["native"] * 3
    with pl.use_backend("numpy"):
        assert pl.backend_info()["encode"] == "numpy (selected by use_backend)"


@pytest.mark.skipif(
    os.environ.get(native.REQUIRE_ENV) != "1", reason=f"{native.REQUIRE_ENV}=1 not set"
)
def test_required_native_build_is_loaded() -> None:
    """`make test` sets PRECISION_LAB_REQUIRE_NATIVE=1: there the extension must serve."""
    assert native.ext is not None, native.WHY
    assert all(pl.backend_info()[op] == "native" for op in dispatch.OPERATIONS)


def test_backend_selection(monkeypatch) -> None:
    x = np.array([0.3, 1e5], dtype=np.float32)
    calls: list[str] = []
    monkeypatch.setattr(native, "round_to", lambda *a: calls.append("native"))
    round_to(x, "e4m3")
    assert calls == ["native"]
    monkeypatch.setenv(dispatch.BACKEND_ENV, "numpy")
    assert pl.backend_info()["round_to"] == f"numpy (selected by {dispatch.BACKEND_ENV})"
    assert round_to(x, "e4m3").tolist()[0] == 0.3125 and calls == ["native"]
    with pl.use_backend("native"):  # the context manager wins over the environment
        round_to(x, "e4m3")
    assert calls == ["native", "native"]
    monkeypatch.setenv(dispatch.BACKEND_ENV, "fast")
    with pytest.raises(ValueError, match="PRECISION_LAB_BACKEND must be one of"):
        round_to(x, "e4m3")
    with pytest.raises(ValueError, match="backend must be one of"), pl.use_backend("c++"):
        pass


def test_missing_or_stale_extension(monkeypatch) -> None:
    """Without the extension everything runs on numpy; selecting native says why it cannot."""
    monkeypatch.setattr(native, "ext", None)
    monkeypatch.setattr(native, "WHY", "extension not built (test)")
    assert pl.backend_info()["decode"] == "numpy (extension not built (test))"
    assert float(round_to(0.3, "e4m3")) == 0.3125
    with pytest.raises(RuntimeError, match="extension not built"), pl.use_backend("native"):
        round_to(0.3, "e4m3")
    # a stale build: the hash compiled in differs from the sources' hash
    monkeypatch.setattr(native, "source_hash", lambda files: "0123456789abcdef")
    mod, why = native.load("precision_lab.backends._native")
    assert mod is None and "stale" in why and "rebuild with: pip install -e ." in why
    monkeypatch.setenv(native.REQUIRE_ENV, "1")
    with pytest.raises(ImportError, match="stale"):
        native.load_or_warn("precision_lab.backends._native")
    monkeypatch.delenv(native.REQUIRE_ENV)
    with pytest.warns(RuntimeWarning, match="numpy reference serves instead"):
        native.load_or_warn("precision_lab.backends._native")


def test_fresh_build_matches_the_sources() -> None:
    assert native.ext is not None
    assert native.ext.SOURCE_HASH == native.source_hash(
        native.EXTENSIONS["precision_lab.backends._native"]
    )


def test_layers_are_enforced() -> None:
    """The import rules (a numpy core that never imports the backends; the dispatch above the
    native and CuPy backends) are import-linter contracts that `make test` runs: they are there."""
    cfg = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    contracts = cfg["tool"]["importlinter"]["contracts"]
    layers = {tuple(c.get("containers", ())): c["layers"] for c in contracts}
    assert layers[("precision_lab.backends",)] == ["dispatch", "native | gpu", "kernel_sources"]
    assert layers[("precision_lab",)][-2:] == ["backends", "core"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_mulhi64_without_int128(tmp_path) -> None:
    """The header's portable 64x64 -> high 64 product equals the __int128 one."""
    src = tmp_path / "t.cpp"
    src.write_text(
        '#include "pl_round.cuh"\n#include <stdio.h>\n'
        "int main() { pl_u64 x = 0x9E3779B97F4A7C15ULL, y = 1, bad = 0;\n"
        "  for (int i = 0; i < 200000; ++i) {\n"
        "    x = x * 6364136223846793005ULL + 1442695040888963407ULL;\n"
        "    y ^= x >> 17; y *= 0xD2E7470EE14C6C93ULL;\n"
        "    bad += pl_mulhi64(x, y) != (pl_u64)(((unsigned __int128)x * y) >> 64);\n"
        "    bad += pl_mulhi64(~0ULL, x) != (pl_u64)(((unsigned __int128)~0ULL * x) >> 64); }\n"
        '  printf("%llu\\n", bad); return 0; }\n'
    )
    exe = tmp_path / "t"
    cmd = ["g++", "-O1", "-DPL_NO_INT128", f"-I{CUDA_DIR}", str(src), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True)
    assert subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout == "0\n"


@pytest.mark.parametrize("fmt", ["bf16", "fp32", "e5m2", FloatFormat(8, 3)])
@pytest.mark.parametrize(
    "mode", ["nearest_even", "nearest_away", "toward_zero", "up", "down", "odd", "nearest_zero"]
)
def test_casts_ignore_the_callers_flush_to_zero(fmt, mode):
    """Flush-to-zero / denormals-are-zero left on by another library change no result: the fast
    paths below the smallest normal let the hardware round, so each call runs in the default
    environment (native/fpenv.h) and gives the caller's back."""
    rng = np.random.default_rng(11)
    # float32 subnormals and their neighbours (DAZ reads them as 0), spread over whole blocks
    x = (rng.standard_normal(5000) * 2.0**-130).astype(np.float32)
    x[::7] = rng.standard_normal(x[::7].size) * 2.0**-120
    with pl.use_backend("numpy"):
        want_r, want_c = pl.round_to(x, fmt, rounding=mode), pl.encode(x, fmt, rounding=mode)
    with ftz_daz(), _parallel.use_workers(1), pl.use_backend("native"):
        got_r, got_c = pl.round_to(x, fmt, rounding=mode), pl.encode(x, fmt, rounding=mode)
    assert np.array_equal(want_r.view(np.uint32), got_r.view(np.uint32))
    assert np.array_equal(want_c, got_c)


@pytest.mark.parametrize("block_format", ["mxfp8_e4m3", "mxfp4_e2m1", "fp8_1x128"])
def test_blocks_ignore_the_callers_flush_to_zero(block_format):
    """The same for the block kernels (their float32 path rounds with the FPU). Not NVFP4: its
    per-tensor scale is numpy float32 arithmetic in the calling thread, which follows the
    caller's environment on either backend, as all numpy code does."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((64, 128)) * 2.0**-127).astype(np.float32)  # mostly subnormal
    with pl.use_backend("numpy"):
        want = pl.round_to_blocks(x, block_format)
    with ftz_daz(), _parallel.use_workers(1), pl.use_backend("native"):
        got = pl.round_to_blocks(x, block_format)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    assert np.count_nonzero(want) > 1000


@pytest.mark.parametrize("name", ["_native", "_native_kernels"])
def test_type_stubs_name_what_the_extension_exports(name) -> None:
    """The .pyi stubs of the compiled extensions (mypy's view of them) list exactly the
    functions and constants the built module has, and each stub function takes the number of
    required positional arguments the module's own docstring names."""
    mod = importlib.import_module(f"precision_lab.backends.{name}")
    stub = Path(pl.__file__).parent / "backends" / f"{name}.pyi"
    tree = ast.parse(stub.read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    consts = {
        n.target.id
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    exported = {k for k in dir(mod) if not k.startswith("__")}
    assert set(funcs) | consts == exported
    for fname, node in funcs.items():
        assert callable(getattr(mod, fname))
        required = len(node.args.posonlyargs) - len(node.args.defaults)
        doc = getattr(mod, fname).__doc__ or ""
        if doc.startswith(f"{fname}(") and "..." not in doc.split(")")[0]:
            listed = [a for a in doc[len(fname) + 1 : doc.index(")")].split(",") if a.strip()]
            assert len(node.args.posonlyargs) == len(listed), (fname, listed)
        if required:  # one argument fewer than the stub requires: refused by the module
            with pytest.raises(TypeError):
                getattr(mod, fname)(*([0] * (required - 1)))
