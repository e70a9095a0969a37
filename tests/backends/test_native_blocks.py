"""The native block kernels (precision_lab/backends/native/blocks.inc) give the numpy reference's
bits.

tests/backends/test_native_kernels.py compares random and edge tensors in every layout; here the
float32 path of contiguous blocks (MX along the last axis, NVFP4: elements rounded in float32 bits,
nearest even by the FPU) is checked exhaustively: every finite float16 value as an element of a
block whose scale a fixed anchor sets, so every tie, subnormal and saturating element of each
format is met, under every deterministic rounding mode; and NVFP4's per-tensor amax pass, chunk
and tile boundaries, thread counts and the baseline instruction-set build.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import precision_lab as pl

native_kernels = importlib.import_module("precision_lab.backends.native.kernels")
blocks = importlib.import_module("precision_lab.quant.blocks")
block_layout = importlib.import_module("precision_lab.quant.block_layout")
parallel = importlib.import_module("precision_lab.core.pool")

pytestmark = pytest.mark.skipif(
    not native_kernels.available(), reason="precision_lab.backends._native_kernels is not built"
)
# the deterministic modes (the stochastic ones draw a fresh seed without one: seeded tests below)
MODES = [m for m in pl.ROUNDING_MODES if m not in pl.core.STOCHASTIC_MODES]
RNG = np.random.default_rng(20261203)


def bits(x: np.ndarray) -> np.ndarray:
    return x.view({4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def same(x, y) -> bool:
    if isinstance(x, np.ndarray):
        return x.dtype == y.dtype and x.shape == y.shape and np.array_equal(bits(x), bits(y))
    return (
        np.array_equal(x.codes, y.codes)
        and np.array_equal(x.scale_codes, y.scale_codes)
        and np.array_equal(bits(x.scales), bits(y.scales))
        and x.tensor_scale == y.tensor_scale
    )


def on_numpy(fn, *args, **kw):
    saved = native_kernels.ext
    native_kernels.ext = None
    try:
        return fn(*args, **kw)
    finally:
        native_kernels.ext = saved


def every_float16_in_blocks(n: int) -> np.ndarray:
    """Every finite float16 value (both zeros included), n - 1 per block after an anchor
    (65504, the largest) that fixes the block's scale; float32, shape (blocks * n,)."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    v = h[np.isfinite(h)].astype(np.float32)
    per = n - 1
    v = np.concatenate([v, np.zeros(-len(v) % per, np.float32)]).reshape(-1, per)
    anchor = np.where(np.arange(len(v)) % 2, 65504.0, -65504.0).astype(np.float32)[:, None]
    return np.concatenate([anchor, v], axis=1).reshape(-1)


FLOAT_PATH_FORMATS = [
    "mxfp8_e4m3",
    "mxfp8_e5m2",
    "mxfp6_e2m3",
    "mxfp6_e3m2",
    "mxfp4_e2m1",
    "nvfp4",
    pl.get_block_format("mxfp8_e4m3", scale_rule="ceil"),
    pl.get_block_format("mxfp4_e2m1", scale_rule="ceil"),
]


@pytest.mark.parametrize("bf", FLOAT_PATH_FORMATS, ids=str)
def test_every_float16_element_matches_numpy(bf):
    bf = pl.get_block_format(bf)
    x = every_float16_in_blocks(bf.block_size)
    for mode in MODES:
        for fn in (pl.round_to_blocks, pl.quantize_blocks):
            got = fn(x, bf, rounding=mode)
            assert same(got, on_numpy(fn, x, bf, rounding=mode)), (fn.__name__, mode)
    # stochastic rounding (blocks.inc: elems32, then fix32_sr_low below the normal range), full
    # and few random bits
    for mode, rbits in (("stochastic", None), ("stochastic", 3), ("stochastic_equal", None)):
        kw = {"rounding": mode, "seed": 2**70 + 3, "random_bits": rbits}
        for fn in (pl.round_to_blocks, pl.quantize_blocks):
            got = fn(x, bf, **kw)
            assert same(got, on_numpy(fn, x, bf, **kw)), (fn.__name__, mode, rbits)


@pytest.mark.parametrize("bf", FLOAT_PATH_FORMATS, ids=str)
def test_every_float16_element_along_a_leading_axis_matches_numpy(bf):
    """Blocks along axis 0 (side by side in memory: blocks.inc's range32_cols, in place): the
    numpy passes' bits under every mode, stochastic ones included (the same flat index), and
    the contiguous blocks' codes and scales, transposed, under the deterministic ones."""
    bf = pl.get_block_format(bf)
    flat = every_float16_in_blocks(bf.block_size).reshape(-1, bf.block_size)
    x = np.ascontiguousarray(flat.T)  # (block, blocks): block j is column j
    for mode in [*MODES, "stochastic", "stochastic_equal"]:
        kw = {"axis": 0, "rounding": mode, "seed": 7 if "stochastic" in mode else None}
        for fn in (pl.round_to_blocks, pl.quantize_blocks):
            got = fn(x, bf, **kw)
            assert same(got, on_numpy(fn, x, bf, **kw)), (fn.__name__, mode)
        if "stochastic" not in mode:
            q, r = (
                pl.quantize_blocks(x, bf, axis=0, rounding=mode),
                pl.quantize_blocks(flat, bf, rounding=mode),
            )
            assert np.array_equal(q.element_codes(), r.element_codes().T), mode
            assert np.array_equal(bits(q.scales), bits(r.scales.T)), mode


@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(
        np.float32,
        st.sampled_from([(256,), (3, 544), (4, 32)]),
        elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
    ),
    name=st.sampled_from(["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4", "mxfp6_e3m2"]),
    mode=st.sampled_from(MODES),
    scale=st.sampled_from([1.0, 2.0**-120, 2.0**100]),
)
def test_random_float32_blocks_match_numpy(x, name, mode, scale):
    """Random bit patterns (NaN, inf, subnormals, zeros) in tiles of blocks, also scaled towards
    the ends of float32's range (factors that are no normal float32, zero blocks)."""
    with np.errstate(over="ignore", under="ignore"):
        x = (x * np.float32(scale)).astype(np.float32)
    for fn in (pl.round_to_blocks, pl.quantize_blocks):
        assert same(fn(x, name, rounding=mode), on_numpy(fn, x, name, rounding=mode))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nvfp4_tensor_amax_skips_nan_and_infinite_blocks(dtype):
    """The per-tensor amax pass: the one-reduction path (every value finite) and the per-block
    one (a block with NaN or inf, or a float64 amax beyond FP32: 3.5e38 rounds to inf there,
    3.4e38 does not); an all-NaN tensor; zero and tiny blocks (block scale 0 or subnormal)."""
    base = RNG.standard_normal(16 * 40) * 300
    cases = [base.copy() for _ in range(5)]
    cases[1][37] = np.inf
    cases[2][70] = np.nan
    cases[2][200:216] = 0.0
    cases[2][300:316] *= 1e-9
    if dtype == np.float64:
        cases[3][100] = 3.5e38  # an infinity in FP32: its block is NaN, not counted
        cases[4][100] = 3.4e38  # finite in FP32: the tensor amax
    cases.append(np.full(64, np.nan))
    for x in cases:
        with np.errstate(over="ignore"):
            x = x.astype(dtype)
        for mode in ("nearest_even", "down", "nearest_zero"):
            for fn in (pl.round_to_blocks, pl.quantize_blocks):
                assert same(fn(x, "nvfp4", rounding=mode), on_numpy(fn, x, "nvfp4", rounding=mode))


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4", "mxfp4_e2m1"])
def test_chunks_tiles_and_threads_do_not_change_results(monkeypatch, name):
    """Chunks of a few blocks (partial tiles at every chunk's end), one or two threads: the
    same bits as numpy; an odd number of blocks in a tile boundary's neighbourhood."""
    x = (RNG.standard_normal((7, 32 * 53)) * 50).astype(np.float32)
    x[2, 100:132] = 0.0  # a zero block: the general path inside a tile
    x[5, 64] = np.nan
    ref = on_numpy(pl.round_to_blocks, x, name)
    assert same(pl.round_to_blocks(x, name), ref)
    for chunk in (32 * 3, 16 * 5, 32 * 300):
        monkeypatch.setattr(block_layout, "_CHUNK", chunk)
        for workers in (1, 2):
            with parallel.use_workers(workers):
                assert same(pl.round_to_blocks(x, name), ref), (chunk, workers)


@pytest.mark.parametrize("name", ["fp8_1x128", "nvfp4", "fp8_128x128"])
@pytest.mark.parametrize("rows", [1, 3])
def test_nan_blocks_of_the_amax_rule_are_positive_nan(name, rows):
    """A block holding -NaN (or a NaN payload) is +NaN throughout on both backends, whether the
    scale grid has one element (numpy's scalar loop) or more."""
    shape = (128 * rows, 128) if name == "fp8_128x128" else (rows, 128)
    for dtype, nan_bits in ((np.float32, 0xFFC00000), (np.float32, 0xFF800001), (np.float64, None)):
        x = np.zeros(shape, dtype)
        x[0, 0] = -np.nan
        if nan_bits is not None:
            x.view(np.uint32)[0, 0] = nan_bits
        got = pl.round_to_blocks(x, name)
        assert same(got, on_numpy(pl.round_to_blocks, x, name))
        block = (
            got[:128, :128] if name == "fp8_128x128" else got[0, : (16 if name == "nvfp4" else 128)]
        )
        assert np.isnan(block).all() and np.isnan(got).sum() == block.size
        assert not np.signbit(got[np.isnan(got)]).any()


SR_CASES = [
    ("mxfp8_e4m3", -1, np.float32),
    ("mxfp4_e2m1", 0, np.float32),
    ("nvfp4", -1, np.float32),
    ("nvfp4", 0, np.float64),
    ("mxint8", -1, np.float32),
    ("mxfp6_e3m2", -1, np.float64),
    ("fp8_1x128", -1, np.float32),
    ("fp8_128x128", -2, np.float32),
]


@pytest.mark.parametrize(("name", "axis", "dtype"), SR_CASES)
@pytest.mark.parametrize("mode", ["stochastic", "stochastic_equal"])
def test_stochastic_rounding_matches_numpy_across_chunks_and_threads(
    monkeypatch, name, axis, dtype, mode
):
    """Native stochastic rounding (float32 fast path, float64 and strided blocks, NaN, zero and
    tiny blocks, fewer random bits) equals numpy's for every chunk size and thread count."""
    x = (RNG.standard_normal((128, 384)) * 30).astype(dtype)
    x[1, 5], x[3, 9] = np.nan, -np.inf
    x[4, 32:64] = 0.0
    x[6, :160] *= 1e-30
    for rbits in (None, 7):
        kw = {"axis": axis, "rounding": mode, "seed": 2**100 + 11, "random_bits": rbits}
        for fn in (pl.round_to_blocks, pl.quantize_blocks):
            ref = on_numpy(fn, x, name, **kw)
            for chunk, workers in ((1 << 18, 2), (16 * 7, 2), (16 * 7, 1)):
                monkeypatch.setattr(block_layout, "_CHUNK", chunk)
                with parallel.use_workers(workers):
                    assert same(fn(x, name, **kw), ref), (fn.__name__, rbits, chunk, workers)


def test_stochastic_rounding_of_padded_blocks_stays_on_numpy():
    """Padding moves elements off x's flat index: those calls run numpy (and say so)."""
    x = (RNG.standard_normal((3, 50)) * 10).astype(np.float32)
    got = pl.round_to_blocks(x, "mxfp8_e4m3", rounding="stochastic", seed=3, pad=True)
    ref = on_numpy(pl.round_to_blocks, x, "mxfp8_e4m3", rounding="stochastic", seed=3, pad=True)
    assert same(got, ref)
    assert "padded" in pl.backend_info()["round_to_blocks"]


_BASELINE_SCRIPT = """
import importlib, sys
sys.path.insert(0, {tests!r})
import numpy as np
nk = importlib.import_module("precision_lab.backends.native.kernels")
assert nk.isa() == "baseline", nk.isa()
import test_native_blocks as t
for bf in t.FLOAT_PATH_FORMATS:
    bf = t.pl.get_block_format(bf)
    x = t.every_float16_in_blocks(bf.block_size)
    for mode in t.MODES:
        assert t.same(t.pl.round_to_blocks(x, bf, rounding=mode),
                      t.on_numpy(t.pl.round_to_blocks, x, bf, rounding=mode)), (bf, mode)
    kw = dict(rounding="stochastic", seed=5)
    assert t.same(t.pl.round_to_blocks(x, bf, **kw), t.on_numpy(t.pl.round_to_blocks, x, bf, **kw))
print("ok")
"""


def test_baseline_instruction_set_build_matches_numpy():
    """The kernels built without AVX2 (their float32 rounding has no vector trunc) agree too."""
    env = dict(os.environ, PRECISION_LAB_NATIVE_ISA="baseline")
    script = _BASELINE_SCRIPT.format(tests=os.path.dirname(__file__))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
