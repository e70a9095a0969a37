"""LossScaling drives a real torch optimizer: with the "torch" preset its scale history, skipped
steps and parameters equal torch.amp.GradScaler's on a seeded run; every preset's history is the
scaler's own trajectory of the found_inf flags."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)

import precision_lab as pl  # noqa: E402
import precision_lab.torch as plt  # noqa: E402

STEPS = 40


def _setup():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 5, generator=g) * (1 + 40 * (i % 7 == 3)),
             torch.randint(0, 3, (16,), generator=g)) for i in range(STEPS)]  # fmt: skip
    return net, opt, data


def _run(scaler, **kw):
    """Train STEPS steps with ``scaler`` (torch's GradScaler or a LossScaling); return the scale
    before each step, whether each step was skipped, and the final parameters."""
    net, opt, data = _setup()
    scales, skipped = [], []
    for x, y in data:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y) * 64.0
        s_before = scaler.get_scale()
        scaler.scale(loss).backward()
        before = [p.detach().clone() for p in net.parameters()]
        scaler.step(opt)
        scaler.update()
        stepped = any(not torch.equal(b, p) for b, p in zip(before, net.parameters(), strict=True))
        scales.append(s_before)
        skipped.append(not stepped)
    return np.array(scales), np.array(skipped), [p.detach().clone() for p in net.parameters()]


def test_torch_preset_equals_torch_gradscaler():
    # 2**126 makes the scaled float32 gradients overflow at first, and on the large batches
    # (every 7th); growth every 3 clean steps brings the overflow back: skips and growth mix
    opts = {"init_scale": 2.0**126, "growth_interval": 3}
    ref = torch.amp.GradScaler("cpu", **opts)
    ours = plt.LossScaling("torch", **opts)
    s_ref, k_ref, p_ref = _run(ref)
    s_ours, k_ours, p_ours = _run(ours)
    assert k_ref.any() and not k_ref.all()  # the run holds both kinds of step
    assert len(set(s_ref.tolist())) > 3
    assert np.array_equal(s_ours, s_ref)
    assert np.array_equal(k_ours, k_ref)
    assert np.array_equal(ours.scales, s_ref) and np.array_equal(ours.skipped, k_ref)
    for a, b in zip(p_ours, p_ref, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("preset", ["torch", "keras", "apex", "deepspeed", "megatron"])
def test_each_preset_drives_the_optimizer_with_its_own_trajectory(preset):
    # overflow of the scaled gradients in fp16 (an FP32 model standing in for fp16 gradients)
    ls = plt.LossScaling(preset, init_scale=2.0**20, fmt="fp16")
    scales_used, skipped, _ = _run(ls)
    assert skipped.any() and not skipped.all()
    ref = pl.scaling.DynamicLossScaler.preset(preset, init_scale=2.0**20)
    after, taken = pl.scaling.trajectory(ref, ls.found_inf.tolist())
    assert np.array_equal(ls.scales, np.concatenate([[2.0**20], after[:-1]]))
    assert np.array_equal(ls.skipped, ~taken) and np.array_equal(skipped, ~taken)
    assert np.array_equal(scales_used, ls.scales)


def test_fmt_counts_overflow_in_the_emulated_gradient_format():
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    ls = plt.LossScaling(pl.scaling.StaticLossScaler(2.0**16), fmt="fp16")
    opt.zero_grad()
    ls.scale((w * 2.0).sum()).backward()  # scaled gradient 2**17: fine in fp32, inf in fp16
    assert ls.step(opt) is None
    ls.update()
    assert ls.skipped.tolist() == [True]
    assert w.item() == 1.0
    with pytest.raises(RuntimeError, match="update\\(\\) without a step"):
        ls.update()
    with pytest.raises(TypeError, match="overrides are for a preset name"):
        plt.LossScaling(pl.scaling.StaticLossScaler(2.0), growth_interval=3)


def test_emulated_fp16_gradients_overflow_and_the_step_is_skipped():
    """Under simulate(mixed_float16) the gradients are stored in fp16: a loss scale that takes
    them past 65504 gives inf there (not in float32), and LossScaling skips the step."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    sim = plt.simulate(net, "mixed_float16")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(8, 4) * 100, torch.randint(0, 3, (8,))
    before = net.weight.detach().clone()
    for scale, skipped in ((2.0**20, True), (1.0, False)):
        ls = plt.LossScaling(pl.scaling.StaticLossScaler(scale))
        opt.zero_grad()
        ls.scale(torch.nn.functional.cross_entropy(sim(x), y)).backward()
        assert bool(torch.isinf(net.weight.grad).any()) == skipped
        ls.step(opt)
        ls.update()
        assert ls.skipped.tolist() == [skipped]
        assert torch.equal(net.weight, before) == skipped


# ----- torch.amp.GradScaler beside every scaler claimed equal to it (issue 31 item 4) -----------
from hypothesis import given  # noqa: E402
from hypothesis import settings as hsettings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: what is claimed equal to torch.amp.GradScaler: the "torch" preset and DynamicLossScaler's
#: defaults (as an object)
GRADSCALER_EQUALS = {
    "torch preset": lambda **kw: plt.LossScaling("torch", **kw),
    "DynamicLossScaler()": lambda **kw: plt.LossScaling(pl.scaling.DynamicLossScaler(**kw)),
}

#: (init_scale, growth_factor, backoff_factor, growth_interval, gradient size): init scales that
#: are not powers of two, factors float32 cannot hold, growth up to the float32 ceiling
CASES = [
    (65536.0, 1.1, 0.1, 1, 1.0),
    (3.0, 1.1, 0.3, 2, 1.0),
    (1000.7, 2.0, 0.5, 3, 1.0),
    (1.0e-3, 3.7, 0.77, 2, 1.0),
    (2.0**127 * 1.5, 1.2, 0.3, 1, 1e-30),  # grows to the ceiling, then growth is refused
]


def _two_optimizer_run(scaler, flags, *, clip, size=1.0):
    """Iterations of two parameters with their own optimizers (SGD with momentum, Adam): flag
    "a" / "b" / "ab" puts inf / NaN in a's / b's loss term (a scaled-gradient overflow), and the
    gradients are otherwise of the order of ``size``. ``clip``: unscale_(oa) then clip a's gradient
    norm before the steps. Returns the scale after each update() and the final parameters."""
    wa = torch.nn.Parameter(torch.tensor([0.5, -1.25, 3.0]))
    wb = torch.nn.Parameter(torch.tensor([[2.0, -0.75], [0.1, 4.0]]))
    oa = torch.optim.SGD([wa], lr=0.1, momentum=0.9)
    ob = torch.optim.Adam([wb], lr=0.01)
    scales = []
    for i, f in enumerate(flags):
        oa.zero_grad()
        ob.zero_grad()
        xa = torch.tensor([1.5, -0.3, 2.0]) * (1 + i % 3) * size
        xb = torch.tensor([[0.7, 1.1], [-2.0, 0.25]]) / (1 + i % 2) * size
        if "a" in f:
            xa[1] = float("inf")
        if "b" in f:
            xb[0, 1] = float("nan")
        loss = (wa * xa).sum() + (wb * wb * xb).sum()
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(oa)
            torch.nn.utils.clip_grad_norm_([wa], max_norm=0.5)
        scaler.step(oa)
        scaler.step(ob)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales, [wa.detach().clone(), wb.detach().clone()]


def _same(got, want):
    s_got, p_got = got
    s_want, p_want = want
    assert s_got == s_want
    for a, b in zip(p_got, p_want, strict=True):
        assert torch.equal(a, b), (a, b)


@pytest.mark.parametrize("name", list(GRADSCALER_EQUALS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"init{c[0]:.4g}-g{c[1]}-b{c[2]}-i{c[3]}")
@pytest.mark.parametrize("clip", [False, True])
def test_equals_torch_gradscaler_with_two_optimizers(name, case, clip):
    init, grow, back, interval, size = case
    opts = {"init_scale": init, "growth_factor": grow, "backoff_factor": back,
            "growth_interval": interval}  # fmt: skip
    flags = ["", "", "a", "", "", "b", "", "ab", "", "", "", "a", "", "", "", "", "b", ""]
    flags += [""] * 12
    ref = torch.amp.GradScaler("cpu", **opts)
    want = _two_optimizer_run(ref, flags, clip=clip, size=size)
    ours = GRADSCALER_EQUALS[name](**opts)
    got = _two_optimizer_run(ours, flags, clip=clip, size=size)
    _same(got, want)
    # the scale changed once per iteration: the history holds one row per update()
    assert len(ours.history) == len(flags)
    assert [h[3] for h in ours.history] == want[0]
    assert ours.found_inf.tolist() == [bool(f) for f in flags]
    assert len(set(want[0])) > 3  # the run backs off and grows
    if size < 1:  # the float32 ceiling: growth refused once the grown scale is not finite
        assert max(want[0]) * grow > float(np.finfo(np.float32).max)


@hsettings(max_examples=60, deadline=None)
@given(
    init=st.floats(1e-30, 3e38).map(lambda v: float(np.float32(v))).filter(lambda v: v > 0),
    grow=st.floats(1.0001, 8.0),
    back=st.floats(0.01, 0.9999),
    interval=st.integers(1, 3),
    flags=st.lists(st.booleans(), min_size=1, max_size=40),
)
def test_torch_preset_scale_rule_equals_the_amp_update_scale_kernel(init, grow, back, interval,
                                                                     flags):  # fmt: skip
    """The scale after each update against torch's own ``_amp_update_scale_`` (the kernel
    GradScaler.update() calls): float32 scale times float64 factor, rounded once."""
    s = torch.full((), init, dtype=torch.float32)
    tracker = torch.zeros((), dtype=torch.int32)
    ours = pl.scaling.DynamicLossScaler.preset(
        "torch", init_scale=init, growth_factor=grow, backoff_factor=back,
        growth_interval=interval, on_collapse="ignore",
    )  # fmt: skip
    for f in flags:
        torch._amp_update_scale_(s, tracker, torch.full((), float(f)), grow, back, interval)
        ours.update(f)
        assert ours.scale == s.item() or (np.isnan(ours.scale) and np.isnan(s.item()))


def test_factors_float32_cannot_hold():
    """Issue 31 item 4 (a): growth 1.1 after backoff 0.1 from 2**16 (torch: 7208.9599609375);
    Megatron's float32 factor tensors round the factor first."""
    kw = {"growth_factor": 1.1, "backoff_factor": 0.1, "growth_interval": 1}
    ref = torch.amp.GradScaler("cpu", init_scale=65536.0, **kw)
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    for x in (float("inf"), 1.0):
        opt.zero_grad()
        ref.scale(w * x).sum().backward()
        ref.step(opt)
        ref.update()
    assert ref.get_scale() == 7208.9599609375
    torch_like = pl.scaling.DynamicLossScaler(**kw)
    megatron = pl.scaling.DynamicLossScaler.preset("megatron", hysteresis=1, **kw)
    megatron.scale = 65536.0
    for s in (torch_like, megatron):
        s.update(True)
        s.update(False)
    assert torch_like.scale == 7208.9599609375
    f32 = torch.tensor([65536.0]) * torch.tensor([0.1]) * torch.tensor([1.1])  # Megatron's ops
    assert megatron.scale == f32.item() == 7208.96044921875


def test_update_changes_the_scale_once_per_iteration():
    """Issue 31 item 4 (b): step(oa); step(ob); update(): ob is unscaled with the iteration's
    scale even when oa's gradients overflowed, and the scale backs off once."""
    ls = plt.LossScaling("torch", init_scale=1024.0)
    wa = torch.nn.Parameter(torch.tensor([1.0]))
    wb = torch.nn.Parameter(torch.tensor([1.0]))
    oa, ob = torch.optim.SGD([wa], lr=1.0), torch.optim.SGD([wb], lr=1.0)
    ls.scale((wa * float("inf")).sum() + (wb * 3.0).sum()).backward()
    assert ls.step(oa) is None
    ls.step(ob)
    assert ls.get_scale() == 1024.0
    assert wb.item() == -2.0  # unscaled with 1024: gradient 3
    ls.update()
    assert ls.get_scale() == 512.0 and ls.scales.tolist() == [1024.0]
    with pytest.raises(RuntimeError, match="update\\(\\) without a step"):
        ls.update()
    ls.scale((wb * 1.0).sum()).backward()
    ls.step(ob)
    with pytest.raises(RuntimeError, match="already been called"):
        ls.step(ob)
