"""simulate's GEMM data path (issue 34): the bias gradients summed without a GEMM call are the
GEMM's bits (``ones @ rows``, pairwise in FP32), specials handed back to the GEMM."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import precision_lab as pl  # noqa: E402
from precision_lab.torch.casts import _pairwise_column_sums  # noqa: E402

PAIRWISE = pl.Accumulator("fp32", order="pairwise")


def _gemm_sums(rows: np.ndarray) -> np.ndarray:
    ones = np.ones((1, rows.shape[0]), dtype=np.float32)
    out = pl.gemm(ones, rows, input_format="fp32", accumulator=PAIRWISE, backend="numpy")
    return np.asarray(out).reshape(-1)


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 13, 64, 100])
def test_pairwise_column_sums_are_the_gemms(m: int) -> None:
    rng = np.random.default_rng(m)
    rows = (rng.standard_normal((m, 24)) * np.exp2(rng.integers(-40, 40, (m, 24)))).astype(
        np.float32
    )
    rows[:, 0] = -0.0  # -0 columns (and +0 + -0 pairs)
    rows[: m // 2, 1] = 0.0
    rows[m // 2 :, 1] = -0.0
    rows[:, 2] = np.float32(2.0**-149) * rng.integers(-3, 4, m)  # subnormals
    rows[:, 3] = np.float32(3.0e38) * np.sign(rng.standard_normal(m))  # overflowing pairs
    fast = _pairwise_column_sums(torch.from_numpy(rows[:, :3].copy()))
    assert fast is not None
    want = _gemm_sums(rows[:, :3])
    assert np.array_equal(fast.numpy().view(np.uint32), want.view(np.uint32))
    fast = _pairwise_column_sums(torch.from_numpy(np.delete(rows, 3, axis=1)))
    assert fast is not None
    assert np.array_equal(
        fast.numpy().view(np.uint32), _gemm_sums(np.delete(rows, 3, axis=1)).view(np.uint32)
    )


def test_the_order_matters_so_the_test_can_fail() -> None:
    """A left-to-right float32 sum differs from the pairwise tree on these rows."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((37, 64)).astype(np.float32)
    seq = np.zeros(64, np.float32)
    for r in rows:
        seq = seq + r
    fast = _pairwise_column_sums(torch.from_numpy(rows))
    assert fast is not None and not np.array_equal(fast.numpy(), seq)
    assert np.array_equal(fast.numpy(), _gemm_sums(rows))


def test_specials_go_to_the_gemm() -> None:
    rows = torch.tensor([[1.0, float("inf")], [2.0, 1.0]])
    assert _pairwise_column_sums(rows) is None
    big = torch.tensor([[3.0e38], [3.0e38]])  # the sum overflows: the GEMM's rules decide
    assert _pairwise_column_sums(big) is None
    # a non-finite input anywhere in a column (odd ones out, opposite infinities, NaN) leaves
    # that column's sum non-finite: no input check is needed for it
    inf, nan = float("inf"), float("nan")
    for col in ([1.0, 2.0, inf], [inf, -inf, 1.0, 2.0], [1.0, nan, 3.0, 4.0, 5.0], [-inf]):
        rows = torch.tensor([[1.0, v] for v in col])
        assert _pairwise_column_sums(rows) is None, col


def test_a_simulated_linear_bias_gradient_is_the_gemms() -> None:
    import precision_lab.torch as plt

    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 5)
    x = torch.randn(7, 8)
    sim = plt.simulate(lin, "float32")
    g = torch.randn(7, 5)
    sim(x).backward(g)
    want = _gemm_sums(g.numpy())
    assert lin.bias.grad is not None
    assert np.array_equal(lin.bias.grad.numpy().view(np.uint32), want.view(np.uint32))
