"""The real training run: FP32, FP16 without / with static / with dynamic loss scaling, BF16 and
FP8 (E4M3 forward, E5M2 backward, delayed scaling), three seeds each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from ..studies.text import signed
from ..training import RUNS, TrainResult, train_seeds

TITLE = "Mixed-precision training of an MLP on the digits (FP32, FP16, BF16, FP8)"
ORDER = 64

SEEDS = (0, 1, 2)

#: colour, line style, marker of each run (readable in greyscale too)
STYLE: dict[str, tuple[str, Any, str]] = {
    "fp32": ("black", "-", "o"),
    "fp16_noscale": ("tab:red", "--", "x"),
    "fp16_static": ("tab:orange", "-.", "^"),
    "fp16_dynamic": ("tab:blue", (0, (5, 1)), "s"),
    "bf16": ("tab:green", ":", "D"),
    "fp8": ("tab:purple", (0, (3, 1, 1, 1)), "v"),
}


def run_all(seeds: tuple[int, ...] = SEEDS, **changes: Any) -> dict[str, list[TrainResult]]:
    """Every run of :data:`precision_lab.training.RUNS`, once per seed (``changes`` applied to
    each configuration)."""
    return {name: train_seeds(cfg.replace(**changes), seeds) for name, cfg in RUNS.items()}


def summary(results: dict[str, list[TrainResult]]) -> list[dict[str, Any]]:
    """One row per run: test accuracy mean/std (sample std, ddof=1, as every table of the report)
    /min/max (percent), gap to FP32 (percentage
    points), final training loss, per-layer fractions of activation gradients lost to zero."""
    base = np.mean([r.final_test_acc for r in results["fp32"]]) if "fp32" in results else None
    rows = []
    for name, rs in results.items():
        acc = 100 * np.array([r.final_test_acc for r in rs])
        rows.append(
            {
                "name": name,
                "label": rs[0].config.label or name,
                "acc_mean": float(acc.mean()),
                "acc_std": float(acc.std(ddof=1)) if acc.size > 1 else 0.0,
                "acc_min": float(acc.min()),
                "acc_max": float(acc.max()),
                "gap": None if base is None else float(acc.mean() - 100 * base),
                "loss": float(np.mean([r.final_loss for r in rs])),
                "epoch90": float(np.mean([_first_epoch(r.test_acc, 0.9) for r in rs])),
                "auc": float(100 * np.mean([np.mean(r.test_acc) for r in rs])),
                "act_zero": [
                    float(np.mean([r.layers[i].act_zero_fraction for r in rs]))
                    for i in range(len(rs[0].layers))
                ],
                "weight_zero": [
                    float(np.mean([r.layers[i].weight_zero_fraction for r in rs]))
                    for i in range(len(rs[0].layers))
                ],
                "skipped": [r.n_skipped for r in rs],
                "seconds": float(sum(r.seconds for r in rs)),
            }
        )
    return rows


def _fp8_text(rs: list[TrainResult]) -> str:
    """What the per-tensor FP8 casts did, over the run (mean of the seeds)."""
    roles = {"x": "activations (E4M3)", "w": "weights (E4M3)", "dy": "gradients (E5M2)"}
    parts = []
    for role, what in roles.items():
        if role in rs[0].fp8_casts:
            sat = 100 * np.mean([r.fp8_casts[role]["saturated"] for r in rs])
            zero = 100 * np.mean([r.fp8_casts[role]["zero"] for r in rs])
            parts.append(f"{what}: {sat:.3f}% saturated at the format's max, {zero:.3f}% to 0")
    return (
        "FP8 casts with delayed scaling (the scale comes from the amax history of earlier "
        "steps, so a tensor whose amax grows faster than the history saturates): "
        + "; ".join(parts)
        + "."
    )


def _first_epoch(acc: list[float], level: float) -> float:
    """First epoch (1-based) with test accuracy >= level (inf if never)."""
    hit = np.flatnonzero(np.asarray(acc) >= level)
    return float(hit[0] + 1) if hit.size else float("inf")


def _curves(results: dict[str, list[TrainResult]], out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 6.4), constrained_layout=True, sharey=True)
    for name, rs in results.items():
        color, ls, marker = STYLE.get(name, ("grey", "-", "."))
        label = rs[0].config.label or name
        for ax, key in zip(axes, ("train_acc", "test_acc"), strict=True):
            ys = 100 * np.array([getattr(r, key) for r in rs])
            y = ys.mean(axis=0)
            x = np.arange(1, len(y) + 1)
            every = max(1, len(y) // 8)
            ax.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=color, alpha=0.12, lw=0)
            ax.plot(x, y, color=color, ls=ls, marker=marker, markevery=every, ms=5, label=label)
    for ax, what in zip(axes, ("training (running, minibatches)", "test"), strict=True):
        ax.set_xlabel("epoch")
        ax.set_title(f"{what} accuracy: mean of {len(SEEDS)} seeds, shaded min to max")
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 100.5)
        ax.set_xlim(0.5, None)
    axes[0].set_ylabel("accuracy (%)")
    fig.legend(*axes[1].get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize=9)
    fig.suptitle("MLP 64-64-64-64-10 on digits: FP32 vs FP16 / BF16 / FP8 mixed precision")
    fig.savefig(out / "training_accuracy.png", dpi=110)
    plt.close(fig)


#: log2 range of the per-layer histograms: the bulk of the values (a few outliers of the
#: output layer reach 2^-140; they are counted, in the first bin shown)
HIST_XLIM = (-40, -4)


def _layer_hists(results: dict[str, list[TrainResult]], out: Path) -> None:
    rs = results["fp16_noscale"]
    n_layers = len(rs[0].layers)
    k = rs[0].layers[0].hist_log2
    fig, axes = plt.subplots(1, n_layers, figsize=(13, 3.6), constrained_layout=True, sharey=True)
    for i, ax in enumerate(axes):
        h = np.sum([r.layers[i].act_hist for r in rs], axis=0).astype(float)
        z = np.sum([r.layers[i].act_hist_zero for r in rs], axis=0).astype(float)
        tot = max(h.sum(), 1.0)
        lo = HIST_XLIM[0]  # values below the axis are added into its first bin
        below = float(h[k <= lo].sum() / tot)
        deepest = int(k[np.flatnonzero(h)[0]]) if h.any() else lo
        for arr in (h, z):
            arr[k == lo + 1] += arr[k <= lo].sum()
            arr[k <= lo] = 0
        if below >= 0.005:
            ax.annotate(
                f"{100 * below:.1f}% below 2^{lo + 1}\n(down to 2^{deepest})",
                xy=(lo + 1, 100 * h[k == lo + 1].sum() / tot),
                xytext=(lo + 3, 0.6 * 100 * h[k == lo + 1].sum() / tot),
                fontsize=8,
                bbox={"fc": "white", "ec": "0.6", "alpha": 0.95},
                arrowprops={"arrowstyle": "->", "lw": 0.8},
            )
        ax.bar(k, 100 * h / tot, width=1.0, color="0.7", edgecolor="0.4", label="all values")
        ax.bar(k, 100 * z / tot, width=1.0, color="tab:red", hatch="//", label="became 0 in fp16")
        ax.axvline(-25, color="k", ls="--", lw=1)
        ax.axvline(-14, color="k", ls=":", lw=1)
        zf = 100 * np.mean([r.layers[i].act_zero_fraction for r in rs])
        ax.set_title(f"layer {i}: {zf:.1f}% lost to zero", fontsize=10)
        ax.set_xlabel("log2 |activation gradient|")
        ax.set_xlim(*HIST_XLIM)
    axes[0].set_ylabel("% of values (all recorded steps)")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(
        "FP16 without loss scaling: per-layer activation-gradient magnitudes "
        "(dashed: 2^-25 rounds to 0; dotted: 2^-14 smallest normal;\n"
        f"values below 2^{HIST_XLIM[0] + 1} counted in the leftmost bin)"
    )
    fig.savefig(out / "training_grad_hist_fp16.png", dpi=110)
    plt.close(fig)


def make(outdir: Path) -> str:
    results = run_all()
    _curves(results, outdir)
    _layer_hists(results, outdir)
    rows = summary(results)
    cfg = RUNS["fp32"]
    lines = [
        "## Mixed-precision training on the digits",
        "",
        f"A ReLU MLP 64-{'-'.join(map(str, cfg.hidden))}-10 in numpy with a hand-written "
        "backward pass, trained on scikit-learn's digits (1347 training, 450 test images; "
        f"seeds {', '.join(map(str, SEEDS))} fix split, initial weights and batch order). "
        f"{cfg.optimizer.capitalize()}, learning rate {cfg.lr}, mean cross-entropy over "
        f"batches of {cfg.batch_size}, {cfg.epochs} epochs, initial weights "
        f"N(0, {cfg.init_std}^2). Every matmul takes its inputs in the run's formats and sums in "
        "fp32 with the same bits on every machine (exact products added in float64 in a fixed "
        "order, rounded once: `precision_lab.training.model.matmul_fixed_order`; no BLAS, so "
        "no thread count or CPU changes a number); activations and gradients are stored in the "
        "run's formats with `pl.round_to`; master weights and the optimizer are fp32.",
        "",
        "![accuracy curves](training_accuracy.png)",
        "",
        "| run | test accuracy (%) mean ± std (ddof=1) [min, max] | gap to FP32 (pp) "
        "| mean test accuracy over the epochs (%) | first epoch at 90% test accuracy "
        "| final train loss | activation gradients lost to zero, per layer (%) "
        "| skipped steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        zeros = " / ".join(f"{100 * z:.1f}" for z in r["act_zero"])
        lines.append(
            f"| {r['label']} | {r['acc_mean']:.2f} ± {r['acc_std']:.2f} "
            f"[{r['acc_min']:.2f}, {r['acc_max']:.2f}] | {signed(r['gap'])} | {r['auc']:.2f} "
            f"| {r['epoch90']:.1f} | {r['loss']:.4f} "
            f"| {zeros} | {', '.join(map(str, r['skipped']))} |"
        )
    by = {r["name"]: r for r in rows}
    noscale = by["fp16_noscale"]
    lines += [
        "",
        "Lost to zero: the fraction of non-zero activation gradients (the `dY` of each layer, "
        "before its rounding to the gradient format, times the loss scale) that the rounding "
        "turned into 0, averaged over the recorded steps (every "
        f"{cfg.record_every}th); layers from input to output. Weight gradients of FP16 without "
        "scaling lost " + " / ".join(f"{100 * z:.2f}" for z in noscale["weight_zero"]) + " %.",
        "",
        "![per-layer gradient histograms](training_grad_hist_fp16.png)",
        "",
        f"The histograms' axis is cut to log2 in [{HIST_XLIM[0]}, {HIST_XLIM[1]}], the bulk of "
        "the values; a layer with a tail below it (the output layer, whose gradients "
        "(p - onehot) / batch are tiny where the probability p of a wrong class is) has that "
        "tail counted in the leftmost bin, labelled with its share and its deepest binade.",
        "",
        f"FP16 with dynamic loss scaling ends {signed(by['fp16_dynamic']['gap'])} pp and BF16 "
        f"{signed(by['bf16']['gap'])} pp from FP32; FP16 without loss scaling "
        f"{signed(noscale['gap'])} pp (final training loss {noscale['loss']:.4f} against "
        f"{by['fp32']['loss']:.4f}; it reaches 90% test accuracy at epoch "
        f"{noscale['epoch90']:.1f} against {by['fp32']['epoch90']:.1f}, and its test accuracy "
        "averaged over the epochs is "
        f"{signed(noscale['auc'] - by['fp32']['auc'])} pp from FP32's); FP8 with delayed "
        f"scaling {signed(by['fp8']['gap'])} pp. Spreads are over the {len(SEEDS)} seeds. The "
        "FP8 loss belongs to this recipe's few optimizer steps under delayed scaling (2 per "
        "epoch with batches of 512), not to FP8 as such: the FP8 ablation in the policies "
        "section below runs this recipe with current scaling and with another amax history, "
        "and the policies recipe with this batch size, and measures the cause.",
        "",
        _fp8_text(results["fp8"]),
    ]
    return "\n".join(lines)
