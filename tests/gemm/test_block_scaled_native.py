"""Block-scaled MMA (``scales="in_block"`` without groups: tcgen05 ``kind::mxf8f6f4``, sm_120
``mma.block_scale``) on the native block-FMA fast path: bit for bit the numpy reference on every
such preset of the tensor-core table, on input classes that move the anchor (zeros, scales far
apart, results that overflow or underflow float32), and it must run (a spy counts the calls it
answers), so that a silent fall-back to the reference cannot pass for it. The presets' values
against an independent exact oracle: tests/gemm/test_tensor_core_presets.py."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.backends.native import kernels as native_kernels

nbk = importlib.import_module("precision_lab.gemm.native_backend")

pytestmark = pytest.mark.skipif(
    not native_kernels.available(), reason="precision_lab.backends._native_kernels is not built"
)


def _presets() -> list[tuple[str, str, str, str]]:
    """(gpu, instruction, format of a, format of b) of every block-scaled row without groups."""
    out = []
    for row in pl.tensor_core.list():
        fmt = row["input_format"]
        fa, _, fb = fmt.partition(" x ")
        gpu = row["gpus"].split(",")[0].split()[0]
        fmts, ins = (fa, fb) if fb else fa, row["instruction"]
        acc = pl.tensor_core(gpu, fmts, out_format=row["out_format"], instruction=ins)
        if acc.scales == "in_block" and acc.group is None and row["out_format"] == "fp32":
            out.append((gpu, row["instruction"], fa, fb or fa))
    return out


PRESETS = _presets()
KINDS = ("normal", "wide", "zeros", "tiny", "huge", "zero_scales", "apart")


def _operand(rng: np.random.Generator, kind: str, shape: tuple[int, int], fmt: str, axis: int):
    x = rng.standard_normal(shape)
    if kind == "wide":  # block scales 2**-40 .. 2**40 apart within a row
        x *= 2.0 ** rng.integers(-40, 40, shape)
    elif kind == "zeros":  # zeros take the exponent -126 unscaled (zeros_in_anchor)
        x *= rng.random(shape) < 0.4
    elif kind == "tiny":  # scales near E8M0's 2**-127: sums underflow float32
        x *= 2.0**-120
    elif kind == "huge":  # scales near 2**127: sums overflow float32
        x *= 2.0**124
    elif kind == "zero_scales":  # whole blocks of zeros (scale 0 or the smallest)
        x[(rng.random(shape) < 0.5)] = 0.0
    elif kind == "apart":  # a's non-zeros at even k, b's at odd k: every product is zero, and
        # the zeros' exponents (-126 plus the partner's; the zero's own scale not added) meet c
        odd = np.arange(shape[axis]) % 2 == 1
        x = np.where(odd[None, :] if axis else ~odd[:, None], 0.0, x)
        x *= 2.0 ** rng.integers(-110, 110, (shape[0], 1) if axis else (1, shape[1]))
    return pl.quantize_blocks(x.astype(np.float32), fmt, axis=axis, pad=True)


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the block-scaled calls the native path answers (and those it hands back)."""
    calls = {"native": 0, "back": 0}
    run = nbk.gemm_block_scaled

    def spy(*args: object, **kwargs: object) -> object:
        out = run(*args, **kwargs)
        calls["native" if out is not None else "back"] += 1
        return out

    monkeypatch.setattr(nbk, "gemm_block_scaled", spy)
    return calls


def test_every_row_without_groups_is_listed():
    # tcgen05 kind::mxf8f6f4 and sm_120 mma.block_scale: 24 format pairs each
    assert len(PRESETS) >= 48
    assert {p[0] for p in PRESETS} >= {"b200", "rtx5090"}


def _native_equals_the_reference(gpu, ins, fa, fb, seed, mmax, nmax):
    """Every input class (KINDS) on the native backend, bit for bit the numpy reference."""
    rng = np.random.default_rng(abs(hash((gpu, ins, fa, fb, seed))) % 2**32)
    acc = pl.tensor_core(gpu, (fa, fb), instruction=ins)
    for i, kind in enumerate(KINDS):
        m, n = int(rng.integers(1, mmax)), int(rng.integers(1, nmax))
        k = (64, 96, 45, 7, 160, 32, 64)[i]  # (45, 7: the last block padded with zeros)
        qa = _operand(rng, kind, (m, k), fa, -1)
        qb = _operand(rng, kind, (k, n), fb, 0)
        c = None if i % 2 else rng.standard_normal((m, n)).astype(np.float32) * 2.0**-40
        want = pl.gemm_blocks(qa, qb, c, accumulator=acc, backend="numpy")
        got = pl.gemm_blocks(qa, qb, c, accumulator=acc, backend="native")
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=kind)


@pytest.mark.parametrize(("gpu", "ins", "fa", "fb"), PRESETS)
def test_native_equals_the_reference(gpu, ins, fa, fb, native_calls):
    _native_equals_the_reference(gpu, ins, fa, fb, 0, 20, 40)
    assert native_calls == {"native": len(KINDS), "back": 0}


def test_batches_and_scales_along_rows_and_columns(native_calls):
    rng = np.random.default_rng(5)
    acc = pl.tensor_core("b200", "mxfp8_e4m3", instruction="tcgen05")
    e4m3 = pl.get_format("e4m3")
    a = pl.round_to(rng.uniform(-1, 1, (3, 5, 96)).astype(np.float32), e4m3)
    b = pl.round_to(rng.uniform(-1, 1, (96, 7)).astype(np.float32), e4m3)
    sa = 2.0 ** rng.integers(-20, 20, (3, 5, 3)).astype(np.float64)
    sb = 2.0 ** rng.integers(-20, 20, (3, 7)).astype(np.float64)  # (K-blocks, N)
    kw = dict(input_format="e4m3", accumulator=acc, input_rounding="exact", scale_a=sa,
              scale_b=sb, scale_block=32)  # fmt: skip
    want = pl.gemm(a, b, backend="numpy", **kw)
    got = pl.gemm(a, b, backend="native", **kw)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert native_calls == {"native": 1, "back": 0}


def test_hands_back_what_it_does_not_compute(native_calls):
    rng = np.random.default_rng(9)
    acc = pl.tensor_core("b200", "mxfp8_e4m3", instruction="tcgen05")
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[1, 40] = np.nan  # a NaN element: the kernels hand the call back
    qa = pl.quantize_blocks(x, "mxfp8_e4m3")
    qb = pl.quantize_blocks(rng.standard_normal((64, 3)).astype(np.float32), "mxfp8_e4m3", axis=0)
    want = pl.gemm_blocks(qa, qb, accumulator=acc, backend="numpy")
    got = pl.gemm_blocks(qa, qb, accumulator=acc, backend="native")
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isnan(got[1]).all() and not np.isnan(got[[0, 2, 3]]).any()
    assert native_calls == {"native": 0, "back": 1}
    # scales that are not powers of two: not taken (the reference's error)
    with pytest.raises(ValueError, match="power-of-two scales"):
        pl.gemm(np.ones((1, 32)), np.ones((32, 1)), input_format="e4m3", accumulator=acc,
                scale_a=np.full((1, 1), 3.0), scale_block=32, backend="native")  # fmt: skip
    assert native_calls == {"native": 0, "back": 2}


@pytest.mark.parametrize(("gpu", "ins", "fa", "fb"), PRESETS[::3])
def test_generic_kernels_equal_the_reference(gpu, ins, fa, fb, monkeypatch):
    # the per-element kernels of pl_gemm.cuh (the CUDA kernels' header) with in-block scales:
    # what runs where the fast path hands a call back (inf or NaN, exponents spread too wide)
    monkeypatch.setattr(nbk, "gemm_block_scaled", lambda *args, **kwargs: None)
    launched = []
    launch = nbk._launch
    monkeypatch.setattr(nbk, "_launch", lambda *a, **kw: launched.append(a[0]) or launch(*a, **kw))
    _native_equals_the_reference(gpu, ins, fa, fb, 1, 9, 12)
    assert launched == ["pl_gemm_generic_f32"] * len(KINDS)


# ----- with groups (tcgen05 kind::mxf4nvf4, sm_120 mma.block_scale with FP4) ---------------------
MXFP4_B16 = pl.BlockFormat("mxfp4_b16", "e2m1", "e8m0", (16,), "floor")
GROUPED = [
    (gpu, ins, fmt)
    for gpu, ins in (("b200", "tcgen05"), ("rtx5090", "mma"))
    for fmt in ("nvfp4", "mxfp4_e2m1", MXFP4_B16)
]


@pytest.fixture
def grouped_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"native": 0, "back": 0}
    run = nbk._grouped_gemm

    def spy(*args: object, **kwargs: object) -> object:
        out = run(*args, **kwargs)
        calls["native" if out is not None else "back"] += 1
        return out

    monkeypatch.setattr(nbk, "_grouped_gemm", spy)
    return calls


@pytest.mark.parametrize(("gpu", "ins", "fmt"), GROUPED, ids=str)
def test_groups_native_equals_the_reference(gpu, ins, fmt, grouped_calls):
    acc = pl.tensor_core(gpu, fmt, instruction=ins)
    assert acc.group == 16 and acc.block == 64
    rng = np.random.default_rng(7)
    kinds = ("normal", "wide", "zeros", "tiny", "huge", "apart", "zero_groups")
    if fmt == "nvfp4":  # (its per-tensor scales' float32 product over- or underflows there)
        kinds = tuple(k for k in kinds if k not in ("tiny", "huge"))
    for i, kind in enumerate(kinds):
        m, n = int(rng.integers(1, 20)), int(rng.integers(1, 40))
        k = (64, 128, 96, 48, 200, 64, 128)[i % 7]
        qa = _operand(rng, "tiny" if kind == "zero_groups" else kind, (m, k), fmt, -1)
        qb = _operand(rng, kind, (k, n), fmt, 0)
        if kind == "zero_groups":  # every other group of a row zero (scale 0: exponent 0), the
            # others far below 1: a zero group must not move the anchor (its exponent is -126)
            x = rng.standard_normal((m, k)) * 2.0**-60
            x[:, (np.arange(k) // 16) % 2 == 1] = 0.0
            qa = pl.quantize_blocks(x.astype(np.float32), fmt, axis=-1, pad=True)
        c = None
        if qa.tensor_scale == 1 and qb.tensor_scale == 1 and (i % 2 == 0 or kind == "apart"):
            c = rng.standard_normal((m, n)).astype(np.float32) * 2.0**-10  # (NVFP4: no c)
        # the preset (zeros_in_anchor: a cancelled group keeps its scales' exponent, which the
        # native grouped kernel does not model: it hands the preset to the reference) and the
        # model without zeros in the anchor (the native grouped kernel)
        for model in (acc, acc.replace(zeros_in_anchor=False)):
            want = pl.gemm_blocks(qa, qb, c, accumulator=model, backend="numpy")
            got = pl.gemm_blocks(qa, qb, c, accumulator=model, backend="native")
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=kind)
    assert grouped_calls == {"native": len(kinds), "back": 0}


# (the native grouped kernel serves the FP4 kinds without zeros in the anchor: with them, a
# cancelled group keeps its scales' exponent, which the numpy reference alone models)
def test_groups_hand_back_nan_and_check_the_grid(grouped_calls):
    acc = pl.tensor_core("b200", "nvfp4", instruction="tcgen05").replace(zeros_in_anchor=False)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[1, 5] = np.nan
    qa = pl.quantize_blocks(x, "nvfp4")
    qb = pl.quantize_blocks(rng.standard_normal((64, 2)).astype(np.float32), "nvfp4", axis=0)
    want = pl.gemm_blocks(qa, qb, accumulator=acc, backend="numpy")
    got = pl.gemm_blocks(qa, qb, accumulator=acc, backend="native")
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isnan(got[1]).all() and grouped_calls == {"native": 0, "back": 1}
    # values off e2m1's grid with input_rounding="exact": the reference's error, not a result
    kw = {"input_format": "e2m1", "accumulator": acc, "scale_a": np.ones((1, 4)),
          "scale_b": np.ones((4, 1)), "scale_block": 16}  # fmt: skip
    with pytest.raises(ValueError, match="not on the e2m1 grid"):
        pl.gemm(np.full((1, 64), 0.7), np.ones((64, 1)), input_rounding="exact", backend="native",
                **kw)  # fmt: skip
    # other input roundings round first (the kernel then takes the grid values)
    a = rng.uniform(-6, 6, (4, 64))
    b = rng.uniform(-6, 6, (64, 3))
    want = pl.gemm(a, b, backend="numpy", **kw)
    got = pl.gemm(a, b, backend="native", **kw)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert grouped_calls["native"] == 1


def test_groups_of_fp8_sums_in_float64(grouped_calls):
    # the kind::mxf4nvf4 model on MXFP8 operands: group sums of 16 e4m3 products span 40 bits,
    # beyond float32 (the FP4 presets' float32 group sums): the kernel's float64 sums
    acc = pl.tensor_core("b200", "mxfp4_e2m1", instruction="tcgen05")
    acc = acc.replace(zeros_in_anchor=False)  # (the native grouped kernel's model)
    rng = np.random.default_rng(11)
    for kind in ("normal", "wide", "zeros", "apart"):
        qa = _operand(rng, kind, (5, 96), "mxfp8_e4m3", -1)
        qb = _operand(rng, kind, (96, 7), "mxfp8_e4m3", 0)
        c = rng.standard_normal((5, 7)).astype(np.float32)
        want = pl.gemm_blocks(qa, qb, c, accumulator=acc, backend="numpy")
        got = pl.gemm_blocks(qa, qb, c, accumulator=acc, backend="native")
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=kind)
    assert grouped_calls == {"native": 4, "back": 0}
