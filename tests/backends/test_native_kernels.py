"""The compiled kernels (precision_lab._native_kernels) give the numpy reference's bits.

The configuration matrices of tests/gemm/test_gemm.py and tests/gemm/test_tensor_core.py already
run on both CPU backends (tests/cpu_backends.py); here: the extension is built, random models and
edge values (inf, NaN, subnormal products, overflow, stochastic rounding, scales, batches) on both
backends, the baseline instruction-set build, and quantize/dequantize against numpy.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import precision_lab as pl

native_kernels = importlib.import_module("precision_lab.backends.native.kernels")
native_backend = importlib.import_module("precision_lab.gemm.native_backend")
quantization = importlib.import_module("precision_lab.quant.integer")

needs_native = pytest.mark.skipif(
    not native_kernels.available(), reason="precision_lab.backends._native_kernels is not built"
)


def _tc(*args, **kw):
    """A tensor-core preset with IEEE special-value rules (what the native kernels compile;
    the presets' NVIDIA rules run on the numpy reference for now)."""
    return pl.tensor_core(*args, **kw).replace(
        overflow="ieee", zeros_in_anchor=False, zero_sign="ieee", nan_encoding="quiet"
    )


RNG = np.random.default_rng(20261203)


def test_extension_is_built():
    """The build on a machine with a C++ compiler must produce and load the kernels."""
    if os.environ.get("PRECISION_LAB_REQUIRE_NATIVE") != "1":
        pytest.skip("the build is required only with PRECISION_LAB_REQUIRE_NATIVE=1 (make test)")
    assert native_kernels.available(), "precision_lab._native_kernels failed to build or load"
    assert native_kernels.isa() in ("avx2+fma, avx512f gemm", "avx2+fma", "baseline")


def same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize]
    return bool(np.array_equal(x.view(u), y.view(u)))


def both_gemm(*args, **kw) -> tuple[np.ndarray, np.ndarray]:
    return (
        pl.gemm(*args, backend="numpy", **kw),
        pl.gemm(*args, backend="native", **kw),
    )


def inputs(fmt: str, m: int, k: int, n: int, spread: float = 1.0):
    a = pl.round_to(RNG.standard_normal((m, k)) * spread, fmt).astype(np.float64)
    b = pl.round_to(RNG.standard_normal((k, n)) * spread, fmt).astype(np.float64)
    return a, b


MODELS = [
    pl.Accumulator("bf16"),
    pl.Accumulator("fp16", rounding="toward_zero", promote_every=16),
    pl.Accumulator("fp16", rounding="odd", subnormals="flush"),
    pl.Accumulator("e5m2", rounding="nearest_away", overflow="saturate"),
    pl.Accumulator("e4m3", rounding="up"),
    pl.Accumulator("fp32", rounding="down"),
    pl.Accumulator("fp32"),
    pl.Accumulator("bf16", rounding="nearest_zero"),  # was rounded to odd by the tile kernels
    pl.Accumulator("e4m3", rounding="nearest_zero", overflow="saturate"),
    pl.Accumulator("fp16", order="pairwise", rounding="nearest_zero"),
    pl.Accumulator("fp64"),
    pl.Accumulator("bf16", rounding="stochastic", seed=5, random_bits=8),
    pl.Accumulator("fp16", order="pairwise", rounding="stochastic", seed=3),
    pl.Accumulator("fp16", order="blocked", block=5, rounding="toward_zero"),
    pl.Accumulator("bf16", product_format="bf16", product_rounding="toward_zero"),
    _tc("h100", "e4m3"),
    _tc("h100", "e4m3").replace(promote_every=64),
    _tc("b200", "e4m3"),
    _tc("b200", "e4m3", out_format="fp16"),
    _tc("a100", "bf16"),
    _tc("v100", "fp16").replace(rounding="stochastic", seed=11),
    _tc("ada", "e4m3").replace(rounding="nearest_even", format="bf16"),
]


@needs_native
@pytest.mark.parametrize("acc", MODELS, ids=lambda a: a.describe()[:60])
@pytest.mark.parametrize("spread", [1.0, 1e-3, 300.0])
def test_random_models_match_numpy(acc, spread):
    fmt = "fp16" if acc.name and "v100" in acc.name else "e4m3"
    a, b = inputs(fmt, 5, 67, 37, spread)
    c = RNG.standard_normal((5, 37)) * spread
    out = "fp16" if isinstance(acc.format, pl.FloatFormat) and acc.format.bits <= 16 else "fp32"
    x, y = both_gemm(a, b, c, input_format=fmt, accumulator=acc, out_format=out)
    assert same_bits(x, y)


@needs_native
@pytest.mark.parametrize(
    "acc", [pl.Accumulator("bf16"), _tc("h100", "e4m3"), pl.Accumulator("fp32")]
)
def test_special_values_match_numpy(acc):
    a, b = inputs("e4m3", 6, 40, 9)
    c = RNG.standard_normal((6, 9))
    a[0, 3], a[1, 5], b[7, 2], b[9, 4] = np.inf, np.nan, -np.inf, 0.0
    a[2, 9] = np.inf  # inf * 0 in column 4
    c[3, 3], c[4, 4] = -np.inf, np.nan
    a[5] *= 2.0**-14  # subnormal-range products
    x, y = both_gemm(a, b, c, input_format="e4m3", accumulator=acc)
    assert same_bits(x, y)


@needs_native
def test_overflow_in_the_accumulator_matches_numpy():
    a = np.full((2, 64), 448.0)
    b = np.full((64, 3), 448.0)
    for acc in (pl.Accumulator("fp16"), pl.Accumulator("fp16", overflow="saturate")):
        x, y = both_gemm(a, b, input_format="e4m3", accumulator=acc, out_format="fp16")
        assert same_bits(x, y)


@needs_native
def test_scales_batches_and_input_rounding_match_numpy():
    a = RNG.standard_normal((2, 1, 6, 256))
    b = RNG.standard_normal((3, 256, 5))
    sa = RNG.uniform(0.5, 2, (2, 1, 6, 2))
    sb = RNG.uniform(0.5, 2, (3, 2, 5))
    for acc in (pl.Accumulator("bf16", promote_every=64), _tc("h100", "e4m3")):
        x, y = both_gemm(
            a, b, input_format="e4m3", accumulator=acc, scale_a=sa, scale_b=sb, scale_block=128
        )
        assert same_bits(x, y)
    acc = pl.Accumulator("fp16", seed=4)
    x, y = both_gemm(a, b, input_format="e5m2", accumulator=acc, input_rounding="stochastic")
    assert same_bits(x, y)


@needs_native
def test_auto_uses_native_and_falls_back_for_blas():
    acc = pl.Accumulator("bf16")
    assert native_backend.covers(acc) and native_backend.covers(_tc("b200", "e4m3"))
    assert not native_backend.covers(pl.Accumulator(order="blas"))
    a, b = inputs("e4m3", 3, 8, 4)
    x = pl.gemm(a, b, input_format="e4m3", accumulator=pl.Accumulator(order="blas"))
    y = pl.gemm(
        a, b, input_format="e4m3", accumulator=pl.Accumulator(order="blas"), backend="native"
    )
    assert same_bits(x, y)


_BASELINE_SCRIPT = """
import numpy as np, precision_lab as pl, importlib
assert importlib.import_module("precision_lab.backends.native.kernels").isa() == "baseline"
rng = np.random.default_rng(1)
a = pl.round_to(rng.standard_normal((7, 50)), "e4m3")
b = pl.round_to(rng.standard_normal((50, 19)), "e4m3")
accs = [pl.Accumulator("fp32"), pl.Accumulator("bf16", rounding="odd")]
ieee = dict(overflow="ieee", zeros_in_anchor=False, zero_sign="ieee", nan_encoding="quiet")
for acc in accs + [pl.tensor_core("b200", "e4m3").replace(**ieee)]:
    x = pl.gemm(a, b, input_format="e4m3", accumulator=acc, backend="numpy")
    y = pl.gemm(a, b, input_format="e4m3", accumulator=acc, backend="native")
    assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), acc
x = (rng.standard_normal((9, 33)) * 50).astype(np.float32)
q = pl.quantize(x, "int8", np.linspace(0.1, 1, 9), axis=0)
qm = importlib.import_module("precision_lab.quant.integer")
nk = importlib.import_module("precision_lab.backends.native.kernels"); nk.ext = None
assert np.array_equal(q, pl.quantize(x, "int8", np.linspace(0.1, 1, 9), axis=0))
print("ok")
"""


@needs_native
def test_baseline_instruction_set_build_matches_numpy():
    """The kernels built without AVX2 (what a CPU without it runs) give the same bits."""
    env = dict(os.environ, PRECISION_LAB_NATIVE_ISA="baseline")
    r = subprocess.run(
        [sys.executable, "-c", _BASELINE_SCRIPT], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ----- quantize / dequantize -------------------------------------------------------------------
def numpy_only(monkeypatch: pytest.MonkeyPatch, fn, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(native_kernels, "ext", None)
        return fn(*args, **kw)


MODES = ["nearest_even", "nearest_away", "toward_zero", "up", "down", "odd"]
EDGES = np.array(
    [0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 1e-310, 5e-324, 1e300, -1e300, 3.4e38, 0.35,
     0.25, -0.25, 0.05, 0.15, 2.5, -2.5, 127.5, -128.5, 0.5, -0.5]
)  # fmt: skip


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", [*MODES, "nearest_zero"])
@pytest.mark.parametrize(
    ("fmt", "scale", "axis", "zp"),
    [
        ("int8", 0.1, None, 0),
        ("uint8", 2.0**-6, None, 128),
        ("int4", np.float32(0.0173), None, -2),
        (pl.formats.IntFormat(16, True, "int16"), 1e-300, None, 0),
        (pl.formats.IntFormat(32, False, "uint32"), 0.37, None, 7),
        ("int8", 1e300, None, 0),
        ("int8", np.array([0.1, 0.2, 0.3, 1 / 3]), 1, np.array([0, 1, -2, 3])),
        ("int8", np.array([0.1, 0.5, 0.25], dtype=np.float32), 0, 0),
        ("int8", np.array([0.01, 3.0, 1 / 3]), -1, 0),
    ],
)
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # numpy, torch division
def test_quantize_matches_numpy(monkeypatch, dtype, mode, fmt, scale, axis, zp):
    shape = {None: (5, 4, 3), 1: (5, 4, 3), 0: (3, 4, 7), -1: (2, 5, 3)}[axis]
    x = (RNG.standard_normal(shape) * RNG.choice([1, 10, 1000], shape)).astype(dtype)
    with np.errstate(over="ignore"):
        x.flat[: len(EDGES)] = EDGES[: x.size].astype(dtype)
    for division in ("exact", "torch"):
        kw = {"axis": axis, "rounding": mode, "division": division}
        q = pl.quantize(x, fmt, scale, zp, **kw)
        assert np.array_equal(q, numpy_only(monkeypatch, pl.quantize, x, fmt, scale, zp, **kw))
        assert q.dtype == numpy_only(monkeypatch, pl.quantize, x, fmt, scale, zp, **kw).dtype
    with np.errstate(over="ignore"):
        s32 = np.float32(scale) if np.ndim(scale) == 0 else scale.astype(np.float32)
    for s in (scale, s32):
        if not np.all((np.asarray(s) > 0) & np.isfinite(np.asarray(s))):
            continue
        d = pl.dequantize(q, s, zp, axis=axis)
        assert same_bits(d, numpy_only(monkeypatch, pl.dequantize, q, s, zp, axis=axis))


@needs_native
def test_quantize_nan_raises_and_wide_formats_saturate_first():
    with pytest.raises(ValueError, match="x contains NaN"):
        pl.quantize(np.array([1.0, np.nan], dtype=np.float32), "int8", 0.1)
    # int32: the quotient saturates to int32 before the zero point is added
    fmt = pl.formats.IntFormat(32, True, "int32")
    assert pl.quantize(np.array([-np.inf, 3.0]), fmt, 2.0**-6, 3).tolist() == [-(2**31) + 3, 195]


@needs_native
@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(
        st.sampled_from([np.float32, np.float64]),
        hnp.array_shapes(min_dims=2, max_dims=2, max_side=9),
        elements={"allow_nan": False},
    ),
    scale=st.floats(1e-6, 1e3),
    mode=st.sampled_from(MODES),
    per_channel=st.booleans(),
)
def test_quantize_hypothesis(x, scale, mode, per_channel):
    axis = 1 if per_channel else None
    s = np.linspace(scale, 2 * scale, x.shape[1]) if per_channel else scale
    q = pl.quantize(x, "int8", s, axis=axis, rounding=mode)
    saved = native_kernels.ext
    native_kernels.ext = None
    try:
        ref = pl.quantize(x, "int8", s, axis=axis, rounding=mode)
        dref = pl.dequantize(ref, s, axis=axis)
    finally:
        native_kernels.ext = saved
    assert np.array_equal(q, ref)
    assert same_bits(pl.dequantize(q, s, axis=axis), dref)


def _near_critical_rows(scales: np.ndarray, width: int, dtype: type) -> np.ndarray:
    """Rows of ``width`` values for the scales: random ones (the first tiles of a row, so the fast
    nearest-even pass decides them) and, further on, exact quotients k/2 (ties, integers), their
    neighbours one step up and down in ``dtype``, zeros, infinities and huge quotients (tiles
    the kernel hands to the exact path)."""
    rows = []
    for s in scales.astype(np.float64):
        k = RNG.integers(-300, 300, width // 4) / 2
        near = (k * s).astype(dtype)
        special = np.array([0.0, -0.0, np.inf, -np.inf, 2.0**45 * s, -(2.0**45) * s], dtype)
        rest = np.concatenate(
            [near, np.nextafter(near, dtype(np.inf)), np.nextafter(near, dtype(-np.inf)), special]
        )
        rand = (RNG.standard_normal(width - rest.size) * 100 * s).astype(dtype)
        rows.append(np.concatenate([rand, rest]))
    return np.stack(rows)


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["rows", "columns", "tensor"])
@pytest.mark.parametrize(
    ("fmt", "zp"), [("int8", 0), ("uint8", 100), (pl.formats.IntFormat(16, True, "int16"), -7)]
)
def test_quantize_nearest_even_fast_pass_near_ties(monkeypatch, dtype, layout, fmt, zp):
    """quant.inc's one-pass nearest_even tiles (q = x * (1/s) in float32 lanes, then float64
    lanes, kept only away from multiples of 1/2) give the exact path's codes, and the Fraction
    referee's where quotients are ties."""
    scales = np.array([3 * 2.0**-7, 0.75, 2.0**-6, np.float32(0.0173), 0.1, 1e-300])
    x = _near_critical_rows(scales, 1800, dtype)  # 4 tiles of random values first per row
    if layout == "columns":  # channels along the last axis: one scale per element of a row
        scales = scales[:-1]  # (a tile with a scale below 2**-400 takes the exact path)
        x, axis = np.ascontiguousarray(x[:-1].T), 1
    else:
        axis = 0 if layout == "rows" else None
    s = scales if axis is not None else np.float64(scales[0])
    with np.errstate(over="ignore", invalid="ignore"):
        q = pl.quantize(x, fmt, s, zp, axis=axis)
        ref = numpy_only(monkeypatch, pl.quantize, x, fmt, s, zp, axis=axis)
    assert np.array_equal(q, ref)
    lo, hi = quantization.qrange(fmt)
    sb = np.broadcast_to(
        s if axis is None else s.reshape((-1, 1) if axis == 0 else (1, -1)), x.shape
    )
    for i in RNG.choice(np.flatnonzero(np.isfinite(x) & (sb > 1e-200)), 400, replace=False):
        v = Fraction(float(x.flat[i])) / Fraction(float(sb.flat[i]))
        assert int(q.flat[i]) == min(max(round(v) + zp, lo), hi)  # round(): half to even


def test_numpy_path_where_native_does_not_apply(monkeypatch):
    """Stochastic rounding, float16 and strided inputs take the numpy path (same results)."""
    x = (RNG.standard_normal((6, 8)) * 10).astype(np.float16)
    q = pl.quantize(x, "int8", 0.1, rounding="stochastic", seed=3)
    assert np.array_equal(
        q, numpy_only(monkeypatch, pl.quantize, x, "int8", 0.1, rounding="stochastic", seed=3)
    )
    y = (RNG.standard_normal((6, 8)) * 10)[:, ::2]
    assert np.array_equal(
        pl.quantize(y, "int8", 0.1), numpy_only(monkeypatch, pl.quantize, y, "int8", 0.1)
    )


# ----- block formats ---------------------------------------------------------------------------
BLOCK_EDGES = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-310, 5e-324, 1e300, -1e300, 3.4e38,
     -3.4e38, 448.0, 500.0, 6.0, 7.0, 1e-40, 2.0**-133, 2.0**-127]
)  # fmt: skip


def same_blocks(x, y) -> bool:
    if isinstance(x, np.ndarray):
        return same_bits(x, y)
    return (
        np.array_equal(x.codes, y.codes)
        and np.array_equal(x.scale_codes, y.scale_codes)
        and np.array_equal(x.scales, y.scales, equal_nan=True)
        and x.tensor_scale == y.tensor_scale
    )


BLOCK_FORMATS = [
    *pl.blocks.known_block_formats(),
    pl.get_block_format("mxfp8_e4m3", scale_rule="ceil"),
    pl.get_block_format("mxint8", scale_rule="ceil"),
]


@needs_native
@pytest.mark.parametrize("bf", BLOCK_FORMATS, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("magnitude", [100.0, 1e-30, 1e30, "edges"])
def test_blocks_match_numpy(monkeypatch, bf, dtype, magnitude):
    bf = pl.get_block_format(bf)
    layouts = (
        [(-1, (256, 256)), (-2, (128, 384))]
        if len(bf.block_shape) == 2
        else [(-1, (4, 256)), (0, (256, 6)), (1, (3, 256, 2)), (-1, (3, 100))]
    )
    for axis, shape in layouts:
        x = RNG.standard_normal(shape) * (1.0 if magnitude == "edges" else magnitude)
        if magnitude == "edges":
            idx = RNG.choice(x.size, 60)
            x.flat[idx] = RNG.choice(BLOCK_EDGES, 60)
        with np.errstate(over="ignore"):
            x = x.astype(dtype)
        for mode in MODES:
            for fn in (pl.round_to_blocks, pl.quantize_blocks):
                kw = {"axis": axis, "rounding": mode, "pad": True}
                got = fn(x, bf, **kw)
                assert same_blocks(got, numpy_only(monkeypatch, fn, x, bf, **kw)), (fn, axis, mode)


@needs_native
@pytest.mark.parametrize("bits", [0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7FA00000, 0xFFC00000])
@pytest.mark.parametrize("name", ["mxint8", "mxfp8_e4m3", "nvfp4"])
def test_blocks_nan_payloads_match_numpy(bits, name):
    """A NaN with a payload (or signalling) in a block: the integer elements' rounding gave
    the payload back (0x7fc00001 for 0x7f800001) where round_to gives the canonical +NaN."""
    x = np.ones(64, np.float32)
    x.view(np.uint32)[0] = bits
    got = pl.round_to_blocks(x, name, pad=True)
    saved = native_kernels.ext
    native_kernels.ext = None
    try:
        ref = pl.round_to_blocks(x, name, pad=True)
    finally:
        native_kernels.ext = saved
    assert same_bits(got, ref)


@needs_native
@settings(max_examples=40, deadline=None)
@given(
    x=hnp.arrays(np.float32, st.sampled_from([(64,), (2, 96), (3, 32)])),
    name=st.sampled_from(["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4", "mxint8", "fp8_1x128"]),
    mode=st.sampled_from(MODES),
)
def test_blocks_hypothesis(x, name, mode):
    got = pl.round_to_blocks(x, name, rounding=mode, pad=True)
    saved = native_kernels.ext
    native_kernels.ext = None
    try:
        ref = pl.round_to_blocks(x, name, rounding=mode, pad=True)
    finally:
        native_kernels.ext = saved
    assert same_bits(got, ref)


@needs_native
@pytest.mark.parametrize("shape", [(4, 64), (64, 4)])
def test_nan_blocks_next_to_unrepresentable_scales(monkeypatch, shape):
    """An all-zero block (scale 2**-127: the factor 2**133 is no float32) beside a NaN block
    takes numpy's ldexp branch, where the NaN block is +NaN whatever the NaN's sign."""
    bf = pl.BlockFormat("e4m3_k64", "e4m3", "e8m0", (32,), "floor", element_exponent=-6)
    x = np.zeros(shape, dtype=np.float32)
    axis = -1 if shape[0] == 4 else 0
    x[(1, 3) if axis == -1 else (3, 1)] = -np.nan
    x[(2, 5) if axis == -1 else (5, 2)] = 1.5
    for fn in (pl.round_to_blocks, pl.quantize_blocks):
        got = fn(x, bf, axis=axis)
        assert same_blocks(got, numpy_only(monkeypatch, fn, x, bf, axis=axis))


_MULHI_PROGRAM = """
#include <stdio.h>
#include "pl_round.cuh"
int main() {
  unsigned long long s = 88172645463325252ULL;
  for (int i = 0; i < 200; ++i) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    unsigned long long a = s;
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    printf("%llu %llu %llu\\n", a, s, pl_mulhi64(a, s));
  }
  unsigned long long w[4];
  pl_random_group(3, 5, 7, 64, w);
  printf("%llu %llu %llu %llu\\n", w[0], w[1], w[2], w[3]);
  return 0;
}
"""


def test_header_without_int128(tmp_path):
    """pl_round.cuh's portable 64x64-bit high product (compilers without __int128) and the
    Philox words it gives."""
    import shutil
    from pathlib import Path

    from precision_lab.core.random_words import random_words

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "mulhi.cpp"
    src.write_text(_MULHI_PROGRAM)
    cuda = Path(pl.__file__).parent / "backends" / "cuda"
    exe = tmp_path / "mulhi"
    subprocess.run(
        [cxx, "-O1", "-U__SIZEOF_INT128__", f"-I{cuda}", str(src), "-o", str(exe)], check=True
    )
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split(
        "\n"
    )
    for line in lines[:200]:
        a, b, hi = (int(v) for v in line.split())
        assert hi == (a * b) >> 64
    words = [int(v) for v in lines[200].split()]
    assert words == random_words(5 + (7 << 64), 4, 12).tolist()
