"""The training loop and its record: accuracy curves, loss scales, skipped steps, per-layer
gradient statistics."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import TrainConfig, make_scaler
from .data import Dataset, load_digits_split
from .model import HIST_HI, HIST_LO, MLP
from .policy_model import PolicyMLP

__all__ = ["LayerRecord", "TrainResult", "train", "train_seeds"]


def _zeros_hist() -> np.ndarray:
    return np.zeros(HIST_HI - HIST_LO, np.int64)


@dataclass
class LayerRecord:
    """Gradient statistics of one layer, accumulated over the recorded steps.

    ``act`` is the gradient of the layer's output before the activation function (the ``dY``
    operand of its backward GEMMs), ``weight`` its weight gradient, both multiplied by the loss
    scale and measured before their rounding to the gradient format. Fractions (of the non-zero
    values) are per recorded step; histograms count the *unscaled* magnitudes in log2 bins
    ``[2**k, 2**(k+1))``, ``k = hist_log2``, summed over the recorded steps.
    """

    act_zero: list[float] = field(default_factory=list)
    #: per recorded step, the fraction of activation gradients that are exactly zero before the
    #: store (ReLU's inactive units, upstream values already flushed): not counted in act_zero
    act_exact_zero: list[float] = field(default_factory=list)
    act_subnormal: list[float] = field(default_factory=list)
    weight_zero: list[float] = field(default_factory=list)
    weight_subnormal: list[float] = field(default_factory=list)
    act_hist: np.ndarray = field(default_factory=_zeros_hist)
    act_hist_zero: np.ndarray = field(default_factory=_zeros_hist)

    hist_log2 = np.arange(HIST_LO, HIST_HI)

    @property
    def act_zero_fraction(self) -> float:
        """Mean over the recorded steps of the fraction of activation gradients lost to zero."""
        return float(np.mean(self.act_zero)) if self.act_zero else 0.0

    @property
    def act_exact_zero_fraction(self) -> float:
        """Mean over the recorded steps of the fraction of activation gradients that were
        exactly zero already before the store (the values ``act_zero_fraction`` leaves out)."""
        return float(np.mean(self.act_exact_zero)) if self.act_exact_zero else 0.0

    @property
    def act_subnormal_fraction(self) -> float:
        return float(np.mean(self.act_subnormal)) if self.act_subnormal else 0.0

    @property
    def weight_zero_fraction(self) -> float:
        return float(np.mean(self.weight_zero)) if self.weight_zero else 0.0


@dataclass
class TrainResult:
    """What one run (one seed) did.

    With per-tensor (FP8) scaling, ``fp8_casts[role]`` (role ``"x"`` activations, ``"w"`` weights,
    ``"dy"`` gradients) gives the fractions of the non-zero values cast over the run that became
    zero (``"zero"``) and that were saturated at the format's maximum (``"saturated"``).

    Per epoch: ``train_acc`` and ``train_loss`` (running accuracy and mean cross-entropy of the
    epoch's minibatches, measured before each update), ``test_acc`` (test set, after the epoch).
    Per step: ``scale`` (the loss scale used), ``skipped`` (optimizer step skipped for inf/NaN
    gradients), ``batch_loss``. At the end: ``final_train_acc`` and ``final_loss`` (whole
    training set). Forward passes for evaluation use the run's own numerics.
    """

    config: TrainConfig
    train_acc: list[float] = field(default_factory=list)
    test_acc: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    batch_loss: list[float] = field(default_factory=list)
    layers: list[LayerRecord] = field(default_factory=list)
    samples: dict[str, np.ndarray] = field(default_factory=dict)
    fp8_casts: dict[str, dict[str, float]] = field(default_factory=dict)
    final_train_acc: float = 0.0
    final_loss: float = 0.0
    seconds: float = 0.0

    @property
    def final_test_acc(self) -> float:
        return self.test_acc[-1]

    @property
    def steps(self) -> int:
        return len(self.scale)

    @property
    def n_skipped(self) -> int:
        return int(np.sum(self.skipped))


@contextlib.contextmanager
def _single_threaded_blas() -> Iterator[None]:
    """The GEMMs of this network are small: BLAS threads only cost (and fight other work)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _evaluate(net: MLP, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logits = net.forward(x, train=False)
    loss, _ = net.loss(logits, y)
    return np.mean(np.argmax(logits, axis=-1) == y, axis=-1), loss


def _lr(cfg: TrainConfig, step: int, total: int) -> float:
    if cfg.lr_schedule == "cosine":
        return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * step / total))
    if cfg.lr_schedule == "step":  # a tenth of the rate for the last quarter of the steps
        return cfg.lr * (0.1 if step >= 0.75 * total else 1.0)
    return cfg.lr


def train(cfg: TrainConfig, data: Dataset | None = None) -> TrainResult:
    """Train the MLP of ``cfg`` (seed ``cfg.seed``) on the digits (or ``data``).

    >>> from precision_lab.training import RUNS
    >>> r = train(RUNS["fp16_noscale"].replace(epochs=2, hidden=(8,), batch_size=256))
    >>> len(r.test_acc), r.steps, len(r.layers)
    (2, 10, 2)
    """
    return train_seeds(cfg, [cfg.seed], None if data is None else [data])[0]


def train_seeds(
    cfg: TrainConfig,
    seeds: Sequence[int],
    data: Sequence[Dataset] | None = None,
    *,
    samples_per_layer: int = 0,
    model: Callable[[list[int], TrainConfig, list[np.random.Generator]], MLP] | None = None,
) -> list[TrainResult]:
    """Train ``cfg`` once per seed, the seeds side by side (batched GEMMs); one result each.

    Seed ``s`` fixes the data split (:func:`load_digits_split`), the initial weights and the batch
    order, exactly as ``train(cfg.replace(seed=s))`` does. ``samples_per_layer`` > 0 keeps that
    many unscaled activation-gradient values per layer from the recorded steps (float32, before
    rounding to the gradient format) in ``result.samples["layer<i>"]``.

    ``model(sizes, cfg, rngs)`` builds the network (default: :class:`MLP`, or
    :class:`~precision_lab.training.policy_model.PolicyMLP` when ``cfg.policy`` is set); keep a
    reference to it to read the trained weights.
    """
    t0 = time.perf_counter()
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    ds = list(data) if data is not None else [load_digits_split(seed=s) for s in seeds]
    if len(ds) != len(seeds):
        raise ValueError(f"data must hold one Dataset per seed ({len(seeds)}), got {len(ds)}")
    shapes = {(d.x_train.shape, d.x_test.shape, d.n_classes) for d in ds}
    if len(shapes) != 1:
        raise ValueError(f"the datasets of the seeds differ in shape: {sorted(shapes)}")
    R = len(seeds)
    xtr = np.stack([d.x_train for d in ds])
    ytr = np.stack([d.y_train for d in ds])
    xte = np.stack([d.x_test for d in ds])
    yte = np.stack([d.y_test for d in ds])
    rngs = [np.random.default_rng(s) for s in seeds]
    sizes = [xtr.shape[2], *cfg.hidden, ds[0].n_classes]
    results = [TrainResult(config=cfg.replace(seed=s)) for s in seeds]
    with _single_threaded_blas():
        net = (model or _default_model(cfg))(sizes, cfg, rngs)
        scalers = [make_scaler(cfg) for _ in range(R)]
        for res in results:
            res.layers = [LayerRecord() for _ in range(net.n_layers)]
        keep: list[list[list[np.ndarray]]] = [[[] for _ in range(net.n_layers)] for _ in seeds]
        n = xtr.shape[1]
        bs = min(cfg.batch_size, n)
        per_epoch = n // bs
        total = cfg.epochs * per_epoch
        step = 0
        rows = np.arange(R)[:, None]
        for _epoch in range(cfg.epochs):
            perms = np.stack([g.permutation(n) for g in rngs])
            correct = np.zeros(R)
            loss_sum = np.zeros(R)
            for j in range(per_epoch):
                idx = perms[:, j * bs : (j + 1) * bs]
                x, y = xtr[rows, idx], ytr[rows, idx]
                logits = net.forward(x, train=True)
                loss, p = net.loss(logits, y)
                correct += np.sum(np.argmax(logits, axis=-1) == y, axis=-1)
                loss_sum += loss * bs
                s = np.array([sc.scale for sc in scalers])
                inv = np.array([sc.inv_scale for sc in scalers])
                record = step % cfg.record_every == 0
                gW, gb, stats = net.backward(p, y, s, record=record)
                finite = np.ones(R, dtype=bool)
                for g in (*gW, *gb):
                    finite &= np.isfinite(g.reshape(R, -1)).all(axis=1)
                taken = np.array(
                    [sc.update(not bool(f)) for sc, f in zip(scalers, finite, strict=True)]
                )
                net.step(gW, gb, inv, _lr(cfg, step, total), taken)
                for r, res in enumerate(results):
                    res.scale.append(float(s[r]))
                    res.skipped.append(not bool(taken[r]))
                    res.batch_loss.append(float(loss[r]))
                    if record:
                        _record(res.layers, stats[r], keep[r], samples_per_layer)
                step += 1
            acc_te, _ = _evaluate(net, xte, yte)
            for r, res in enumerate(results):
                res.train_acc.append(float(correct[r] / (per_epoch * bs)))
                res.train_loss.append(float(loss_sum[r] / (per_epoch * bs)))
                res.test_acc.append(float(acc_te[r]))
        acc_tr, loss_tr = _evaluate(net, xtr, ytr)
    took = time.perf_counter() - t0
    for r, res in enumerate(results):
        res.final_train_acc = float(acc_tr[r])
        res.final_loss = float(loss_tr[r])
        res.seconds = took / R
        for role, c in net.num.cast_counts.items():
            tot = max(int(c[r, 0]), 1)
            res.fp8_casts[role] = {"zero": c[r, 1] / tot, "saturated": c[r, 2] / tot}
        if samples_per_layer:
            for i, chunks in enumerate(keep[r]):
                v = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
                stride = max(1, v.size // samples_per_layer)  # evenly over the recorded steps
                res.samples[f"layer{i}"] = v[::stride][:samples_per_layer]
    return results


def _default_model(cfg: TrainConfig) -> Callable[..., MLP]:
    if cfg.policy is None:
        return MLP
    return PolicyMLP


def _record(
    layers: list[LayerRecord],
    stats: list[dict[str, Any]],
    keep: list[list[np.ndarray]],
    samples_per_layer: int,
) -> None:
    for rec, st, kp in zip(layers, stats, keep, strict=True):
        a, w = st["act"], st["weight"]
        rec.act_zero.append(a["zero_fraction"])
        rec.act_exact_zero.append(a["exact_zero_fraction"])
        rec.act_subnormal.append(a["subnormal_fraction"])
        rec.weight_zero.append(w["zero_fraction"])
        rec.weight_subnormal.append(w["subnormal_fraction"])
        rec.act_hist += a["hist"]
        rec.act_hist_zero += a["hist_zero"]
        if samples_per_layer:
            kp.append(a["values"])
