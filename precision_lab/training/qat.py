"""INT8 quantization-aware training (QAT): fake quantization with a straight-through estimator.

QAT fine-tunes the FP32-trained network with the INT8 rounding in its forward pass:

* **fake quantization** ``fq(x) = dequantize(quantize(x))`` (the core's exact
  :func:`precision_lab.quantize` / :func:`precision_lab.dequantize`) of every GEMM input, with
  the fixed per-tensor activation calibrations of PTQ (:mod:`precision_lab.training.ptq`), and of
  the weights, per output channel with ``max`` calibration recomputed at every step;
* **straight-through estimator** (STE, Bengio et al. 2013; pytorch-quantization's
  ``fake_tensor_quant``): the rounding is treated as the identity in the backward pass, so the
  gradient of ``fq(x)`` is the incoming gradient where ``x`` lies inside the clipping range
  ``[clip_min, clip_max]`` (bounds included) and zero where it was clipped. (PyTorch's
  ``fake_quantize_per_tensor_affine`` tests the rounded code instead, which lets half a step
  more through at each end.)

:class:`QATMLP` is the training emulation's :class:`~precision_lab.training.policy_model.PolicyMLP`
(FP32 policy) with those two hooks; :func:`qat_finetune` starts it from trained weights and
returns the INT8 network (:class:`~precision_lab.training.ptq.QuantizedMLP`) of the fine-tuned
weights.

>>> import numpy as np, precision_lab as pl
>>> cal = pl.calibrate(np.array([-1.0, 1.0]), "int8")
>>> xq, inside = fake_quant(np.array([0.3, -1.0, 2.5], np.float32), cal)
>>> (xq / cal.scale).round().tolist(), inside.tolist()
([38.0, -127.0, 127.0], [True, True, False])
>>> ste_grad(np.array([5.0, 6.0, 7.0], np.float32), inside).tolist()
[5.0, 6.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..quant.integer import Calibration
from .config import TrainConfig
from .data import Dataset
from .loop import TrainResult, train_seeds
from .policy_model import PolicyMLP
from .ptq import QuantizedMLP, _weight_calibration, build

__all__ = ["QATMLP", "fake_quant", "qat_finetune", "ste_grad"]


def _along(v: np.ndarray, cal: Calibration, ndim: int) -> np.ndarray:
    """Per-axis values of a calibration shaped to broadcast against an ``ndim`` array."""
    if cal.axis is None:
        return v.reshape(())
    shape = [1] * ndim
    shape[cal.axis] = -1
    return v.reshape(shape)


def fake_quant(x: Any, cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """``dequantize(quantize(x))`` with ``cal`` (float32, x's shape) and the STE mask: True
    where ``clip_min <= x <= clip_max`` (the gradient passes), False where ``x`` was clipped."""
    a = np.asarray(x, dtype=np.float32)
    xq = cal.dequantize(cal.quantize(a), dtype=np.float32)
    lo = _along(cal.clip_min, cal, a.ndim)
    hi = _along(cal.clip_max, cal, a.ndim)
    inside = (a >= lo) & (a <= hi)
    return np.asarray(xq, dtype=np.float32), inside


def ste_grad(grad: Any, inside: Any) -> np.ndarray:
    """The straight-through gradient: ``grad`` where ``inside``, 0 elsewhere (float32)."""
    g = np.asarray(grad, dtype=np.float32)
    return np.where(np.asarray(inside, dtype=bool), g, np.float32(0))


class QATMLP(PolicyMLP):
    """The MLP with fake-quantized GEMM inputs (fixed per-replica calibrations ``act``, one per
    layer, ``axis=0``) and weights (``weights``: ``per_channel`` or ``per_tensor`` max,
    recomputed each step), gradients by the straight-through estimator."""

    def __init__(
        self,
        sizes: list[int],
        cfg: TrainConfig,
        rngs: list[np.random.Generator],
        *,
        act: Sequence[Calibration],
        weights: str = "per_channel",
    ) -> None:
        super().__init__(sizes, cfg, rngs)
        if len(act) != self.n_layers:
            raise ValueError(
                f"act must hold one calibration per layer ({self.n_layers}), got {len(act)}"
            )
        if any(c.axis != 0 or c.scale.shape != (self.R,) for c in act):
            raise ValueError(f"act: expected per-replica calibrations (axis=0, {self.R} scales)")
        self.act = list(act)
        self.weights = weights

    def load(self, W: Sequence[Any], b: Sequence[Any]) -> QATMLP:
        """Start from trained weights and biases (copied); returns self."""
        if len(W) != self.n_layers or len(b) != self.n_layers:
            raise ValueError(f"W and b must hold {self.n_layers} layers")
        for i in range(self.n_layers):
            w = np.array(W[i], dtype=np.float32)
            bb = np.array(b[i], dtype=np.float32)
            if w.shape != self.W[i].shape or bb.shape != self.b[i].shape:
                raise ValueError(
                    f"layer {i}: shapes {w.shape}, {bb.shape} differ from the network's "
                    f"{self.W[i].shape}, {self.b[i].shape}"
                )
            self.W[i], self.b[i] = w, bb
        return self

    def _quant_input(self, i: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        return fake_quant(h, self.act[i])

    def _quant_weight(self, i: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        cal, view = _weight_calibration(w, self.weights)
        q, inside = fake_quant(view, cal)
        if self.weights == "per_channel":
            R, m, n = w.shape
            q = np.swapaxes(q.reshape(R, n, m), 1, 2)
            inside = np.swapaxes(inside.reshape(R, n, m), 1, 2)
        return np.ascontiguousarray(q), np.ascontiguousarray(inside)

    def quantized(self) -> QuantizedMLP:
        """The INT8 network of the current weights (same calibrations)."""
        return build(self.W, self.b, self.act, weights=self.weights, method="qat")


def qat_finetune(
    W: Sequence[Any],
    b: Sequence[Any],
    act: Sequence[Calibration],
    cfg: TrainConfig,
    seeds: Sequence[int],
    data: Sequence[Dataset],
    *,
    weights: str = "per_channel",
) -> tuple[QuantizedMLP, list[TrainResult], QATMLP]:
    """Fine-tune the trained network ``(W, b)`` (R replicas, one per seed) with QAT under
    ``cfg`` (its policy must be ``float32``; epochs, learning rate and schedule are the
    fine-tuning's); returns the INT8 network of the fine-tuned weights, the training record
    (test accuracy with fake quantization) and the QAT network."""
    if cfg.policy is None or cfg.policy.name != "float32":
        raise ValueError("cfg: QAT fine-tunes in FP32: use TrainConfig.from_policy('float32')")
    built: list[QATMLP] = []

    def model(sizes: list[int], c: TrainConfig, rngs: list[np.random.Generator]) -> QATMLP:
        net = QATMLP(sizes, c, rngs, act=act, weights=weights).load(W, b)
        built.append(net)
        return net

    results = train_seeds(cfg, seeds, data, model=model)
    net = built[0]
    return net.quantized(), results, net
