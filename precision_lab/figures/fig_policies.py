"""Precision policies (FP32 / mixed FP16 with FP32 or FP16 head / BF16 / FP8 hybrid), layer-norm
statistics in FP16 versus FP32, and INT8 PTQ (four calibration methods, per-tensor and
per-channel weights) versus QAT, three seeds each; the selection guide."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from ..quant.integer import CALIBRATION_METHODS
from ..studies.policy import Study, Variant, markdown, run_study
from ..training.ptq import WEIGHT_GRANULARITIES

TITLE = "Precision policies, FP32 head and norm statistics, INT8 PTQ versus QAT"
ORDER = 66

FIGURE = "policies_int8.png"
SEED_MARKERS = ("o", "s", "^", "D", "v")
HATCHES = ("", "//", "..", "xx", "\\\\", "--", "++")


def _seed_marks(ax: plt.Axes, pos: float, d: np.ndarray, spread: float, first: bool) -> None:
    for r, a in enumerate(d):
        ax.plot(
            pos + (r - (len(d) - 1) / 2) * spread,
            a,
            SEED_MARKERS[r % len(SEED_MARKERS)],
            color="black",
            mfc="white",
            ms=6,
            zorder=3,
            label=f"seed {r}" if first else None,
        )


def _bars(ax: plt.Axes, variants: list[Variant], labels: list[str], ref: Variant) -> None:
    """Paired differences to ``ref`` (pp): bars mean ± std over seeds, markers the seeds."""
    for k, v in enumerate(variants):
        d = 100 * (v.acc - ref.acc)
        ax.bar(
            k,
            d.mean(),
            yerr=d.std(ddof=1) if d.size > 1 else 0.0,
            color="0.85" if k % 2 == 0 else "0.6",
            edgecolor="black",
            hatch=HATCHES[k % len(HATCHES)],
            capsize=4,
            zorder=2,
        )
        _seed_marks(ax, k, d, 0.15, k == 0)
    ax.axhline(0, color="black", lw=1)
    ax.set_xticks(np.arange(len(variants)), labels, rotation=20, ha="right", fontsize=10)
    ax.grid(axis="y", alpha=0.3, zorder=0)


def plot(study: Study, out: Path) -> None:
    """One PNG, three panels (policies and layer norm above, INT8 below); paired differences
    in pp."""
    fig = plt.figure(figsize=(13, 11), constrained_layout=True)
    grid = fig.add_gridspec(2, 2, width_ratios=[2, 1])
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])]
    ref = study.fp32
    P = list(study.policies.values())
    short = {
        "float32": "float32",
        "mixed_float16": "mixed_float16\n(FP32 head)",
        "mixed_float16_fp16_head": "mixed_float16\nFP16 head",
        "mixed_float16_no_loss_scaling": "mixed_float16\nno loss scaling",
        "mixed_bfloat16": "mixed_bfloat16",
        "fp8_hybrid": "fp8_hybrid\n(E4M3/E5M2)",
    }
    _bars(axes[0], P, [short.get(v.name, v.name) for v in P], ref)
    axes[0].set_ylabel(f"test accuracy minus float32's, same seed (pp)\nfloat32: {ref.mean:.2f}%")
    axes[0].set_title("Training policies vs float32", fontsize=12)
    axes[0].legend(fontsize=9, loc="lower left")

    N = list(study.norm.values())
    if N:
        labels = ["float32", "mixed_float16\nstats FP32", "mixed_float16\nstats FP16"]
        _bars(axes[1], N, labels[: len(N)], N[0])
        axes[1].set_ylabel(
            "test accuracy minus the float32 layer-norm run's,\n"
            f"same seed (pp); float32 with layer norm: {N[0].mean:.2f}%"
        )
    axes[1].set_title("Layer norm statistics: FP32 vs FP16", fontsize=12)

    ax = axes[2]
    if study.ptq:
        width = 0.38
        for gi, g in enumerate(WEIGHT_GRANULARITIES):
            for mi, m in enumerate(CALIBRATION_METHODS):
                d = 100 * (study.ptq[(m, g)].acc - ref.acc)
                pos = mi + (gi - 0.5) * width
                ax.bar(
                    pos,
                    d.mean(),
                    width,
                    yerr=d.std(ddof=1) if d.size > 1 else 0.0,
                    color="0.85" if gi == 0 else "0.55",
                    edgecolor="black",
                    hatch="" if gi == 0 else "//",
                    capsize=3,
                    zorder=2,
                    label=f"INT8 PTQ, {g.replace('_', '-')} weights" if mi == 0 else None,
                )
                _seed_marks(ax, pos, d, 0.09, False)
        n = len(CALIBRATION_METHODS)
        styles = {"qat": ("tab:blue", "/"), "fp32_finetune_ptq": ("tab:red", "..")}
        names = {"qat": "INT8 QAT", "fp32_finetune_ptq": "control:\nFP32 fine-tune\n+ PTQ"}
        for j, (key, v) in enumerate(study.qat.items()):
            d = 100 * (v.acc - ref.acc)
            color, hatch = styles.get(key, ("grey", "xx"))
            ax.bar(
                n + 0.2 + j * 0.8,
                d.mean(),
                0.6,
                yerr=d.std(ddof=1) if d.size > 1 else 0.0,
                color=color,
                alpha=0.6,
                edgecolor="black",
                hatch=hatch,
                capsize=3,
                zorder=2,
            )
            _seed_marks(ax, n + 0.2 + j * 0.8, d, 0.12, False)
        ax.axhline(0, color="black", lw=1)
        ticks = [*range(n), *(n + 0.2 + j * 0.8 for j in range(len(study.qat)))]
        labels = [*CALIBRATION_METHODS, *(names.get(k, k) for k in study.qat)]
        ax.set_xticks(ticks, labels, fontsize=10)
        ax.set_xlabel("PTQ: activation calibration method (held-out slice) | QAT (per-channel)")
        ax.set_ylabel(
            f"INT8 test accuracy minus float32's,\nsame seed (pp); float32: {ref.mean:.2f}%"
        )
        ax.grid(axis="y", alpha=0.3, zorder=0)
        ax.legend(fontsize=9, loc="upper left")
    ax.set_title("INT8 PTQ (four calibrations, two weight granularities) vs QAT", fontsize=12)
    fig.suptitle(
        f"MLP 64-64-64-64-10 on digits, {len(study.seeds)} seeds paired: FP16/BF16/FP8 "
        "policies and INT8 deployment against FP32\n(bars: mean ± std; markers: seeds)",
        fontsize=13,
    )
    fig.savefig(out / FIGURE, dpi=100)
    plt.close(fig)


def make(outdir: Path) -> str:
    study = run_study()
    plot(study, outdir)
    return markdown(study, figure=FIGURE)
