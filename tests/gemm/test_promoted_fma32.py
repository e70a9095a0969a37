"""Scaled GEMMs (spec 2: scales applied at promotion) on the native fp32 FMA kernel
(``native_backend._promoted_fma32_gemm`` and its pre-scaled operands, issue 34) equal the numpy
reference bit for bit, and each path is taken where it should be (and declined where the scales
would leave float32's range)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.backends.native import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the native extension is not built")

nb = importlib.import_module("precision_lab.gemm.native_backend")


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of calls that each fast path answered (not None)."""
    count = {"promoted": 0, "prescaled": 0}
    for name, key in (("_promoted_fma32_gemm", "promoted"), ("_prescaled_segments", "prescaled")):
        orig = getattr(nb, name)

        def wrap(*a, _orig=orig, _key=key, **k):  # type: ignore[no-untyped-def]
            out = _orig(*a, **k)
            if out is not None:
                count[_key] += 1
            return out

        monkeypatch.setattr(nb, name, wrap)
    return count


def _inputs(rng: np.random.Generator, fa: str, fb: str, m: int, k: int, n: int):  # type: ignore[no-untyped-def]
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-6, 6, (m, k)))
    w = rng.standard_normal((k, n)) * np.exp2(rng.integers(-6, 6, (k, n)))
    x = np.asarray(pl.round_to(x, fa, overflow="saturate"), dtype=np.float64)
    w = np.asarray(pl.round_to(w, fb, overflow="saturate"), dtype=np.float64)
    x[rng.random(x.shape) < 0.2] = 0.0
    return x, w


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def _e4m3_scales(r: np.random.Generator, s: tuple[int, int]) -> np.ndarray:
    return np.asarray(pl.round_to(np.abs(r.standard_normal(s) * 30) + 2.0**-6, "e4m3"))


#: (scale_a, scale_b) of shapes (M, nk), (nk, N)
SCALES = {
    "pow2": lambda r, a, b: (2.0 ** r.integers(-30, 30, a), 2.0 ** r.integers(-30, 30, b)),
    # a * sa past float32 (sa * sb near 1): the pre-scaled operands are declined
    "pow2_huge": lambda r, a, b: (2.0 ** r.integers(125, 128, a), 2.0 ** r.integers(-127, -124, b)),
    "pow2_tiny": lambda r, a, b: (2.0 ** r.integers(-60, -50, a), 2.0 ** r.integers(-60, -50, b)),
    "e4m3": lambda r, a, b: (_e4m3_scales(r, a), _e4m3_scales(r, b)),
    "any": lambda r, a, b: (r.random(a) + 0.01, r.random(b) + 0.01),  # 24-bit: segment sums
}


@pytest.mark.parametrize("kind", sorted(SCALES))
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", ("e2m1", "e4m3")])
def test_scaled_gemms_equal_the_reference(kind: str, fmt, taken: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(abs(hash((kind, str(fmt)))) % 2**32)
    fa, fb = (fmt, fmt) if isinstance(fmt, str) else fmt
    # (K past the kernel's K block of 256 (AVX-512) / 512 / 1024 floats: segments across K
    # blocks; a scale block of 2048 above every K block: the kernel declines that segment)
    shapes = [(5, 64, 7, 32), (9, 100, 3, 32), (4, 48, 6, 16), (3, 16, 2, 16),
              (13, 1100, 37, 32), (3, 2100, 2, 2048)]  # fmt: skip
    for m, k, n, blk in shapes:
        for acc in (pl.Accumulator(), pl.Accumulator(promote_every=blk // 2)):
            for out in ("fp32", "bf16"):
                x, w = _inputs(rng, fa, fb, m, k, n)
                nk = -(-k // blk)
                sa, sb = SCALES[kind](rng, (m, nk), (nk, n))
                c = None if rng.random() < 0.5 else rng.standard_normal((m, n)).astype(np.float32)
                if c is not None and rng.random() < 0.3:
                    c[:] = -0.0
                kw = dict(input_format=fmt, accumulator=acc, out_format=out, scale_a=sa,
                          scale_b=sb, scale_block=blk, input_rounding="exact")  # fmt: skip
                want = pl.gemm(x, w, c, backend="numpy", **kw)
                got = pl.gemm(x, w, c, backend="native", **kw)
                assert _same(got, want), (kind, fmt, m, k, n, acc.describe(), out)
    assert taken["promoted"] > 0
    if kind in ("pow2", "pow2_tiny") or (kind == "e4m3" and fa == fb == "e2m1"):
        assert taken["prescaled"] > 0  # MX's power-of-two scales; NVFP4's exact sums
    if kind in ("pow2_huge", "any") or (kind == "e4m3" and fa != "e2m1"):
        assert taken["prescaled"] == 0  # operands past float32 / sums not provably exact


def test_recipes_equal_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """recipe_gemm of the block recipes (the simulate path): native against numpy."""
    ref = importlib.import_module("precision_lab.gemm.reference")
    rng = np.random.default_rng(7)
    for recipe in ("te_mxfp8", "te_nvfp4", "deepseek_v3"):
        for role in ("forward", "dgrad", "wgrad"):
            x = rng.standard_normal((24, 160)) * np.exp(rng.standard_normal((24, 160)) * 2)
            w = rng.standard_normal((160, 9))
            got = pl.recipe_gemm(x.astype(np.float32), w.astype(np.float32), recipe, role, seed=3)
            monkeypatch.setattr(ref, "_AUTO_CPU", "numpy")
            want = pl.recipe_gemm(x.astype(np.float32), w.astype(np.float32), recipe, role, seed=3)
            monkeypatch.undo()
            assert _same(got, want), (recipe, role)


def test_zero_blocks_with_the_smallest_scale_stay_prescaled(taken: dict[str, int]) -> None:
    """MX blocks of zeros (the causal mask's: scale 2**-127, E8M0 of an amax of 0) multiply to
    exact zeros: the pre-scaled path takes them and keeps the reference's bits (zeros of both
    signs, c = -0 included), while a non-zero element in such a block declines it."""
    rng = np.random.default_rng(11)
    m, k, n, blk = 6, 96, 5, 32
    for trial in range(6):
        x, w = _inputs(rng, "e4m3", "e4m3", m, k, n)
        sa = 2.0 ** rng.integers(-20, 0, (m, k // blk))
        sb = 2.0 ** rng.integers(-20, 0, (k // blk, n))
        zero = rng.random((m, k // blk)) < 0.5
        zero[0, 0] = True
        xz = x.reshape(m, k // blk, blk)
        xz[zero] = 0.0
        xz[zero & (rng.random(zero.shape) < 0.5)] = -0.0
        sa[zero] = 2.0**-127
        if trial == 5:  # a live element in a block with the smallest scale: declined
            x[0, 0] = 1.0
        c = np.full((m, n), -0.0, np.float32) if trial % 2 else None
        kw = dict(input_format="e4m3", accumulator=pl.Accumulator(), scale_a=sa, scale_b=sb,
                  scale_block=blk, input_rounding="exact")  # fmt: skip
        want = pl.gemm(x, w, c, backend="numpy", **kw)
        before = taken["prescaled"]
        got = pl.gemm(x, w, c, backend="native", **kw)
        assert _same(got, want), trial
        assert taken["prescaled"] == before + (trial != 5), trial


def test_gemm_blocks_takes_its_decoded_operands_as_on_the_grid(
    taken: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gemm_blocks' operands are decoded element codes: the native path takes them without
    rounding them again (no round_to in _grid32 while gemm_blocks runs), and still equals the
    numpy reference with NaN blocks, infinite elements (E5M2) and zero blocks; the flag is
    reset afterwards, also when the call raises."""
    rng = np.random.default_rng(3)
    checks = []
    orig = nb.round_to

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        checks.append(1)
        return orig(*a, **k)

    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp4_e2m1", "nvfp4"):
        for case in ("plain", "nan", "inf", "zero"):
            x = rng.standard_normal((6, 64)).astype(np.float32)
            w = rng.standard_normal((64, 5)).astype(np.float32)
            if case == "nan":
                x[2, 3] = np.nan
            elif case == "inf" and fmt == "mxfp8_e5m2":
                w[7, 1] = np.inf
            elif case == "zero":
                x[:, :32] = 0.0
            qa = pl.quantize_blocks(x, fmt)
            qb = pl.quantize_blocks(w, fmt, axis=0)
            monkeypatch.setattr(nb, "round_to", spy)
            got = pl.gemm_blocks(qa, qb)
            monkeypatch.undo()
            want = pl.gemm_blocks(qa, qb, backend="numpy")
            assert _same(got, want), (fmt, case)
            assert not nb.ON_GRID.get()
            if case == "plain":
                assert not checks, fmt  # (no input check: the fast path took the values)
            checks.clear()
    assert taken["prescaled"] > 0
    qa = pl.quantize_blocks(np.ones((2, 32), np.float32), "nvfp4")
    with pytest.raises(ValueError):
        pl.gemm_blocks(qa, pl.quantize_blocks(np.ones((32, 2), np.float32), "nvfp4", axis=0),
                       c=np.zeros((2, 2)))  # fmt: skip
    assert not nb.ON_GRID.get()
