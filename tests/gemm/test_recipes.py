"""Recipes as data (precision_lab.quant.recipes) and apply_recipe (precision_lab.gemm.recipes).

apply_recipe's GEMMs are checked against an independent assembly: the operands quantized by
hand with quantize_blocks / hadamard, dequantized, multiplied in exact float64 (every product of
these values is exact and K is small, so float64 sums err by at most K ulps of the largest
partial sum), against which the FP32-accumulated result must lie within the FP32 accumulation
bound gamma_K * sum|a||b|.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.quant.recipes import RECIPES, GemmRole, Operand, Recipe, with_rounding

U32 = 2.0**-24


def data(m=32, k=64, n=48, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((m, k)).astype(np.float32),
        rng.standard_normal((n, k)).astype(np.float32),
        rng.standard_normal((m, n)).astype(np.float32),
    )


def fp32_bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = a.shape[1]
    g = k * U32 / (1 - k * U32)
    return g * (np.abs(a) @ np.abs(b)) * 2 + 1e-30


def test_every_recipe_is_frozen_data_with_a_source() -> None:
    for name, r in RECIPES.items():
        assert r.name == name and r.source
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.name = "x"  # type: ignore[misc]
        for role in ("forward", "dgrad", "wgrad"):
            g = r.role(role)
            assert isinstance(g, GemmRole)
            assert g.a.hadamard == g.b.hadamard  # a rotation must act on both operands
    with pytest.raises(ValueError, match="unknown recipe"):
        pl.get_recipe("te_nvfp5")
    with pytest.raises(ValueError, match="role must be one of"):
        RECIPES["fp32"].role("fgrad")
    with pytest.raises(ValueError, match="unknown format"):
        Operand("nvfp5")
    with pytest.raises(ValueError, match="sideways"):
        Operand("nvfp4", "sideways")


def test_te_nvfp4_recipe_facts() -> None:
    r = pl.get_recipe("te_nvfp4")
    assert (r.forward.a.format, r.forward.b.format) == ("nvfp4", "nvfp4_16x16")
    assert r.forward.a.rounding == r.forward.b.rounding == "nearest_even"
    assert r.dgrad.a.rounding == "stochastic" and r.dgrad.b.rounding == "nearest_even"
    assert r.wgrad.a.hadamard == r.wgrad.b.hadamard == 16
    assert r.forward.a.hadamard is None


def test_forward_is_the_product_of_the_quantized_operands() -> None:
    x, w, dy = data()
    out = pl.apply_recipe(x, w, dy, "te_nvfp4", seed=7)
    qa = pl.dequantize_blocks(pl.quantize_blocks(x, "nvfp4")).astype(np.float64)
    qb = pl.dequantize_blocks(pl.quantize_blocks(w.T, "nvfp4_16x16", axis=0)).astype(np.float64)
    exact = qa @ qb
    assert (np.abs(out.y - exact) <= fp32_bound(qa, qb)).all()
    assert out.y.dtype == np.float32


def test_wgrad_rotation_and_stochastic_rounding() -> None:
    x, w, dy = data()
    out = pl.apply_recipe(x, w, dy, "te_nvfp4", seed=7)
    seed = 7 + 4 * 2  # wgrad: role 2
    ha = pl.hadamard(dy.T, block=16, axis=-1, seed=seed).astype(np.float32)
    hb = pl.hadamard(x, block=16, axis=0, seed=seed).astype(np.float32)
    qa = pl.quantize_blocks(ha, "nvfp4", rounding="stochastic", seed=seed)
    qb = pl.quantize_blocks(hb, "nvfp4", axis=0, seed=seed + 1)
    a, b = (pl.dequantize_blocks(q).astype(np.float64) for q in (qa, qb))
    assert (np.abs(out.dw - a @ b) <= fp32_bound(a, b)).all()
    again = pl.apply_recipe(x, w, dy, "te_nvfp4", seed=7)
    other = pl.apply_recipe(x, w, dy, "te_nvfp4", seed=8)
    assert np.array_equal(out.dw, again.dw) and not np.array_equal(out.dw, other.dw)
    assert np.array_equal(out.y, other.y)  # forward has no randomness (RTN, no rotation)


def test_rotation_cancels_in_exact_formats() -> None:
    """With fp32 operands the 16-point rotation of both wgrad inputs leaves dy.T @ x."""
    x, w, dy = data(m=64)
    fp32 = Operand("fp32")
    rot = Operand("fp32", hadamard=16)
    r = Recipe("rot", GemmRole(fp32, fp32), GemmRole(fp32, fp32), GemmRole(rot, rot))
    out = pl.apply_recipe(x, w, dy, r)
    exact = dy.T.astype(np.float64) @ x.astype(np.float64)
    assert np.allclose(out.dw, exact, rtol=0, atol=1e-4 * np.abs(exact).max())
    assert np.array_equal(out.y, pl.apply_recipe(x, w, dy, "fp32").y)


def test_fp32_and_bf16_recipes_are_plain_gemms() -> None:
    x, w, dy = data()
    out = pl.apply_recipe(x, w, dy, "fp32")
    assert np.array_equal(out.y, pl.gemm(x, w.T, input_format="fp32", accumulator=None))
    assert np.array_equal(out.dx, pl.gemm(dy, w, input_format="fp32", accumulator=None))
    b = pl.apply_recipe(x, w, dy, "bf16")
    xb, wb = (pl.round_to(v, "bf16") for v in (x, w))
    assert np.array_equal(b.y, pl.gemm(xb, wb.T, input_format="bf16", accumulator=None))


@pytest.mark.parametrize("name", list(RECIPES))
def test_errors_are_ordered_by_precision(name: str) -> None:
    x, w, dy = data(m=64, k=128, n=128)
    out = pl.apply_recipe(x, w, dy, name, seed=1)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    rqe = pl.analysis.quant_error(out.y, exact).rqe
    bound = {"fp32": 1e-12, "bf16": 1e-4, "te_mxfp8": 5e-3, "te_fp8_block": 5e-3}
    bound |= {"deepseek_v3": 5e-3}
    assert rqe < bound.get(name, 0.1), (name, rqe)  # FP4 recipes: 2-5e-2
    assert rqe > (0 if name == "fp32" else 1e-7)


def test_with_rounding_and_bad_shapes() -> None:
    r = with_rounding(pl.get_recipe("fp4_all_the_way"), dgrad="nearest_even")
    assert r.dgrad.a.rounding == "nearest_even" and r.wgrad.a.rounding == "stochastic"
    x, w, dy = data()
    with pytest.raises(ValueError, match="do not match a linear layer"):
        pl.apply_recipe(x, w[:, :32], dy, "fp32")
    with pytest.raises(ValueError, match="2-D"):
        pl.apply_recipe(x[0], w, dy, "fp32")


def test_rotation_pads_the_contraction_axis() -> None:
    """K = 40 is no multiple of the 32-point rotation: both operands are zero-padded alike."""
    x, w, dy = data(m=40, k=40, n=24)
    fp32 = Operand("fp32")
    rot = Operand("fp32", hadamard=32)
    r = Recipe("rot", GemmRole(rot, rot), GemmRole(fp32, fp32), GemmRole(rot, rot))
    out = pl.apply_recipe(x, w, dy, r, seed=2)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.allclose(out.y, exact, rtol=0, atol=1e-4 * np.abs(exact).max())
    q = pl.apply_recipe(x, w, dy, "quartet", seed=2)  # MXFP4 blocks of 32 after padding
    assert q.y.shape == (40, 24) and q.dw.shape == (24, 40)


def test_recipe_gemm_one_role_batches_and_accumulator_precedence() -> None:
    """pl.recipe_gemm: a role of an element-format recipe is pl.gemm of the rounded operands; a
    given accumulator replaces the role's (here BF16 accumulation, which changes the bits); a
    batch without SR or per-tensor scales is the 2-D GEMM per batch; errors name the argument."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 50)).astype(np.float32)
    b = rng.standard_normal((50, 7)).astype(np.float32)
    ra, rb = pl.round_to(a, "bf16"), pl.round_to(b, "bf16")
    acc = pl.Accumulator("bf16")
    got = pl.recipe_gemm(a, b, "bf16", "dgrad", accumulator=acc)
    want = pl.gemm(ra, rb, input_format="bf16", accumulator=acc)
    assert np.array_equal(got, want)
    assert not np.array_equal(got, pl.recipe_gemm(a, b, "bf16", "dgrad"))
    assert np.array_equal(
        pl.recipe_gemm(a, b, "bf16", "dgrad"),
        pl.gemm(ra, rb, input_format="bf16", accumulator=None),
    )
    A = rng.standard_normal((3, 4, 200)).astype(np.float32)
    B = rng.standard_normal((3, 200, 5)).astype(np.float32)
    for name in ("te_mxfp8", "te_fp8_block"):
        y = pl.recipe_gemm(A, B, name, "forward", seed=3)
        assert y.shape == (3, 4, 5) and y.dtype == np.float32
        for i in range(3):
            assert np.array_equal(y[i], pl.recipe_gemm(A[i], B[i], name, "forward", seed=3))
    with pytest.raises(TypeError, match=r"accumulator must be a precision_lab\.Accumulator"):
        pl.recipe_gemm(a, b, "bf16", "forward", accumulator="fp32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"a and b must be at least 2-D"):
        pl.recipe_gemm(a[0], b, "bf16", "forward")
    with pytest.raises(ValueError, match=r"unknown recipe 'nvfp4'"):
        pl.recipe_gemm(a, b, "nvfp4", "forward")


@pytest.mark.parametrize("size", [0, 3, -16, 1, 8192, 16.0, True])
def test_operand_hadamard_is_checked_at_construction(size):
    """Issue 31 item 10: Operand(hadamard=0 or 3) was accepted and failed later with a bare
    ZeroDivisionError; the error now names the argument, the value and what is expected."""
    err = TypeError if isinstance(size, bool | float) else ValueError
    with pytest.raises(err, match=f"hadamard must be .*power of two.*got {size!r}"):
        Operand("nvfp4", hadamard=size)
