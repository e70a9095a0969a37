"""When FP4 training stops improving: the gradient-to-noise ratio of "FP4 all the way".

Chmiel, Fishman, Banner & Soudry, "FP4 All the Way: Fully Quantized Training of LLMs" (arXiv
2505.19115), abstract: "when the gradient norm falls below approximately sqrt(3) times the
quantization noise, quantized training becomes less effective"; they then finish training with
the backward pass in higher precision (quantization-aware fine-tuning, QAF: forward still FP4)
and recover the gap. :func:`gradient_noise_study` measures this on the digits MLP:

* the FP4 run (recipe ``fp4_all_the_way``: NVFP4, round to nearest forward, stochastic rounding
  in the dgrad and wgrad GEMMs) logs per step the norm of the full-precision gradient ``g`` (the
  same forward pass, cached activations and batch, backward GEMMs in FP32) and the norm of the
  quantization noise ``Q(g) - g`` (the FP4 backward's gradient minus ``g``), over every weight
  and bias;
* per epoch, the ratio ``sqrt(sum ||g||^2 / sum ||Q(g) - g||^2)`` over the epoch's steps; the
  crossing is the first epoch whose ratio is below ``sqrt(3)`` (our reading of the paper's
  criterion: "quantization noise" as the norm of the noise vector);
* at the end of the crossing epoch or of epoch ``epochs // 2``, whichever comes first (or of
  ``switch_epoch`` when given), the FP4 run forks: one branch goes on in FP4, the other
  switches its backward to FP32 (QAF; the forward stays NVFP4), and an FP32 run of the same
  seed (data split, initial weights, batch order) is the baseline.

Every number is seeded (the recipe's stochastic rounding is keyed by the replica, the step and
the GEMM), the GEMMs are the training emulation's fixed-order sums and the norms are
:func:`math.fsum` sums of float64 squares: the same bits on every machine.

>>> r = gradient_noise_study(epochs=3, hidden=(16,), batch_size=256)
>>> len(r["epoch"]["ratio"]), len(r["step"]["grad_norm"]) == 3 * r["steps_per_epoch"]
(3, True)
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from ..quant.recipes import get_recipe
from ..training import RUNS, load_digits_split
from ..training.recipe_model import RecipeMLP

__all__ = ["THRESHOLD", "gradient_noise_study"]

#: the paper's threshold on ||g|| / ||Q(g) - g||
THRESHOLD = math.sqrt(3.0)


def _sumsq(arrays: list[np.ndarray]) -> float:
    return math.fsum(math.fsum((a.astype(np.float64).reshape(-1) ** 2).tolist()) for a in arrays)


def _loss(net: RecipeMLP, x: np.ndarray, y: np.ndarray) -> float:
    loss, _ = net.loss(net.forward(x, train=False), y)
    return float(loss[0])


def gradient_noise_study(
    *,
    recipe: str = "fp4_all_the_way",
    seed: int = 0,
    epochs: int = 40,
    batch_size: int = 128,
    hidden: tuple[int, ...] = (64, 64, 64),
    lr: float = 0.01,
    threshold: float = THRESHOLD,
    switch_epoch: int | None = None,
) -> dict[str, Any]:
    """The gradient-to-noise ratio of ``recipe`` on the digits MLP and what switching the
    backward to FP32 at its crossing of ``threshold`` does (module docstring).

    Returns ``step`` (per step of the FP4 run: ``grad_norm``, ``noise_norm``, ``batch_loss``),
    ``epoch`` (per epoch: ``ratio``, and the full training set's loss after the epoch of the
    runs ``fp4``, ``fp32`` and, from the switch on, ``switched``; the test accuracy of each
    as ``acc_<run>``), ``crossing`` (the crossing epoch, 1-based, or None), ``switch`` (the
    epoch, 1-based, at whose end the ``switched`` run leaves FP4), ``steps_per_epoch`` and the
    settings. Adam at a constant learning rate ``lr`` (no decay: a schedule would
    change the loss curves at a time of its own).
    """
    cfg = RUNS["fp32"].replace(
        epochs=epochs, batch_size=batch_size, hidden=tuple(hidden), lr=lr, lr_schedule="constant"
    )
    ds = load_digits_split(seed=seed)
    xtr, ytr = ds.x_train[None], ds.y_train[None]
    xte, yte = ds.x_test[None], ds.y_test[None]
    sizes = [xtr.shape[2], *cfg.hidden, ds.n_classes]
    fp4 = get_recipe(recipe)
    qaf = get_recipe(recipe)
    qaf = type(qaf)(
        f"{fp4.name}_qaf",
        forward=fp4.forward,
        dgrad=get_recipe("fp32").dgrad,
        wgrad=get_recipe("fp32").wgrad,
        source="FP4 forward, FP32 backward (QAF)",
    )
    rng = np.random.default_rng(seed)
    nets = {
        "fp4": RecipeMLP(sizes, cfg, [np.random.default_rng(seed)], fp4),
        "fp32": RecipeMLP(sizes, cfg, [np.random.default_rng(seed)], "fp32"),
    }
    hp = RecipeMLP(sizes, cfg, [np.random.default_rng(seed)], qaf)  # full-precision backward
    n = xtr.shape[1]
    per_epoch = n // batch_size
    one = np.ones(1)
    taken = np.ones(1, dtype=bool)
    step: dict[str, list[float]] = {"grad_norm": [], "noise_norm": [], "batch_loss": []}
    ep: dict[str, list[Any]] = {"ratio": [], "fp4": [], "fp32": [], "switched": []}
    for k in ("fp4", "fp32", "switched"):
        ep[f"acc_{k}"] = []
    crossing: int | None = None
    if switch_epoch is not None and not 1 <= switch_epoch <= epochs:
        raise ValueError(f"switch_epoch must be in [1, epochs={epochs}], got {switch_epoch}")
    switch = switch_epoch
    for e in range(epochs):
        perm = rng.permutation(n)
        g2 = n2 = 0.0
        for j in range(per_epoch):
            idx = perm[j * batch_size : (j + 1) * batch_size]
            x, y = xtr[:, idx], ytr[:, idx]
            for name, net in nets.items():
                loss, p = net.loss(net.forward(x, train=True), y)
                if name == "switched":  # the FP4 forward's cache, the FP32 backward
                    hp._cache = net._cache
                    gW, gb, _ = hp.backward(p, y, one)
                else:
                    gW, gb, _ = net.backward(p, y, one)
                if name == "fp4":
                    hp._cache = net._cache
                    hW, hb, _ = hp.backward(p, y, one)
                    gn = _sumsq([*hW, *hb])
                    nn_ = _sumsq([a - b for a, b in zip([*gW, *gb], [*hW, *hb], strict=True)])
                    g2, n2 = g2 + gn, n2 + nn_
                    step["grad_norm"].append(math.sqrt(gn))
                    step["noise_norm"].append(math.sqrt(nn_))
                    step["batch_loss"].append(float(loss[0]))
                net.step(gW, gb, one, lr, taken)
        ep["ratio"].append(math.sqrt(g2 / n2) if n2 > 0 else math.inf)
        for name in ("fp4", "fp32", "switched"):
            net_ = nets.get(name)
            ep[name].append(None if net_ is None else _loss(net_, xtr, ytr))
            acc = None
            if net_ is not None:
                logits = net_.forward(xte, train=False)
                acc = float(np.mean(np.argmax(logits, axis=-1) == yte))
            ep[f"acc_{name}"].append(acc)
        if crossing is None and ep["ratio"][-1] < threshold:
            crossing = e + 1
        if switch is None and (crossing is not None or e + 1 == epochs // 2):
            switch = e + 1
        if switch == e + 1:
            nets["switched"] = copy.deepcopy(nets["fp4"])
            ep["switched"][-1] = ep["fp4"][-1]
            ep["acc_switched"][-1] = ep["acc_fp4"][-1]
    return {
        "recipe": fp4.name,
        "seed": seed,
        "epochs": epochs,
        "batch_size": batch_size,
        "hidden": tuple(hidden),
        "lr": lr,
        "threshold": threshold,
        "steps_per_epoch": per_epoch,
        "crossing": crossing,
        "switch": switch,
        "step": step,
        "epoch": ep,
    }
