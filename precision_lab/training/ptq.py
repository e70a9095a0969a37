"""INT8 post-training quantization (PTQ) of a trained MLP of the training emulation.

The network is ``R`` replicas (seeds) of the ReLU MLP of :mod:`precision_lab.training`: weights
``W[i]`` of shape (R, fan_in, fan_out), biases ``b[i]`` (R, 1, fan_out). PTQ turns it into an
INT8 network without training:

* **activations** (the input of every GEMM) are quantized per tensor, symmetric INT8, with the
  scale :func:`precision_lab.calibrate` chooses from a held-out calibration slice run through
  the FP32 network; ``method`` is one of the core's calibration methods (``max``,
  ``percentile``, ``mse``, ``entropy``);
* **weights** are quantized symmetric INT8 with ``max`` calibration (the usual choice, as
  TensorRT and pytorch-quantization make it), per tensor or per output channel;
* each GEMM is an integer GEMM (int8 x int8, exact sums, as an int32 accumulator holds them)
  scaled by ``scale_x * scale_w`` per output column (:func:`precision_lab.gemm` with per-tensor
  and per-column scales, ``torch._scaled_mm`` style), plus the FP32 bias; the logits stay FP32.

One calibration per replica: activation and per-tensor weight calibrations are
:class:`~precision_lab.Calibration` objects with ``axis=0`` over the replicas.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> W = [rng.standard_normal((1, 8, 6)).astype(np.float32), rng.standard_normal((1, 6, 3))]
>>> b = [np.zeros((1, 1, 6), np.float32), np.zeros((1, 1, 3), np.float32)]
>>> x = rng.standard_normal((1, 50, 8)).astype(np.float32)
>>> q = ptq(W, b, x, method="max", weights="per_channel")
>>> q.forward(x).shape, [c.dtype.name for c in q.w_codes]
((1, 50, 3), ['int8', 'int8'])
>>> bool(np.mean(q.predict(x) == fp32_forward(W, b, x).argmax(-1)) > 0.9)
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..gemm import Accumulator, gemm
from ..quant.integer import CALIBRATION_METHODS, Calibration, calibrate
from .model import matmul_fixed_order

__all__ = [
    "WEIGHT_GRANULARITIES",
    "QuantizedMLP",
    "calibrate_activations",
    "fp32_forward",
    "layer_inputs",
    "ptq",
    "quantize_weights",
]

WEIGHT_GRANULARITIES = ("per_tensor", "per_channel")
#: the integer GEMM's sums are exact in float32 (checked), so BLAS order cannot change them
_BLAS = Accumulator("fp32", order="blas")
#: int8 codes are exact in bf16 (8 significant bits): the carrier grid of the integer GEMM
_CARRIER = "bf16"


def _as_replicas(arrs: Sequence[Any], name: str) -> list[np.ndarray]:
    out = [np.asarray(a, dtype=np.float32) for a in arrs]
    if not out or any(a.ndim != 3 for a in out):
        raise ValueError(f"{name} must be a non-empty list of (R, rows, cols) arrays")
    return out


def layer_inputs(W: Sequence[Any], b: Sequence[Any], x: Any) -> list[np.ndarray]:
    """The input of every GEMM of the FP32 network on ``x`` (R, N, D): ``[x, relu(z0), ...]``,
    float32 (FP32 accumulation by the training emulation's
    :func:`~precision_lab.training.model.matmul_fixed_order`: the same bits on every machine)."""
    Ws, bs = _as_replicas(W, "W"), _as_replicas(b, "b")
    h = np.asarray(x, dtype=np.float32)
    out = []
    for i, (w, bias) in enumerate(zip(Ws, bs, strict=True)):
        out.append(h)
        if i < len(Ws) - 1:
            z = matmul_fixed_order(h, w) + bias
            h = np.maximum(z, np.float32(0))
    return out


def fp32_forward(W: Sequence[Any], b: Sequence[Any], x: Any) -> np.ndarray:
    """Logits (R, N, C) of the FP32 network."""
    h = layer_inputs(W, b, x)[-1]
    return np.asarray(matmul_fixed_order(h, np.asarray(W[-1], np.float32)) + b[-1])


def _per_replica(x: np.ndarray, method: str, **kwargs: Any) -> Calibration:
    """One symmetric INT8 calibration per replica (axis 0) of ``x`` (R, ...)."""
    return calibrate(x.reshape(x.shape[0], -1), "int8", method=method, axis=0, **kwargs)


def calibrate_activations(
    W: Sequence[Any], b: Sequence[Any], x_calib: Any, *, method: str = "max", **kwargs: Any
) -> list[Calibration]:
    """Per-tensor INT8 calibrations (one per replica, ``axis=0``) of every GEMM input of the FP32
    network on the calibration data ``x_calib`` (R, N, D); ``kwargs`` go to
    :func:`precision_lab.calibrate` (``percentile``, ``num_bins`` ...)."""
    if method not in CALIBRATION_METHODS:
        raise ValueError(f"method must be one of {', '.join(CALIBRATION_METHODS)}, got {method!r}")
    return [_per_replica(h, method, **kwargs) for h in layer_inputs(W, b, x_calib)]


def _weight_calibration(w: np.ndarray, weights: str) -> tuple[Calibration, np.ndarray]:
    """Max calibration of ``w`` (R, m, n) and the view it applies to (per tensor: ``w``; per
    channel: ``w`` as (R * n, m), one row per replica and output column)."""
    if weights == "per_tensor":
        return _per_replica(w, "max"), w
    rows = np.ascontiguousarray(np.swapaxes(w, 1, 2)).reshape(-1, w.shape[1])
    return calibrate(rows, "int8", method="max", axis=0), rows


def _scale_shape(cal: Calibration, w: np.ndarray, weights: str) -> np.ndarray:
    R, _, n = w.shape
    if weights == "per_tensor":
        return cal.scale.reshape(R, 1, 1)
    return cal.scale.reshape(R, 1, n)


def quantize_weights(
    w: Any, weights: str = "per_channel"
) -> tuple[np.ndarray, np.ndarray, Calibration]:
    """INT8 codes of ``w`` (R, m, n) (int8, same shape), their scales ((R, 1, 1) per tensor,
    (R, 1, n) per output channel, float32) and the calibration (``max``: nothing is clipped)."""
    if weights not in WEIGHT_GRANULARITIES:
        raise ValueError(
            f"weights must be one of {', '.join(WEIGHT_GRANULARITIES)}, got {weights!r}"
        )
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 3:
        raise ValueError(f"w must have shape (R, fan_in, fan_out), got {w.shape}")
    cal, view = _weight_calibration(w, weights)
    codes = cal.quantize(view)
    if weights == "per_channel":
        codes = np.swapaxes(codes.reshape(w.shape[0], w.shape[2], w.shape[1]), 1, 2)
    return np.ascontiguousarray(codes), _scale_shape(cal, w, weights), cal


@dataclass(frozen=True)
class QuantizedMLP:
    """An INT8 network: weight codes and scales, FP32 biases, activation calibrations.

    ``forward`` quantizes each GEMM input with its calibration (per replica), runs the integer
    GEMM exactly (int8 codes carried on the bf16 grid, where they are exact, integer sums below
    ``2**24`` exact in FP32) and scales it by ``scale_x * scale_w``; ReLU between layers.
    """

    w_codes: tuple[np.ndarray, ...]
    w_scales: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    act: tuple[Calibration, ...]
    method: str
    weights: str

    def forward(self, x: Any) -> np.ndarray:
        """Logits (R, N, C), float32, of inputs ``x`` (R, N, D)."""
        h = np.asarray(x, dtype=np.float32)
        n = len(self.w_codes)
        for i in range(n):
            cal, codes = self.act[i], self.w_codes[i]
            if codes.shape[1] * 128 * 128 >= 2**24:
                raise ValueError(f"layer {i}: K={codes.shape[1]} too long for exact FP32 sums")
            qx = cal.quantize(h)
            z = gemm(
                qx.astype(np.float32),
                codes.astype(np.float32),
                input_format=_CARRIER,
                accumulator=_BLAS,
                input_rounding="exact",
                scale_a=cal.scale.reshape(-1, 1, 1),
                scale_b=self.w_scales[i],
            )
            z = np.asarray(z, dtype=np.float32) + self.biases[i]
            h = np.maximum(z, np.float32(0)) if i < n - 1 else z
        return h

    def predict(self, x: Any) -> np.ndarray:
        """Predicted classes (R, N)."""
        return np.argmax(self.forward(x), axis=-1)

    def accuracy(self, x: Any, y: Any) -> np.ndarray:
        """Accuracy per replica (R,)."""
        return np.asarray(np.mean(self.predict(x) == np.asarray(y), axis=-1))

    def loss(self, x: Any, y: Any) -> np.ndarray:
        """Mean cross-entropy per replica (R,), float64."""
        z = self.forward(x).astype(np.float64)
        z -= z.max(axis=-1, keepdims=True)
        lse = np.log(np.exp(z).sum(axis=-1))
        picked = np.take_along_axis(z, np.asarray(y)[..., None], axis=-1)[..., 0]
        return np.asarray(np.mean(lse - picked, axis=-1))

    def bytes_per_parameter(self) -> float:
        """Storage of the deployed network per parameter: INT8 weights, FP32 biases and FP32
        scales (weights and activations), over weights and biases."""
        params = sum(c[0].size for c in self.w_codes) + sum(b[0].size for b in self.biases)
        store = sum(c[0].size for c in self.w_codes)
        store += 4 * sum(b[0].size for b in self.biases)
        store += 4 * sum(s[0].size for s in self.w_scales) + 4 * len(self.act)
        return store / params


def build(
    W: Sequence[Any], b: Sequence[Any], act: Sequence[Calibration], *, weights: str, method: str
) -> QuantizedMLP:
    """The INT8 network of weights ``W``, biases ``b`` and activation calibrations ``act``."""
    Ws, bs = _as_replicas(W, "W"), _as_replicas(b, "b")
    if len(act) != len(Ws):
        raise ValueError(f"act must hold one calibration per layer ({len(Ws)}), got {len(act)}")
    qs = [quantize_weights(w, weights) for w in Ws]
    return QuantizedMLP(
        w_codes=tuple(q[0] for q in qs),
        w_scales=tuple(q[1] for q in qs),
        biases=tuple(bs),
        act=tuple(act),
        method=method,
        weights=weights,
    )


def ptq(
    W: Sequence[Any],
    b: Sequence[Any],
    x_calib: Any,
    *,
    method: str = "max",
    weights: str = "per_channel",
    **kwargs: Any,
) -> QuantizedMLP:
    """INT8 PTQ of the FP32 network ``(W, b)``: activations calibrated with ``method`` on
    ``x_calib`` (R, N, D), weights ``per_tensor`` or ``per_channel`` (max)."""
    if weights not in WEIGHT_GRANULARITIES:
        raise ValueError(
            f"weights must be one of {', '.join(WEIGHT_GRANULARITIES)}, got {weights!r}"
        )
    act = calibrate_activations(W, b, x_calib, method=method, **kwargs)
    return build(W, b, act, weights=weights, method=method)
