"""Loss scalers and FP8 scaling recipes, as small, exact state machines.

Loss scalers (for FP16 training) multiply the loss by ``scale`` before the backward pass so that
small gradients survive the cast to the low format; the optimizer unscales, and a step whose
gradients hold inf/NaN is skipped. Every scaler here has ``.scale``, ``update(found_inf) -> bool``
(was the optimizer step taken?), ``state_dict()`` and ``load_state_dict()``.

* :class:`StaticLossScaler`: a fixed scale.
* :class:`DynamicLossScaler`: back off on overflow, grow after a run of clean steps. Its defaults
  are the exact semantics of PyTorch's ``torch.amp.GradScaler`` (scale kept in float32, init 2**16,
  growth 2, backoff 0.5, interval 2000, growth refused when the grown scale is not finite). Named
  presets (:meth:`DynamicLossScaler.preset`) reproduce Keras' ``LossScaleOptimizer``, NVIDIA Apex,
  DeepSpeed (hysteresis, ``consecutive_hysteresis``, min scale 1, growth after window + 1 clean
  steps as since DeepSpeed 0.17.1) and Megatron-LM (hysteresis refilled only at growth).

FP8 scaling as in NVIDIA Transformer Engine (TE):

* :class:`DelayedScaling`: per-tensor scale from a history of amax values (TE's ``DelayedScaling``
  recipe, with TE's PyTorch history update: amax written to slot 0, scale computed, history rolled
  by one and slot 0 zeroed).
* :func:`current_scale` / :func:`quantize_current`: just-in-time per-tensor scaling (TE's
  ``Float8CurrentScaling``, ``compute_scale_from_amax``), optionally rounded down to a power of two.
* :func:`block_scales`: per-tile scales (1x128, 128x128) and MXFP8 E8M0 scales per 32 values; the
  block formats themselves (element codes and scales) live in :mod:`precision_lab.blocks`.

All scale arithmetic is done in the dtype the reference framework uses (float32 for PyTorch, Keras,
Megatron and TE; Python float64 for Apex and DeepSpeed), so trajectories agree bit for bit.

>>> s = DynamicLossScaler.preset("torch", growth_interval=4)
>>> [s.update(found_inf) for found_inf in (True, False, False, False, False)]
[False, True, True, True, True]
>>> s.scale
65536.0
>>> ds = DelayedScaling("e4m3", amax_history_len=4)
>>> ds.update(3.5)
128.0
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .formats import FloatFormat, get_format
from .rounding import _ML_FLOATS, as_float_array, round_to

__all__ = [
    "PRESETS",
    "DelayedScaling",
    "DynamicLossScaler",
    "LossScaleCollapseWarning",
    "LossScaleError",
    "LossScaler",
    "StaticLossScaler",
    "block_scales",
    "current_scale",
    "has_inf_or_nan",
    "quantize_current",
    "scale_from_amax",
    "trajectory",
]

_F32_MAX = float(np.finfo(np.float32).max)


class LossScaleError(RuntimeError):
    """A loss scaler cannot continue (DeepSpeed's overflow at the minimum scale, or a collapse
    with ``on_collapse="raise"``)."""


class LossScaleCollapseWarning(RuntimeWarning):
    """The loss scale became 0, inf or NaN: unscaling would now turn every gradient into NaN."""


def _check_positive(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a positive finite number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def _check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer >= {lo}, got {value!r}")
    if value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def _check_flag(name: str, value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {value!r}")


def has_inf_or_nan(*arrays: Any) -> bool:
    """True when any of the arrays holds inf or NaN (the ``found_inf`` of a training step).

    numpy float and complex arrays and ml_dtypes float arrays (bfloat16, float8_*, ...; numpy
    sees their dtype as kind ``"V"``) are checked; other dtypes cannot hold inf or NaN.

    >>> has_inf_or_nan(np.ones(3), np.array([1.0, np.inf]))
    True
    >>> import ml_dtypes
    >>> has_inf_or_nan(np.array([1.0, np.inf], dtype=ml_dtypes.bfloat16))
    True
    """
    for a in arrays:
        x = np.asarray(a)
        if (x.dtype.kind in "fc" or x.dtype in _ML_FLOATS) and not np.isfinite(x).all():
            return True
    return False


class LossScaler:
    """Base class of the loss scalers: ``scale``, ``update``, ``state_dict``, helpers.

    ``scale_loss(loss)`` multiplies by the scale; ``unscale(grads)`` multiplies by ``1/scale`` as
    PyTorch does (the reciprocal computed in float64 and rounded to float32, then a float32
    product for float32 gradients); both return new arrays and never modify their input.
    """

    scale: float
    steps: int
    skipped: int

    def update(self, found_inf: bool) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def inv_scale(self) -> float:
        """``1/scale`` rounded to float32 (inf when the scale is 0)."""
        with np.errstate(divide="ignore"):
            return float(np.float32(1.0 / self.scale) if self.scale != 0 else np.float32(np.inf))

    def scale_loss(self, loss: Any) -> np.ndarray:
        """``loss * scale`` (float32 for float32 input)."""
        x = as_float_array(loss, "loss")
        return x * x.dtype.type(self.scale)

    def unscale(self, grads: Any) -> np.ndarray:
        """``grads * (1/scale)``; a collapsed (zero) scale gives NaN/inf, as it would in PyTorch.

        >>> StaticLossScaler(1024.0).unscale(np.array([2048.0], dtype=np.float32))
        array([2.], dtype=float32)
        """
        g = as_float_array(grads, "grads")
        with np.errstate(invalid="ignore", over="ignore"):
            return g * g.dtype.type(self.inv_scale)

    def _common_state(self) -> dict[str, Any]:
        return {"scale": self.scale, "steps": self.steps, "skipped": self.skipped}


class StaticLossScaler(LossScaler):
    """A fixed loss scale.

    Parameters
    ----------
    scale:
        The loss scale (positive, finite).
    skip_on_inf:
        Whether a step whose gradients hold inf/NaN is skipped (default True). Apex and DeepSpeed
        static scalers do not skip (``skip_on_inf=False``): the non-finite update is applied.

    >>> s = StaticLossScaler(128.0)
    >>> s.update(False), s.update(True), s.scale, s.skipped
    (True, False, 128.0, 1)
    """

    def __init__(self, scale: float = 1.0, *, skip_on_inf: bool = True) -> None:
        self.scale = float(_check_positive("scale", scale))  # type: ignore[arg-type]
        self.skip_on_inf = _check_flag("skip_on_inf", skip_on_inf)
        self.steps = 0
        self.skipped = 0

    def update(self, found_inf: bool) -> bool:
        """Record one step; returns whether the optimizer step is taken."""
        found = _check_flag("found_inf", found_inf)
        self.steps += 1
        taken = not (found and self.skip_on_inf)
        self.skipped += not taken
        return taken

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "static", **self._common_state(), "skip_on_inf": self.skip_on_inf}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "static":
            raise ValueError(
                f"state must come from a StaticLossScaler, got kind={state.get('kind')!r}"
            )
        self.scale = float(_check_positive("state['scale']", state["scale"]))  # type: ignore[arg-type]
        self.steps = int(state["steps"])
        self.skipped = int(state["skipped"])
        self.skip_on_inf = bool(state["skip_on_inf"])

    def __repr__(self) -> str:
        return f"StaticLossScaler(scale={self.scale!r}, skip_on_inf={self.skip_on_inf})"


#: Named presets of :class:`DynamicLossScaler`: the defaults of each framework.
PRESETS: dict[str, dict[str, Any]] = {
    # torch.amp.GradScaler: float32 scale tensor, _amp_update_scale_ kernel
    "torch": {
        "init_scale": 2.0**16,
        "growth_interval": 2000,
        "dtype": "float32",
        "check_finite_growth": True,
    },
    # keras.optimizers.LossScaleOptimizer (Keras 3): float32 variable, no finiteness check
    "keras": {
        "init_scale": 2.0**15,
        "growth_interval": 2000,
        "dtype": "float32",
        "check_finite_growth": False,
    },
    # apex.amp LossScaler: Python floats, max_loss_scale 2**24, optional min_loss_scale
    "apex": {
        "init_scale": 2.0**16,
        "growth_interval": 2000,
        "max_scale": 2.0**24,
        "dtype": "float64",
        "check_finite_growth": False,
    },
    # deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler with DeepSpeed's config defaults
    # (initial_scale_power 16, loss_scale_window 1000, hysteresis 2, min_loss_scale 1)
    "deepspeed": {
        "init_scale": 2.0**16,
        "growth_interval": 1000,
        "hysteresis": 2,
        "consecutive_hysteresis": False,
        "min_scale": 1.0,
        "growth_offset": 1,
        "raise_at_min_scale": True,
        "dtype": "float64",
        "check_finite_growth": False,
    },
    # megatron.core.optimizer.grad_scaler.DynamicGradScaler with Megatron-LM's argument defaults
    # (initial_loss_scale 2**32, min_loss_scale 1, loss_scale_window 1000, hysteresis 2)
    "megatron": {
        "init_scale": 2.0**32,
        "growth_interval": 1000,
        "hysteresis": 2,
        "min_scale": 1.0,
        "dtype": "float32",
        "check_finite_growth": False,
    },
}


class DynamicLossScaler(LossScaler):
    """Dynamic loss scaling; the defaults are exactly PyTorch's ``torch.amp.GradScaler``.

    On a step with inf/NaN gradients the step is skipped, the growth counter is reset and (once
    ``hysteresis`` overflows have been seen since the tracker was last refilled) the scale is
    multiplied by ``backoff_factor``. On a clean step the counter ``n`` of clean steps since the
    last overflow (or the start) grows; when ``n - growth_offset`` is a positive multiple of
    ``growth_interval`` the scale is multiplied by ``growth_factor`` (refused if the result is not
    finite and ``check_finite_growth``) and the hysteresis tracker is refilled.

    Parameters
    ----------
    init_scale, growth_factor, backoff_factor, growth_interval:
        As in ``torch.amp.GradScaler`` (2**16, 2.0, 0.5, 2000).
    hysteresis:
        Overflows tolerated (step skipped, scale kept) before backing off; 1 = back off at once
        (PyTorch). DeepSpeed's ``delayed_shift``, Megatron's ``hysteresis``.
    consecutive_hysteresis:
        Refill the hysteresis tracker on every clean step (DeepSpeed option) instead of only at
        growth (DeepSpeed default, Megatron).
    growth_offset:
        Extra clean steps before growth: DeepSpeed >= 0.17.1 grows after ``growth_interval + 1``
        clean steps since the last overflow (offset 1); PyTorch, Keras, Apex, Megatron: 0.
    min_scale, max_scale:
        Optional floor and ceiling of the scale.
    dtype:
        ``"float32"`` (PyTorch, Keras, Megatron: scale tensors) or ``"float64"`` (Apex, DeepSpeed:
        Python floats): the arithmetic of the scale.
    check_finite_growth:
        Refuse a growth whose result is not finite (PyTorch's kernel does this; others don't).
    raise_at_min_scale:
        DeepSpeed: raise :class:`LossScaleError` on an overflow that would back off while the
        scale is already at ``min_scale``.
    on_collapse:
        What to do when the scale becomes 0, inf or NaN (possible without a floor or ceiling,
        e.g. PyTorch after 166 overflows in a row from 2**16): ``"warn"`` (default, a
        :class:`LossScaleCollapseWarning`), ``"raise"`` (:class:`LossScaleError`) or ``"ignore"``.
        ``collapsed`` tells afterwards.

    >>> s = DynamicLossScaler(growth_interval=3)
    >>> [s.update(f) for f in (False, True, False, False, False)], s.scale
    ([True, False, True, True, True], 65536.0)
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        *,
        hysteresis: int = 1,
        consecutive_hysteresis: bool = False,
        growth_offset: int = 0,
        min_scale: float | None = None,
        max_scale: float | None = None,
        dtype: Literal["float32", "float64"] = "float32",
        check_finite_growth: bool = True,
        raise_at_min_scale: bool = False,
        on_collapse: Literal["warn", "raise", "ignore"] = "warn",
        name: str | None = None,
    ) -> None:
        init = _check_positive("init_scale", init_scale)
        gf = _check_positive("growth_factor", growth_factor)
        bf = _check_positive("backoff_factor", backoff_factor)
        assert init is not None and gf is not None and bf is not None
        if not gf > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if not bf < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        self.growth_interval = _check_int("growth_interval", growth_interval, 1)
        self.hysteresis = _check_int("hysteresis", hysteresis, 1)
        self.growth_offset = _check_int("growth_offset", growth_offset, 0)
        self.consecutive_hysteresis = _check_flag("consecutive_hysteresis", consecutive_hysteresis)
        self.check_finite_growth = _check_flag("check_finite_growth", check_finite_growth)
        self.raise_at_min_scale = _check_flag("raise_at_min_scale", raise_at_min_scale)
        lo = _check_positive("min_scale", min_scale, allow_none=True)
        hi = _check_positive("max_scale", max_scale, allow_none=True)
        if lo is not None and lo > init:
            raise ValueError(f"min_scale must be <= init_scale ({init!r}), got {min_scale!r}")
        if hi is not None and hi < init:
            raise ValueError(f"max_scale must be >= init_scale ({init!r}), got {max_scale!r}")
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
        if on_collapse not in ("warn", "raise", "ignore"):
            raise ValueError(
                f"on_collapse must be 'warn', 'raise' or 'ignore', got {on_collapse!r}"
            )
        self.dtype = dtype
        self._F = np.float32 if dtype == "float32" else np.float64
        self.growth_factor = float(self._F(gf))
        self.backoff_factor = float(self._F(bf))
        self.min_scale = None if lo is None else float(self._F(lo))
        self.max_scale = None if hi is None else float(self._F(hi))
        self.on_collapse = on_collapse
        self.name = name
        self.init_scale = float(self._F(init))
        self.scale = self.init_scale
        self.growth_tracker = 0  # clean steps since the last overflow (or the start)
        self.hysteresis_tracker = self.hysteresis
        self.steps = 0
        self.skipped = 0
        self.collapsed = False

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> DynamicLossScaler:
        """The scaler of a framework: ``"torch"``, ``"keras"``, ``"apex"``, ``"deepspeed"``,
        ``"megatron"`` (see :data:`PRESETS`), with any option overridden.

        >>> DynamicLossScaler.preset("megatron").scale == 2.0**32
        True
        >>> DynamicLossScaler.preset("caffe")
        Traceback (most recent call last):
        ...
        ValueError: unknown preset 'caffe'; known: torch, keras, apex, deepspeed, megatron
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        opts = {**PRESETS[name], "name": name, **overrides}
        return cls(**opts)

    def _mul(self, a: float, b: float) -> float:
        with np.errstate(over="ignore", under="ignore"):
            return float(self._F(a) * self._F(b))

    def update(self, found_inf: bool) -> bool:
        """Record one step (``found_inf``: did the gradients hold inf/NaN?); returns whether the
        optimizer step is taken (False: skipped). The new scale is in ``.scale``."""
        found = _check_flag("found_inf", found_inf)
        self.steps += 1
        if found:
            self.skipped += 1
            self.growth_tracker = 0
            self.hysteresis_tracker = max(self.hysteresis_tracker - 1, 0)
            if self.hysteresis_tracker == 0:
                if (
                    self.raise_at_min_scale
                    and self.min_scale is not None
                    and self.scale == self.min_scale
                ):
                    raise LossScaleError(
                        f"overflow at step {self.steps - 1} with the loss scale already at "
                        f"min_scale={self.min_scale!r}: cannot decrease it (DeepSpeed stops here)"
                    )
                new = self._mul(self.scale, self.backoff_factor)
                if self.min_scale is not None:
                    new = max(new, self.min_scale)
                self.scale = new
                self._check_collapse()
            return False
        self.growth_tracker += 1
        if self.consecutive_hysteresis:
            self.hysteresis_tracker = self.hysteresis
        k = self.growth_tracker - self.growth_offset
        if k > 0 and k % self.growth_interval == 0:
            self.hysteresis_tracker = self.hysteresis
            new = self._mul(self.scale, self.growth_factor)
            if self.check_finite_growth and not math.isfinite(new):
                new = self.scale
            if self.max_scale is not None:
                new = min(new, self.max_scale)
            self.scale = new
            self._check_collapse()
        return True

    def _check_collapse(self) -> None:
        s = self.scale
        if s != 0 and math.isfinite(s):
            return
        first = not self.collapsed
        self.collapsed = True
        if self.on_collapse == "ignore" or not first:
            return
        msg = (
            f"loss scale collapsed to {s!r} ({self.dtype}) after {self.steps} steps "
            f"({self.skipped} skipped): unscaled gradients will be NaN; set min_scale/max_scale"
        )
        if self.on_collapse == "raise":
            raise LossScaleError(msg)
        warnings.warn(msg, LossScaleCollapseWarning, stacklevel=3)

    _CONFIG = (
        "init_scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "hysteresis",
        "consecutive_hysteresis",
        "growth_offset",
        "min_scale",
        "max_scale",
        "dtype",
        "check_finite_growth",
        "raise_at_min_scale",
        "on_collapse",
        "name",
    )

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: the configuration and the trackers (plain Python types).

        >>> a = DynamicLossScaler.preset("deepspeed", growth_interval=4)
        >>> _ = [a.update(f) for f in (True, False, False)]
        >>> b = DynamicLossScaler()
        >>> b.load_state_dict(a.state_dict())
        >>> b.state_dict() == a.state_dict()
        True
        """
        return {
            "kind": "dynamic",
            **{k: getattr(self, k) for k in self._CONFIG},
            **self._common_state(),
            "growth_tracker": self.growth_tracker,
            "hysteresis_tracker": self.hysteresis_tracker,
            "collapsed": self.collapsed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (configuration included)."""
        if state.get("kind") != "dynamic":
            raise ValueError(
                f"state must come from a DynamicLossScaler, got kind={state.get('kind')!r}"
            )
        missing = [k for k in (*self._CONFIG, "scale", "growth_tracker") if k not in state]
        if missing:
            raise ValueError(f"state is missing {missing}")
        fresh = DynamicLossScaler(**{k: state[k] for k in self._CONFIG})
        self.__dict__.update(fresh.__dict__)
        self.scale = float(state["scale"])
        self.steps = int(state["steps"])
        self.skipped = int(state["skipped"])
        self.growth_tracker = int(state["growth_tracker"])
        self.hysteresis_tracker = int(state["hysteresis_tracker"])
        self.collapsed = bool(state["collapsed"])

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._CONFIG)
        return f"DynamicLossScaler({opts}; scale={self.scale!r})"


def trajectory(scaler: LossScaler, found_inf: Iterable[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Feed a sequence of overflow flags; return the scale after each update (float64) and
    whether each step was taken. The scaler is advanced (pass a fresh one).

    >>> s, taken = trajectory(DynamicLossScaler.preset("torch", growth_interval=2),
    ...                       [True, False, False])
    >>> np.log2(s).tolist(), taken.tolist()
    ([15.0, 15.0, 16.0], [False, True, True])
    """
    scales, taken = [], []
    for f in found_inf:
        taken.append(scaler.update(bool(f)))
        scales.append(scaler.scale)
    return np.array(scales, dtype=np.float64), np.array(taken, dtype=bool)


# ----------------------------------------------------------------------------------------------
# FP8 scaling (Transformer Engine)
# ----------------------------------------------------------------------------------------------


def _float_format(fmt: Any, name: str = "fmt") -> FloatFormat:
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise TypeError(f"{name} must be a floating-point format, got {f}")
    return f


def scale_from_amax(
    amax: Any,
    fmt: str | FloatFormat,
    *,
    margin: float = 0,
    power_of_two: bool = False,
    amax_epsilon: float = 0.0,
    previous: Any = 1.0,
) -> np.ndarray:
    """Per-tensor FP8 scale(s) ``(fmt.max / amax) / 2**margin`` in float32, as TE computes them.

    Vectorised over ``amax``. Where amax is 0, inf or NaN the ``previous`` scale is kept (TE's
    delayed scaling; current scaling passes ``previous=1``); a scale that overflows float32
    becomes float32 max; ``amax`` below ``amax_epsilon`` is raised to it; ``power_of_two`` rounds
    the scale down to a power of two (TE's ``force_pow_2_scales``: the float32 mantissa cleared).

    >>> scale_from_amax([3.5, 0.0, 1e-45], "e4m3", previous=7.0).tolist()
    [128.0, 7.0, 3.4028234663852886e+38]
    >>> float(scale_from_amax(3.0, "e4m3", power_of_two=True))
    128.0
    """
    f = _float_format(fmt)
    a = np.asarray(amax, dtype=np.float64)
    if a.dtype.kind != "f":
        raise TypeError(f"amax must be real numbers, got {a.dtype}")
    if (a < 0).any():
        raise ValueError(f"amax must be >= 0 (a maximum of absolute values), got {amax!r}")
    a32 = a.astype(np.float32)
    eps = np.float32(amax_epsilon)
    if amax_epsilon < 0 or not math.isfinite(amax_epsilon):
        raise ValueError(f"amax_epsilon must be a finite number >= 0, got {amax_epsilon!r}")
    a32 = np.where(a32 < eps, eps, a32)
    prev = np.broadcast_to(np.asarray(previous, dtype=np.float32), a32.shape)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        sf = np.float32(f.max) / a32
        sf = sf / np.float32(2.0**margin)
    usable = (a32 > 0) & np.isfinite(a32)
    sf = np.where(usable, sf, prev)
    sf = np.where(np.isinf(sf), np.float32(_F32_MAX), sf).astype(np.float32)
    if power_of_two:
        bits = sf.view(np.uint32) & np.uint32(0xFF800000)
        sf = bits.view(np.float32)
    return sf


def current_scale(
    x: Any,
    fmt: str | FloatFormat = "e4m3",
    *,
    power_of_two: bool = False,
    amax_epsilon: float = 0.0,
    margin: float = 0,
) -> float:
    """Just-in-time per-tensor scale of ``x`` (TE ``Float8CurrentScaling``): ``fmt.max / amax(x)``
    in float32, 1.0 when amax is 0 or not finite, optionally rounded down to a power of two.

    >>> current_scale(np.array([-3.0, 1.0]), "e4m3"), current_scale([-3.0, 1.0], "e4m3",
    ...                                                             power_of_two=True)
    (149.3333282470703, 128.0)
    """
    a = as_float_array(x)
    amax = float(np.max(np.abs(a))) if a.size else 0.0
    return float(
        scale_from_amax(
            amax, fmt, power_of_two=power_of_two, amax_epsilon=amax_epsilon, margin=margin
        )
    )


def quantize_current(
    x: Any,
    fmt: str | FloatFormat = "e4m3",
    *,
    power_of_two: bool = False,
    amax_epsilon: float = 0.0,
    rounding: str = "nearest_even",
) -> tuple[np.ndarray, float]:
    """Fake-quantize ``x`` with current scaling: ``round_to(x*scale, fmt, saturate) * (1/scale)``.

    Returns the dequantized values (float32) and the scale. The product ``x*scale`` and the
    dequantization are float32 operations, as in TE's kernels.

    >>> q, s = quantize_current(np.array([0.1, -3.0], dtype=np.float32), "e4m3")
    >>> q.tolist(), s
    ([0.1004464328289032, -3.0], 149.3333282470703)
    """
    scale = current_scale(x, fmt, power_of_two=power_of_two, amax_epsilon=amax_epsilon)
    return _fake_quant(x, fmt, scale, rounding), scale


def _fake_quant(x: Any, fmt: str | FloatFormat, scale: float, rounding: str) -> np.ndarray:
    a = as_float_array(x).astype(np.float32)
    s = np.float32(scale)
    inv = np.float32(1.0) / s
    with np.errstate(over="ignore", invalid="ignore"):
        q = round_to(a * s, fmt, rounding=rounding, overflow="saturate")
        return q * inv


class DelayedScaling:
    """FP8 delayed scaling of one tensor, as Transformer Engine's PyTorch code does it.

    ``.scale`` is the scale to use *now* (computed from past amaxes). Each step, the tensor's
    current amax goes to ``update(amax)``, which writes it into slot 0 of the history, takes
    ``max`` of the history (or slot 0 for ``"most_recent"``, or a callable's result), computes
    the new scale ``(fmt.max / amax) / 2**margin`` in float32 (the old scale kept where amax is 0
    or not finite, an infinite scale becoming float32 max), then rolls the history by one
    (``numpy.roll(h, -1)``) and zeroes slot 0. The effective window is the last
    ``amax_history_len`` amaxes.

    >>> ds = DelayedScaling("e4m3", amax_history_len=2)
    >>> [ds.update(a) for a in (7.0, 1.0, 1.0, 0.0)]
    [64.0, 64.0, 448.0, 448.0]
    >>> ds.amax_history.tolist()
    [0.0, 0.0]
    """

    def __init__(
        self,
        fmt: str | FloatFormat = "e4m3",
        amax_history_len: int = 1024,
        amax_compute_algo: str | Callable[[np.ndarray], float] = "max",
        margin: float = 0,
        *,
        init_scale: float = 1.0,
    ) -> None:
        self.fmt = _float_format(fmt)
        self.amax_history_len = _check_int("amax_history_len", amax_history_len, 1)
        if not callable(amax_compute_algo) and amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(
                "amax_compute_algo must be 'max', 'most_recent' or a callable, "
                f"got {amax_compute_algo!r}"
            )
        self.amax_compute_algo = amax_compute_algo
        if isinstance(margin, bool) or not isinstance(margin, int | float | np.integer):
            raise TypeError(f"margin must be a number, got {margin!r}")
        if not math.isfinite(margin):
            raise ValueError(f"margin must be finite, got {margin!r}")
        self.margin = margin
        self.scale = float(np.float32(_check_positive("init_scale", init_scale)))
        self.amax_history = np.zeros(self.amax_history_len, dtype=np.float32)
        self.steps = 0

    @property
    def scale_inv(self) -> float:
        """``1/scale`` in float32 (what TE multiplies the FP8 values by to dequantize)."""
        return float(np.float32(1.0) / np.float32(self.scale))

    def _reduce(self) -> float:
        h = self.amax_history
        algo = self.amax_compute_algo
        if callable(algo):
            return float(algo(h.copy()))
        if algo == "max" and h.size > 1:
            return float(np.max(h))  # NaN propagates, as torch.max does
        return float(h[0])

    def update(self, amax: float) -> float:
        """Record this step's amax, compute and return the new scale (also in ``.scale``)."""
        if isinstance(amax, bool) or not isinstance(amax, int | float | np.integer | np.floating):
            raise TypeError(f"amax must be a number >= 0, got {amax!r}")
        if amax < 0:
            raise ValueError(f"amax must be >= 0 (a maximum of absolute values), got {amax!r}")
        self.amax_history[0] = np.float32(amax)
        reduced = self._reduce()
        if not (reduced >= 0 or math.isnan(reduced)):
            raise ValueError(f"amax_compute_algo returned a negative amax {reduced!r}")
        self.scale = float(
            scale_from_amax(reduced, self.fmt, margin=self.margin, previous=self.scale)
        )
        if self.amax_history_len > 1:
            self.amax_history = np.roll(self.amax_history, -1)
        self.amax_history[0] = 0.0
        self.steps += 1
        return self.scale

    def quantize(
        self, x: Any, *, rounding: str = "nearest_even", update: bool = True
    ) -> np.ndarray:
        """Fake-quantize ``x`` with the current (delayed) scale, saturating, then (by default)
        :meth:`update` with ``x``'s amax. Returns float32 ``round_to(x*scale) * scale_inv``."""
        a = as_float_array(x, "x")
        out = _fake_quant(a, self.fmt, self.scale, rounding)
        if update:
            amax = float(np.max(np.abs(a))) if a.size else 0.0
            self.update(amax)
        return out

    def state_dict(self) -> dict[str, Any]:
        if callable(self.amax_compute_algo):
            raise ValueError("state_dict() needs amax_compute_algo 'max' or 'most_recent'")
        return {
            "fmt": str(self.fmt),
            "amax_history_len": self.amax_history_len,
            "amax_compute_algo": self.amax_compute_algo,
            "margin": self.margin,
            "scale": self.scale,
            "amax_history": self.amax_history.tolist(),
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        hist = np.asarray(state["amax_history"], dtype=np.float32)
        if hist.shape != (int(state["amax_history_len"]),):
            raise ValueError(
                f"amax_history has shape {hist.shape}, expected ({state['amax_history_len']},)"
            )
        fresh = DelayedScaling(
            state["fmt"],
            state["amax_history_len"],
            state["amax_compute_algo"],
            state["margin"],
            init_scale=state["scale"],
        )
        self.__dict__.update(fresh.__dict__)
        self.amax_history = hist.copy()
        self.steps = int(state["steps"])

    def __repr__(self) -> str:
        return (
            f"DelayedScaling(fmt={str(self.fmt)!r}, amax_history_len={self.amax_history_len}, "
            f"amax_compute_algo={self.amax_compute_algo!r}, margin={self.margin}; "
            f"scale={self.scale!r})"
        )


# ----------------------------------------------------------------------------------------------
# per-block scales
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockScales:
    """Scales of a 2-D tensor cut into tiles: ``scales[i, j]`` scales tile (i, j)."""

    scales: np.ndarray  # float32, one per tile
    block: tuple[int, int]
    fmt: FloatFormat

    def expand(self, shape: Sequence[int]) -> np.ndarray:
        """One scale per element of a tensor of ``shape`` (tiles cut at the edges)."""
        r, c = self.block
        s = np.repeat(np.repeat(self.scales, r, axis=0), c, axis=1)
        return s[: shape[0], : shape[1]]

    def quantize(self, x: Any, *, rounding: str = "nearest_even") -> np.ndarray:
        """Fake-quantize ``x`` tile by tile: ``round_to(x*s, fmt, saturate) * (1/s)`` (float32)."""
        a = as_float_array(x, "x").astype(np.float32)
        s = self.expand(a.shape)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            q = round_to(a * s, self.fmt, rounding=rounding, overflow="saturate")
            return q * (np.float32(1.0) / s)


def block_scales(
    x: Any,
    fmt: str | FloatFormat = "e4m3",
    *,
    block: tuple[int, int] | str = (1, 128),
    power_of_two: bool = True,
    amax_epsilon: float = 0.0,
) -> BlockScales:
    """Per-tile current scales of a 2-D tensor: ``block=(1, 128)`` (activations, one scale per 128
    values of a row) or ``(128, 128)`` (weights), as in DeepSeek-V3 and TE's
    ``Float8BlockScaling`` (power-of-two scales by default); each tile's scale is
    :func:`scale_from_amax` of the tile's amax.

    ``block="mxfp8"`` gives OCP MX scales (E8M0, one per 32 values along the last axis) from
    :mod:`precision_lab.blocks` with the round-up rule of Transformer Engine, so that
    ``amax / X <= fmt.max``; ``scales`` holds the multipliers ``1/X`` applied to x. (DeepSeek-V3's
    own tiles, with the decode scale ``amax / 448`` kept in fp32, are the block formats
    ``"fp8_1x128"`` and ``"fp8_128x128"`` of :mod:`precision_lab.blocks`.)

    >>> x = np.arange(256, dtype=np.float32).reshape(1, 256)
    >>> block_scales(x, "e4m3", block=(1, 128)).scales.tolist()
    [[2.0, 1.0]]
    """
    f = _float_format(fmt)
    a = as_float_array(x, "x")
    if isinstance(block, str):
        if block.lower() != "mxfp8":
            raise ValueError(f"block must be (rows, cols) or 'mxfp8', got {block!r}")
        return _mx_scales(a, f)
    if (
        not isinstance(block, tuple)
        or len(block) != 2
        or not all(isinstance(b, int) and b >= 1 for b in block)
    ):
        raise ValueError(f"block must be a pair of positive ints or 'mxfp8', got {block!r}")
    if a.ndim != 2:
        raise ValueError(f"x must be 2-D for tile scales, got shape {a.shape}")
    r, c = block
    rows, cols = -(-a.shape[0] // r), -(-a.shape[1] // c)
    pad = np.zeros((rows * r, cols * c), dtype=np.float64)
    pad[: a.shape[0], : a.shape[1]] = np.abs(a)
    amax = pad.reshape(rows, r, cols, c).max(axis=(1, 3))
    s = scale_from_amax(amax, f, power_of_two=power_of_two, amax_epsilon=amax_epsilon)
    return BlockScales(scales=np.asarray(s, dtype=np.float32), block=(r, c), fmt=f)


def _mx_scales(a: np.ndarray, f: FloatFormat) -> BlockScales:
    """MX (E8M0 per 32 values) multipliers ``1/X`` from :mod:`precision_lab.blocks` with the
    round-up rule (``X = 2**ceil(log2(amax / fmt.max))``, so ``amax / X <= fmt.max``)."""
    from .blocks import get_block_format, quantize_blocks

    names = {"e4m3": "mxfp8_e4m3", "e5m2": "mxfp8_e5m2"}
    if str(f) not in names:
        raise ValueError(f"block='mxfp8' needs fmt e4m3 or e5m2, got {f}")
    if a.ndim != 2:
        raise ValueError(f"x must be 2-D for MX scales, got shape {a.shape}")
    bf = get_block_format(names[str(f)], scale_rule="ceil")
    q = quantize_blocks(a, bf, axis=-1, pad=True)
    mult = (1.0 / q.scales).astype(np.float32)  # exact: powers of two within float32
    return BlockScales(scales=mult, block=(1, 32), fmt=f)
