"""Issue 34: the operations simulate now emulates (mv, dot, inner, outer, addmv, addr, einsum,
tensordot, baddbmm, addbmm, grouped / 3-D / transposed convolutions) equal pl.gemm on the
decomposed computation bit for bit (operands, accumulator and stores computed here with the
numpy API), and equal torch's float32 results to float32 rounding under the float32 policy."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)
import torch.nn.functional as F  # noqa: E402

import precision_lab as pl  # noqa: E402
import precision_lab.torch as plt  # noqa: E402

ACC = pl.tensor_core("a100", "bf16")


def _np(t) -> np.ndarray:
    return t.detach().numpy()


def _g(a, b, c=None, acc=ACC) -> np.ndarray:
    """bf16 operands, the accumulator, stored in bf16 (mixed_bfloat16's activation format)."""
    r = pl.gemm(np.asarray(a, np.float32), np.asarray(b, np.float32), c, input_format="bf16",
                accumulator=acc)  # fmt: skip
    return np.asarray(pl.round_to(np.asarray(r, np.float32), "bf16"), np.float32)


def _bits(t, a) -> bool:
    a = np.asarray(a, np.float32)
    got = np.array(_np(t), np.float32)
    return got.shape == a.shape and bool(
        np.array_equal(got.reshape(-1).view(np.uint32), np.array(a).reshape(-1).view(np.uint32))
    )


class _Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *a):
        return self.fn(*a)


def _sim(fn, *args, policy="mixed_bfloat16"):
    return plt.simulate(_Call(fn), policy, accumulator=ACC if policy != "float32" else None)(*args)


_r = np.random.default_rng(0)


def _t(*shape) -> torch.Tensor:
    return torch.from_numpy((_r.standard_normal(shape) * 2).astype(np.float32))


A, B, V = _t(3, 40), _t(40, 5), _t(40)
B3, B4 = _t(2, 3, 40), _t(2, 40, 5)


def test_vector_products_are_gemms():
    a, v = _np(A), _np(V)
    assert _bits(_sim(torch.mv, A, V), _g(a, v[:, None])[:, 0])
    assert _bits(_sim(torch.dot, V, V), _g(v[None], v[:, None]).reshape(()))
    assert _bits(_sim(torch.inner, A, A), _g(a, a.T))
    assert _bits(_sim(torch.outer, V[:4], V[:3]), _g(v[:4, None], v[None, :3]))
    c = _np(_t(3))
    got = _sim(lambda m, x, c: torch.addmv(c, m, x), A, V, torch.from_numpy(c))
    assert _bits(got, _g(a, v[:, None], c[:, None])[:, 0])  # c in the accumulator
    # alpha, beta: an epilogue on the stored product, in float32
    got = _sim(lambda m, x, c: torch.addmv(c, m, x, beta=0.5, alpha=2.0), A, V, torch.from_numpy(c))
    assert _bits(got, _g(a, v[:, None])[:, 0] * np.float32(2.0) + c * np.float32(0.5))


def test_einsum_and_tensordot_are_batched_gemms():
    b3, b4, a = _np(B3), _np(B4), _np(A)
    assert _bits(_sim(lambda x, y: torch.einsum("bij,bjk->bik", x, y), B3, B4), _g(b3, b4))
    # implicit output, ellipsis, a contraction over two subscripts
    got = _sim(lambda x, y: torch.einsum("...ij,...jk", x, y), B3, B4)
    assert _bits(got, _g(b3, b4))
    got = _sim(lambda x, y: torch.einsum("bij,bij->i", x, y), B3, B3)
    want = _g(b3.transpose(1, 0, 2).reshape(3, 1, 80), b3.transpose(1, 0, 2).reshape(3, 80, 1))
    assert _bits(got, want.reshape(3))
    # three operands: left to right
    got = _sim(lambda x, y, z: torch.einsum("ik,kj,jl->il", x, y, z), A, B, B.T)
    assert _bits(got, _g(_g(a, _np(B)), _np(B).T))
    got = _sim(lambda x, y: torch.tensordot(x, y, dims=([0, 2], [0, 1])), B3, B4)
    assert _bits(got, _g(b3.transpose(1, 0, 2).reshape(3, 80), b4.reshape(80, 5)))
    # under float32: torch's own values to float32 rounding
    ref = torch.einsum("ik,kj,jl->il", A, B, B.T)
    got = _sim(lambda x, y, z: torch.einsum("ik,kj,jl->il", x, y, z), A, B, B.T, policy="float32")
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_baddbmm_and_addbmm():
    b3, b4 = _np(B3), _np(B4)
    c = _t(2, 3, 5)
    got = _sim(lambda c, x, y: torch.baddbmm(c, x, y), c, B3, B4)
    assert _bits(got, _g(b3, b4, _np(c)))
    got = _sim(lambda c, x, y: torch.baddbmm(c, x, y, beta=0.0, alpha=0.125), c * np.nan, B3, B4)
    assert _bits(got, _g(b3, b4) * np.float32(0.125))  # beta = 0 ignores c, NaN included
    c2 = _t(3, 5)
    got = _sim(lambda c, x, y: torch.addbmm(c, x, y), c2, B3, B4)
    # one GEMM whose contraction runs over the batches in order
    want = _g(b3.transpose(1, 0, 2).reshape(3, 80), b4.reshape(80, 5), _np(c2))
    assert _bits(got, want)
    ref = torch.addbmm(c2, B3, B4)
    assert float((got - ref).abs().max()) < 0.5 and not torch.equal(got, ref)


def _im2col(x: np.ndarray, k: tuple[int, ...]) -> np.ndarray:
    """(C*prod(k), N*L) patches of an unpadded, stride-1 convolution (numpy's windows)."""
    nd = len(k)
    w = np.lib.stride_tricks.sliding_window_view(x, k, axis=tuple(range(2, 2 + nd)))
    # (N, C, *O, *k) -> (C, *k, N, *O)
    perm = (1, *range(2 + nd, 2 + 2 * nd), 0, *range(2, 2 + nd))
    w = w.transpose(perm)
    return w.reshape(x.shape[1] * int(np.prod(k)), -1)


def test_grouped_and_3d_convolutions_are_im2col_gemms():
    x = _t(2, 4, 5, 4, 3)
    w = _t(6, 2, 2, 3, 2)
    b = _t(6)
    conv = torch.nn.Conv3d(4, 6, (2, 3, 2), groups=2)
    with torch.no_grad():
        conv.weight.copy_(w)
        conv.bias.copy_(b)
    got = plt.simulate(conv, "mixed_bfloat16", accumulator=ACC)(x)
    xs = _np(x)
    outs = []
    for g in range(2):
        cols = _im2col(xs[:, 2 * g : 2 * g + 2], (2, 3, 2))
        outs.append(
            _g(_np(w)[3 * g : 3 * g + 3].reshape(3, -1), cols, _np(b)[3 * g : 3 * g + 3, None])
        )
    want = np.concatenate(outs).reshape(6, 2, 4, 2, 2).transpose(1, 0, 2, 3, 4)
    assert _bits(got, want)
    ref = conv(x).detach()
    assert float((got - ref).detach().abs().max()) < 0.01 * float(ref.abs().max())


def test_transposed_convolution_is_a_gemm_then_col2im():
    x = _t(2, 4, 3, 3)
    w = _t(4, 3, 2, 2)
    got = _sim(lambda x, w: F.conv_transpose2d(x, w, stride=2), x, w)
    cols = _g(_np(w).reshape(4, 12).T, _np(x).transpose(1, 0, 2, 3).reshape(4, 18))
    cols_t = torch.from_numpy(cols.reshape(12, 2, 9).transpose(1, 0, 2).copy())
    want = F.fold(cols_t, (6, 6), 2, stride=2)  # torch's col2im adds the columns
    want = np.asarray(pl.round_to(_np(want), "bf16"), np.float32)
    assert _bits(got, want)
    # float32 policy: torch's values (here the same bits: the same sums in the same order)
    ref = F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1)
    got32 = _sim(lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
                 x, w, policy="float32")  # fmt: skip
    assert got32.shape == ref.shape and torch.allclose(got32, ref, rtol=1e-6, atol=1e-5)


def test_gradients_flow_through_the_new_operations():
    x = _t(2, 4, 5).requires_grad_(True)
    w = _t(4, 3, 3).requires_grad_(True)
    y = _sim(lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1), x, w, policy="float32")
    y.square().sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    F.conv_transpose1d(x, w, stride=2, padding=1).square().sum().backward()
    assert torch.allclose(gx, x.grad, rtol=1e-5, atol=1e-4)
    assert torch.allclose(gw, w.grad, rtol=1e-5, atol=1e-4)
