"""Gradient capture: the captured values are the gradients saved by hand, bit for bit; the
statistics of a captured step equal those computed on the hand-saved tensors; a sample keeps
exact counts; the file is what pl.gradients reads."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)

import precision_lab as pl  # noqa: E402
import precision_lab.torch as plt  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 5)
        self.fc2 = torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(7, 6, generator=g)
    y = torch.randint(0, 3, (7,), generator=g)
    return x, y


def _model(scale_down: float = 2.0**-14) -> Net:
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():  # small weights: gradients reach fp16's subnormals and below
        net.fc1.weight.mul_(scale_down)
        net.fc2.weight.mul_(scale_down)
    return net


def _by_hand(net: Net, x, y) -> dict[str, np.ndarray]:
    """The same step's gradients, saved by hand (retain_grad on the outputs, .grad)."""
    net.zero_grad()
    h1 = net.fc1(x)
    h1.retain_grad()
    h2 = net.fc2(torch.relu(h1))
    h2.retain_grad()
    torch.nn.functional.cross_entropy(h2, y).backward()
    out = {
        "act:fc1": h1.grad.numpy().reshape(-1).copy(),
        "act:fc2": h2.grad.numpy().reshape(-1).copy(),
    }
    for n, p in net.named_parameters():
        out[f"param:{n}"] = p.grad.numpy().reshape(-1).copy()
    return out


def test_captured_step_equals_hand_saved_tensors_and_their_statistics(tmp_path):
    net, (x, y) = _model(2.0**-22), _data()
    hand = _by_hand(net, x, y)
    net.zero_grad()
    with plt.capture_gradients(net, formats=("fp16", "e4m3")) as cap:
        torch.nn.functional.cross_entropy(net(x), y).backward()
    (step,) = cap.steps
    assert set(step.grads) == set(hand)
    for n, v in hand.items():
        assert np.array_equal(step.grads[n].view(np.uint32), v.view(np.uint32)), n
    # one call each, equal to the analysis of the hand-saved tensors
    for fmt in ("fp16", "e4m3", "bf16"):
        stats = step.underflow_stats(fmt)
        for n, v in hand.items():
            assert stats[n] == _eq(pl.underflow_stats(v, fmt)), (fmt, n)
        every = np.concatenate([hand[n].astype(np.float64) for n in step.names()])
        assert stats["all"] == _eq(pl.underflow_stats(every, fmt))
        assert step.pick_loss_scale(fmt) == pl.pick_loss_scale(every, fmt)
    # a real underflow to see: some of these gradients are below fp16's smallest subnormal
    assert step.underflow_stats("fp16")["all"].zero_fraction > 0
    scaler = pl.scaling.DynamicLossScaler(init_scale=1.0, growth_interval=1)
    sim = cap.simulate(scaler, "fp16")
    ref = pl.scaling.simulate(
        pl.scaling.DynamicLossScaler(init_scale=1.0, growth_interval=1), [hand], "fp16"
    )
    assert sim.summary() == ref.summary()
    assert np.array_equal(sim.underflow_fraction, ref.underflow_fraction)
    assert str(cap.diagnose(pl.scaling.DynamicLossScaler(init_scale=1.0))) == str(
        pl.scaling.diagnose(
            pl.scaling.simulate(pl.scaling.DynamicLossScaler(init_scale=1.0), [hand], "fp16")
        )
    )
    a = step.analyze("fp16", scaler=pl.scaling.DynamicLossScaler(init_scale=1.0))
    assert a.loss_scale == pl.pick_loss_scale(every, "fp16")
    want = pl.scaling.diagnose(
        pl.scaling.simulate(pl.scaling.DynamicLossScaler(init_scale=1.0), [hand], "fp16")
    )
    assert a.diagnosis == want and "vanishing_gradients" in want.kinds
    assert a.underflow["e4m3"] == _eq(pl.underflow_stats(every, "e4m3"))
    # the file pl.gradients reads
    path = step.save(tmp_path / "step0")
    back = pl.gradients.load_gradients(path)
    assert set(back) == {"act__fc1", "act__fc2", "param__fc1_weight", "param__fc1_bias",
                         "param__fc2_weight", "param__fc2_bias"}  # fmt: skip
    assert np.array_equal(back["param__fc1_weight"], hand["param:fc1.weight"])


def _eq(st):
    """UnderflowStats compare by fields; the histograms are numpy arrays (compared apart)."""
    return _Fields(st)


class _Fields:
    def __init__(self, st) -> None:
        self.st = st

    def __eq__(self, other) -> bool:
        a, b = self.st, other
        scalars = ("fmt", "scale", "n", "n_nonzero", "n_nonfinite", "zero_fraction")
        scalars += ("subnormal_fraction", "overflow_fraction", "rel_l1_error", "rel_l2_error")
        arrays = ("hist_log2", "hist_counts", "hist_zero", "hist_subnormal")
        return all(getattr(a, k) == getattr(b, k) for k in scalars) and all(
            np.array_equal(getattr(a, k), getattr(b, k)) for k in arrays
        )

    __hash__ = None  # type: ignore[assignment]


def test_sample_keeps_exact_counts_and_is_reproducible():
    net, (x, y) = _model(2.0**-20), _data(1)
    hand = _by_hand(net, x, y)
    steps = []
    for _ in range(2):
        net.zero_grad()
        with plt.capture_gradients(net, sample=4, seed=3, formats=("fp16", "bf16")) as cap:
            torch.nn.functional.cross_entropy(net(x), y).backward()
        steps.append(cap.steps[0])
    s = steps[0]
    assert s.sampled
    for n, v in hand.items():
        c = s.counts[n]
        assert c.n == v.size and c.n_kept == min(4, v.size)
        assert c.n_zero == int(np.count_nonzero(v == 0))
        for fmt in ("fp16", "bf16"):
            st = pl.underflow_stats(v, fmt)
            assert c.zero[fmt] == round(st.zero_fraction * st.n_nonzero)
            assert c.subnormal[fmt] == round(st.subnormal_fraction * st.n_nonzero)
            assert c.overflow[fmt] == 0
        # the kept values are values of the tensor, in order, the same on a second run
        assert np.isin(s.grads[n], v).all()
        assert np.array_equal(s.grads[n], steps[1].grads[n])
    # fp16 loses some of these gradients to zero: the counts see it
    assert sum(c.zero["fp16"] for c in s.counts.values()) > 0


def test_each_backward_is_a_step_and_repeated_modules_get_numbered():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)
    model = torch.nn.Sequential(lin, torch.nn.Tanh())
    with plt.capture_gradients(model, formats=()) as cap:
        for _ in range(3):
            model(model(torch.randn(2, 3))).sum().backward()
    assert len(cap.steps) == 3
    assert cap.steps[0].names("act") == ["act:1#1", "act:0#1", "act:1", "act:0"]
    assert [st.index for st in cap.steps] == [0, 1, 2]
    with pytest.raises(ValueError, match="has no module 'nope'"):
        plt.GradientCapture(model, modules=["nope"])
    with pytest.raises(ValueError, match="sample must be None or an int >= 1"):
        plt.GradientCapture(model, sample=0)


def test_enabled_records_only_the_chosen_steps_and_pools_them():
    torch.manual_seed(0)
    net = Net()
    x, y = _data(2)
    hand = []
    with plt.capture_gradients(net, formats=("fp16",)) as cap:
        for i in range(5):
            cap.enabled = i % 2 == 0
            net.zero_grad()
            torch.nn.functional.cross_entropy(net(x * (i + 1)), y).backward()
            if cap.enabled:
                hand.append({n: p.grad.numpy().copy() for n, p in net.named_parameters()})
    assert len(cap.steps) == 3
    for step, h in zip(cap.steps, hand, strict=True):
        for n, v in h.items():
            assert np.array_equal(step.grads[f"param:{n}"], v.reshape(-1))
    pooled = np.concatenate([s.values() for s in cap.steps])
    assert np.array_equal(cap.values(), pooled)
    assert cap.pick_loss_scale("fp16") == pl.pick_loss_scale(pooled, "fp16")


def test_capture_of_an_emulated_model_sees_the_stored_gradients():
    """Under simulate(mixed_float16) every gradient a GEMM returns is stored in fp16: the
    captured weight gradients are on the fp16 grid (round_to is the identity on them)."""
    net, (x, y) = _model(2.0**-10), _data(3)
    sim = plt.simulate(net, "mixed_float16")
    with plt.capture_gradients(net, formats=("fp16",)) as cap:
        torch.nn.functional.cross_entropy(sim(x), y).backward()
    (step,) = cap.steps
    for n in ("param:fc1.weight", "param:fc2.weight", "act:fc1"):
        v = step.grads[n]
        assert np.array_equal(pl.round_to(v, "fp16"), v), n
        assert step.counts[n].zero["fp16"] == 0  # nothing left to lose: already stored in fp16


class _AttnBlock(torch.nn.Module):
    """Attention (a module with a child, ``out_proj``, that its forward never calls as a module)
    and a residual add after it."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.skip = torch.nn.Identity()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, _ = self.attn(x, x, x, need_weights=False)
        return self.fc(self.skip(x + a)) + x


def test_default_capture_records_non_leaf_outputs_once():
    """The attention output (not a leaf module's) and the model's own output (a residual add)
    are recorded, equal to the gradients saved by hand; a tensor returned by several modules
    (Identity, the Sequential around the block) is recorded once."""
    torch.manual_seed(0)
    block = _AttnBlock()
    model = torch.nn.Sequential(block)
    x = torch.randn(2, 3, 8)
    with plt.capture_gradients(model, formats=()) as cap:
        model(x).square().sum().backward()
    (step,) = cap.steps
    assert sorted(step.names("act")) == ["act:0", "act:0.attn.0", "act:0.fc", "act:0.skip"]
    a, _ = block.attn(x, x, x, need_weights=False)
    a.retain_grad()
    h = x + a
    h.retain_grad()
    f = block.fc(h)
    f.retain_grad()
    out = f + x
    out.retain_grad()
    out.square().sum().backward()
    for name, t in (("act:0.attn.0", a), ("act:0.skip", h), ("act:0.fc", f), ("act:0", out)):
        assert np.array_equal(step.grads[name], t.grad.numpy().reshape(-1)), name
