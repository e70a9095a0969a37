"""The training emulation's network under a :class:`~precision_lab.training.policy.Policy`.

:class:`PolicyMLP` is the :class:`~precision_lab.training.MLP` with its numerics taken from a
policy (``cfg.policy``, set by :meth:`TrainConfig.from_policy
<precision_lab.training.TrainConfig.from_policy>`): per-layer formats (the policy's overrides),
the FP32 rule list, and an optional normalisation layer. What each rule means here:

* ``softmax``: the output layer's GEMM result (FP32 accumulator plus bias) is the softmax's
  input as it is, FP32, not rounded to the activation format; the softmax runs in FP32.
  Otherwise the logits are stored in the output layer's activation format and every step of
  the softmax (``z - max``, ``exp``, the sum, the division, ``log`` of the sum) is rounded to it.
* ``cross_entropy``: the log-probabilities, the loss and its gradient
  ``(softmax - onehot) * scale / batch`` in FP32 (then stored in the gradient format), or each
  step rounded to the output layer's activation format (forward) / gradient format (backward).
* ``norm_statistics``: the layer norm's statistics and arithmetic (mean, centred values, their
  squares, variance, ``1/sqrt(var + eps)``, the normalised output; in the backward pass the two
  means and the combination) in FP32, or each step rounded to the layer's activation format
  (gradient format backward).
* ``reductions``: every sum (the statistics' sums, the softmax denominator, bias gradients, the
  loss mean) accumulates in FP32 (numpy's pairwise float32 sum); otherwise in the tensor's own
  low format, pairwise (:func:`precision_lab.gemm` with ``Accumulator(fmt, order="pairwise")``).

Low-precision elementwise steps are computed in float64 (exact for ``+ - *`` of 16-bit values,
and innocuous before one rounding to a format of at most 24 bits for ``/`` and ``sqrt``) and
rounded once with :func:`precision_lab.round_to`.

The normalisation layer (``norm=True``): a layer norm without affine parameters (the next
layer's weights absorb them) after each hidden GEMM, before the ReLU:
``y = (z - mean(z)) / sqrt(var(z) + eps)`` over the features, ``eps = 1e-5`` (PyTorch's).

The inputs of the layer norms of the last forward pass are kept in ``net.norm_inputs``.

Every storage decision can be traced: set ``net.trace = []`` and each rounding of a stored
tensor appends ``(tensor, format name)``.

>>> import numpy as np
>>> from precision_lab.training import TrainConfig
>>> net = PolicyMLP([4, 3, 2], TrainConfig.from_policy("mixed_float16"), [np.random.default_rng(0)])
>>> net.trace = []
>>> _ = net.forward(np.ones((1, 5, 4), np.float32))
>>> net.trace
[('input', 'fp16'), ('layer0.out', 'fp16'), ('layer1.logits', 'fp32')]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.formats import FloatFormat, get_format
from ..core.rounding import round_to
from ..gemm import Accumulator, gemm
from .config import TrainConfig
from .model import MLP, Operand, _t, softmax_xent
from .policy import LayerPrecision, Policy, get_policy

__all__ = ["NORM_EPS", "PolicyMLP"]

NORM_EPS = 1e-5
_FP32: FloatFormat = get_format("fp32")  # type: ignore[assignment]


def _check_config(cfg: TrainConfig) -> Policy:
    if cfg.policy is None:
        raise ValueError(
            "cfg.policy: PolicyMLP needs a policy; build the config with TrainConfig.from_policy"
        )
    policy = get_policy(cfg.policy)
    for name, want in policy.train_fields().items():
        have = getattr(cfg, name)
        if have != want:
            raise ValueError(
                f"{name}: the config has {have!r} but its policy {policy.name!r} says {want!r}; "
                "change the policy (Policy.replace) and use TrainConfig.from_policy"
            )
    return policy


class PolicyMLP(MLP):
    """``R`` replicas of the ReLU MLP with the numerics of ``cfg.policy`` (see the module
    docstring); ``norm=True`` adds a layer norm after every hidden GEMM."""

    def __init__(
        self,
        sizes: list[int],
        cfg: TrainConfig,
        rngs: list[np.random.Generator],
        *,
        norm: bool = False,
    ) -> None:
        policy = _check_config(cfg)
        super().__init__(sizes, cfg, rngs)
        self.policy = policy
        self.norm = bool(norm)
        self.layers: list[LayerPrecision] = [
            policy.layer(i, self.n_layers) for i in range(self.n_layers)
        ]
        self.trace: list[tuple[str, str]] | None = None
        self.norm_inputs: list[np.ndarray] = []

    # ----- rounding helpers ----------------------------------------------------------------------
    def _fmt(self, op: str, low: FloatFormat) -> FloatFormat:
        return _FP32 if self.policy.runs_in_fp32(op) else low

    def _store(self, x: np.ndarray, fmt: FloatFormat, what: str) -> np.ndarray:
        """Round a stored tensor to ``fmt`` (float32 result; FP32 keeps a float32 array)."""
        if self.trace is not None:
            self.trace.append((what, str(fmt.name)))
        if fmt == _FP32 and x.dtype == np.float32:
            return x
        return np.asarray(round_to(x, fmt), dtype=np.float32)

    @staticmethod
    def _r(v: np.ndarray, fmt: FloatFormat) -> np.ndarray:
        """One rounding of float64 values (an exact or innocuous float64 step) to ``fmt``."""
        return np.asarray(round_to(np.asarray(v, dtype=np.float64), fmt), dtype=np.float32)

    def _sum(self, x: np.ndarray, axis: int, fmt: FloatFormat) -> np.ndarray:
        """Sum over ``axis`` (kept), float32: FP32 accumulation under the ``reductions`` rule,
        else a pairwise sum in ``fmt`` through :func:`precision_lab.gemm`."""
        x = np.asarray(x, dtype=np.float32)
        if self.policy.runs_in_fp32("reductions") or fmt == _FP32:
            return x.sum(axis=axis, keepdims=True, dtype=np.float32)
        acc = Accumulator(fmt, order="pairwise")
        if axis in (-1, x.ndim - 1):
            ones = np.ones((x.shape[-1], 1), dtype=np.float32)
            s = gemm(x, ones, input_format=fmt, accumulator=acc, out_format=fmt)
        else:
            assert axis in (-2, x.ndim - 2)
            ones = np.ones((1, x.shape[-2]), dtype=np.float32)
            s = gemm(ones, x, input_format=fmt, accumulator=acc, out_format=fmt)
        return np.asarray(s, dtype=np.float32)

    def _operand(self, x: np.ndarray, fmt: FloatFormat, key: Any, update: bool) -> Operand:
        """A GEMM operand; per-tensor (FP8) scaling for 8-bit formats only."""
        if fmt.bits <= 8 and self.cfg.tensor_scaling != "none":
            return self.num.operand(x, fmt, key, update)
        return x, None

    # ----- hooks for quantization-aware training -------------------------------------------------
    def _quant_input(self, i: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The input of GEMM ``i`` as the forward pass uses it, and the straight-through mask of
        its gradient (``None``: all through)."""
        return h, None

    def _quant_weight(self, i: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The weights of GEMM ``i`` as the forward pass uses them, and their gradient mask."""
        return w, None

    # ----- forward ------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, *, train: bool = False) -> np.ndarray:
        """Logits (R, B, C) of batches ``x`` (R, B, D): FP32 under the ``softmax`` rule, else on
        the output layer's activation grid."""
        n = self.n_layers
        h = self._store(np.asarray(x, dtype=np.float32), self.layers[0].activation, "input")
        ys: list[np.ndarray] = []
        qx: list[Operand] = []
        qw: list[Operand] = []
        masks: list[tuple[np.ndarray | None, np.ndarray | None]] = []
        norms: list[tuple[np.ndarray, np.ndarray]] = []
        self.norm_inputs = []
        for i, (w, b) in enumerate(zip(self.W, self.b, strict=True)):
            L = self.layers[i]
            hq, hmask = self._quant_input(i, h)
            wq, wmask = self._quant_weight(i, w)
            ox = self._operand(hq, L.compute, ("x", i), train)
            ow = self._operand(wq, L.compute, ("w", i), train)
            acc = self.num.mm(ox, ow, L.compute, L.compute) + b
            qx.append(ox)
            qw.append(ow)
            masks.append((hmask, wmask))
            if i == n - 1:
                h = self._store(acc, self._fmt("softmax", L.activation), f"layer{i}.logits")
            else:
                z = self._store(acc, L.activation, f"layer{i}.out")
                if self.norm:
                    self.norm_inputs.append(z)
                    z, rstd = self.norm_forward(z, L, i)
                    norms.append((z, rstd))
                ys.append(z)
                h = np.maximum(z, np.float32(0))
        if train:
            self._cache = {"ys": ys, "qx": qx, "qw": qw, "masks": masks, "norms": norms}
        return h

    def norm_forward(
        self, z: np.ndarray, L: LayerPrecision, i: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Layer norm of GEMM layer ``i``'s output ``z`` (R, B, D) over the features, formats
        ``L``: the output (stored in the activation format) and ``1/sqrt(var + eps)``
        (R, B, 1), under the policy's ``norm_statistics`` and ``reductions`` rules."""
        f = self._fmt("norm_statistics", L.activation)
        D = z.shape[-1]
        z64 = z.astype(np.float64)
        mu = self._r(self._sum(z, -1, f).astype(np.float64) / D, f)
        d = self._r(z64 - mu, f)
        sq = self._r(d.astype(np.float64) ** 2, f)
        var = self._r(self._sum(sq, -1, f).astype(np.float64) / D, f)
        ve = self._r(var.astype(np.float64) + NORM_EPS, f)
        rstd = self._r(1.0 / np.sqrt(ve.astype(np.float64)), f)
        y = self._r(d.astype(np.float64) * rstd, f)
        if self.trace is not None:
            self.trace.append((f"layer{i}.norm_statistics", str(f.name)))
        return self._store(y, L.activation, f"layer{i}.norm"), rstd

    def _norm_backward(
        self, dy: np.ndarray, y: np.ndarray, rstd: np.ndarray, L: LayerPrecision
    ) -> np.ndarray:
        """``rstd * (dy - mean(dy) - y * mean(dy * y))`` (before the gradient-format store)."""
        f = self._fmt("norm_statistics", L.gradient)
        D = dy.shape[-1]
        a = self._r(self._sum(dy, -1, f).astype(np.float64) / D, f)
        yy = self._r(dy.astype(np.float64) * y, f)
        c = self._r(self._sum(yy, -1, f).astype(np.float64) / D, f)
        t = self._r(dy.astype(np.float64) - a, f)
        t = self._r(t.astype(np.float64) - self._r(y.astype(np.float64) * c, f), f)
        return self._r(t.astype(np.float64) * rstd, f)

    # ----- the head ----------------------------------------------------------------------------
    def loss(self, logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean cross-entropy (float64, (R,)) and softmax probabilities (float32) under the
        ``softmax`` and ``cross_entropy`` rules."""
        L = self.layers[-1]
        fs = self._fmt("softmax", L.activation)
        fc = self._fmt("cross_entropy", L.activation)
        if fs == _FP32 and fc == _FP32:
            return softmax_xent(logits, y)
        z = np.asarray(logits, dtype=np.float64)
        d = self._r(z - z.max(axis=-1, keepdims=True), fs)
        e = self._r(np.exp(d.astype(np.float64)), fs)
        s = self._r(self._sum(e, -1, fs), fs)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = self._r(e.astype(np.float64) / s, fs)
            logs = self._r(np.log(s.astype(np.float64)), fs)
        lp = self._r(d.astype(np.float64) - logs, fc)
        picked = np.take_along_axis(lp, y[..., None], axis=-1)  # (R, B, 1)
        total = self._sum(np.swapaxes(picked, -1, -2), -1, fc)[..., 0, 0]
        return -total.astype(np.float64) / y.shape[-1], p

    # ----- backward ----------------------------------------------------------------------------
    def backward(
        self, probs: np.ndarray, y: np.ndarray, scale: np.ndarray, record: bool = False
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[list[dict[str, Any]]]]:
        """Scaled gradients of weights and biases of the last ``forward(train=True)`` (see
        :meth:`MLP.backward <precision_lab.training.MLP.backward>`)."""
        L = self.layers[-1]
        n = y.shape[1]
        s = np.asarray(scale, dtype=np.float64).reshape(self.R, 1, 1)
        onehot = np.zeros(probs.shape, dtype=np.float32)
        np.put_along_axis(onehot, y[..., None], np.float32(1), axis=-1)
        fc = self._fmt("cross_entropy", L.gradient)
        with np.errstate(over="ignore", invalid="ignore"):
            if fc == _FP32:
                g = probs.astype(np.float32) - onehot
                g *= (s / n).astype(np.float32)
            else:
                g = self._r(probs.astype(np.float64) - onehot, fc)
                g = self._r(g.astype(np.float64) * (s / n), fc)
        stats: list[list[dict[str, Any]]] = [
            [{} for _ in range(self.n_layers)] for _ in range(self.R)
        ]
        if record:
            self._stats(stats, self.n_layers - 1, "act", g, s)
        dz = self._store(g, L.gradient, f"layer{self.n_layers - 1}.grad")
        with np.errstate(invalid="ignore", over="ignore"):
            gW, gb = self._policy_backward(dz, stats, s, record)
        return gW, gb, stats

    def _policy_backward(
        self, dz: np.ndarray, stats: list[list[dict[str, Any]]], s: np.ndarray, record: bool
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        c = self._cache
        ys, qx, qw, masks, norms = c["ys"], c["qx"], c["qw"], c["masks"], c["norms"]
        gW: list[np.ndarray] = [np.empty(0)] * self.n_layers
        gb: list[np.ndarray] = [np.empty(0)] * self.n_layers
        zero = np.float32(0)
        for i in range(self.n_layers - 1, -1, -1):
            L = self.layers[i]
            hmask, wmask = masks[i]
            ody = self._operand(dz, L.backward, ("dy", i), True)
            wg = self.num.mm(_t(qx[i]), ody, L.compute, L.backward)
            if wmask is not None:  # straight-through estimator of the weights' fake quant
                wg = np.where(wmask, wg, zero)
            if record:
                self._stats(stats, i, "weight", wg, s)
            gW[i] = self._store(wg, L.gradient, f"layer{i}.wgrad")
            gb[i] = self._store(self._sum(dz, -2, L.gradient), L.gradient, f"layer{i}.bgrad")
            if not i:
                break
            P = self.layers[i - 1]
            dh = self.num.mm(ody, _t(qw[i]), L.backward, L.compute)
            if hmask is not None:  # straight-through estimator of the input's fake quant
                dh = np.where(hmask, dh, zero)
            mask = ys[i - 1] > 0
            if self.norm:
                dy = np.where(mask, self._store(dh, P.gradient, f"layer{i - 1}.normgrad"), zero)
                y_n, rstd = norms[i - 1]
                pre = self._norm_backward(dy, y_n, rstd, P)
                if record:
                    self._stats(stats, i - 1, "act", pre, s)
                dz = self._store(pre, P.gradient, f"layer{i - 1}.grad")
            else:
                if record:
                    self._stats(stats, i - 1, "act", np.where(mask, dh, zero), s)
                dz = np.where(mask, self._store(dh, P.gradient, f"layer{i - 1}.grad"), zero)
        return gW, gb
