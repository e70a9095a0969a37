"""The fp32 FMA kernel's packs put float32 inputs on their formats' grids (grid32 in fma32.inc).

``fma32_pack`` (B) and ``gemm_fma32`` (A, packed per row chunk) round float32 inputs as they
copy them; the oracle is the numpy reference of the rounding core (``round_to`` under
``use_backend("numpy")``), element by element, on adversarial values: every float16 bit pattern
widened (ties of the narrow formats, their subnormals, values beyond their max, inf, NaN, -0),
float32 ties of bf16/fp16, the overflow threshold and its neighbours, float32 subnormals, NaN
payloads and random bit patterns. With ``check`` (``input_rounding="exact"``) the packs keep the
input and count the elements that rounding would change.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools

import numpy as np
import pytest
from fpenv import ftz_daz

import precision_lab as pl
from precision_lab.backends.kernel_sources import format_args
from precision_lab.core.pool import use_workers
from precision_lab.core.rounding import ROUNDING_MODES
from precision_lab.gemm.cupy_backend import kernel_plan

native_kernels = importlib.import_module("precision_lab.backends.native.kernels")
native_backend = importlib.import_module("precision_lab.gemm.native_backend")

pytestmark = pytest.mark.skipif(
    not native_kernels.available(), reason="precision_lab.backends._native_kernels is not built"
)
ext = native_kernels.ext
FP32 = pl.Accumulator("fp32")
FORMATS = ["e4m3", "e5m2", "e2m1", "e3m2", "e4m3fnuz", "bf16", "fp16", "fp32", "e8m0"]
MODES = ["nearest_even", "nearest_away", "toward_zero", "up", "down", "odd", "nearest_zero"]


def adversarial(fmt: pl.FloatFormat) -> np.ndarray:
    """float32 values around every edge of ``fmt``'s grid (see the module docstring)."""
    rng = np.random.default_rng(fmt.exponent_bits * 100 + fmt.mantissa_bits)
    half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    parts = [half.astype(np.float32)]
    top = np.float32(min(float(fmt.max), float(np.finfo(np.float32).max)))
    s = 23 - fmt.mantissa_bits
    if s > 0:  # the overflow threshold (max + half its quantum) and float32 ties of the format
        over = top.view(np.uint32) + np.uint32(1 << (s - 1))
        u = rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32)
        ties = (u & ~np.uint32((1 << s) - 1)) | np.uint32(1 << (s - 1))
        parts += [np.array([over - 1, over, over + 1], np.uint32).view(np.float32)]
        parts += [ties.view(np.float32), (ties + 1).view(np.float32), (ties - 1).view(np.float32)]
    tiny = np.float32(fmt.smallest_subnormal) if fmt.has_subnormals else np.float32(2.0**-149)
    edges = [top, np.nextafter(top, np.float32(0)), tiny, tiny / 2, tiny * 1.5, tiny * 0.75]
    edges += [np.float32(2.0**-149), np.float32(3 * 2.0**-140), np.finfo(np.float32).tiny]
    parts += [np.array(edges, np.float32), -np.array(edges, np.float32)]
    nans = np.array([0x7FC00001, 0xFFA00000, 0x7F800001, 0xFFFFFFFF], np.uint32)
    parts += [nans.view(np.float32), rng.integers(0, 1 << 32, 8000, np.uint64).astype(np.uint32)]
    parts[-1] = parts[-1].view(np.float32)
    return np.concatenate(parts)


def reference(x: np.ndarray, fmt: pl.FloatFormat, mode: str) -> np.ndarray:
    with pl.use_backend("numpy"), np.errstate(all="ignore"):
        return np.asarray(pl.round_to(x, fmt, rounding=mode), np.float32)


def same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bits, NaN for NaN (a NaN input sends the GEMM to the general path anyway)."""
    nan = np.isnan(want)
    return bool(
        np.array_equal(nan, np.isnan(got))
        and np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    )


def grid_of(x: np.ndarray, fmt: pl.FloatFormat, mode: str) -> np.ndarray:
    """The packs' grid spec of ``fmt`` and ``mode`` (what ``_packed_input`` passes; for fp32,
    which it skips, the same spec built here, so the kernel's fp32 grid stays tested)."""
    spec = native_backend._packed_input(x, fmt, mode, 0)
    assert spec is not None
    if spec[1] is None:
        assert fmt.name == "fp32" and mode != "exact"
        return np.array([*format_args(fmt), ROUNDING_MODES.index(mode), 0], np.int32)
    return spec[1]


@pytest.mark.parametrize("mode", MODES)
def test_float32_inputs_skip_the_fp32_grid(mode):
    """fp32 needs no pass over float32 input: every float32 but NaN is on its grid in every
    mode (a NaN makes the kernel's output non-finite, and the call goes to the general path)."""
    fmt = pl.get_format("fp32")
    x = adversarial(fmt)
    spec = native_backend._packed_input(x, fmt, mode, 0)
    assert spec is not None and spec[0] is x and spec[1] is None
    assert same(reference(x, fmt, mode), x)
    assert native_backend._packed_input(x, fmt, "exact", 0)[1] is not None  # (the check stays)


def pack(x: np.ndarray, grid: np.ndarray | None, n: int = 37, nb: int = 1) -> tuple:
    """``x`` as nb x K x n (padded) through fma32_pack in uneven panel ranges; returns the
    unpacked values and the count the pack reported."""
    nr = ext.fma32_tile()[1]
    k = -(-x.size // (nb * n))
    B = np.ones(nb * k * n, np.float32)  # (1 is on every grid: the padding is never counted)
    B[: x.size] = x
    B = B.reshape(nb, k, n)
    npan = -(-n // nr)
    Bp = np.full(nb * npan * k * nr, np.nan, np.float32)
    cuts = sorted({0, 1, npan + 1, nb * npan - 1, nb * npan} & set(range(nb * npan + 1)))
    count = sum(ext.fma32_pack(B, Bp, k, n, lo, hi, grid) for lo, hi in itertools.pairwise(cuts))
    out = Bp.reshape(nb, npan, k, nr).transpose(0, 2, 1, 3).reshape(nb, k, npan * nr)[:, :, :n]
    assert not np.any(out.view(np.uint32)[:, :, n:])  # (padding columns are +0)
    return out.reshape(-1)[: x.size], count


@pytest.mark.parametrize("name", FORMATS)
def test_pack_of_b_rounds_as_round_to(name):
    fmt = pl.get_format(name)
    x = adversarial(fmt)
    for mode in MODES:
        got, count = pack(x, grid_of(x, fmt, mode), nb=2)
        assert count == 0
        assert same(got, reference(x, fmt, mode)), (name, mode)
    got, count = pack(x, grid_of(x, fmt, "exact"))  # the check: x kept, misses counted
    assert np.array_equal(got.view(np.uint32), x.view(np.uint32))
    assert count == np.count_nonzero(~(reference(x, fmt, "nearest_even") == x))
    got, count = pack(x, None)  # no rounding: a copy
    assert count == 0 and np.array_equal(got.view(np.uint32), x.view(np.uint32))


def rows(x: np.ndarray, fmt: pl.FloatFormat, grid: np.ndarray) -> tuple[np.ndarray, int]:
    """A = x as a column, B = [[1]], C = -0: the fp32 FMA kernel's outputs are the packed A."""
    m = x.size
    plan = kernel_plan((m, 1), (1, 1), fa=fmt, fb=fmt, acc=FP32, out_fmt=pl.get_format("fp32"),
                       has_c=True, has_special=False, scales=None)  # fmt: skip
    nr = ext.fma32_tile()[1]
    Bp = np.zeros(nr, np.float32)
    Bp[0] = 1.0
    C = np.full((1, m, 1), -0.0, np.float32)
    D = np.empty((1, m, 1), np.float32)
    cut = (m // 3) | 1  # (a chunk that starts inside a register tile)
    bad = ext.gemm_fma32(plan.params, x.reshape(1, m, 1), Bp, C, D, 1, 0, cut, grid)
    bad += ext.gemm_fma32(plan.params, x.reshape(1, m, 1), Bp, C, D, 1, cut, m, grid)
    return D.reshape(-1), bad


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e3m2", "e4m3fnuz", "bf16", "fp32"])
def test_pack_of_a_rounds_as_round_to(name):
    fmt = pl.get_format(name)
    x = adversarial(fmt)
    for mode in MODES:
        want = reference(x, fmt, mode)
        got, bad = rows(x, fmt, grid_of(x, fmt, mode))
        assert same(got, want), (name, mode)  # (d = round(a) * 1 + -0: every sign kept)
        assert bad == np.count_nonzero(~np.isfinite(want))
    got, bad = rows(x, fmt, grid_of(x, fmt, "exact"))
    assert same(got, x)
    misses = np.count_nonzero(~(reference(x, fmt, "nearest_even") == x))
    assert bad == misses + np.count_nonzero(~np.isfinite(x))  # (and the non-finite outputs)


def test_stochastic_modes_are_refused():
    x = np.ones(4, np.float32)
    spec = grid_of(x, pl.get_format("e4m3"), "nearest_even").copy()
    spec[5] = pl.rounding.ROUNDING_MODES.index("stochastic")
    with pytest.raises(ValueError, match="grid"):
        pack(x, spec)


@pytest.mark.parametrize("mode", [*MODES, "exact"])
def test_gemm_on_adversarial_inputs_equals_the_reference(mode):
    """End to end: ties, subnormals, -0, values beyond the max (e4m3: NaN after rounding, the
    general path), batches broadcast, c = -0; thread counts; the caller's FTZ/DAZ."""
    rng = np.random.default_rng(len(mode))
    fmt = pl.get_format("e4m3")
    pool = adversarial(fmt)
    pool = pool[np.isfinite(pool) & (np.abs(pool) <= fmt.max) & (np.abs(pool) > 2.0**-30)]
    pool = np.concatenate([pool, [-0.0, 0.0, 0.5 * 2.0**-9, 1.5 * 2.0**-9]]).astype(np.float32)
    a = rng.choice(pool, (2, 29, 40))
    b = rng.choice(pool, (40, 45))
    if mode == "exact":
        a, b = reference(a, fmt, "rne"), reference(b, fmt, "rne")
    c = np.full((29, 45), -0.0)
    for beyond in (False, True):  # 500 > max: NaN in the nearest and outward modes
        if beyond:
            a[1, 3, 7] = 500.0 if mode != "exact" else np.nan
        ref = pl.gemm(a, b, c, input_format=fmt, input_rounding=mode, backend="numpy")
        for workers in (1, 2):
            with use_workers(workers):
                got = pl.gemm(a, b, c, input_format=fmt, input_rounding=mode, backend="native")
            assert np.array_equal(ref.view(np.uint32), got.view(np.uint32))
        fast = native_backend._fma32_gemm(a, b, c, fmt, fmt, FP32, pl.get_format("fp32"), mode)
        assert (fast is not None) == bool(np.isfinite(ref).all())
        assert beyond or fast is not None
    bf16 = pl.get_format("bf16")
    x = np.array([[3 * 2.0**-135, -(2.0**-140), 2.0**-126]], np.float32)  # bf16 subnormals
    y = np.array([[2.0**100], [2.0**100], [1.0]], np.float32)
    if mode == "exact":
        x = reference(x, bf16, "rne")
    want = pl.gemm(x, y, input_format=bf16, input_rounding=mode, backend="numpy")
    with ftz_daz(), use_workers(1):
        got = pl.gemm(x, y, input_format=bf16, input_rounding=mode, backend="native")
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32)) and want[0, 0] != 0


@pytest.mark.parametrize(
    "fmt",
    [
        dataclasses.replace(pl.get_format(name), has_subnormals=False, name=f"{name}_nosub")
        for name in ("e5m2", "e4m3", "bf16")
    ]
    + [pl.get_format("tf32"), pl.get_format("e2m3")],
    ids=lambda f: f.name,
)
def test_the_exact_check_counts_per_chunk(fmt):
    """The check's bit tests (grid_sure in fma32.inc) decide most elements without rounding
    them: in chunks of 512 adversarial values, formats without subnormals included, the count
    equals the elements that rounding would change."""
    x = adversarial(fmt)
    for i in range(0, x.size, 512):
        xs = x[i : i + 512]
        _, count = pack(xs, grid_of(xs, fmt, "exact"))
        assert count == np.count_nonzero(~(reference(xs, fmt, "nearest_even") == xs)), i


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "e4m3"])
@pytest.mark.parametrize("mode", ["nearest_even", "exact"])
def test_a_transposed_operand_is_packed_as_it_is(fmt: str, mode: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A transposed float32 A (the backward's x^T) goes to the kernel without a copy (a_trans)
    and gives the bits of its contiguous copy and of the numpy reference, batched too, with rows
    that do not fill a register tile, K past the kernel's K block, and an input off the grid
    under "exact" (the kernel's check hands the call back)."""
    rng = np.random.default_rng(8)
    f = pl.get_format(fmt)
    seen = []
    orig = native_backend._is_transposed

    def spy(x, shape):  # type: ignore[no-untyped-def]
        out = orig(x, shape)
        seen.append(out)
        return out

    for shape_t, n in (((300, 29), 37), ((2, 70, 13), 20), ((1100, 5), 3)):
        at = rng.standard_normal(shape_t).astype(np.float32)
        if mode == "exact":
            at = np.asarray(pl.round_to(at, fmt), dtype=np.float32)
        a = np.swapaxes(at, -1, -2)  # (..., M, K) view, not C-contiguous
        b = rng.standard_normal((*a.shape[:-2], a.shape[-1], n)).astype(np.float32)
        if mode == "exact":
            b = np.asarray(pl.round_to(b, fmt), dtype=np.float32)
        for off_grid in (False, True) if mode == "exact" and fmt != "fp32" else (False,):
            if off_grid:
                a = a.copy()
                a[..., 1, 2] = np.float32(1.0 + 2.0**-20)
                a = np.swapaxes(np.ascontiguousarray(np.swapaxes(a, -1, -2)), -1, -2)
            kw = dict(input_format=fmt, input_rounding=mode)
            want = pl.gemm(a, b, backend="numpy", **kw) if not off_grid else None
            monkeypatch.setattr(native_backend, "_is_transposed", spy)
            fast = native_backend._fma32_gemm(a, b, None, f, f, FP32, pl.get_format("fp32"), mode)
            monkeypatch.undo()
            assert seen[0] is True  # (A's; B's test comes second)
            seen.clear()
            if off_grid:
                assert fast is None  # (the general path raises for it)
                continue
            contiguous = native_backend._fma32_gemm(
                np.ascontiguousarray(a), b, None, f, f, FP32, pl.get_format("fp32"), mode
            )
            assert fast is not None and contiguous is not None
            assert np.array_equal(fast.view(np.uint32), contiguous.view(np.uint32))
            assert np.array_equal(fast.view(np.uint32), np.asarray(want).view(np.uint32))


@pytest.mark.parametrize("name", FORMATS)
def test_pack_of_a_transposed_b_equals_the_pack_of_b(name):
    """fma32_pack with b_trans (B given as its transpose, nb x N x K) writes the panels and
    counts the misses of the pack of B itself, in every mode and the check, over uneven panel
    ranges (a panel's columns past N are zeros)."""
    fmt = pl.get_format(name)
    x = adversarial(fmt)
    nr = ext.fma32_tile()[1]
    nb, n = 2, 37
    k = -(-x.size // (nb * n))
    B = np.ones(nb * k * n, np.float32)
    B[: x.size] = x
    B = B.reshape(nb, k, n)
    Bt = np.ascontiguousarray(np.swapaxes(B, -1, -2))
    npan = -(-n // nr)
    cuts = sorted({0, 1, npan + 1, nb * npan - 1, nb * npan})
    for mode in [*MODES, "exact"]:
        grid = grid_of(x, fmt, mode) if mode != "exact" else native_backend._packed_input(
            x, fmt, "exact", 0)[1]  # fmt: skip
        for g in (grid, None):
            want = np.full(nb * npan * k * nr, np.nan, np.float32)
            got = want.copy()
            cw = sum(
                ext.fma32_pack(B, want, k, n, lo, hi, g) for lo, hi in itertools.pairwise(cuts)
            )
            cg = sum(
                ext.fma32_pack(Bt, got, k, n, lo, hi, g, 1) for lo, hi in itertools.pairwise(cuts)
            )
            assert cg == cw, (name, mode)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, mode)
