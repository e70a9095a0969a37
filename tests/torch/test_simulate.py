"""simulate(model, policy): every emulated GEMM, forward and backward, equals pl.gemm on the same
operands bit for bit (the operands and the stores computed here with the numpy API)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)
import torch.nn.functional as F  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402

import precision_lab as pl  # noqa: E402
import precision_lab.torch as plt  # noqa: E402
from precision_lab.torch.simulate import GemmSpec  # noqa: E402
from precision_lab.training.policy import LossScaleSpec, Policy, TensorScaleSpec  # noqa: E402


def _np(t) -> np.ndarray:
    return t.detach().numpy()


def _store(a, fmt) -> np.ndarray:
    return np.asarray(pl.round_to(np.asarray(a, dtype=np.float32), fmt), dtype=np.float32)


def _bits_equal(t, a) -> bool:
    a = np.asarray(a, dtype=np.float32)
    return bool(np.array_equal(_np(t).view(np.uint32), a.view(np.uint32)))


ACCUMULATORS = {
    "fp32": pl.Accumulator(),
    "a100": pl.tensor_core("a100", "fp16"),
    "bf16_pairwise": pl.Accumulator("bf16", order="pairwise"),
}


@pytest.mark.parametrize("acc", list(ACCUMULATORS), ids=list(ACCUMULATORS))
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16", "float32"])
def test_linear_forward_and_backward_equal_pl_gemm(policy, acc):
    torch.manual_seed(1)
    lin = torch.nn.Linear(24, 5)
    p = pl.get_policy(policy)
    fc, fa, fg = p.compute_format, p.activation_format, p.gradient_format
    fb = p.backward_format
    accumulator = ACCUMULATORS[acc]
    sim = plt.simulate(lin, p, accumulator=accumulator)
    x = (torch.randn(2, 3, 24) * 3).requires_grad_(True)
    g = torch.randn(2, 3, 5) * 1e-3
    y = sim(x)
    y.backward(g)
    X, W, b, G = _np(x).reshape(6, 24), _np(lin.weight), _np(lin.bias), _np(g).reshape(6, 5)
    want_y = _store(pl.gemm(X, W.T, b, input_format=fc, accumulator=accumulator), fa)
    assert _bits_equal(y.reshape(6, 5), want_y)
    Gs = _store(G, fg)
    dX = _store(pl.gemm(Gs, W, input_format=(fb, fc), accumulator=accumulator), fg)
    dWt = _store(pl.gemm(X.T, Gs, input_format=(fc, fb), accumulator=accumulator), fg)
    ones = np.ones((1, 6), np.float32)
    red = "fp32" if p.runs_in_fp32("reductions") else fg
    db = _store(
        pl.gemm(ones, Gs, input_format=fg, accumulator=pl.Accumulator(red, order="pairwise")), fg
    )
    assert _bits_equal(x.grad.reshape(6, 24), dX)
    assert _bits_equal(lin.weight.grad, dWt.T)
    assert _bits_equal(lin.bias.grad, db.reshape(5))
    # not vacuous: the emulation differs from torch's own float32 result
    if policy != "float32":
        assert not torch.equal(y.detach(), F.linear(x, lin.weight, lin.bias).detach())


def test_conv2d_is_an_im2col_gemm():
    torch.manual_seed(2)
    conv = torch.nn.Conv2d(2, 4, 3, padding=1, stride=1)
    sim = plt.simulate(conv, "mixed_bfloat16")
    x = torch.randn(3, 2, 5, 5).requires_grad_(True)
    y = sim(x)
    cols = F.unfold(x.detach(), 3, padding=1)  # (N, 18, 25)
    K = cols.shape[1]
    C2 = _np(cols.transpose(0, 1).reshape(K, -1))
    W2 = _np(conv.weight).reshape(4, K)
    want = pl.gemm(W2, C2, _np(conv.bias).reshape(4, 1), input_format="bf16",
                   accumulator=pl.Accumulator())  # fmt: skip
    want = _store(want, "bf16").reshape(4, 3, 5, 5).transpose(1, 0, 2, 3)
    assert _bits_equal(y, want)
    # close to torch's own convolution (bf16 inputs and outputs)
    assert float((y - conv(x)).detach().abs().max()) < 0.05
    g = torch.randn_like(y)
    y.backward(g)
    G2 = _store(_np(g).transpose(1, 0, 2, 3).reshape(4, -1), "bf16")
    dW = _store(pl.gemm(G2, C2.T, input_format="bf16", accumulator=pl.Accumulator()), "bf16")
    assert _bits_equal(conv.weight.grad.reshape(4, K), dW)
    dcols = _store(pl.gemm(W2.T, G2, input_format="bf16", accumulator=pl.Accumulator()), "bf16")
    dcols_t = torch.from_numpy(dcols.reshape(K, 3, 25).transpose(1, 0, 2).copy())
    want_dx = F.fold(dcols_t, (5, 5), 3, padding=1)  # torch adds the overlapping patches
    assert torch.equal(x.grad, want_dx)


def test_conv1d_and_matmul_bmm_sdpa_run_emulated():
    torch.manual_seed(3)

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(3, 4, 3)

        def forward(self, x, q):
            h = self.conv(x)
            s = torch.bmm(q, q.transpose(1, 2)) @ q
            a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            return h, s, a

    m = M()
    sim = plt.simulate(m, "mixed_float16")
    sim.trace = []
    x, q = torch.randn(2, 3, 7), torch.randn(2, 5, 8)
    h, s_out, a = sim(x, q)
    kinds = [t[0] for t in sim.trace]
    assert kinds == ["conv", "matmul", "matmul", "matmul", "matmul"]
    assert [t[1] for t in sim.trace] == [0, None, None, None, None]
    Q = _np(q)
    s = _store(
        pl.gemm(Q, Q.transpose(0, 2, 1), input_format="fp16", accumulator=pl.Accumulator()), "fp16"
    )
    s2 = _store(pl.gemm(s, Q, input_format="fp16", accumulator=pl.Accumulator()), "fp16")
    assert _bits_equal(s_out, s2)
    ref = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert 0 < float((a - ref).abs().max()) < 0.01  # fp16 GEMMs, an fp32 softmax
    assert h.shape == (2, 4, 5)


def test_fp8_delayed_scaling_operands():
    """Under fp8_hybrid the operands are cast with Transformer Engine's delayed scaling: the
    first step's scale is 1 (empty history), the next the scale from the first step's amax."""
    torch.manual_seed(4)
    lin = torch.nn.Linear(16, 4, bias=False)
    p = pl.get_policy("fp8_hybrid")
    sim = plt.simulate(lin, p)
    sim.train()
    X1 = torch.randn(8, 16) * 0.01
    X2 = torch.randn(8, 16) * 0.01
    W = _np(lin.weight).T
    ds_x = pl.scaling.DelayedScaling("e4m3", 1024, "max", 0)
    ds_w = pl.scaling.DelayedScaling("e4m3", 1024, "max", 0)
    for X in (X1, X2):
        y = sim(X)
        xa, sx = _np(X), np.float32(ds_x.scale)
        sw = np.float32(ds_w.scale)
        qx = pl.round_to(xa * sx, "e4m3", overflow="saturate")
        qw = pl.round_to(W * sw, "e4m3", overflow="saturate")
        want = pl.gemm(qx, qw, input_format="e4m3", accumulator=pl.Accumulator(),
                       scale_a=np.float32(1) / sx, scale_b=np.float32(1) / sw)  # fmt: skip
        assert _bits_equal(y, _store(want, "bf16"))
        ds_x.update(float(np.abs(xa).max()))
        ds_w.update(float(np.abs(W).max()))
    assert ds_x.scale > 1000  # the second step really was scaled


def test_per_layer_overrides_and_training_changes_weights():
    from precision_lab.training.policy import LayerOverride

    torch.manual_seed(5)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    pol = pl.get_policy("fp8_hybrid").replace(
        overrides=(LayerOverride(-1, compute_format="bf16", backward_format="bf16"),)
    )
    sim = plt.simulate(net, pol)
    sim.trace = []
    opt = torch.optim.SGD(sim.parameters(), lr=0.1)
    before = net[0].weight.detach().clone()
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(sim(x), y).backward()
        opt.step()
    assert [t[2] for t in sim.trace[:2]] == ["e4m3", "bf16"]
    assert not torch.equal(before, net[0].weight)


def test_softmax_rule_and_bad_arguments():
    pol = Policy("lowsoft", compute_format="fp16", fp32_ops=("reductions",),
                 loss_scaling=LossScaleSpec("none"), tensor_scaling=TensorScaleSpec())  # fmt: skip

    class S(torch.nn.Module):
        def forward(self, z):
            return torch.softmax(z, dim=-1)

    z = torch.tensor([[0.1, 0.2, 0.3]])
    low = plt.simulate(S(), pol)(z)
    keep = plt.simulate(S(), "mixed_float16")(z)
    assert torch.equal(keep, torch.softmax(z, -1))
    assert _bits_equal(low, _store(_np(torch.softmax(z, -1)), "fp16"))
    with pytest.raises(TypeError, match=r"accumulator must be a precision_lab\.Accumulator"):
        plt.simulate(torch.nn.Linear(2, 2), "float32", accumulator="fp16")
    with pytest.raises(
        TypeError, match="policy must be a Policy, a Recipe, or a policy or recipe name, got int"
    ):
        plt.simulate(torch.nn.Linear(2, 2), 3)
    with pytest.raises(ValueError, match="attention: unknown recipe 'fa9'"):
        plt.simulate(torch.nn.Linear(2, 2), "float32", attention="fa9")
    with pytest.raises(ValueError, match="optimizer_state_format: expected a floating-point"):
        plt.simulate(torch.nn.Linear(2, 2), "float32", optimizer_state_format="int8")
    with pytest.raises(ValueError, match="rounding"):
        plt.simulate(torch.nn.Linear(2, 2), "float32", variable_rounding="sideways")


def test_addmm_is_emulated_and_unemulated_gemms_are_refused():
    torch.manual_seed(6)
    a, b, c = torch.randn(3, 8), torch.randn(8, 2), torch.randn(2)

    class AddMM(torch.nn.Module):
        def forward(self, a, b, c):
            return torch.addmm(c, a, b)

    got = plt.simulate(AddMM(), "mixed_bfloat16")(a, b, c)
    want = _store(pl.gemm(_np(a), _np(b), _np(c), input_format="bf16",
                          accumulator=pl.Accumulator()), "bf16")  # fmt: skip
    assert _bits_equal(got, want)

    class Bil(torch.nn.Module):
        def forward(self, a, b):
            return F.bilinear(a, a, b.reshape(2, 8, 1).expand(2, 8, 8))

    with pytest.raises(NotImplementedError, match="bilinear runs a GEMM"):
        plt.simulate(Bil(), "float32")(a, torch.randn(16))


def test_each_functional_matmul_has_its_own_delayed_scaling_state():
    class Two(torch.nn.Module):
        def forward(self, a, b):
            return (a @ b) @ (b.t() * 1000.0)

    sim = plt.simulate(Two(), pl.get_policy("fp8_hybrid"))
    sim.train()
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(2):
        sim(a, b)
    keys = sorted(k for k in sim.operands.delayed if k[0][0] == "matmul")
    assert len(keys) == 4  # (call 1, call 2) x (a, b)
    scales = {k: sim.operands.delayed[k].scale for k in keys}
    assert len(set(scales.values())) == 4  # four different amax histories


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 5),
    k=st.integers(1, 40),
    n=st.integers(1, 4),
    fmt=st.sampled_from(["fp16", "bf16", "e5m2"]),
    acc=st.sampled_from(list(ACCUMULATORS)),
    data=st.data(),
)
def test_emulated_matmul_equals_pl_gemm_on_any_operands(m, k, n, fmt, acc, data):
    floats = st.floats(-1e3, 1e3, width=32)
    a = data.draw(arrays(np.float32, (m, k), elements=floats))
    b = data.draw(arrays(np.float32, (k, n), elements=floats))
    g = data.draw(arrays(np.float32, (m, n), elements=st.floats(-1, 1, width=32)))
    f = pl.get_format(fmt)
    accumulator = ACCUMULATORS[acc]
    spec = GemmSpec(f, f, f, f, f, accumulator)
    ta = torch.from_numpy(a.copy()).requires_grad_(True)
    tb = torch.from_numpy(b.copy()).requires_grad_(True)
    y = plt.emulated_matmul(ta, tb, spec=spec)
    y.backward(torch.from_numpy(g.copy()))
    with np.errstate(over="ignore", invalid="ignore"):
        want = _store(pl.gemm(a, b, input_format=f, accumulator=accumulator), f)
        gs = _store(g, f)
        da = _store(pl.gemm(gs, b.T, input_format=f, accumulator=accumulator), f)
        db = _store(pl.gemm(a.T, gs, input_format=f, accumulator=accumulator), f)
    assert _bits_equal(y, want)
    assert _bits_equal(ta.grad, da)
    assert _bits_equal(tb.grad, db)


@pytest.mark.parametrize("which", ["b", "a"])
def test_broadcast_operand_gradients_are_summed_then_stored(which):
    """A batched a @ b whose other operand is broadcast over the batch: the broadcast operand's
    gradient is the FP32 sum over the batch (torch's sum of the per-entry pl.gemm results) stored
    once; the batched operand's gradient is stored as its GEMM writes it (the same bits as
    storing pl.gemm's FP32 result)."""
    rng = np.random.default_rng(11)
    f, accumulator = pl.get_format("bf16"), pl.Accumulator()
    spec = GemmSpec(f, f, f, f, f, accumulator)
    a = rng.standard_normal((3, 5, 7) if which == "b" else (5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 4) if which == "b" else (3, 7, 4)).astype(np.float32)
    g = rng.standard_normal((3, 5, 4)).astype(np.float32)
    ta = torch.from_numpy(a.copy()).requires_grad_(True)
    tb = torch.from_numpy(b.copy()).requires_grad_(True)
    plt.emulated_matmul(ta, tb, spec=spec).backward(torch.from_numpy(g))
    gs = _store(g, f)
    ab = [np.broadcast_to(a, (3, 5, 7))[i] for i in range(3)]
    bb = [np.broadcast_to(b, (3, 7, 4))[i] for i in range(3)]
    da = np.stack([pl.gemm(gs[i], bb[i].T, input_format=f, accumulator=accumulator)
                   for i in range(3)])  # fmt: skip
    db = np.stack([pl.gemm(ab[i].T, gs[i], input_format=f, accumulator=accumulator)
                   for i in range(3)])  # fmt: skip
    if which == "b":
        want_a, want_b = _store(da, f), _store(torch.from_numpy(db).sum(0).numpy(), f)
    else:
        want_a, want_b = _store(torch.from_numpy(da).sum(0).numpy(), f), _store(db, f)
    assert _bits_equal(ta.grad, want_a)
    assert _bits_equal(tb.grad, want_b)


# ----- issue 31 item 10: no GEMM runs silently in FP32; integer GEMMs untouched; variables -------
_V = torch.tensor([0.3, -1.7, 2.2, 0.9])
_M = torch.tensor([[1.1, 0.2, -0.5, 3.0], [0.7, -2.0, 0.25, 1.3], [0.1, 0.9, -1.4, 2.2]])
_B = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(3))

#: (name the error must carry, the call) for every GEMM-running op that is not emulated
NOT_EMULATED = [
    ("addmm_", lambda: torch.zeros(3, 3).addmm_(_M, _M.T)),
    ("baddbmm_", lambda: torch.zeros(2, 3, 3).baddbmm_(_B, _B.transpose(1, 2))),
    ("multi_dot", lambda: torch.linalg.multi_dot([_M, _M.T, _M])),
    ("vecdot", lambda: torch.linalg.vecdot(_M, _M)),
    ("cdist", lambda: torch.cdist(_M, _M)),
    (
        "conv_tbc",
        lambda: torch.conv_tbc(torch.randn(5, 1, 2), torch.randn(3, 2, 4), torch.zeros(4)),
    ),
    ("smm", lambda: torch.smm(_M.to_sparse(), _M.T)),
    ("_sparse_mm", lambda: torch.sparse.mm(_M.to_sparse(), _M.T)),
    ("_addmm_activation", lambda: torch._addmm_activation(torch.zeros(3, 3), _M, _M.T)),
]


class _Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self):
        return self.fn()


@pytest.mark.parametrize(("name", "fn"), NOT_EMULATED, ids=[n for n, _ in NOT_EMULATED])
def test_gemm_ops_that_are_not_emulated_raise(name, fn):
    for policy in ("mixed_bfloat16", "te_nvfp4"):
        with pytest.raises(NotImplementedError, match=rf"simulate: (linalg_)?{name} runs a GEMM"):
            plt.simulate(_Call(fn), policy)()


def test_integer_matmuls_run_as_torch_runs_them():
    a = torch.arange(-6, 6, dtype=torch.int64).reshape(3, 4) * (2**40 + 1)
    b = torch.arange(8, dtype=torch.int64).reshape(4, 2) - 3
    ops = [
        lambda: a @ b,
        lambda: torch.matmul(a, b),
        lambda: torch.mm(a, b),
        lambda: torch.bmm(a[None], b[None]),
        lambda: torch.mv(a, b[:, 0]),
        lambda: torch.dot(b[:, 0], b[:, 1]),
        lambda: torch.addmm(torch.ones(3, 2, dtype=torch.int64), a, b),
    ]
    for policy in ("mixed_bfloat16", "te_nvfp4", "fp8_hybrid"):
        for op in ops:
            want = op()
            got = plt.simulate(_Call(op), policy)()
            assert got.dtype == torch.int64 and torch.equal(got, want)  # exact: beyond 2**24


def test_linalg_matmul_is_emulated_as_matmul():
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    w = torch.randn(8, 3, generator=torch.Generator().manual_seed(6))
    want = plt.simulate(_Call(lambda: x @ w), "mixed_bfloat16")()
    got = plt.simulate(_Call(lambda: torch.linalg.matmul(x, w)), "mixed_bfloat16")()
    assert torch.equal(got, want) and not torch.equal(got, x @ w)


def test_variable_format_stores_the_parameters():
    """Policy.variable_format: the parameters are rounded to it at the start and after every
    optimizer step (torch's own bf16 cast, round to nearest even, as the oracle)."""
    pol = Policy("pure_bf16", compute_format="bf16", variable_format="bf16")
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3)
    w0 = lin.weight.detach().clone()
    sim = plt.simulate(lin, pol)
    assert torch.equal(lin.weight, w0.to(torch.bfloat16).float())
    assert not torch.equal(lin.weight, w0)
    opt = torch.optim.SGD(lin.parameters(), lr=0.0123)
    x = torch.randn(5, 6)
    for _ in range(3):
        opt.zero_grad()
        sim(x).square().sum().backward()
        want = [
            (p - 0.0123 * p.grad).detach().to(torch.bfloat16).float()
            for p in (lin.weight, lin.bias)
        ]
        exact = [(p - 0.0123 * p.grad).detach() for p in (lin.weight, lin.bias)]
        opt.step()
        assert torch.equal(lin.weight, want[0]) and torch.equal(lin.bias, want[1])
        assert not torch.equal(lin.weight, exact[0])
    other = torch.nn.Parameter(torch.tensor([1.0 + 2.0**-20]))  # not the model's: untouched
    torch.optim.SGD([other], lr=0.0).step()
    assert other.item() == 1.0 + 2.0**-20
    sim.remove()  # the step hook goes with the layer hooks
    w = lin.weight.detach().clone()
    lin.weight.grad = torch.full_like(w, 2.0**-20)
    torch.optim.SGD([lin.weight], lr=1.0).step()
    assert torch.equal(lin.weight, w - 2.0**-20)


# ----- issue 34: stochastic variable stores, optimizer state formats, capture under emulation ---
def test_variable_format_with_stochastic_rounding_is_unbiased_and_seeded():
    """pure bf16 weights at 1.0, an update of a quarter ulp (2**-9): round to nearest loses it,
    stochastic rounding keeps it on average (a quarter of the weights move up one ulp)."""
    pol = Policy("pure_bf16", compute_format="bf16", variable_format="bf16")

    def step(rounding, seed):
        lin = torch.nn.Linear(64, 64, bias=False)
        with torch.no_grad():
            lin.weight.fill_(1.0)
        sim = plt.simulate(lin, pol, variable_rounding=rounding, seed=seed)
        lin.weight.grad = torch.full_like(lin.weight, -(2.0**-9))
        torch.optim.SGD(lin.parameters(), lr=1.0).step()
        sim.remove()
        return lin.weight.detach().clone()

    rn = step("nearest_even", 0)
    assert torch.equal(rn, torch.ones_like(rn))
    sr = step("stochastic", 3)
    assert set(sr.unique().tolist()) == {1.0, 1.0 + 2.0**-7}  # the two bf16 neighbours
    up = float((sr > 1).float().mean())
    assert abs(up - 0.25) < 0.03  # 4096 weights: 3 sigma is 0.02
    assert torch.equal(step("stochastic", 3), sr)  # the seed reproduces it
    assert not torch.equal(step("stochastic", 4), sr)


def test_a_collected_simulation_does_not_break_a_later_optimizer_step():
    """A simulation that stores parameters after optimizer steps, then dropped, may be collected
    by the garbage collector while torch iterates over its global step hooks (here: a hook that
    collects). Regression: a hook per simulation removed by a finalizer raised "OrderedDict
    mutated during iteration" inside ``optimizer.step()`` (seen in CI)."""
    import gc

    from torch.optim.optimizer import register_optimizer_step_post_hook

    pol = Policy("pure_bf16", compute_format="bf16", variable_format="bf16")
    gc.disable()
    try:
        lin = torch.nn.Linear(4, 4)
        plt.simulate(lin, pol)  # dropped: a reference cycle with lin's layer hooks
        del lin
        collect = register_optimizer_step_post_hook(lambda *args: gc.collect())
        try:
            lin2 = torch.nn.Linear(4, 4, bias=False)
            with torch.no_grad():
                lin2.weight.fill_(1.0)
            sim = plt.simulate(lin2, pol)
            lin2.weight.grad = torch.full_like(lin2.weight, -(2.0**-6))
            torch.optim.SGD(lin2.parameters(), lr=1.0).step()
            assert torch.equal(lin2.weight, torch.full_like(lin2.weight, 1.015625))  # bf16
            sim.remove()
        finally:
            collect.remove()
    finally:
        gc.enable()


def test_optimizer_state_is_stored_in_its_format():
    torch.manual_seed(7)
    lin, twin = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
    twin.load_state_dict(lin.state_dict())
    sim = plt.simulate(lin, "float32", optimizer_state_format="bf16")  # noqa: F841 (kept alive)
    opt, opt2 = torch.optim.Adam(lin.parameters()), torch.optim.Adam(twin.parameters())
    x = torch.randn(5, 6)
    for o, m in ((opt, lin), (opt2, twin)):
        m(x).square().sum().backward()
        o.step()
    for p, p2 in zip(lin.parameters(), twin.parameters(), strict=True):
        st, st2 = opt.state[p], opt2.state[p2]
        for key in ("exp_avg", "exp_avg_sq"):
            want = torch.from_numpy(_store(_np(st2[key]), "bf16"))
            assert torch.equal(st[key], want), key
        assert st["step"] == st2["step"]  # the step count is not rounded
    assert not all(torch.equal(opt.state[p]["exp_avg"], opt2.state[p2]["exp_avg"])
                   for p, p2 in zip(lin.parameters(), twin.parameters(), strict=True))  # fmt: skip


def test_capture_gradients_under_emulation():
    """capture_gradients and simulate compose: the captured gradients are the emulated
    backward's (bf16 values), not FP32's."""
    torch.manual_seed(8)
    net = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    x, y = torch.randn(10, 8), torch.randint(0, 3, (10,))
    sim = plt.simulate(net, "mixed_bfloat16")
    with plt.capture_gradients(net) as cap:
        F.cross_entropy(sim(x), y).backward()
    (step,) = cap.steps
    for n, p in net.named_parameters():
        got = step.grads[f"param:{n}"]
        assert np.array_equal(got, _np(p.grad).reshape(-1)), n
        assert np.array_equal(got, _store(got, "bf16")), n  # on the gradient format's grid
    assert "act:0" in step.grads and "act:2" in step.grads
    emulated = _np(net[0].weight.grad).copy()
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    assert not np.array_equal(emulated, _np(net[0].weight.grad))
