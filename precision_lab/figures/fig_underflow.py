"""Gradient underflow: the Micikevicius et al. (2018) histogram of activation-gradient magnitudes
recorded in the real training run, and the underflow fraction versus loss scale per format."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from ..analysis.measures import (
    LossScaleChoice,
    analytic_zero_fraction,
    pick_loss_scale,
    underflow_stats,
)
from ..core.formats import get_format
from ..core.rounding import round_to
from ..scaling.gradients import lognormal, save_gradients
from ..training import RUNS, TrainResult, train_seeds

TITLE = "Gradient underflow in FP16/BF16/FP8 and the loss scale that prevents it"
ORDER = 60

FORMATS = ("fp16", "bf16", "e5m2", "e4m3")
STYLE = {
    "fp16": ("tab:blue", "-", "o"),
    "bf16": ("tab:green", ":", "D"),
    "e5m2": ("tab:purple", "--", "s"),
    "e4m3": ("tab:red", "-.", "^"),
}


def recorded_gradients(seed: int = 0, per_layer: int = 8192) -> TrainResult:
    """The FP32 baseline run with ``per_layer`` recorded activation gradients per layer
    (unscaled, float32) in ``result.samples``."""
    return train_seeds(RUNS["fp32"], [seed], samples_per_layer=per_layer)[0]


def _histogram(layers: list, choice: LossScaleChoice, out: Path) -> dict[str, float]:
    k = layers[0].hist_log2
    h = np.sum([rec.act_hist for rec in layers], axis=0).astype(float)
    pct = 100 * h / h.sum()
    fp16 = get_format("fp16")
    s = choice.log2_scale
    fig, ax = plt.subplots(figsize=(10, 4.8), constrained_layout=True)
    lo_sub, lo_norm, hi = math.log2(fp16.smallest_subnormal), math.log2(fp16.smallest_normal), 16
    ax.axvspan(lo_norm, hi, color="tab:blue", alpha=0.10, label="fp16 normal range")
    ax.axvspan(lo_sub, lo_norm, color="tab:orange", alpha=0.18, label="fp16 subnormal range")
    ax.axvspan(
        k[0] - 5,
        lo_sub - 1,
        facecolor="none",
        edgecolor="tab:red",
        hatch="//",
        alpha=0.5,
        label="becomes 0 in fp16 (< 2^-25)",
    )
    ax.bar(
        k,
        pct,
        width=1.0,
        color="0.45",
        edgecolor="black",
        lw=0.4,
        label="activation gradients (FP32 run)",
    )
    ax.step(
        k + s,
        pct,
        where="mid",
        color="tab:blue",
        ls="--",
        lw=1.5,
        label=f"after loss scale 2^{s} (pick_loss_scale)",
    )
    top = float(pct.max())
    peak = float(k[int(np.argmax(pct))])
    ax.annotate(
        "",
        xy=(peak + s, 1.04 * top),
        xytext=(peak, 1.04 * top),
        arrowprops={"arrowstyle": "->", "color": "tab:blue", "lw": 1.5},
    )
    ax.text(peak + s / 2, 1.07 * top, f"x 2^{s}", color="tab:blue", ha="center")
    cum = np.cumsum(h) / h.sum()
    first = float(k[int(np.searchsorted(cum, 0.002))])
    ax.set_xlim(first - 2, max(float(k[np.flatnonzero(h)[-1]]) + s + 3, hi + 2))
    ax.set_ylim(0, 1.15 * top)
    ax.set_xlabel("log2 |gradient value|")
    ax.set_ylabel("% of recorded values")
    ax.set_title(
        "Activation gradients of the digits MLP (all layers, all recorded steps) "
        "against the fp16 range"
    )
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(out / "underflow_histogram.png", dpi=110)
    plt.close(fig)
    below = float(h[k < -25].sum() / h.sum())
    sub = float(h[(k >= -25) & (k < -14)].sum() / h.sum())
    return {"below": below, "subnormal": sub, "count": float(h.sum())}


def largest_safe_log2_scale(g: np.ndarray, fmt: str) -> int:
    """The largest ``k`` for which no finite value of ``g`` times ``2**k`` overflows ``fmt``
    (rounded to nearest, IEEE overflow): a property of the format and of ``max|g|`` alone, found
    exactly (``max|g| * 2**k`` is exact in float64), not where a scan of ``k`` stops.

    >>> largest_safe_log2_scale(np.float32([1.0, -3.0]), "fp16")   # 3 * 2**14 <= 65504 < 3 * 2**15
    14
    """
    f = get_format(fmt)
    a = np.abs(np.asarray(g, dtype=np.float64))
    amax = float(a[np.isfinite(a)].max())
    k = math.floor(math.log2(f.max / amax))  # amax * 2**k <= max: never overflows
    while np.isfinite(round_to(amax * 2.0 ** (k + 1), f)):  # values up to max + ulp/2 round down
        k += 1
    return k


def _vs_scale(g: np.ndarray, out: Path, chosen: int) -> dict[str, list[tuple[int, float, float]]]:
    ks = np.arange(-8, 41)
    curves: dict[str, list[tuple[int, float, float]]] = {}
    fig, (ax, ax_o) = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True, sharey=True)
    for j, name in enumerate(FORMATS):
        color, ls, marker = STYLE[name]
        zs, os = [], []
        for kk in ks:
            st = underflow_stats(g, name, 2.0 ** int(kk))
            zs.append(st.zero_fraction)
            os.append(st.overflow_fraction)
        curves[name] = list(zip(ks.tolist(), zs, os, strict=True))
        every = (j, 4)  # staggered markers: curves that coincide stay distinguishable
        ax.plot(ks, 100 * np.array(zs), color=color, ls=ls, marker=marker, ms=5, markevery=every)
        ax_o.plot(
            ks,
            100 * np.array(os),
            color=color,
            ls=ls,
            lw=3.0 if name == "fp16" else 1.5,  # fp16 wide, e5m2 drawn on top of it
            marker=marker,
            ms=6,
            mfc="none" if name == "e5m2" else color,
            markevery=every,
            label=name,
        )
    for a in (ax, ax_o):
        a.set_yscale("symlog", linthresh=0.01)
        a.set_ylim(0, 100)
        a.set_xlabel("log2 of the loss scale S")
        a.axvline(chosen, color="tab:blue", lw=0.8, ls=":")
        a.grid(alpha=0.3)
    ax.text(chosen + 0.3, 0.003, f"fp16 choice 2^{chosen}", color="tab:blue", fontsize=8)
    ax.set_ylabel("% of non-zero gradients (symlog)")
    ax.set_title("underflow: gradients x S that round to 0")
    ax_o.set_title("overflow: gradients x S above the format's max")
    ax_o.legend(fontsize=9, loc="upper left")
    ax_o.text(
        -8,
        0.5,
        "fp16 (max 65504) and e5m2 (max 57344)\noverflow at almost the same S:\n"
        "wide blue line under the dashed purple one",
        fontsize=8,
        va="top",
    )
    fig.suptitle("Recorded activation gradients x S cast to fp16 / bf16 / e5m2 / e4m3")
    fig.savefig(out / "underflow_vs_loss_scale.png", dpi=110)
    plt.close(fig)
    return curves


def make(outdir: Path) -> str:
    res = recorded_gradients()
    g = np.concatenate([res.samples[k] for k in sorted(res.samples)])
    save_gradients(outdir / "training_gradients.npz", res.samples)
    layers = res.layers
    choice = pick_loss_scale(g, "fp16")
    target = pick_loss_scale(g, "fp16", target_underflow=0.001)
    hist = _histogram(layers, choice, outdir)
    curves = _vs_scale(g, outdir, choice.log2_scale)
    lines = [
        "## Gradient underflow and the choice of loss scale",
        "",
        "Activation gradients (the `dY` of each layer, unscaled, before any rounding) recorded "
        "every few steps of the FP32 baseline training run (seed 0), pooled over layers; "
        f"{g.size} sampled values are saved in `training_gradients.npz` "
        "(`pl.gradients.load_gradients`).",
        "",
        "![histogram](underflow_histogram.png)",
        "",
        f"Of all recorded values ({hist['count']:,.0f} in the layers' histograms, every "
        f"element of every recorded step), {100 * hist['below']:.1f}% lie below 2^-25 (they "
        f"round to 0 in fp16) and {100 * hist['subnormal']:.1f}% in fp16's subnormal range "
        f"[2^-25, 2^-14). `pick_loss_scale`, the curves and the table below use the {g.size} "
        "values sampled from them and saved in `training_gradients.npz` (a uniform sample per "
        "layer and step, so the two populations differ slightly: "
        f"{100 * underflow_stats(g, 'fp16').zero_fraction:.2f}% of the samples underflow in fp16 "
        "at S = 1).",
        "",
        f"`pick_loss_scale(g, 'fp16')`: {choice.reason}.",
        "",
        f"`pick_loss_scale(g, 'fp16', target_underflow=0.001)` ({target.rule}): {target.reason}.",
        "",
        "![underflow vs loss scale](underflow_vs_loss_scale.png)",
        "",
        "| format | underflow to 0 at S=1 (%) | at S=2^8 | at S=2^16 | at S=2^24 "
        "| overflow at S=2^24 (%) | largest S without overflow (max|g| x S <= the format's "
        "overflow threshold) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in FORMATS:
        c = {k: (z, o) for k, z, o in curves[name]}
        safe = largest_safe_log2_scale(g, name)
        note = " (a float32 loss scale stops at 2^127)" if safe > 127 else ""
        lines.append(
            f"| {name} | {100 * c[0][0]:.2f} | {100 * c[8][0]:.2f} | {100 * c[16][0]:.2f} "
            f"| {100 * c[24][0]:.3f} | {100 * c[24][1]:.3f} | 2^{safe}{note} |"
        )
    # the closed form check on synthetic log-normal gradients
    lines += [
        "",
        "Check against the closed form on 10^6 synthetic log-normal gradients "
        "(`pl.gradients.lognormal`, log2|g| ~ N(mu, sigma)): zero fraction "
        "Phi((log2(t/S) - mu)/sigma), t the format's rounding threshold to zero.",
        "",
        "| format | mu | sigma | S | measured | closed form |",
        "|---|---|---|---|---|---|",
    ]
    for fmt, mu, sigma, s in [
        ("fp16", -24.0, 3.0, 1.0),
        ("fp16", -24.0, 3.0, 2.0**8),
        ("e5m2", -14.0, 2.0, 1.0),
        ("e4m3", -8.0, 2.0, 4.0),
    ]:
        st = underflow_stats(lognormal(10**6, mu=mu, sigma=sigma, seed=1), fmt, s)
        lines.append(
            f"| {fmt} | {mu:g} | {sigma:g} | {s:g} | {st.zero_fraction:.5f} "
            f"| {analytic_zero_fraction(mu, sigma, fmt, s):.5f} |"
        )
    return "\n".join(lines)
