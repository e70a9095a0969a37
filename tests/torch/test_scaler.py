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
    assert ls.step(opt) is None and ls.skipped.tolist() == [True]
    ls.update()
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
