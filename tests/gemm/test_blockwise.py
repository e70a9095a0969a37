"""The fine-grained FP8 GEMM (precision_lab.gemm.blockwise): cuBLAS's, CUTLASS's, DeepGEMM's orders.

Oracles: (1) TE's reference equations (``tests/pytorch/references/blockwise_fp8_gemm_reference.py``,
``CuBLASRefBlockwiseGemm.qgemm_blockwise_2d``) re-written here loop by loop over 128x128 output
tiles and K tiles, in exact rational arithmetic with explicit float32 roundings, with the
tensor-core partial of each K tile (``torch._scaled_mm`` in TE's code) replaced by the library's
H100 preset; (2) the whole tile algebra from exact products when the partial is exact; (3) the
library's own promotion (``gemm_blocks``), which is DeepGEMM's order.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from referee import round_in_range as _rn

import precision_lab as pl
from precision_lab.gemm.blockwise import blockwise_gemm, fma32, promotion_error
from precision_lab.quant.fine_grained import deepgemm_quantize, te_blockwise_quantize

H100 = pl.tensor_core("h100", "e4m3")


def _rn32(v: Fraction) -> Fraction:
    return _rn(v, 23, -126)


def _f(v: float) -> Fraction:
    return Fraction(float(v))


def _per_elem_scales(q: pl.QuantizedBlocks, which: str, m: int, nk: int) -> np.ndarray:
    """(rows of A or columns of B) x nk scales, as TE's reference indexes sx / sw."""
    s = q.scales
    if which == "a":
        return np.repeat(s, 128, axis=0)[:m] if len(q.block_format.block_shape) == 2 else s
    s = s.T  # (N or Ng, nk)
    return np.repeat(s, 128, axis=0)[:m] if len(q.block_format.block_shape) == 2 else s


def _te_reference(qa: pl.QuantizedBlocks, qb: pl.QuantizedBlocks, out: str, c=None):
    """TE's qgemm_blockwise_2d, with Fraction arithmetic and explicit float32 roundings."""
    va = qa.element_values().astype(np.float64)
    vb = qb.element_values().astype(np.float64)
    m, k = va.shape
    n = vb.shape[1]
    nk = -(-k // 128)
    a1, b1 = len(qa.block_format.block_shape) == 1, len(qb.block_format.block_shape) == 1
    sx = _per_elem_scales(qa, "a", m, nk)
    sw = _per_elem_scales(qb, "b", n, nk)
    y = [[Fraction(0)] * n for _ in range(m)]
    for t in range(nk):
        lo, hi = t * 128, min(k, t * 128 + 128)
        # the tensor-core partial of this K tile (TE: torch._scaled_mm on the tile)
        part = np.asarray(
            pl.gemm(va[:, lo:hi], vb[lo:hi], input_format="e4m3", accumulator=H100), np.float64
        )
        for i in range(m):
            for j in range(n):
                p, s_a, s_b = _f(part[i, j]), _f(sx[i, t]), _f(sw[j, t])
                if a1:  # 1Dx1D, 1Dx2D: y += (p * sa) * sb, the second product fused
                    y[i][j] = _rn32(_rn32(p * s_a) * s_b + y[i][j])
                elif b1:  # 2Dx1D
                    y[i][j] = _rn32(_rn32(p * s_b) * s_a + y[i][j])
                else:
                    y[i][j] = _rn32(p * _rn32(s_a * s_b) + y[i][j])
    res = np.array([[float(v) for v in row] for row in y])
    d = np.asarray(pl.round_to(res, out), np.float64)
    if c is not None:  # cuBLAS: convert, then accumulate (in FP32), then convert
        cc = np.asarray(pl.round_to(np.asarray(c, np.float64), out), np.float64)
        d = np.array(
            [[float(_rn32(_f(d[i, j]) + _f(cc[i, j]))) for j in range(n)] for i in range(m)]
        )
        d = np.asarray(pl.round_to(d, out), np.float64)
    return d.astype(np.float32)


def _operands(rng: np.random.Generator, m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-4, 4, size=(m, 1)))
    w = rng.standard_normal((k, n)) * np.exp2(rng.integers(-4, 4, size=(1, n)))
    return x, w


@pytest.mark.parametrize(
    ("ta", "tb"), [((1, 128), (1, 128)), ((1, 128), (128, 128)), ((128, 128), (1, 128))]
)
@pytest.mark.parametrize("pow2", [False, True])
def test_cublas_order_is_te_reference(ta, tb, pow2) -> None:
    rng = np.random.default_rng(0)
    x, w = _operands(rng, 6, 320, 5)  # K = 2.5 tiles: the last one padded
    qa = te_blockwise_quantize(x, tile=ta, pow2=pow2)
    qb = te_blockwise_quantize(w, tile=tb, pow2=pow2, axis=-2)
    got = blockwise_gemm(qa, qb, order="cublas")
    np.testing.assert_array_equal(got, _te_reference(qa, qb, "fp32"))


def test_cublas_2dx2d_and_accumulate_bf16() -> None:
    rng = np.random.default_rng(1)
    x, w = _operands(rng, 5, 256, 4)
    qa = deepgemm_quantize(x, tile=(128, 128), ue8m0=False)
    qb = deepgemm_quantize(w, tile=(128, 128), ue8m0=False)
    c = rng.standard_normal((5, 4)) * 30
    got = blockwise_gemm(qa, qb, c, out_format="bf16")
    np.testing.assert_array_equal(got, _te_reference(qa, qb, "bf16", c))


def test_orders_differ_only_for_fp32_scales() -> None:
    """With FP32 scales cuBLAS's 1D equations (two roundings) and CUTLASS's product of the
    scales (sa * sb rounded, one FMA; 1Dx2D here) part in some outputs; with power-of-two
    scales they agree."""
    rng = np.random.default_rng(2)
    x, w = _operands(rng, 16, 512, 16)
    for pow2, differ in ((False, True), (True, False)):
        qa = te_blockwise_quantize(x, pow2=pow2)
        qb = te_blockwise_quantize(w, tile=(128, 128), pow2=pow2)
        one = blockwise_gemm(qa, qb, order="cublas")
        two = blockwise_gemm(qa, qb, order="cutlass")
        assert bool((one != two).any()) is differ


@pytest.mark.parametrize("ue8m0", [False, True])
def test_deepgemm_order_is_the_library_promotion(ue8m0: bool) -> None:
    """DeepGEMM's order is the library's gemm_blocks promotion (W = round(W + P *
    round(sa * sb))), with the H100 preset forming each tile's partial."""
    rng = np.random.default_rng(3)
    x, w = _operands(rng, 8, 384, 7)
    qa = deepgemm_quantize(x, ue8m0=ue8m0)
    qb = deepgemm_quantize(w, tile=(128, 128), ue8m0=ue8m0)
    got = blockwise_gemm(qa, qb, order="deepgemm")
    np.testing.assert_array_equal(got, pl.gemm_blocks(qa, qb, accumulator=H100))


def test_tile_algebra_from_exact_products() -> None:
    """With an exact partial (fp64 sums of E4M3 products, exact at K = 128), the result is the
    cuBLAS equations applied to the exact tile sums rounded once to FP32."""
    rng = np.random.default_rng(4)
    x, w = _operands(rng, 3, 256, 3)
    qa = te_blockwise_quantize(x, pow2=False)
    qb = te_blockwise_quantize(w, pow2=False, axis=-2)
    got = blockwise_gemm(qa, qb, accumulator=pl.Accumulator("fp64"))
    va, vb = qa.element_values(), qb.element_values()
    for i in range(3):
        for j in range(3):
            y = Fraction(0)
            for t in range(2):
                sl = slice(128 * t, 128 * t + 128)
                p = _rn32(sum(_f(a) * _f(b) for a, b in zip(va[i, sl], vb[sl, j], strict=True)))
                y = _rn32(_rn32(p * _f(qa.scales[i, t])) * _f(qb.scales[t, j]) + y)
            assert _f(got[i, j]) == y


def test_unit_scales_are_promotion_every_tile() -> None:
    """Scales 1: each tile's partial promoted into FP32 (the split accumulator), which is the
    preset with promote_every=128 through pl.gemm."""
    rng = np.random.default_rng(5)
    a = pl.round_to(rng.random((4, 512)), "e4m3")
    b = pl.round_to(rng.random((512, 3)), "e4m3")
    qa = pl.quantize_blocks(a, "fp8_1x128")
    qb = pl.quantize_blocks(b, "fp8_1x128", axis=0)
    qa = type(qa)(**{**qa.__dict__, "scales": np.ones_like(qa.scales)})
    qb = type(qb)(**{**qb.__dict__, "scales": np.ones_like(qb.scales)})
    qa = type(qa)(**{**qa.__dict__, "codes": pl.encode(a, "e4m3")})
    qb = type(qb)(**{**qb.__dict__, "codes": pl.encode(b, "e4m3")})
    got = blockwise_gemm(qa, qb)
    want = pl.gemm(a, b, input_format="e4m3", accumulator=H100.replace(promote_every=128))
    np.testing.assert_array_equal(got, want)
    fast = pl.gemm(a, b, input_format="e4m3", accumulator=H100)  # no promotion: differs
    assert (np.asarray(fast) != got).any()


def test_cutlass_order_is_cublas_for_1dx1d_and_deepgemm_otherwise() -> None:
    """CUTLASS multiplies the partial by A's scale first only when both operands have 1-D
    (per-row / per-column) scales; with a 128x128 operand it multiplies the scales first."""
    rng = np.random.default_rng(7)
    x, w = _operands(rng, 16, 512, 16)
    a1 = te_blockwise_quantize(x, pow2=False)
    b1 = te_blockwise_quantize(w, pow2=False, axis=-2)
    b2 = te_blockwise_quantize(w, tile=(128, 128), pow2=False)
    run = {o: (blockwise_gemm(a1, b1, order=o), blockwise_gemm(a1, b2, order=o))
           for o in ("cublas", "cutlass", "deepgemm")}  # fmt: skip
    np.testing.assert_array_equal(run["cutlass"][0], run["cublas"][0])  # 1Dx1D
    np.testing.assert_array_equal(run["cutlass"][1], run["deepgemm"][1])  # 1Dx2D
    assert (run["cutlass"][0] != run["deepgemm"][0]).any()
    assert (run["cutlass"][1] != run["cublas"][1]).any()


def test_fma32_is_one_rounding() -> None:
    x = np.float32(1 + 2**-12)
    assert fma32(x, x, np.float32(-1.0)) == 2.0**-11 + 2.0**-24  # the product's low bit kept
    assert np.isnan(fma32(np.inf, 0.0, 1.0)) and fma32(np.inf, 1.0, 1.0) == np.inf


def test_promotion_error_without_and_with() -> None:
    r = promotion_error(1024, m=8, n=8, distribution="uniform")
    assert r["max_rel_no_promotion"] > 10 * r["max_rel_promoted"]


def test_errors() -> None:
    q = deepgemm_quantize(np.ones((2, 128)))
    with pytest.raises(ValueError, match="order must be"):
        blockwise_gemm(q, deepgemm_quantize(np.ones((128, 2)), axis=-2), order="cudnn")
    with pytest.raises(TypeError, match="QuantizedBlocks"):
        blockwise_gemm(np.ones((2, 128)), q)  # type: ignore[arg-type]


def test_fp8_x_fp4_operands() -> None:
    """DeepGEMM's FP8 x FP4 pairing: a 1x128 E4M3 operand with a 1x128 E2M1 one (UE8M0 scales),
    on the B200 mixed-kind preset; power-of-two scales, so cuBLAS's order is the library's
    promotion (gemm_blocks)."""
    from precision_lab.quant.fine_grained import deepgemm_fp4_quantize

    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((4, 256)), rng.standard_normal((256, 6))
    qa, qb = deepgemm_quantize(x), deepgemm_fp4_quantize(w, axis=-2)
    acc = pl.tensor_core("b200", ("e4m3", "e2m1"))
    got = blockwise_gemm(qa, qb, accumulator=acc)
    np.testing.assert_array_equal(got, pl.gemm_blocks(qa, qb, accumulator=acc))
    exact = qa.dequantize().astype(np.float64) @ qb.dequantize().astype(np.float64)
    assert np.abs(got - exact).max() <= 1e-5 * np.abs(exact).max()


def test_deepseek_k4096_numbers_in_the_docs() -> None:
    """The numbers docs/fine_grained_fp8.md and docs/reproductions.md state (inferred)."""
    r = promotion_error(4096, m=24, n=24, distribution="uniform", seed=0)
    assert f"{r['max_rel_no_promotion']:.3g}" == "0.0703"
    assert f"{r['max_rel_promoted']:.3g}" == "0.000568"
    n = promotion_error(4096, m=24, n=24, distribution="normal", seed=0)
    assert (f"{n['normwise_no_promotion']:.3g}", f"{n['normwise_promoted']:.3g}") == (
        "0.00148",
        "0.00012",
    )
