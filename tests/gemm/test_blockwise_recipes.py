"""The fine-grained FP8 recipes deepseek_v3_fp8 and te_fp8_block, role by role."""

from __future__ import annotations

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.gemm.blockwise import blockwise_gemm
from precision_lab.quant.fine_grained import deepgemm_quantize, te_blockwise_quantize
from precision_lab.quant.recipes import GemmRole, Operand, get_recipe

H100 = pl.tensor_core("h100", "e4m3")


def _layer(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((130, 256)).astype(np.float32),  # x (M, K), M not a multiple of 128
        rng.standard_normal((96, 256)).astype(np.float32),  # w (N, K)
        rng.standard_normal((130, 96)).astype(np.float32),  # dy (M, N)
    )


def test_deepseek_v3_fp8_roles_are_deepgemm_tiles_on_h100() -> None:
    x, w, dy = _layer()
    out = pl.apply_recipe(x, w, dy, "deepseek_v3_fp8")

    def run(a, b, ta, tb):
        qa = deepgemm_quantize(a, tile=ta)
        qb = deepgemm_quantize(b, tile=tb, axis=-2)
        return blockwise_gemm(qa, qb, accumulator=H100, order="cublas")

    np.testing.assert_array_equal(out.y, run(x, w.T, (1, 128), (128, 128)))
    np.testing.assert_array_equal(out.dx, run(dy, w, (1, 128), (128, 128)))
    np.testing.assert_array_equal(out.dw, run(dy.T, x, (1, 128), (1, 128)))
    # UE8M0 scales: every scale a power of two, so CUTLASS's and DeepGEMM's orders agree
    qa, qb = deepgemm_quantize(x), deepgemm_quantize(w.T, tile=(128, 128))
    for order in ("cutlass", "deepgemm"):
        np.testing.assert_array_equal(blockwise_gemm(qa, qb, order=order), out.y)


def test_te_fp8_block_is_te_quantizer_cublas_order() -> None:
    x, w, dy = _layer(1)
    out = pl.apply_recipe(x, w, dy, "te_fp8_block")
    qa = te_blockwise_quantize(dy.T)  # wgrad: 1x128 column-wise tiles of dy and x
    qb = te_blockwise_quantize(x, axis=-2)
    np.testing.assert_array_equal(out.dw, blockwise_gemm(qa, qb, accumulator=H100))
    r = get_recipe("te_fp8_block")
    assert (r.forward.a.format, r.forward.b.format) == ("te_block_1x128", "te_block_128x128")
    assert {r.role(n).scale_order for n in ("forward", "dgrad", "wgrad")} == {"cublas"}


def test_fp8_recipes_error_grows_from_bf16() -> None:
    x, w, dy = _layer(2)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    err = {
        n: np.abs(pl.apply_recipe(x, w, dy, n).y - ref).max() / np.abs(ref).max()
        for n in ("bf16", "deepseek_v3_fp8", "te_fp8_block")
    }
    assert err["bf16"] < err["deepseek_v3_fp8"] < 0.1
    assert err["bf16"] < err["te_fp8_block"] < 0.1


def test_role_checks() -> None:
    with pytest.raises(ValueError, match="scale_order must be"):
        GemmRole(Operand("deepgemm_1x128"), Operand("deepgemm_1x128"), "h100", "cudnn")
    with pytest.raises(ValueError, match="needs block-scaled operands"):
        GemmRole(Operand("bf16"), Operand("bf16"), "h100", "cublas")
    with pytest.raises(ValueError, match="round to nearest even"):
        Operand("deepgemm_1x128", "stochastic")


def test_simulate_runs_the_recipe() -> None:
    torch = pytest.importorskip("torch")
    from precision_lab.torch import simulate

    lin = torch.nn.Linear(256, 8, bias=False)
    x = torch.randn(3, 256)
    y = simulate(lin, "deepseek_v3_fp8")(x)
    want = pl.recipe_gemm(
        x.numpy(), lin.weight.detach().numpy().T, "deepseek_v3_fp8", "forward", seed=0
    )
    np.testing.assert_array_equal(y.detach().numpy(), want)
