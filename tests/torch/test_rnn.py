"""Issue 34: nn.RNN / nn.LSTM / nn.GRU and their cells under simulate: every gate GEMM emulated
(an independent step-by-step reference with pl.gemm gives the same bits), and under the float32
policy torch's own results to float32 rounding, for every layer and direction."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)

import precision_lab as pl  # noqa: E402
import precision_lab.torch as plt  # noqa: E402

ACC = pl.tensor_core("a100", "bf16")


def _lin(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x @ w^T + b with bf16 operands, the bias in the accumulator, stored in bf16."""
    x2 = x.detach().reshape(-1, x.shape[-1]).numpy()
    r = pl.gemm(x2, w.detach().numpy().T, None if b is None else b.detach().numpy(),
                input_format="bf16", accumulator=ACC)  # fmt: skip
    r = np.asarray(pl.round_to(np.asarray(r, np.float32), "bf16"), np.float32)
    return torch.from_numpy(r).reshape(*x.shape[:-1], w.shape[0])


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.asarray(pl.round_to(t.detach().numpy(), "bf16"), np.float32))


def _gru_reference(gru: torch.nn.GRU, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer, one direction: gates r, z, n; b_hn inside r * (.)."""
    w_ih, w_hh, b_ih, b_hh = gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0
    h = torch.zeros(x.shape[1], gru.hidden_size)
    gi = _lin(x, w_ih, b_ih)
    ys = []
    for t in range(x.shape[0]):
        gh = _lin(h, w_hh, b_hh)
        ir, iz, in_ = gi[t].chunk(3, -1)
        hr, hz, hn = gh.chunk(3, -1)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        h = _bf16((1 - z) * n + z * h)
        ys.append(h)
    return torch.stack(ys), h


def test_gru_gates_are_emulated_gemms_bit_for_bit():
    torch.manual_seed(0)
    gru = torch.nn.GRU(6, 5)
    x = torch.randn(4, 3, 6)
    out, h = plt.simulate(gru, "mixed_bfloat16", accumulator=ACC)(x)
    want, hw = _gru_reference(gru, x)
    assert torch.equal(out, want) and torch.equal(h[0], hw)
    assert not torch.equal(out, gru(x)[0])  # not torch's FP32 result


def test_lstm_cell_gates_i_f_g_o():
    torch.manual_seed(1)
    cell = torch.nn.LSTMCell(6, 4)
    x, h0, c0 = torch.randn(3, 6), torch.randn(3, 4), torch.randn(3, 4)
    h, c = plt.simulate(cell, "mixed_bfloat16", accumulator=ACC)(x, (h0, c0))
    g = _lin(x, cell.weight_ih, cell.bias_ih) + _lin(h0, cell.weight_hh, cell.bias_hh)
    i, f, gg, o = g.chunk(4, -1)
    cw = _bf16(torch.sigmoid(f) * c0 + torch.sigmoid(i) * torch.tanh(gg))
    hw = _bf16(torch.sigmoid(o) * torch.tanh(cw))
    assert torch.equal(c, cw) and torch.equal(h, hw)


@pytest.mark.parametrize(
    ("module", "x"),
    [
        (
            lambda: torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True),
            (2, 5, 3),
        ),
        (lambda: torch.nn.GRU(3, 4, num_layers=2, bidirectional=True), (5, 2, 3)),
        (lambda: torch.nn.RNN(3, 4, num_layers=2, nonlinearity="relu"), (5, 2, 3)),
        (lambda: torch.nn.RNN(3, 4, bias=False), (5, 3)),  # unbatched
        (lambda: torch.nn.LSTM(3, 4, proj_size=2, bidirectional=True), (5, 2, 3)),
        (lambda: torch.nn.GRUCell(3, 4), (2, 3)),
        (lambda: torch.nn.RNNCell(3, 4, nonlinearity="relu"), (3,)),
    ],
    ids=[
        "lstm_bi_2layers",
        "gru_bi_2layers",
        "rnn_relu",
        "rnn_unbatched",
        "lstm_proj",
        "gru_cell",
        "rnn_cell",
    ],
)
def test_float32_policy_matches_torch(module, x):
    torch.manual_seed(2)
    m = module()
    xt = torch.randn(*x, requires_grad=True)
    got = plt.simulate(m, "float32")(xt)
    ref = m(xt)

    def flat(o):
        if isinstance(o, torch.Tensor):
            return [o]
        return [t for u in o for t in flat(u)]

    for g, r in zip(flat(got), flat(ref), strict=True):
        assert g.shape == r.shape
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-6)
    # the gradients too (autograd through the emulated GEMMs)
    sum(t.square().sum() for t in flat(got)).backward()
    gx = xt.grad.clone()
    gw = [p.grad.clone() for p in m.parameters()]
    xt.grad = None
    m.zero_grad()
    sum(t.square().sum() for t in flat(ref)).backward()
    assert torch.allclose(gx, xt.grad, rtol=1e-4, atol=1e-5)
    for a, b in zip(gw, (p.grad for p in m.parameters()), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_recurrent_layers_under_a_recipe_differ_from_fp32():
    """A GRU under te_nvfp4 used to differ from FP32 by exactly 0.0 (issue 31); now its GEMMs
    are the recipe's."""
    torch.manual_seed(3)
    gru = torch.nn.GRU(16, 16)
    x = torch.randn(3, 2, 16)
    sim = plt.simulate(gru, "te_nvfp4")
    sim.trace = []
    out = sim(x)[0]
    assert len(sim.trace) == 1 + 3  # the input GEMM, then one hidden GEMM per step
    assert float((out - gru(x)[0]).detach().abs().max()) > 1e-3
