"""Dynamic loss scaling: the frameworks' scalers on one overflow pattern, PyTorch's collapse to
zero, and the loss scale of a real FP16 training run with its skipped steps."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from ..scaling import DynamicLossScaler, LossScaleCollapseWarning, trajectory
from ..training import RUNS, train

TITLE = "Dynamic loss scaling: PyTorch, DeepSpeed, Megatron-LM, and a real FP16 run"
ORDER = 62

#: the overflow pattern of the scaler comparison (init 2**16, interval 4, hysteresis 2)
PATTERN_STEPS = (0, 1, 2, 9, 10, 16)
N_STEPS = 24
#: the real FP16 run of the right panel: the torch scaler started high (2^24) with a short
#: growth interval (4), so that it overflows again and again (a sawtooth), not once by chance
REAL_INIT_LOG2 = 24
REAL_INTERVAL = 4
REAL_RUN = RUNS["fp16_dynamic"].replace(
    loss_scale=2.0**REAL_INIT_LOG2,
    scaler_options=(("growth_interval", REAL_INTERVAL),),
    label=f"FP16, dynamic loss scaling (torch, init 2^{REAL_INIT_LOG2}, interval {REAL_INTERVAL})",
)
STYLE = {
    "torch": ("black", "-", "o"),
    "deepspeed": ("tab:blue", "--", "s"),
    "megatron": ("tab:orange", "-.", "^"),
}


def pattern_trajectories() -> dict[str, np.ndarray]:
    """log2 of the scale after each update for the issue's overflow pattern."""
    flags = [i in PATTERN_STEPS for i in range(N_STEPS)]
    out = {}
    for name in STYLE:
        kw: dict[str, object] = {"init_scale": 2.0**16, "growth_interval": 4}
        if name in ("deepspeed", "megatron"):
            kw["hysteresis"] = 2
        scales, _ = trajectory(DynamicLossScaler.preset(name, **kw), flags)
        out[name] = np.log2(scales)
    return out


def collapse_steps() -> tuple[int, float]:
    """Overflows in a row that take PyTorch's float32 scale from 2**16 to exactly 0."""
    s = DynamicLossScaler.preset("torch", on_collapse="ignore")
    n = 0
    while s.scale != 0.0:
        s.update(True)
        n += 1
    return n, s.scale


def make(outdir: Path) -> str:
    traj = pattern_trajectories()
    res = train(REAL_RUN)
    scale = np.log2(np.array(res.scale))
    skipped = np.array(res.skipped)
    steps = np.arange(len(scale))

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), constrained_layout=True)
    ax = axes[0]
    for k in PATTERN_STEPS:
        ax.axvspan(k - 0.5, k + 0.5, color="tab:red", alpha=0.12, lw=0)
    for name, y in traj.items():
        color, ls, marker = STYLE[name]
        ax.step(
            np.arange(N_STEPS), y, where="post", color=color, ls=ls, marker=marker, ms=4, label=name
        )
    ax.set_xlabel("step (shaded: overflow)")
    ax.set_ylabel("log2 of the loss scale after the update")
    ax.set_title("Same overflows, different scalers (interval 4, hysteresis 2)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)

    ax = axes[1]
    ax.step(steps, scale, where="post", color="tab:blue", label="loss scale used")
    ax.plot(
        steps[skipped],
        scale[skipped],
        "x",
        color="tab:red",
        ms=9,
        mew=2,
        label=f"skipped step (inf/NaN in fp16 gradients): {int(skipped.sum())}",
    )
    ax.set_xlabel("training step")
    ax.set_ylabel("log2 of the loss scale")
    ax.set_title(
        f"FP16 training run (torch scaler, init 2^{REAL_INIT_LOG2}, growth interval "
        f"{REAL_INTERVAL}), seed 0"
    )
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    for a in axes:
        a.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.savefig(outdir / "loss_scale_trajectory.png", dpi=110)
    plt.close(fig)

    n, final = collapse_steps()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = DynamicLossScaler.preset("torch")
        for _ in range(n):
            s.update(True)
    reported = any(issubclass(w.category, LossScaleCollapseWarning) for w in caught)
    lines = [
        "## Dynamic loss scaling",
        "",
        "![loss scale trajectories](loss_scale_trajectory.png)",
        "",
        "Overflow at steps " + ", ".join(map(str, PATTERN_STEPS)) + "; init 2^16, growth "
        "interval 4, hysteresis 2 (DeepSpeed, Megatron-LM). log2 of the scale after each "
        "update, steps 0..23 (`pl.scaling.DynamicLossScaler.preset`):",
        "",
        "| scaler | trajectory |",
        "|---|---|",
    ]
    for name, y in traj.items():
        lines.append(f"| {name} | `{' '.join(str(int(v)) for v in y)}` |")
    lines += [
        "",
        "PyTorch, DeepSpeed and Megatron-LM reproduce the frameworks' real outputs for this "
        "pattern. Keras' LossScaleOptimizer has PyTorch's rule (without the finiteness check "
        "on growth) and starts at 2^15; Apex has PyTorch's rule with a ceiling of 2^24.",
        "",
        f"PyTorch's scale is a float32 tensor with no floor: {n} overflows in a row take it "
        f"from 2^16 to exactly {final} (2^-150 rounds to 0 in float32), after which unscaling "
        "gives NaN gradients. The simulator "
        + (
            "reports it (a `LossScaleCollapseWarning`, `collapsed=True`)."
            if reported
            else "did NOT report it."
        )
        + "",
        "",
        f"Real run (the training section's FP16 run with the torch scaler started at "
        f"2^{REAL_INIT_LOG2} and a growth interval of {REAL_INTERVAL}, seed 0, chosen so that "
        f"the scale overflows again and again): {len(scale)} steps, {int(skipped.sum())} "
        f"skipped (steps {', '.join(map(str, np.flatnonzero(skipped).tolist()))}), scale from "
        f"2^{scale.min():.0f} to 2^{scale.max():.0f}, final 2^{scale[-1]:.0f}; test accuracy "
        f"{100 * res.final_test_acc:.2f}%.",
    ]
    return "\n".join(lines)
