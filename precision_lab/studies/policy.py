"""Experiments on precision policies and INT8 deployment, on the training emulation's digits MLP.

:func:`run_study` runs, each for three seeds (batched replicas) on the real dataset:

1. **policies**: ``float32``, ``mixed_float16`` (FP32 head, Keras' dynamic loss scaling), the
   same with the softmax head and loss in FP16, the same without loss scaling,
   ``mixed_bfloat16``, ``fp8_hybrid``;
2. **normalisation**: the MLP with a layer norm after each hidden GEMM, FP32 policy, and under
   ``mixed_float16`` with the statistics in FP32 (the rule) or in FP16;
3. **INT8 PTQ** of the FP32-trained network (:mod:`precision_lab.training.ptq`): activations
   calibrated with each method of the core (max, percentile, mse, entropy) on a held-out
   calibration slice of the training split (never trained on), weights per tensor or per channel;
4. **INT8 QAT** (:mod:`precision_lab.training.qat`): fine-tuning from the FP32 network with fake
   quantization and the straight-through estimator, starting from the per-channel PTQ network
   whose calibration method has the smallest loss on the calibration slice (chosen without the
   test set); and, as a control, the same fine-tuning in plain FP32 followed by the same PTQ.

A :class:`Study` holds the accuracies per seed; :func:`selection_guide` turns them into the
table of the report (format, accuracy cost, memory per parameter, whether loss scaling was
needed), :func:`markdown` into the report's section.

>>> s = run_study(seeds=(0,), epochs=1, qat_epochs=1, parts=("policies",), calib_size=50)
>>> sorted(s.policies)[:2], s.policies["float32"].acc.shape
(['float32', 'fp8_hybrid'], (1,))
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..quant.integer import CALIBRATION_METHODS
from ..training import RUNS, Dataset, TrainConfig, TrainResult, load_digits_split, train_seeds
from ..training.policy import LossScaleSpec, Policy, get_policy
from ..training.policy_model import PolicyMLP
from ..training.ptq import WEIGHT_GRANULARITIES, QuantizedMLP, build, calibrate_activations
from ..training.qat import qat_finetune
from .text import signed

__all__ = [
    "QAT_SETTINGS",
    "SEEDS",
    "SETTINGS",
    "Fp8Row",
    "Study",
    "Variant",
    "markdown",
    "run_study",
    "selection_guide",
    "split_data",
]

SEEDS = (0, 1, 2)
#: model and optimisation of every run (the training package's MLP, shorter: the figure job's
#: time); init_std stays the package's 0.002, which makes FP16 gradients underflow
SETTINGS: dict[str, Any] = {"hidden": (64, 64, 64), "batch_size": 128, "epochs": 30}
CALIB_SIZE = 200
#: quantization-aware fine-tuning of every QAT variant
QAT_SETTINGS: dict[str, Any] = {"epochs": 3, "lr": 1e-3, "lr_schedule": "cosine"}
PARTS = ("policies", "norm", "int8", "fp8")


@dataclass
class Variant:
    """One configuration: test accuracy per seed (fraction), and what else was measured."""

    name: str
    label: str
    acc: np.ndarray
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return float(100 * self.acc.mean())

    @property
    def std(self) -> float:
        """Sample standard deviation over the seeds (ddof=1; 0 for one seed), in %."""
        return float(100 * self.acc.std(ddof=1)) if self.acc.size > 1 else 0.0

    def delta(self, ref: Variant) -> tuple[float, float]:
        """Paired difference to ``ref`` in percentage points: mean and sample std over seeds."""
        d = 100 * (self.acc - ref.acc)
        return float(d.mean()), float(d.std(ddof=1)) if d.size > 1 else 0.0


@dataclass
class Fp8Row:
    """One row of the FP8 ablation: a recipe (``"training"``: the training section's MLP on the
    whole training split; ``"policies"``: this section's policy MLP with the calibration slice
    held out), its settings, the FP8 run and the FP32 run of the same recipe and seeds."""

    recipe: str
    change: str
    batch_size: int
    epochs: int
    steps: int
    history: int
    scaling: str
    fp8: Variant
    ref: Variant


@dataclass
class Study:
    """Everything :func:`run_study` measured."""

    seeds: tuple[int, ...]
    settings: dict[str, Any]
    calib_size: int
    policies: dict[str, Variant] = field(default_factory=dict)
    norm: dict[str, Variant] = field(default_factory=dict)
    norm_error: dict[str, dict[str, float]] = field(default_factory=dict)
    ptq: dict[tuple[str, str], Variant] = field(default_factory=dict)
    qat: dict[str, Variant] = field(default_factory=dict)
    qat_method: str = ""
    int8_bytes: dict[str, float] = field(default_factory=dict)
    fp8: list[Fp8Row] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def fp32(self) -> Variant:
        return self.policies["float32"]


def split_data(
    seeds: Sequence[int], calib_size: int = CALIB_SIZE
) -> tuple[list[Dataset], np.ndarray, np.ndarray]:
    """Per seed: the digits split of :func:`~precision_lab.training.load_digits_split` with
    ``calib_size`` training images held out (seeded); returns the reduced datasets and the
    calibration slices stacked over seeds, ``x`` (R, n, 64) and ``y`` (R, n)."""
    data, xs, ys = [], [], []
    for s in seeds:
        d = load_digits_split(seed=s)
        idx = np.random.default_rng(10_000 + s).permutation(len(d.y_train))
        cal, keep = idx[:calib_size], np.sort(idx[calib_size:])
        data.append(
            Dataset(
                x_train=d.x_train[keep],
                y_train=d.y_train[keep],
                x_test=d.x_test,
                y_test=d.y_test,
                n_classes=d.n_classes,
                name="digits (calibration slice held out)",
            )
        )
        xs.append(d.x_train[cal])
        ys.append(d.y_train[cal])
    return data, np.stack(xs), np.stack(ys)


def _train(
    policy: Policy,
    seeds: Sequence[int],
    data: Sequence[Dataset],
    settings: dict[str, Any],
    *,
    norm: bool = False,
) -> tuple[list[TrainResult], PolicyMLP]:
    cfg = TrainConfig.from_policy(policy, **settings)
    built: list[PolicyMLP] = []

    def model(sizes: list[int], c: TrainConfig, rngs: list[np.random.Generator]) -> PolicyMLP:
        net = PolicyMLP(sizes, c, rngs, norm=norm)
        built.append(net)
        return net

    return train_seeds(cfg, seeds, data, model=model), built[0]


def _head_zeros_note(h32: Variant, h16: Variant) -> str:
    """Why the hidden layers lose fewer gradients under the FP16 head, from the numbers: the
    FP16 softmax rounds confident predictions to exactly one-hot, so ``p - y`` and everything
    it backpropagates for those examples is exactly zero, already zero before the store and
    not counted as lost. Says so only where the exact-zero shares support it."""
    hid = slice(0, len(h32.extra["act_zero"]) - 1)
    lost32, lost16 = h32.extra["act_zero"][hid], h16.extra["act_zero"][hid]
    ex32, ex16 = h32.extra["act_exact_zero"][hid], h16.extra["act_exact_zero"][hid]

    def span(v: list[float], digits: int) -> str:
        return f"{100 * min(v):.{digits}f}-{100 * max(v):.{digits}f}%"

    head = (
        f"Hidden layers: {span(lost32, 2)} of the non-zero activation gradients are lost to zero "
        f"under the FP32 head and {span(lost16, 2)} under the FP16 head, while the share already "
        f"exactly zero before the store is {span(ex32, 1)} and {span(ex16, 1)}."
    )
    fewer_lost = all(a < b for a, b in zip(lost16, lost32, strict=True))
    more_zero = all(a > b for a, b in zip(ex16, ex32, strict=True))
    if fewer_lost and more_zero:
        return (
            f"{head} The metric counts only values that were non-zero: the FP16 softmax rounds "
            "confident predictions to exactly one-hot, so p - y, and every gradient it "
            "backpropagates for those examples, is exactly 0 before any store. The tiny values "
            "that the FP32 head passes down (and the FP16 store then flushes) become exact zeros "
            "upstream instead: the gradients are not better preserved, they are lost earlier."
        )
    return f"{head} (No simple relation between the two shares on this run.)"


def _variant(name: str, label: str, results: list[TrainResult], policy: Policy) -> Variant:
    n_layers = len(results[0].layers)
    zeros = [
        float(np.mean([r.layers[i].act_zero_fraction for r in results])) for i in range(n_layers)
    ]
    exact = [
        float(np.mean([r.layers[i].act_exact_zero_fraction for r in results]))
        for i in range(n_layers)
    ]
    return Variant(
        name,
        label,
        np.array([r.final_test_acc for r in results]),
        {
            "policy": policy,
            "act_zero": zeros,
            "act_exact_zero": exact,
            "skipped": [r.n_skipped for r in results],
            "final_scale": [r.scale[-1] for r in results],
            "loss": float(np.mean([r.final_loss for r in results])),
            "steps": results[0].steps,
            "saturated": {
                role: float(np.mean([r.fp8_casts[role]["saturated"] for r in results]))
                for role in results[0].fp8_casts
            },
        },
    )


def _policy_runs() -> list[tuple[str, str, Policy]]:
    mf16 = get_policy("mixed_float16")
    return [
        ("float32", "float32", get_policy("float32")),
        ("mixed_float16", "mixed_float16 (FP32 head)", mf16),
        (
            "mixed_float16_fp16_head",
            "mixed_float16, softmax + loss in FP16",
            mf16.without_fp32("softmax", "cross_entropy"),
        ),
        (
            "mixed_float16_no_loss_scaling",
            "mixed_float16 without loss scaling",
            mf16.replace(name="mixed_float16_no_loss_scaling", loss_scaling=LossScaleSpec()),
        ),
        ("mixed_bfloat16", "mixed_bfloat16", get_policy("mixed_bfloat16")),
        ("fp8_hybrid", "fp8_hybrid (E4M3 fwd, E5M2 bwd, delayed)", get_policy("fp8_hybrid")),
    ]


def _norm_runs() -> list[tuple[str, str, Policy]]:
    mf16 = get_policy("mixed_float16")
    return [
        ("ln_float32", "layer norm, float32", get_policy("float32")),
        ("ln_fp32_stats", "layer norm, mixed_float16, statistics FP32", mf16),
        (
            "ln_fp16_stats",
            "layer norm, mixed_float16, statistics FP16",
            mf16.without_fp32("norm_statistics"),
        ),
    ]


def run_study(
    seeds: Sequence[int] = SEEDS,
    *,
    epochs: int | None = None,
    qat_epochs: int | None = None,
    calib_size: int = CALIB_SIZE,
    parts: Sequence[str] = PARTS,
    **settings: Any,
) -> Study:
    """Run the experiments (``parts`` of ``policies``, ``norm``, ``int8``; ``int8`` needs the
    FP32 network of ``policies`` and trains it itself when ``policies`` is not asked for).

    ``epochs``, ``qat_epochs`` and ``settings`` (fields of
    :class:`~precision_lab.training.TrainConfig`) change :data:`SETTINGS` and
    :data:`QAT_SETTINGS`."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"parts: unknown {unknown}; known: {', '.join(PARTS)}")
    seeds = tuple(int(s) for s in seeds)
    conf = {**SETTINGS, **settings}
    if epochs is not None:
        conf["epochs"] = epochs
    qconf = {**conf, **QAT_SETTINGS}
    if qat_epochs is not None:
        qconf["epochs"] = qat_epochs
    study = Study(seeds=seeds, settings=conf, calib_size=calib_size)
    data, xc, yc = split_data(seeds, calib_size)
    xte = np.stack([d.x_test for d in data])
    yte = np.stack([d.y_test for d in data])

    fp32_net: PolicyMLP | None = None
    runs = _policy_runs() if "policies" in parts else _policy_runs()[:1] if "int8" in parts else []
    for name, label, policy in runs:
        t0 = time.perf_counter()
        results, net = _train(policy, seeds, data, conf)
        study.seconds[name] = time.perf_counter() - t0
        study.policies[name] = _variant(name, label, results, policy)
        if name == "float32":
            fp32_net = net

    if "norm" in parts:
        for name, label, policy in _norm_runs():
            t0 = time.perf_counter()
            results, net = _train(policy, seeds, data, conf, norm=True)
            study.seconds[name] = time.perf_counter() - t0
            study.norm[name] = _variant(name, label, results, policy)
            if name == "ln_fp32_stats":
                t0 = time.perf_counter()
                study.norm_error = norm_statistics_error(net, xte)
                study.seconds["norm_error"] = time.perf_counter() - t0

    if "int8" in parts:
        assert fp32_net is not None
        _int8(study, fp32_net, data, xc, yc, xte, yte, qconf)
    if "fp8" in parts:
        t0 = time.perf_counter()
        study.fp8 = fp8_ablation(study, data, conf)
        study.seconds["fp8"] = time.perf_counter() - t0
    return study


def fp8_ablation(study: Study, data: Sequence[Dataset], conf: dict[str, Any]) -> list[Fp8Row]:
    """Why FP8 with delayed scaling loses 15 pp in the training section's recipe and nothing in
    this section's: each recipe as reported, then one factor changed at a time (amax history,
    current instead of delayed scaling, batch size and epochs), FP8 against FP32 of the same
    recipe and seeds. Reuses ``study.policies`` (``float32``, ``fp8_hybrid``) when present."""
    seeds = study.seeds
    rows: list[Fp8Row] = []
    t8, t32 = RUNS["fp8"], RUNS["fp32"]
    tref = _variant("t_fp32", "FP32", train_seeds(t32, seeds), get_policy("float32"))
    for change, cfg in (
        ("as reported", t8),
        ("amax history 1024", t8.replace(amax_history_len=1024)),
        ("current scaling", t8.replace(tensor_scaling="current")),
    ):
        v = _variant("t_fp8", change, train_seeds(cfg, seeds), get_policy("fp8_hybrid"))
        rows.append(
            Fp8Row(
                "training",
                change,
                cfg.batch_size,
                cfg.epochs,
                v.extra["steps"],
                cfg.amax_history_len,
                cfg.tensor_scaling,
                v,
                tref,
            )
        )
    f32, f8 = get_policy("float32"), get_policy("fp8_hybrid")
    pref = study.policies.get("float32")
    if pref is None:
        pref = _variant("float32", "float32", _train(f32, seeds, data, conf)[0], f32)
    p8 = study.policies.get("fp8_hybrid")
    if p8 is None:
        p8 = _variant("fp8_hybrid", "fp8_hybrid", _train(f8, seeds, data, conf)[0], f8)
    big = {**conf, "batch_size": t8.batch_size, "epochs": t8.epochs}
    bref = _variant("float32", "float32", _train(f32, seeds, data, big)[0], f32)
    b8 = _variant("fp8_hybrid", "fp8_hybrid", _train(f8, seeds, data, big)[0], f8)
    hist = f8.tensor_scaling.amax_history_len
    for change, c, v, ref in (
        ("as reported", conf, p8, pref),
        (f"batch {t8.batch_size}, {t8.epochs} epochs", big, b8, bref),
    ):
        rows.append(
            Fp8Row(
                "policies",
                change,
                c["batch_size"],
                c["epochs"],
                v.extra["steps"],
                hist,
                "delayed",
                v,
                ref,
            )
        )
    return rows


def fp8_markdown(study: Study) -> list[str]:
    """The FP8 ablation table and what it shows (Markdown lines)."""
    rows = study.fp8
    if not rows:
        return []
    lines = [
        "### FP8: why the training section's run fails and this one does not",
        "",
        "The same FP8 recipe (E4M3 forward, E5M2 gradients, BF16 storage, per-tensor scaling) "
        "in the two sections' settings, each as reported and with one factor changed; FP8 "
        "against FP32 trained with the same recipe, data and seeds "
        f"({', '.join(map(str, study.seeds))}). *training*: the training section's MLP on the "
        "whole training split; *policies*: this section's policy network with the calibration "
        "slice held out. Saturated: share of the non-zero values cast to FP8 that the scale put "
        "above the format's max, over the run (activations / weights / gradients).",
        "",
        "| recipe | change | batch | epochs | optimizer steps | amax history | scaling "
        "| FP8 test accuracy (%) | FP32, same recipe (%) | FP8 vs FP32 (pp, paired) "
        "| saturated (%) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sat = r.fp8.extra["saturated"]
        sat_text = " / ".join(f"{100 * sat[k]:.2f}" for k in ("x", "w", "dy") if k in sat)
        lines.append(
            f"| {r.recipe} | {r.change} | {r.batch_size} | {r.epochs} | {r.steps} "
            f"| {r.history} | {r.scaling} | {_pm(r.fp8)} | {_pm(r.ref)} "
            f"| {_delta(r.fp8, r.ref)} | {sat_text} |"
        )
    by = {(r.recipe, r.change): r for r in rows}
    t = by.get(("training", "as reported"))
    th = by.get(("training", "amax history 1024"))
    tc = by.get(("training", "current scaling"))
    p = by.get(("policies", "as reported"))
    pb = [r for r in rows if r.recipe == "policies" and r.change != "as reported"]
    if t and th and tc and p and pb:

        def loses(r: Fp8Row) -> bool:
            """Every seed loses more than 0.3 pp (a loss the seeds agree on)."""
            return bool(np.all(100 * (r.fp8.acc - r.ref.acc) < -0.3))

        def gap(r: Fp8Row) -> str:
            d, sd = r.fp8.delta(r.ref)
            per = ", ".join(signed(v) for v in 100 * (r.fp8.acc - r.ref.acc))
            if loses(r):
                verdict = "every seed loses"
            elif not _significant(d, sd):
                verdict = "within the spread over seeds"
            else:
                verdict = "a real gain" if d > 0 else "a real loss"
            return f"{signed(d)} ± {sd:.2f} pp (per seed {per}: {verdict})"

        def sat(r: Fp8Row) -> str:
            return f"{100 * r.fp8.extra['saturated'].get('dy', 0.0):.2f}%"

        lines += [
            "",
            f"Measured: the training section's recipe ({t.steps} steps of batches of "
            f"{t.batch_size}) with delayed scaling: {gap(t)}; {sat(t)} of the gradients cast to "
            f"E5M2 saturate. An amax history of {th.history} instead of {t.history}: {gap(th)}. "
            f"Current scaling (each tensor's own amax, no lag): {gap(tc)}, {sat(tc)} saturated. "
            f"The policies recipe ({p.steps} steps of batches of {p.batch_size}) with delayed "
            f"scaling: {gap(p)}, {sat(p)} saturated; the same recipe with batches of "
            f"{pb[0].batch_size} for {pb[0].epochs} epochs ({pb[0].steps} steps): {gap(pb[0])}, "
            f"{sat(pb[0])} saturated.",
        ]
        if loses(t) and loses(th) and loses(pb[0]) and not loses(p) and not loses(tc):
            lines += [
                "",
                "So the two sections disagree because of the number of optimizer steps under "
                "delayed scaling (a scale taken from earlier steps' amax saturates tensors that "
                "still change fast), not because of the amax history; current scaling avoids the "
                "loss in the recipe where delayed scaling fails.",
            ]
        else:
            lines += ["", "These runs do not single out one cause of the difference."]
    return lines


def norm_statistics_error(net: PolicyMLP, x: np.ndarray) -> dict[str, dict[str, float]]:
    """How far the layer norm of ``net`` (trained, ``norm=True``, a ``mixed_float16``-like
    policy) is from exact arithmetic on its own inputs: ``x`` goes through ``net``, and each
    hidden layer norm's input (on the FP16 grid) is normalised with FP32 statistics, FP16
    statistics, and FP16 statistics with FP16 sums; the reference is float64 arithmetic on the
    same input. Per variant: ``rstd_rel`` (largest relative error of 1/sqrt(var + eps)),
    ``y_max`` and ``y_median`` (absolute error of the normalised output, whose spread is 1)."""
    net.forward(x)
    inputs = list(net.norm_inputs)
    base = net.policy
    variants = {
        "FP32 statistics": base.replace(
            fp32_ops=tuple(sorted(set(base.fp32_ops) | {"norm_statistics", "reductions"}))
        ),
        "FP16 statistics": base.without_fp32("norm_statistics"),
        "FP16 statistics and FP16 sums": base.without_fp32("norm_statistics", "reductions"),
    }
    sizes = [net.W[0].shape[1], *(w.shape[2] for w in net.W)]
    out: dict[str, dict[str, float]] = {}
    for label, pol in variants.items():
        cfg = TrainConfig.from_policy(pol, hidden=tuple(sizes[1:-1]))
        probe = PolicyMLP(sizes, cfg, [np.random.default_rng(0)] * net.R, norm=True)
        rel, ymax, ys = 0.0, 0.0, []
        for i, z in enumerate(inputs):
            y, rstd = probe.norm_forward(z, probe.layers[i], i)
            z64 = z.astype(np.float64)
            mu = z64.mean(axis=-1, keepdims=True)
            var = ((z64 - mu) ** 2).mean(axis=-1, keepdims=True)
            r64 = 1.0 / np.sqrt(var + 1e-5)
            y64 = (z64 - mu) * r64
            rel = max(rel, float(np.max(np.abs(rstd / r64 - 1))))
            err = np.abs(y - y64)
            ymax = max(ymax, float(err.max()))
            ys.append(err.ravel())
        out[label] = {
            "rstd_rel": rel,
            "y_max": ymax,
            "y_median": float(np.median(np.concatenate(ys))),
        }
    return out


def _int8(
    study: Study,
    net: PolicyMLP,
    data: list[Dataset],
    xc: np.ndarray,
    yc: np.ndarray,
    xte: np.ndarray,
    yte: np.ndarray,
    qconf: dict[str, Any],
) -> None:
    t0 = time.perf_counter()
    W, b = [w.copy() for w in net.W], [v.copy() for v in net.b]
    act = {m: calibrate_activations(W, b, xc, method=m) for m in CALIBRATION_METHODS}
    study.seconds["calibration"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    calib_loss: dict[str, float] = {}
    for m in CALIBRATION_METHODS:
        for g in WEIGHT_GRANULARITIES:
            q = build(W, b, act[m], weights=g, method=m)
            loss = q.loss(xc, yc)
            v = Variant(
                f"ptq_{m}_{g}",
                f"PTQ {m}, {g.replace('_', '-')} weights",
                q.accuracy(xte, yte),
                {
                    "calib_loss": float(loss.mean()),
                    "calib_acc": float(q.accuracy(xc, yc).mean()),
                    "amax": [float(np.mean(c.amax)) for c in act[m]],
                    "bytes": q.bytes_per_parameter(),
                },
            )
            study.ptq[(m, g)] = v
            if g == "per_channel":
                calib_loss[m] = float(loss.mean())
            study.int8_bytes[g] = q.bytes_per_parameter()
    study.seconds["ptq"] = time.perf_counter() - t0
    method = min(CALIBRATION_METHODS, key=lambda m: calib_loss[m])  # first on ties
    study.qat_method = method
    t0 = time.perf_counter()
    cfg = TrainConfig.from_policy("float32", **qconf)
    q, results, _ = qat_finetune(W, b, act[method], cfg, study.seeds, data)
    study.qat["qat"] = Variant(
        "qat",
        f"QAT ({cfg.epochs} epochs, from PTQ {method} per-channel)",
        q.accuracy(xte, yte),
        {
            "fake_quant_acc": np.array([r.final_test_acc for r in results]),
            "bytes": q.bytes_per_parameter(),
        },
    )
    study.seconds["qat"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    built: list[PolicyMLP] = []

    def model(sizes: list[int], c: TrainConfig, rngs: list[np.random.Generator]) -> PolicyMLP:
        m = PolicyMLP(sizes, c, rngs)
        for i in range(m.n_layers):
            m.W[i], m.b[i] = W[i].copy(), b[i].copy()
        built.append(m)
        return m

    train_seeds(cfg, study.seeds, data, model=model)
    ft = built[0]
    act_ft = calibrate_activations(ft.W, ft.b, xc, method=method)
    qft: QuantizedMLP = build(ft.W, ft.b, act_ft, weights="per_channel", method=method)
    study.qat["fp32_finetune_ptq"] = Variant(
        "fp32_finetune_ptq",
        f"control: FP32 fine-tuning ({_count(cfg.epochs, 'epoch')}), then PTQ {method} per-channel",
        qft.accuracy(xte, yte),
    )
    study.seconds["qat_control"] = time.perf_counter() - t0


# ----- the selection guide and the report ------------------------------------------------------
#: an FP32 baseline below this test accuracy (%) is too short a run to judge formats by: the
#: generated prose then gives the numbers and draws no finding from them
MIN_TRAINED_ACCURACY = 85.0


def _count(n: int, word: str) -> str:
    """``"1 epoch"``, ``"3 epochs"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _pm(v: Variant) -> str:
    return f"{v.mean:.2f} ± {v.std:.2f}"


def _delta(v: Variant, ref: Variant) -> str:
    d, s = v.delta(ref)
    return f"{signed(d)} ± {s:.2f}"


def _lost(v: Variant) -> tuple[float, int]:
    """The largest share (%) of activation gradients flushed to zero among the hidden layers
    (the output layer's are left out: there the flushed values are ``scale * p / batch``
    below 2^-25, probabilities ``p`` below ``2^-25 * batch / scale``, which carry no signal),
    and its layer."""
    z = v.extra.get("act_zero", [0.0, 0.0])
    hidden = z[:-1] if len(z) > 1 else z
    k = int(np.argmax(hidden))
    return 100 * float(hidden[k]), k


def _significant(d: float, s: float) -> bool:
    """A paired difference larger than twice its spread over seeds and than 0.3 pp."""
    return abs(d) > 2 * s and abs(d) > 0.3


def selection_guide(study: Study) -> list[dict[str, str]]:
    """Rows of the selection guide, generated from the measurements of ``study``: option,
    formats, test accuracy, paired cost against FP32, training and inference bytes per
    parameter, and whether loss scaling was needed here (with the evidence)."""
    P, ref = study.policies, study.fp32
    rows: list[dict[str, str]] = []
    nols = P.get("mixed_float16_no_loss_scaling")
    for name in ("float32", "mixed_float16", "mixed_bfloat16", "fp8_hybrid"):
        if name not in P:
            continue
        v = P[name]
        pol: Policy = v.extra["policy"]
        mem = pol.bytes_per_parameter()
        lost, layer = _lost(v)
        if name == "float32":
            need = "no (FP32 gradients)"
        elif name == "mixed_float16" and nols is not None:
            lost_n, layer_n = _lost(nols)
            d, s = nols.delta(v)
            evidence = (
                f"without it {lost_n:.1f}% of the layer-{layer_n} activation gradients flush "
                f"to zero (with it {lost:.2f}%) and accuracy moves {signed(d)} ± {s:.2f} pp"
            )
            if lost_n < 1.0:
                need = f"no: {evidence}"
            elif _significant(d, s) and d < 0:
                need = f"yes: {evidence}"
            else:
                need = f"for the gradients yes, for the accuracy not measurably here: {evidence}"
        elif name == "fp8_hybrid":
            need = (
                f"no loss scaler; per-tensor delayed scaling of the FP8 operands instead "
                f"({lost:.2f}% of the layer-{layer} BF16 activation gradients flushed)"
            )
            short = [r for r in study.fp8 if r.recipe == "policies" and r.change != "as reported"]
            cur = [r for r in study.fp8 if r.scaling == "current"]
            if short:
                d, sd = short[0].fp8.delta(short[0].ref)
                need += (
                    f". With batches of {short[0].batch_size} for {short[0].epochs} epochs "
                    f"({short[0].steps} steps) delayed scaling costs {signed(d)} ± {sd:.2f} pp "
                    "(FP8 ablation above)"
                )
            if cur:
                d, sd = cur[0].fp8.delta(cur[0].ref)
                ok = not (_significant(d, sd) and d < 0)
                need += (
                    f"; current scaling in the training section's recipe: {signed(d)} ± "
                    f"{sd:.2f} pp" + (", so prefer it for short runs" if ok else "")
                )
        else:
            need = f"no: {lost:.2f}% of the layer-{layer} activation gradients flush without it"
        fmts = f"{pol.compute_format}"
        if pol.backward_format != pol.compute_format:
            fmts += f"/{pol.backward_format}"
        fmts += f" compute, {pol.activation_format} storage, {pol.variable_format} master"
        rows.append(
            {
                "option": f"`{name}`",
                "formats": fmts,
                "accuracy": _pm(v),
                "cost": "0 (reference)" if name == "float32" else _delta(v, ref),
                "train_bytes": f"{mem['total']:g}",
                "infer_bytes": f"{mem['inference']:g}",
                "loss_scaling": need,
            }
        )
    if study.ptq:
        fp32_mem = get_policy("float32").bytes_per_parameter()["total"]
        naive = study.ptq.get(("max", "per_tensor"))
        best_key = max(study.ptq, key=lambda k: (study.ptq[k].mean, -_order(k)))
        picks = [("best", best_key)]
        if naive is not None and best_key != ("max", "per_tensor"):
            picks.append(("simplest", ("max", "per_tensor")))
        for tag, key in picks:
            v = study.ptq[key]
            rows.append(
                {
                    "option": f"INT8 PTQ ({tag}: {key[0]}, {key[1].replace('_', '-')} weights)",
                    "formats": "int8 weights and activations, int32 sums, FP32 bias and logits",
                    "accuracy": _pm(v),
                    "cost": _delta(v, ref),
                    "train_bytes": f"{fp32_mem:g} (FP32 training)",
                    "infer_bytes": f"{v.extra['bytes']:.3f}",
                    "loss_scaling": "no (FP32 training, no retraining)",
                }
            )
    if "qat" in study.qat:
        v = study.qat["qat"]
        rows.append(
            {
                "option": f"INT8 QAT (from PTQ {study.qat_method}, per-channel weights)",
                "formats": "FP32 fine-tuning with fake INT8; deployed as INT8 PTQ",
                "accuracy": _pm(v),
                "cost": _delta(v, ref),
                "train_bytes": "16 (FP32 fine-tuning)",
                "infer_bytes": f"{v.extra['bytes']:.3f}",
                "loss_scaling": "no (FP32 fine-tuning)",
            }
        )
    return rows


def _order(key: tuple[str, str]) -> int:
    return CALIBRATION_METHODS.index(key[0]) * 2 + WEIGHT_GRANULARITIES.index(key[1])


def guide_markdown(study: Study) -> list[str]:
    """The selection guide as Markdown table lines."""
    lines = [
        "| option | formats | test accuracy (%) | cost vs FP32 (pp, paired) "
        "| training bytes/parameter | inference bytes/parameter | loss scaling needed here? |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in selection_guide(study):
        lines.append(
            f"| {r['option']} | {r['formats']} | {r['accuracy']} | {r['cost']} "
            f"| {r['train_bytes']} | {r['infer_bytes']} | {r['loss_scaling']} |"
        )
    return lines


def markdown(study: Study, *, figure: str | None = "policies_int8.png") -> str:
    """The report's section: settings, one table per experiment, the selection guide."""
    c = study.settings
    R = len(study.seeds)
    ref = study.fp32
    sizes = "-".join(map(str, (64, *c["hidden"], 10)))
    lines = [
        "## Precision policies and INT8 PTQ versus QAT",
        "",
        f"The training emulation's ReLU MLP {sizes} on the digits, {c['epochs']} epochs of "
        f"batches of {c['batch_size']} (Adam, initial weights N(0, 0.002^2)), seeds "
        f"{', '.join(map(str, study.seeds))} (split, weights, batch order). {study.calib_size} "
        "training images per seed are held out as the INT8 calibration slice and never "
        "trained on; accuracies are on the 450 test images. Every number is mean ± sample "
        f"std (ddof=1) over the {R} seeds; *paired* differences are computed per seed first.",
        "",
    ]
    judged = ref.mean >= MIN_TRAINED_ACCURACY
    if not judged:
        lines += [
            f"**Too short a run to judge formats by**: the FP32 baseline reaches only "
            f"{_pm(ref)} % test accuracy (below {MIN_TRAINED_ACCURACY:g} %), so the "
            "differences below are noise of an unfinished training; the tables give the "
            "numbers and the text draws no finding from them.",
            "",
        ]
    if figure:
        lines += [f"![policies and INT8]({figure})", ""]
    P = study.policies
    if len(P) > 1:
        lines += [
            "### Policies (and the FP32 head under `mixed_float16`)",
            "",
            "| run | test accuracy (%) | vs FP32 (pp, paired) | activation gradients "
            "lost to zero, per layer (%) | already zero before the store, per layer (%) "
            "| skipped steps | final loss scale |",
            "|---|---|---|---|---|---|---|",
        ]
        for v in P.values():
            z = " / ".join(f"{100 * a:.2f}" for a in v.extra["act_zero"])
            ez = " / ".join(f"{100 * a:.1f}" for a in v.extra["act_exact_zero"])
            lines.append(
                f"| {v.label} | {_pm(v)} | {_delta(v, ref)} | {z} | {ez} "
                f"| {', '.join(map(str, v.extra['skipped']))} "
                f"| {', '.join(f'2^{np.log2(s):g}' for s in v.extra['final_scale'])} |"
            )
        if "mixed_float16_fp16_head" in P:
            h32, h16 = P["mixed_float16"], P["mixed_float16_fp16_head"]
            d, s = h16.delta(h32)
            if not judged:
                verdict = "is not judged here (too short a run, see above)"
            elif not _significant(d, s):
                verdict = (
                    "does not measurably matter on this model (the difference is within twice "
                    "the spread over seeds). The FP16 softmax rounds probabilities to 11 "
                    "significant bits (steps of 2^-11 just below 1) and flushes those below "
                    "2^-25; a plausible reason it does no harm here (not measured separately): "
                    "10 classes keep the softmax sum small and exact-ish, and Adam normalises "
                    "the coarsened gradient magnitudes"
                )
            else:
                verdict = "matters here" if d < 0 else "is worse here, surprisingly"
            lines += [
                "",
                f"**FP16 head versus FP32 head** (`mixed_float16`): FP16 head {_pm(h16)} %, FP32 "
                f"head {_pm(h32)} %, paired difference {signed(d)} ± {s:.2f} pp: the FP32 head "
                f"{verdict}.",
                "",
                "Lost to zero: the share of non-zero activation gradients (times the loss "
                "scale) that the store in the gradient format flushes, mean over the recorded "
                "steps and seeds, layers from input to output. Under the FP32 head the output "
                "layer's flushed values are scale * p / batch below 2^-25, i.e. probabilities "
                "p below 2^-25 * batch / scale (2^-33 at scale 2^15, batch 128: no signal); "
                "under the FP16 head the softmax has already flushed them to 0 before the "
                "store, so they are not counted.",
                "",
                _head_zeros_note(h32, h16),
            ]
    if study.fp8:
        lines += ["", *fp8_markdown(study)]
    if study.norm:
        N = study.norm
        lines += [
            "",
            "### Layer norm: statistics in FP32 versus FP16 (`mixed_float16`)",
            "",
            "| run | test accuracy (%) | vs layer norm in float32 (pp, paired) |",
            "|---|---|---|",
        ]
        base = N.get("ln_float32")
        for v in N.values():
            lines.append(f"| {v.label} | {_pm(v)} | {_delta(v, base) if base else '-'} |")
        if "ln_fp16_stats" in N and "ln_fp32_stats" in N:
            d, s = N["ln_fp16_stats"].delta(N["ln_fp32_stats"])
            lines += [
                "",
                f"FP16 statistics against FP32 statistics: {signed(d)} ± {s:.2f} pp (paired): "
                + (
                    "no measurable difference on this model. "
                    if not _significant(d, s)
                    else ("FP16 statistics cost accuracy here. " if d < 0 else "a difference. ")
                )
                + "Sums accumulate in FP32 in both (the `reductions` rule); with FP16 "
                "statistics the mean, the squares of the centred values, the variance and "
                "1/sqrt(var + eps) are each rounded to FP16."
                + (
                    f" On the trained network's own inputs the largest relative error of "
                    f"1/sqrt(var + eps) with FP16 statistics is "
                    f"{study.norm_error['FP16 statistics']['rstd_rel']:.1e}, "
                    f"{study.norm_error['FP16 statistics']['rstd_rel'] / 2**-11:.1f} times "
                    "FP16's unit roundoff 2^-11, and the normalised output's error is of the "
                    "order of its own FP16 storage error (table below)."
                    if "FP16 statistics" in study.norm_error
                    else ""
                ),
            ]
        if study.norm_error:
            lines += [
                "",
                "Error of the layer norm itself, on the trained network's own inputs (the test "
                "set through the FP32-statistics network; reference: float64 arithmetic on the "
                "same FP16 inputs; the normalised output is stored in FP16 in every variant):",
                "",
                "| statistics | max relative error of 1/sqrt(var + eps) "
                "| max / median absolute error of the normalised output |",
                "|---|---|---|",
            ]
            for label, e in study.norm_error.items():
                lines.append(
                    f"| {label} | {e['rstd_rel']:.2e} | {e['y_max']:.2e} / {e['y_median']:.2e} |"
                )
    if study.ptq:
        lines += [
            "",
            "### INT8 post-training quantization of the FP32 network",
            "",
            f"FP32 network: {_pm(ref)} %. Activations per tensor (symmetric INT8, calibrated "
            "on the held-out slice with each method of `pl.calibrate`), weights symmetric INT8 "
            "with max calibration per tensor or per output channel; integer GEMMs exact, "
            "scaled by scale_x * scale_w.",
            "",
            "| calibration | weights | test accuracy (%) | vs FP32 (pp, paired) "
            "| calibration-slice loss | activation amax per layer (mean over seeds) |",
            "|---|---|---|---|---|---|",
        ]
        for (m, g), v in study.ptq.items():
            amax = " / ".join(f"{a:.3g}" for a in v.extra["amax"])
            lines.append(
                f"| {m} | {g.replace('_', '-')} | {_pm(v)} | {_delta(v, ref)} "
                f"| {v.extra['calib_loss']:.4f} | {amax} |"
            )
    if study.qat:
        q = study.qat["qat"]
        best_key = max(study.ptq, key=lambda k: (study.ptq[k].mean, -_order(k)))
        best = study.ptq[best_key]
        start = study.ptq[(study.qat_method, "per_channel")]
        d_best, s_best = q.delta(best)
        lines += [
            "",
            "### INT8 quantization-aware training",
            "",
            "| run | test accuracy (%) | vs FP32 (pp, paired) | vs best PTQ (pp, paired) |",
            "|---|---|---|---|",
        ]
        shown: list[Variant] = []
        for v in (ref, best, start, *study.qat.values()):
            if any(v is w for w in shown):  # the best PTQ variant may be QAT's start
                continue
            shown.append(v)
            label = v.label if v is not best else f"best PTQ: {v.label}"
            if v is best and v is start:
                label += " (QAT's start)"
            lines.append(f"| {label} | {_pm(v)} | {_delta(v, ref)} | {_delta(v, best)} |")
        ok = q.mean >= best.mean
        ctrl = study.qat.get("fp32_finetune_ptq")
        d_ctrl, s_ctrl = q.delta(ctrl) if ctrl is not None else (0.0, 0.0)
        ends = f"QAT ends {signed(d_best)} ± {s_best:.2f} pp from the best PTQ variant"
        if not judged:
            verdict = f"{ends}; not judged here (too short a run, see above)."
        elif ok:
            verdict = f"{ends}: at least as accurate, as required"
            if not _significant(d_best, s_best):
                verdict += ", by a margin within the spread over seeds"
            verdict += (
                ". (The best PTQ variant is picked by test accuracy among eight, which flatters "
                "it.)"
            )
            if ctrl is not None:
                verdict += (
                    " Against the control (the same fine-tuning in FP32, then the same PTQ) QAT "
                    f"ends {signed(d_ctrl)} ± {s_ctrl:.2f} pp: part of its margin is the extra "
                    "training, not the fake quantization."
                )
        else:
            verdict = (
                f"{ends}, below it: on this model INT8 PTQ already loses almost nothing, so the "
                "fine-tuning's noise (a few test images of 450) decides the order."
            )
        lines += [
            "",
            f"QAT starts from the per-channel PTQ network calibrated with `{study.qat_method}` "
            "(the smallest loss on the calibration slice, so chosen without the test set) and "
            "fine-tunes with fake quantization (weights per channel, max, recomputed each step; "
            "activations with the fixed calibration) and the straight-through estimator; the "
            "accuracy is that of the exported INT8 network. " + verdict,
        ]
    if len(P) > 1 or study.ptq:
        lines += [
            "",
            "### Selection guide (generated from the measurements above)",
            "",
            *guide_markdown(study),
            "",
            "Training bytes per parameter: master weight + working copy in the compute format "
            "+ gradient + Adam's two FP32 moments (mixed precision saves activation memory and "
            "GEMM time, not parameter memory). Inference bytes per parameter: weights in the "
            "deployed format, plus for INT8 the FP32 biases and scales, over weights and biases.",
        ]
    return "\n".join(lines)
