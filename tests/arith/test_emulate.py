"""Emulated arrays: unmodified numpy algorithms give, step for step, the op-level results."""

from __future__ import annotations

import math

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.arith import ops

RNG = np.random.default_rng(99)


def lu_textbook(A):  # type: ignore[no-untyped-def]
    """Gaussian elimination without pivoting, written with numpy operators only."""
    A = A.copy()
    n = A.shape[0]
    for k in range(n - 1):
        A[k + 1 :, k] = A[k + 1 :, k] / A[k, k]
        A[k + 1 :, k + 1 :] -= np.outer(A[k + 1 :, k], A[k, k + 1 :])
    return A


def lu_ops(A: np.ndarray, fmt: str, rounding: str) -> np.ndarray:
    """The same elimination, each step an explicit precision_lab.ops call."""
    kw = {"rounding": rounding}
    A = pl.round_to(A, fmt, rounding=rounding).astype(np.float64)  # as emulate() converts
    n = A.shape[0]
    for k in range(n - 1):
        A[k + 1 :, k] = ops.div(A[k + 1 :, k], A[k, k], fmt, **kw)
        prod = ops.mul(A[k + 1 :, k][:, None], A[k, k + 1 :][None, :], fmt, **kw)
        A[k + 1 :, k + 1 :] = ops.sub(A[k + 1 :, k + 1 :], prod, fmt, **kw)
    return A


def cg_textbook(A, b, iters: int):  # type: ignore[no-untyped-def]
    """Conjugate gradients without np.linalg."""
    x = b * 0.0
    r = b - A @ x
    p = r.copy()
    rs = r @ r
    for _ in range(iters):
        Ap = A @ p
        alpha = rs / (p @ Ap)
        x = x + alpha * p
        r = r - alpha * Ap
        rs_new = r @ r
        p = r + (rs_new / rs) * p
        rs = rs_new
    return x


def cg_ops(A: np.ndarray, b: np.ndarray, iters: int, fmt: str) -> np.ndarray:
    acc = pl.Accumulator(fmt)
    A = pl.round_to(A, fmt).astype(np.float64)
    b = pl.round_to(b, fmt).astype(np.float64)

    def mv(M: np.ndarray, v: np.ndarray) -> np.ndarray:
        return ops.dot(M, v, accumulator=acc)

    x = ops.mul(b, 0.0, fmt)
    r = ops.sub(b, mv(A, x), fmt)
    p = r.copy()
    rs = ops.dot(r, r, accumulator=acc)
    for _ in range(iters):
        Ap = mv(A, p)
        alpha = ops.div(rs, ops.dot(p, Ap, accumulator=acc), fmt)
        x = ops.add(x, ops.mul(alpha, p, fmt), fmt)
        r = ops.sub(r, ops.mul(alpha, Ap, fmt), fmt)
        rs_new = ops.dot(r, r, accumulator=acc)
        p = ops.add(r, ops.mul(ops.div(rs_new, rs, fmt), p, fmt), fmt)
        rs = rs_new
    return x


def bits_equal(a: object, b: object) -> bool:
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    return bool(np.array_equal(x, y, equal_nan=True) and (np.signbit(x) == np.signbit(y)).all())


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3"])
@pytest.mark.parametrize("rounding", ["nearest_even", "toward_zero", "odd"])
def test_gaussian_elimination_step_by_step(fmt: str, rounding: str) -> None:
    n = 12
    A = RNG.uniform(-1, 1, (n, n)) + n * np.eye(n)
    got = lu_textbook(pl.emulate(A, fmt, rounding=rounding))
    assert isinstance(got, pl.Emulated)
    want = lu_ops(A, fmt, rounding=rounding)
    assert bits_equal(got, want)
    # and it is not float64 elimination
    assert not np.allclose(
        np.asarray(got), lu_textbook(pl.round_to(A, fmt).astype(float)), rtol=1e-6
    )


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_conjugate_gradients_step_by_step(fmt: str) -> None:
    n = 10
    M = RNG.uniform(-1, 1, (n, n))
    A = M @ M.T + n * np.eye(n)
    b = RNG.uniform(-1, 1, n)
    got = cg_textbook(pl.emulate(A, fmt), pl.emulate(b, fmt), 6)
    assert bits_equal(got, cg_ops(A, b, 6, fmt))
    # it converges about as far as the format allows
    exact = np.linalg.solve(pl.round_to(A, fmt).astype(float), pl.round_to(b, fmt).astype(float))
    u = pl.get_format(fmt).unit_roundoff
    assert np.max(np.abs(np.asarray(got) - exact)) < 2000 * u * np.max(np.abs(exact))


def test_matmul_sum_and_dot_use_the_accumulator() -> None:
    x = RNG.uniform(0, 1, 300)
    acc = pl.Accumulator("fp32")
    e = pl.emulate(x, "bf16", accumulator=acc)
    xb = pl.round_to(x, "bf16").astype(np.float64)
    assert float(e.sum()) == float(ops.sum(xb, accumulator=acc, out_format="bf16"))
    assert float(np.sum(e)) == float(e.sum())
    assert float(e @ e) == float(ops.dot(xb, xb, accumulator=acc, out_format="bf16"))
    assert float(np.dot(e, e)) == float(e @ e)
    own = pl.emulate(x, "bf16")  # default: sequential in bf16
    assert float(own.sum()) == float(ops.sum(xb, accumulator="bf16"))
    c = np.cumsum(own)
    assert float(c[-1]) == float(own.sum())
    M = pl.emulate(RNG.uniform(-1, 1, (4, 300)), "bf16")
    assert bits_equal(M @ own, [float(row @ own) for row in M])


def test_unsupported_functions_name_themselves() -> None:
    a = pl.emulate(np.eye(3) * 2, "bf16")
    with pytest.raises(TypeError, match=r"numpy\.linalg\.solve"):
        np.linalg.solve(a, np.ones(3))
    with pytest.raises(TypeError, match=r"numpy\.linalg\.inv"):
        np.linalg.inv(a)
    with pytest.raises(TypeError, match=r"numpy\.sin"):
        np.sin(a)
    with pytest.raises(TypeError, match="power"):
        a**3
    with pytest.raises(TypeError, match=r"numpy\.prod"):
        np.prod(a)
    with pytest.raises(TypeError, match=r"numpy\.multiply\.reduce"):
        np.multiply.reduce(a)


def test_pass_through_keeps_values_and_format() -> None:
    x = RNG.uniform(-3, 3, (3, 4))
    e = pl.emulate(x, "e4m3")
    v = pl.round_to(x, "e4m3").astype(np.float64)
    for got, want in [
        (e.T, v.T),
        (e.reshape(4, 3), v.reshape(4, 3)),
        (np.concatenate([e, e]), np.concatenate([v, v])),
        (np.where(e > 0, e, 0.0), np.where(v > 0, v, 0.0)),
        (e[1:, ::2], v[1:, ::2]),
        (np.triu(e), np.triu(v)),
        (e.copy(), v),
    ]:
        assert isinstance(got, pl.Emulated) and got.fmt == e.fmt
        assert bits_equal(got, want)
    joined = np.concatenate([e, np.full((1, 4), 0.3)])  # plain parts are rounded
    assert float(joined[3, 0]) == float(pl.round_to(0.3, "e4m3"))
    e[0, 0] = 0.3  # assignment rounds
    assert float(e[0, 0]) == float(pl.round_to(0.3, "e4m3"))
    assert (e > 0).dtype == bool
    assert np.isnan(pl.emulate([np.nan], "bf16")).tolist() == [True]


def test_promotion_rule() -> None:
    b = pl.emulate([1.0], "bf16")
    h = pl.emulate([1.0], "fp16")
    e = pl.emulate([1.0], "e4m3")
    assert (b + h).fmt == h.fmt  # fp16 has more significand bits
    assert (b + e).fmt == b.fmt  # bf16: 8 bits against 4
    assert (h + 2.0**-11).fmt == h.fmt
    assert float((b + 2.0**-9)[0]) == 1.0  # the scalar takes bf16's format: 1 + 2**-9 ties to 1
    assert float((h + 2.0**-9)[0]) == 1.0 + 2.0**-9
    assert (b + np.ones(1)).fmt == b.fmt


def test_stochastic_counter_is_fresh_and_reproducible() -> None:
    def run(seed: int) -> np.ndarray:
        x = pl.emulate(np.ones(2000), "bf16", rounding="stochastic", seed=seed)
        y = x + 2.0**-10
        z = x + 2.0**-10  # the same operation again: fresh random words
        return np.stack([np.asarray(y), np.asarray(z)])

    a, b = run(5), run(5)
    assert np.array_equal(a, b)
    assert not np.array_equal(a[0], a[1])
    assert not np.array_equal(run(6), a)
    frac_up = float((a > 1).mean())
    assert abs(frac_up - 0.125) < 0.02  # 2**-10 is an eighth of bf16's ulp at 1


def test_in_place_updates_write_through() -> None:
    a = pl.emulate(np.arange(6.0).reshape(2, 3), "fp16")
    a[1] -= a[0] * 0.5
    assert a.tolist() == [[0.0, 1.0, 2.0], [3.0, 3.5, 4.0]]
    a *= 2.0
    assert a.tolist()[1] == [6.0, 7.0, 8.0]


def test_results_are_on_grid_and_repr() -> None:
    e = pl.emulate(RNG.uniform(-1, 1, 50), "e5m2")
    for r in (e * 1.7, np.exp(e), np.tanh(e), np.sqrt(np.abs(e)), e / 3.0, -e, np.square(e)):
        v = np.asarray(r)
        assert bits_equal(pl.round_to(v, "e5m2"), v)
    assert repr(pl.emulate(1.5, "e4m3")) == "Emulated(1.5, fmt=e4m3)"
    assert math.isclose(float(pl.emulate(2.0, "bf16") ** 0.5), 1.4140625)
