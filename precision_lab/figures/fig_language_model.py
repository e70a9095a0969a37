"""A character-level GPT trained under emulated precisions (issue 34).

The study is :func:`precision_lab.studies.language_model.run_study`: the same small GPT trained
on the same seeded batches of Python standard-library text in FP32, mixed BF16, mixed FP16 with
a dynamic loss scaler, MXFP8 and NVFP4 (Transformer Engine's recipes), BF16 with FP8 attention
(FlashAttention-3's casts) and DeepSeek-V3's fine-grained FP8, every GEMM emulated by
:func:`precision_lab.torch.simulate`. Figures: ``lm_loss.png`` (loss curves, and the loss-scale
trajectory of the FP16 run) and ``lm_underflow.png`` (per parameter tensor and captured step:
the fraction of the baseline run's gradient values that FP16 / E4M3 / E5M2 flush to zero,
unscaled and, for FP16, at the picked loss scale).

It needs torch (the ``torch`` extra); without it the job is skipped. The default size fits
``make figures``' budget; ``python -m precision_lab.figures.fig_language_model --long`` runs
the issue's size (d = 128, context 64, 600 steps) into a directory of its own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

TITLE = "A character-level GPT under seven emulated precisions (FP32 to NVFP4, FP8 attention)"
ORDER = 68


def make(outdir: Path, *, config: Any = None) -> str:
    from ..studies import language_model as lm

    result = lm.run_study_portable(config or lm.LMConfig())
    _plot_loss(outdir, result)
    _plot_underflow(outdir, result)
    return "\n".join(
        [
            "## A character-level language model under emulated precisions",
            "",
            lm.markdown(result),
            "",
            "![loss curves and loss scale](lm_loss.png)",
            "",
            "![gradient underflow per parameter tensor and step](lm_underflow.png)",
        ]
    )


def _smooth(x: np.ndarray, n: int = 10) -> np.ndarray:
    """Trailing mean over up to ``n`` steps (float64, fixed order: np.cumsum)."""
    c = np.cumsum(np.concatenate([[0.0], x]))
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(i - n, 0)
    return np.asarray((c[i] - c[lo]) / (i - lo))


def _plot_loss(outdir: Path, result: Any) -> None:
    scaled = [r for r in result.runs if r.scales is not None]
    n = 3 if scaled else 2
    fig, axes = plt.subplots(1, n, figsize=(5.6 * n, 4.6), constrained_layout=True)
    ax, dx = axes[0], axes[1]
    base = _smooth(result.runs[0].losses)
    for i, r in enumerate(result.runs):
        steps = np.arange(1, len(r.losses) + 1)
        ax.plot(steps, r.losses, color=f"C{i}", alpha=0.25, linewidth=0.6)
        ax.plot(steps, _smooth(r.losses), color=f"C{i}", linewidth=1.5,
                label=f"{r.run.label} (held-out {r.eval_loss:.3f})")  # fmt: skip
        dx.plot(steps, _smooth(r.losses) - base, color=f"C{i}", linewidth=1.5, label=r.run.label)
    ax.set_xlabel("step")
    ax.set_ylabel("training cross-entropy (nats / character)")
    ax.set_title("training loss (thin: per step; thick: mean of 10)")
    ax.legend(fontsize=8)
    dx.axhline(0, color="k", linewidth=0.5)
    dx.set_xlabel("step")
    dx.set_ylabel(f"loss - {result.runs[0].run.label} loss (means of 10)")
    dx.set_title(f"gap to {result.runs[0].run.label} (same batches)")
    if scaled:
        sx = axes[2]
        for r in scaled:
            assert r.scales is not None
            sx.step(np.arange(1, len(r.scales) + 1), np.log2(r.scales), where="post",
                    label=f"{r.run.label}: {r.skipped} steps skipped")  # fmt: skip
        sx.set_xlabel("step")
        sx.set_ylabel("log2 loss scale")
        sx.set_title("loss scale (start: pick_loss_scale; PyTorch's dynamic rule)")
        sx.legend(fontsize=8)
    fig.savefig(outdir / "lm_loss.png", dpi=110)
    plt.close(fig)


def _plot_underflow(outdir: Path, result: Any) -> None:
    maps = sorted(result.underflow.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    maps = [(k, v) for k, v in maps if v.size]
    if not maps:
        return
    fig, axes = plt.subplots(
        1, len(maps), figsize=(4.2 * len(maps) + 1.5, 0.22 * len(result.params) + 2.2),
        constrained_layout=True, sharey=True,
    )  # fmt: skip
    axes = np.atleast_1d(axes)
    im = None
    for ax, ((fmt, sc), arr) in zip(axes, maps, strict=True):
        im = ax.imshow(100 * arr, aspect="auto", cmap="magma", vmin=0, vmax=100,
                       interpolation="nearest")  # fmt: skip
        ax.set_xticks(range(len(result.capture_steps)))
        ax.set_xticklabels(result.capture_steps, fontsize=7, rotation=90)
        ax.set_xlabel("step")
        how = f"x {result.picked_scale:g} (picked)" if sc else "unscaled"
        ax.set_title(f"{fmt}, {how}", fontsize=9)
    axes[0].set_yticks(range(len(result.params)))
    axes[0].set_yticklabels(result.params, fontsize=7)
    base = result.runs[0].run.label
    fig.suptitle(f"{base} run's gradients: % of non-zero values that become 0", fontsize=10)
    assert im is not None
    fig.colorbar(im, ax=list(axes), label="% flushed to zero")
    fig.savefig(outdir / "lm_underflow.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """``--long``: the issue's size; ``--outdir``: where to write (default ``figures/lm_long``)."""
    import argparse

    import matplotlib

    from ..studies import language_model as lm

    matplotlib.use("Agg")
    p = argparse.ArgumentParser(prog="python -m precision_lab.figures.fig_language_model",
                                description=__doc__)  # fmt: skip
    p.add_argument("--long", action="store_true", help="d = 128, context 64, 600 steps")
    p.add_argument("--steps", type=int, help="training steps (default: the size's)")
    p.add_argument("--outdir", default=None, help="default: figures/lm_long, or figures/lm")
    args = p.parse_args(argv)
    cfg = lm.LMConfig.long() if args.long else lm.LMConfig()
    if args.steps:
        import dataclasses

        cfg = dataclasses.replace(cfg, steps=args.steps)
    out = Path(args.outdir or ("figures/lm_long" if args.long else "figures/lm"))
    out.mkdir(parents=True, exist_ok=True)
    text = make(out, config=cfg)
    (out / "REPORT.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
