"""A multilayer perceptron in numpy with a hand-written backward pass, every GEMM through
:func:`precision_lab.gemm`, every stored tensor rounded with :func:`precision_lab.round_to`.

Several independent replicas (one per seed) are trained side by side: every array has a leading
replica axis ``R`` and each GEMM is one batched :func:`~precision_lab.gemm` call, so that the
fixed cost of a call is shared by the seeds. Replicas never mix: each has its own weights, data
order, loss scaler and FP8 scalers.

The numerics follow mixed-precision practice (PyTorch autocast / Apex O1, Transformer Engine for
FP8):

* master weights and biases in ``master_format`` (fp32); each step the weights are cast to the
  GEMM input format;
* forward: ``z = gemm(h, W) + b`` (sum in the accumulator, bias added in fp32), rounded to
  ``activation_format``; ``h = relu(z)``; the loss (softmax cross-entropy, mean over the batch) in
  fp32;
* backward: ``dz = S * (softmax - onehot) / B`` rounded to ``gradient_format`` (``S`` the loss
  scale); per layer the weight gradient ``gemm(h.T, dz)``, the bias gradient ``sum(dz)`` and the
  input gradient ``gemm(dz, W.T)`` (masked by the ReLU), each rounded to ``gradient_format``;
* FP8 with per-tensor scaling: each GEMM operand ``x`` is cast as ``round_to(x * s, fmt,
  saturate)`` and the GEMM gets the decode scale ``1/s`` (as ``torch._scaled_mm``); ``s`` comes
  from a :class:`~precision_lab.scaling.DelayedScaling` per operand and replica (updated with the
  operand's amax when it is cast) or from the operand itself (current scaling). The casts of the
  forward pass (activations, weights) are reused by the backward pass, as Transformer Engine
  keeps them.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import numpy as np

from ..analysis.measures import underflow_stats
from ..core.formats import FloatFormat, get_format
from ..core.rounding import round_to
from ..gemm import Accumulator, gemm
from ..scaling import DelayedScaling, scale_from_amax
from .config import TrainConfig
from .updates import apply_update

__all__ = ["MLP", "Numerics", "matmul_fixed_order", "softmax_xent"]

#: fixed log2 bins of the recorded gradient histograms: k in [HIST_LO, HIST_HI)
HIST_LO, HIST_HI = -150, 20

Operand = tuple[np.ndarray, np.ndarray | None]


def matmul_fixed_order(a: Any, b: Any) -> np.ndarray:
    """``a @ b`` (batches broadcast like :func:`numpy.matmul`) with the same bits on every
    machine: the fp32 accumulation of the training emulation.

    ``a`` (..., M, K) and ``b`` (..., K, N) are taken as float32 (values off the float32 grid
    raise ``ValueError``). Each product is exact in float64 (24 + 24 significant bits); the
    products are added in float64 in increasing ``k`` by elementwise numpy additions, so no BLAS
    kernel, thread count or SIMD width can reorder them; the sum is rounded once to float32
    (round to nearest even; inf/NaN follow IEEE float64 arithmetic). At least as accurate as a
    float32 BLAS product; about 5-15 times its time for this network's small matrices.

    >>> a = np.array([[1.0, 2.0**-24, 2.0**-24]], np.float32)
    >>> b = np.ones((3, 1), np.float32)
    >>> float(matmul_fixed_order(a, b)[0, 0]) == 1.0 + 2.0**-23  # float32 BLAS may give 1.0
    True
    """
    a32 = np.asarray(a, dtype=np.float32)
    b32 = np.asarray(b, dtype=np.float32)
    for name, x, x32 in (("a", a, a32), ("b", b, b32)):
        if x32.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions, got shape {x32.shape}")
        with np.errstate(invalid="ignore"):
            off = np.asarray(x, dtype=np.float64) != x32
        if np.any(off & ~np.isnan(x32)):
            raise ValueError(f"{name} must hold float32 values (off the float32 grid)")
    if b32.shape[-2] != a32.shape[-1]:
        raise ValueError(f"a {a32.shape} and b {b32.shape} disagree on K")
    with np.errstate(over="ignore", invalid="ignore"):
        return fixed_order_sum(a32, b32).astype(np.float32)


def fixed_order_sum(a32: np.ndarray, b32: np.ndarray) -> np.ndarray:
    """The float64 sum of :func:`matmul_fixed_order` before its rounding (no checks: float32
    operands of matching shapes)."""
    k = a32.shape[-1]
    shape = (*np.broadcast_shapes(a32.shape[:-2], b32.shape[:-2]), a32.shape[-2], b32.shape[-1])
    # k first and contiguous, so each step reads one contiguous slice of each operand
    ak = np.ascontiguousarray(np.moveaxis(a32, -1, 0), dtype=np.float64)[..., :, None]
    bk = np.ascontiguousarray(np.moveaxis(b32, -2, 0), dtype=np.float64)[..., None, :]
    acc = np.zeros(shape)
    tmp = np.empty(shape)
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(k):
            np.multiply(ak[j], bk[j], out=tmp)
            acc += tmp
    return acc


def _float(name: str) -> FloatFormat:
    f = get_format(name)
    assert isinstance(f, FloatFormat)  # checked by TrainConfig
    return f


class Numerics:
    """The number formats, accumulator and FP8 scalers of one run (``replicas`` seeds)."""

    def __init__(self, cfg: TrainConfig, replicas: int) -> None:
        self.cfg = cfg
        self.R = replicas
        #: None: fp32 sums by :func:`matmul_fixed_order` (the same bits on every machine)
        self.acc: Accumulator | None = cfg.accumulator
        self.fwd = get_format(cfg.forward_format)
        self.bwd = get_format(cfg.backward_format)
        self.act = get_format(cfg.activation_format)
        self.grad = get_format(cfg.gradient_format)
        self.grad_format = _float(cfg.gradient_format)
        self.master = get_format(cfg.master_format)
        self._fp32 = get_format("fp32")
        self.scalers: dict[Any, list[DelayedScaling]] = {}
        #: per operand role ("x", "w", "dy"): (R, 3) counts of non-zero values cast with a
        #: per-tensor scale, of those that became zero, and of those saturated at fmt.max
        self.cast_counts: dict[str, Any] = {}

    def store(self, x: np.ndarray, fmt: Any) -> np.ndarray:
        """Round a float32 array to a storage format (no-op for fp32)."""
        if fmt == self._fp32:
            return x
        return round_to(x, fmt)

    def operand(self, x: np.ndarray, fmt: Any, key: Any, update: bool) -> Operand:
        """A GEMM operand of shape (R, ..): ``(x, None)`` (the GEMM rounds it) or, with per-tensor
        scaling, the scaled, saturated cast and the decode scales, shape (R, 1, 1)."""
        mode = self.cfg.tensor_scaling
        if mode == "none":
            return x, None
        amax = np.max(np.abs(x.reshape(self.R, -1)), axis=1).astype(np.float64)
        if mode == "current":
            s = scale_from_amax(amax, fmt)
        else:
            dss = self.scalers.get(key)
            if dss is None:
                dss = [
                    DelayedScaling(fmt, self.cfg.amax_history_len, "max", self.cfg.fp8_margin)
                    for _ in range(self.R)
                ]
                self.scalers[key] = dss
            s = np.array([ds.scale for ds in dss], dtype=np.float32)
            if update:
                for ds, a in zip(dss, amax.tolist(), strict=True):
                    ds.update(a)
        s = s.reshape(self.R, *([1] * (x.ndim - 1)))
        with np.errstate(over="ignore", invalid="ignore"):
            xs = x * s
            q = round_to(xs, fmt, overflow="saturate")
        if update:  # each tensor is cast once per step with update=True: count its fate
            flat_x, flat_q = xs.reshape(self.R, -1), q.reshape(self.R, -1)
            nz = flat_x != 0
            counts = np.stack(
                [
                    nz.sum(axis=1),
                    ((flat_q == 0) & nz).sum(axis=1),
                    (np.abs(flat_x) > fmt.max).sum(axis=1),
                ],
                axis=1,
            )
            role = key[0]
            self.cast_counts[role] = self.cast_counts.get(role, 0) + counts
        return q, (np.float32(1.0) / s).reshape(self.R, 1, 1)

    def mm(self, a: Operand, b: Operand, fa: Any, fb: Any) -> np.ndarray:
        """Batched ``a @ b`` of two operands, inputs in ``fa``/``fb``, float32 (fp32) result:
        through :func:`precision_lab.gemm` with the run's accumulator, or (none set) the
        operands rounded to their formats (:func:`round_to`), :func:`matmul_fixed_order`, and
        the decode scales applied to the float64 sum (one rounding to float32)."""
        (qa, sa), (qb, sb) = a, b
        if self.acc is None:
            return self._mm_fixed(qa, qb, fa, fb, sa, sb)
        fmt = fa if fa == fb else (fa, fb)
        return gemm(
            qa,
            qb,
            input_format=fmt,
            accumulator=self.acc,
            out_format="fp32",
            scale_a=sa,
            scale_b=sb,
        )

    def _mm_fixed(
        self,
        qa: np.ndarray,
        qb: np.ndarray,
        fa: Any,
        fb: Any,
        sa: np.ndarray | None,
        sb: np.ndarray | None,
    ) -> np.ndarray:
        qa = np.asarray(qa if fa == self._fp32 else round_to(qa, fa), dtype=np.float32)
        qb = np.asarray(qb if fb == self._fp32 else round_to(qb, fb), dtype=np.float32)
        total = fixed_order_sum(qa, qb)
        for sc in (sa, sb):  # FP8: the decode scales multiply the float64 sum
            if sc is not None:
                total *= np.asarray(sc, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            return total.astype(np.float32)


def _t(op: Operand) -> Operand:
    return np.swapaxes(op[0], -1, -2), op[1]


def softmax_xent(logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean cross-entropy loss per replica (float64, shape (R,)) and the softmax probabilities
    (float32) of logits (R, B, C) and labels (R, B).

    ``exp`` and ``log`` are evaluated in float64 and rounded once to float32: numpy's float32
    ``exp``/``log`` have CPU-specific SIMD implementations, while a float64 result that differs
    in its last bit between math libraries changes the float32 rounding only about once in 2^29
    values."""
    z = logits.astype(np.float32)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z.astype(np.float64)).astype(np.float32)
    s = e.sum(axis=-1, keepdims=True)
    p = e / s
    lp = z - np.log(s.astype(np.float64)).astype(np.float32)
    picked = np.take_along_axis(lp, y[..., None], axis=-1)[..., 0]
    return -picked.mean(axis=-1, dtype=np.float64), p


def _entropy(g: np.random.Generator) -> int:
    """The seed a generator was made from (``default_rng(s)``: ``s``), else 0."""
    ent = getattr(getattr(g.bit_generator, "seed_seq", None), "entropy", None)
    return int(ent) if isinstance(ent, int) else 0


class MLP:
    """``R`` replicas of a ReLU MLP ``sizes[0] -> ... -> sizes[-1]`` with fp32 master weights,
    trained by SGD with momentum or Adam.

    >>> from precision_lab.training import RUNS
    >>> rngs = [np.random.default_rng(s) for s in (0, 1)]
    >>> net = MLP([4, 3, 2], RUNS["fp16_noscale"], rngs)
    >>> logits = net.forward(np.ones((2, 5, 4), np.float32))
    >>> logits.shape, logits.dtype
    ((2, 5, 2), dtype('float32'))
    """

    def __init__(self, sizes: list[int], cfg: TrainConfig, rngs: list[np.random.Generator]) -> None:
        self.cfg = cfg
        self.R = len(rngs)
        self.num = Numerics(cfg, self.R)
        pairs = list(itertools.pairwise(sizes))
        self.W = [
            np.stack([(g.standard_normal((m, n)) * cfg.init_std) for g in rngs]).astype(np.float32)
            for m, n in pairs
        ]
        self.b = [np.zeros((self.R, 1, n), dtype=np.float32) for _, n in pairs]
        self.W = [self.num.store(w, self.num.master) for w in self.W]
        if cfg.weight_update != "fp32":  # the weights themselves live in bf16
            self.W = [self.num.store(w, get_format("bf16")) for w in self.W]
        #: Kahan compensation buffers (bf16 values) of weights and biases (weight_update only)
        self.cW = [np.zeros_like(w) for w in self.W]
        self.cb = [np.zeros_like(b) for b in self.b]
        #: per replica: the seed its stochastic weight updates are keyed by (the seed the
        #: replica's generator was made from, so a replica's run does not depend on the others)
        self.update_keys = [_entropy(g) for g in rngs]
        self.mW = [np.zeros_like(w) for w in self.W]
        self.mb = [np.zeros_like(b) for b in self.b]
        self.vW = [np.zeros_like(w) for w in self.W]
        self.vb = [np.zeros_like(b) for b in self.b]
        self.t = np.zeros(self.R, dtype=np.int64)
        self._cache: dict[str, Any] = {}

    @property
    def n_layers(self) -> int:
        return len(self.W)

    def loss(self, logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The head: :func:`softmax_xent` of the logits (a subclass may change its numerics)."""
        return softmax_xent(logits, y)

    def forward(self, x: np.ndarray, *, train: bool = False) -> np.ndarray:
        """Logits (R, B, C) (float32, on the activation grid) of batches ``x`` (R, B, D)."""
        num = self.num
        h = num.store(np.asarray(x, dtype=np.float32), num.act)
        zs, qx, qw = [], [], []
        for i, (w, b) in enumerate(zip(self.W, self.b, strict=True)):
            ox = num.operand(h, num.fwd, ("x", i), train)
            ow = num.operand(w, num.fwd, ("w", i), train)
            z = num.store(num.mm(ox, ow, num.fwd, num.fwd) + b, num.act)
            qx.append(ox)
            qw.append(ow)
            zs.append(z)
            h = np.maximum(z, np.float32(0)) if i < self.n_layers - 1 else z
        if train:
            self._cache = {"zs": zs, "qx": qx, "qw": qw}
        return h

    def backward(
        self, probs: np.ndarray, y: np.ndarray, scale: np.ndarray, record: bool = False
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[list[dict[str, Any]]]]:
        """Scaled gradients of the weights and biases (on the gradient grid, float32) of the last
        :meth:`forward` with ``train=True``, ``scale`` the loss scale per replica; with
        ``record``, statistics ``stats[r][layer]`` of the activation and weight gradients before
        their rounding."""
        num = self.num
        zs, qx, qw = self._cache["zs"], self._cache["qx"], self._cache["qw"]
        n = y.shape[1]
        s = np.asarray(scale, dtype=np.float64).reshape(self.R, 1, 1)
        g = probs.astype(np.float32, copy=True)
        onehot = np.zeros_like(g)
        np.put_along_axis(onehot, y[..., None], np.float32(1), axis=-1)
        g -= onehot
        g *= (s / n).astype(np.float32)
        stats: list[list[dict[str, Any]]] = [
            [{} for _ in range(self.n_layers)] for _ in range(self.R)
        ]
        if record:
            self._stats(stats, self.n_layers - 1, "act", g, s)
        dz = num.store(g, num.grad)
        with np.errstate(invalid="ignore", over="ignore"):  # overflow is the scaler's business
            gW, gb = self._backward_layers(dz, zs, qx, qw, stats, s, record)
        return gW, gb, stats

    def _backward_layers(
        self,
        dz: np.ndarray,
        zs: list[np.ndarray],
        qx: list[Operand],
        qw: list[Operand],
        stats: list[list[dict[str, Any]]],
        s: np.ndarray,
        record: bool,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        num = self.num
        gW: list[np.ndarray] = [np.empty(0)] * self.n_layers
        gb: list[np.ndarray] = [np.empty(0)] * self.n_layers
        for i in range(self.n_layers - 1, -1, -1):
            ody = num.operand(dz, num.bwd, ("dy", i), True)
            wg = num.mm(_t(qx[i]), ody, num.fwd, num.bwd)
            if record:
                self._stats(stats, i, "weight", wg, s)
            gW[i] = num.store(wg, num.grad)
            gb[i] = num.store(dz.sum(axis=1, keepdims=True, dtype=np.float32), num.grad)
            if i:
                dh = num.mm(ody, _t(qw[i]), num.bwd, num.fwd)
                mask = zs[i - 1] > 0
                if record:
                    self._stats(stats, i - 1, "act", np.where(mask, dh, np.float32(0)), s)
                dz = np.where(mask, num.store(dh, num.grad), np.float32(0))  # ReLU backward
        return gW, gb

    def _stats(
        self, stats: list[list[dict[str, Any]]], layer: int, kind: str, pre: np.ndarray, s: Any
    ) -> None:
        """Underflow statistics of each replica's scaled gradients ``pre`` cast to the gradient
        format; histograms of the unscaled magnitudes ``pre / scale``."""
        for r in range(self.R):
            sr = float(s[r, 0, 0])
            flat = (pre[r] * np.float32(1.0 / sr)).reshape(-1)
            st = underflow_stats(flat, self.num.grad_format, sr)
            hist = np.zeros(HIST_HI - HIST_LO, dtype=np.int64)
            zero = np.zeros_like(hist)
            k = np.clip(st.hist_log2, HIST_LO, HIST_HI - 1) - HIST_LO
            np.add.at(hist, k, st.hist_counts)
            np.add.at(zero, k, st.hist_zero)
            nz = flat[flat != 0]
            stats[r][layer][kind] = {
                "values": nz[:: max(1, nz.size // 2048)],
                "zero_fraction": st.zero_fraction,
                "exact_zero_fraction": 1.0 - nz.size / flat.size if flat.size else 0.0,
                "subnormal_fraction": st.subnormal_fraction,
                "overflow_fraction": st.overflow_fraction,
                "hist": hist,
                "hist_zero": zero,
            }

    def step(
        self,
        gW: list[np.ndarray],
        gb: list[np.ndarray],
        inv_scale: np.ndarray,
        lr: float,
        taken: np.ndarray,
    ) -> None:
        """Unscale (float32 multiply by ``inv_scale`` per replica) and update the master weights
        of the replicas with ``taken`` in fp32, learning rate ``lr``: SGD with momentum, or Adam
        (bias-corrected, ``eps = 1e-8``). Replicas whose step is skipped keep everything."""
        cfg = self.cfg
        lr32, b1 = np.float32(lr), np.float32(cfg.momentum)
        inv = np.asarray(inv_scale, dtype=np.float32).reshape(self.R, 1, 1)
        on = np.asarray(taken, dtype=bool).reshape(self.R, 1, 1)
        self.t += np.asarray(taken, dtype=np.int64)
        t = np.maximum(self.t, 1).astype(np.float64).reshape(self.R, 1, 1)
        b2, eps = np.float32(cfg.beta2), np.float32(1e-8)
        c1 = (1 - float(b1) ** t).astype(np.float32)
        c2 = (1 - float(b2) ** t).astype(np.float32)
        groups = ((self.W, gW, self.mW, self.vW), (self.b, gb, self.mb, self.vb))
        with np.errstate(invalid="ignore", over="ignore"):
            for P, G, M, V in groups:
                for i in range(self.n_layers):
                    g = np.where(on, G[i] * inv, np.float32(0))
                    if cfg.optimizer == "adam":
                        m = b1 * M[i] + (np.float32(1) - b1) * g
                        v = b2 * V[i] + (np.float32(1) - b2) * (g * g)
                        upd = (m / c1) / (np.sqrt(v / c2) + eps)
                    else:
                        m = b1 * M[i] + g
                        v = V[i]
                        upd = m
                    M[i] = np.where(on, m, M[i])
                    V[i] = np.where(on, v, V[i])
                    if cfg.weight_update != "fp32":
                        self._update_low(P, i, -(lr32 * upd), taken)
                        continue
                    new = self.num.store(P[i] - lr32 * upd, self.num.master)
                    P[i] = np.where(on, new, P[i])

    def _update_low(self, P: list[np.ndarray], i: int, delta: np.ndarray, taken: Any) -> None:
        """``P[i] <- round(P[i] + delta)`` by the bf16 ``weight_update`` rule, per replica
        whose step is taken (stochastic words keyed by the replica, its step, the tensor)."""
        comp = self.cW if P is self.W else self.cb
        tensor = 2 * i + (P is not self.W)
        for r in range(self.R):
            if not taken[r]:
                continue
            key = (self.update_keys[r], int(self.t[r]), tensor)
            seed = int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:16], "little")
            w, c = apply_update(self.cfg.weight_update, P[i][r], delta[r], comp[i][r], seed=seed)
            P[i][r] = w
            if c is not None:
                comp[i][r] = c
