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
    "Diagnosis",
    "DynamicLossScaler",
    "LossScaleCollapseWarning",
    "LossScaleError",
    "LossScaler",
    "Simulation",
    "StaticLossScaler",
    "block_scales",
    "current_scale",
    "diagnose",
    "has_inf_or_nan",
    "quantize_current",
    "scale_from_amax",
    "simulate",
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


def _in_dtype(name: str, value: float, dtype: type) -> float:
    """``value`` rounded to the scale arithmetic's dtype; a ValueError when it overflows to inf or
    underflows to 0 there (a scale, factor or bound the scaler could not hold)."""
    with np.errstate(over="ignore", under="ignore"):
        v = float(dtype(value))
    if not (math.isfinite(v) and v > 0):
        info = np.finfo(dtype)
        raise ValueError(
            f"{name}={value!r} does not fit the scaler's {np.dtype(dtype).name} arithmetic "
            f"(it would become {v!r}; positive values from {float(info.smallest_subnormal):.3g} "
            f"to {float(info.max):.3g})"
        )
    return v


def _check_state(state: Any, kind: str | None, required: Iterable[str]) -> dict[str, Any]:
    """``state`` is a dict of the right kind holding every required key (else a clear error)."""
    classes = {"static": "StaticLossScaler", "dynamic": "DynamicLossScaler"}
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    if kind is not None and state.get("kind") != kind:
        raise ValueError(f"state must come from a {classes[kind]}, got kind={state.get('kind')!r}")
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(f"state is missing {missing}")
    return state


def _check_counters(state: dict[str, Any]) -> tuple[int, int]:
    """``state['steps']`` and ``state['skipped']``: integers, 0 <= skipped <= steps."""
    steps = _check_int("state['steps']", state["steps"], 0)
    skipped = _check_int("state['skipped']", state["skipped"], 0)
    if skipped > steps:
        raise ValueError(f"state['skipped'] ({skipped}) must be <= state['steps'] ({steps})")
    return steps, skipped


def _check_margin(margin: Any) -> float:
    """An FP8 scaling margin: finite, with 2**margin a normal float32 (|margin| <= 126)."""
    if isinstance(margin, bool) or not isinstance(margin, int | float | np.integer | np.floating):
        raise TypeError(f"margin must be a number, got {margin!r}")
    if not (math.isfinite(margin) and -126 <= margin <= 126):
        raise ValueError(
            f"margin must be a finite number in [-126, 126] (2**margin a float32 power of two), "
            f"got {margin!r}"
        )
    return float(margin)


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
        """Restore from :meth:`state_dict`; every field is checked (error naming it)."""
        _check_state(state, "static", ("scale", "steps", "skipped", "skip_on_inf"))
        scale = float(_check_positive("state['scale']", state["scale"]))  # type: ignore[arg-type]
        steps, skipped = _check_counters(state)
        skip = _check_flag("state['skip_on_inf']", state["skip_on_inf"])
        self.scale, self.steps, self.skipped, self.skip_on_inf = scale, steps, skipped, skip

    def __repr__(self) -> str:
        return (
            f"StaticLossScaler(scale={_pow2_text(self.scale, code=True)}, "
            f"skip_on_inf={self.skip_on_inf}; steps={self.steps}, skipped={self.skipped})"
        )


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
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
        F = np.float32 if dtype == "float32" else np.float64
        init = _in_dtype("init_scale", _check_positive("init_scale", init_scale), F)  # type: ignore[arg-type]
        gf = _in_dtype("growth_factor", _check_positive("growth_factor", growth_factor), F)  # type: ignore[arg-type]
        bf = _in_dtype("backoff_factor", _check_positive("backoff_factor", backoff_factor), F)  # type: ignore[arg-type]
        if not gf > 1.0:
            raise ValueError(f"growth_factor must be > 1 in {dtype}, got {growth_factor!r}")
        if not bf < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1) in {dtype}, got {backoff_factor!r}")
        self.growth_interval = _check_int("growth_interval", growth_interval, 1)
        self.hysteresis = _check_int("hysteresis", hysteresis, 1)
        self.growth_offset = _check_int("growth_offset", growth_offset, 0)
        self.consecutive_hysteresis = _check_flag("consecutive_hysteresis", consecutive_hysteresis)
        self.check_finite_growth = _check_flag("check_finite_growth", check_finite_growth)
        self.raise_at_min_scale = _check_flag("raise_at_min_scale", raise_at_min_scale)
        lo = _check_positive("min_scale", min_scale, allow_none=True)
        hi = _check_positive("max_scale", max_scale, allow_none=True)
        lo = None if lo is None else _in_dtype("min_scale", lo, F)
        hi = None if hi is None else _in_dtype("max_scale", hi, F)
        if lo is not None and lo > init:
            raise ValueError(f"min_scale must be <= init_scale ({init!r}), got {min_scale!r}")
        if hi is not None and hi < init:
            raise ValueError(f"max_scale must be >= init_scale ({init!r}), got {max_scale!r}")
        if on_collapse not in ("warn", "raise", "ignore"):
            raise ValueError(
                f"on_collapse must be 'warn', 'raise' or 'ignore', got {on_collapse!r}"
            )
        self.dtype = dtype
        self._F = F
        self.growth_factor = gf
        self.backoff_factor = bf
        self.min_scale = lo
        self.max_scale = hi
        self.on_collapse = on_collapse
        self.name = name
        self.init_scale = init
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
        """Restore from :meth:`state_dict` (configuration included). Every field is checked
        (TypeError/ValueError naming it); a refused state leaves the scaler unchanged. A scale
        of 0, inf or NaN is accepted only with ``collapsed=True``."""
        _check_state(state, "dynamic", (*self._CONFIG, *self._STATE))
        fresh = DynamicLossScaler(**{k: state[k] for k in self._CONFIG})
        fresh.collapsed = _check_flag("state['collapsed']", state["collapsed"])
        fresh.scale = self._check_scale(state["scale"], fresh)
        fresh.steps, fresh.skipped = _check_counters(state)
        fresh.growth_tracker = _check_int("state['growth_tracker']", state["growth_tracker"], 0)
        tracker = _check_int("state['hysteresis_tracker']", state["hysteresis_tracker"], 0)
        if tracker > fresh.hysteresis:
            raise ValueError(
                f"state['hysteresis_tracker'] must be <= hysteresis ({fresh.hysteresis}), "
                f"got {tracker}"
            )
        fresh.hysteresis_tracker = tracker
        self.__dict__.update(fresh.__dict__)

    _STATE = ("scale", "steps", "skipped", "growth_tracker", "hysteresis_tracker", "collapsed")

    @staticmethod
    def _check_scale(value: Any, into: DynamicLossScaler) -> float:
        name = "state['scale']"
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise TypeError(f"{name} must be a number, got {value!r}")
        v = float(value)
        if into.collapsed and (v == 0 or not math.isfinite(v)) and not v < 0:
            return v  # a collapsed scaler's scale
        if not (math.isfinite(v) and v > 0):
            raise ValueError(
                f"{name} must be a positive finite number (0, inf or NaN only with "
                f"collapsed=True), got {value!r}"
            )
        return _in_dtype(name, v, into._F)

    def __repr__(self) -> str:
        """The class, the current scale, the growth rule and every other non-default setting.

        >>> DynamicLossScaler.preset("megatron", growth_interval=4)
        DynamicLossScaler(name='megatron', scale=2.0**32, growth_factor=2.0, backoff_factor=0.5,
        growth_interval=4, hysteresis=2, min_scale=1.0, check_finite_growth=False; steps=0,
        skipped=0)
        """
        defaults = {
            "hysteresis": 1,
            "consecutive_hysteresis": False,
            "growth_offset": 0,
            "min_scale": None,
            "max_scale": None,
            "dtype": "float32",
            "check_finite_growth": True,
            "raise_at_min_scale": False,
            "on_collapse": "warn",
        }
        head = [f"name={self.name!r}"] if self.name is not None else []
        head.append(f"scale={_pow2_text(self.scale, code=True)}")
        head += [f"{k}={getattr(self, k)!r}" for k in self._CONFIG[1:4]]
        head += [f"{k}={getattr(self, k)!r}" for k, v in defaults.items() if getattr(self, k) != v]
        tail = f"steps={self.steps}, skipped={self.skipped}" + (
            ", collapsed" if self.collapsed else ""
        )
        return f"DynamicLossScaler({', '.join(head)}; {tail})"


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
# simulating a scaler over recorded gradients
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Simulation:
    """What :func:`simulate` saw at each step (arrays of one entry per step).

    ``scale`` is the scale the step's gradients were multiplied by, ``scale_after`` the scale
    after the update; ``found_inf`` says whether some scaled gradient became inf or NaN in the
    format, ``skipped`` whether the optimizer step was skipped; ``overflow_count`` counts those
    values, ``nonfinite_count`` the gradients that were inf/NaN already before scaling;
    ``underflow_fraction`` is the fraction of finite non-zero gradients that became zero (0 when
    there are none); ``amax`` / ``amin`` are the largest and smallest finite non-zero ``|g|``
    (0 when there are none); ``n_values`` counts the gradients. ``settings`` is the scaler's
    ``state_dict()`` before the first step.
    """

    fmt: str
    scaler: str
    settings: dict[str, Any]
    scale: np.ndarray
    scale_after: np.ndarray
    found_inf: np.ndarray
    skipped: np.ndarray
    overflow_count: np.ndarray
    nonfinite_count: np.ndarray
    underflow_fraction: np.ndarray
    amax: np.ndarray
    amin: np.ndarray
    n_values: np.ndarray

    def __len__(self) -> int:
        return len(self.scale)

    @property
    def final_scale(self) -> float:
        """The scale after the last step (the scaler's scale before the first, if none)."""
        return float(self.scale_after[-1]) if len(self) else float(self.settings["scale"])

    def summary(self) -> str:
        """One line: steps, skips, the scale's path and the underflow.

        >>> r = simulate(DynamicLossScaler(), [np.float32([1e3, 1e-9])] * 12, "fp16")
        >>> print(r.summary())
        12 steps in fp16: 10 skipped (0 with inf/NaN in the gradients themselves); scale 65536
        -> 64 (used 64 to 65536); underflow to zero: median 0%, max 0%
        """
        n = len(self)
        if n == 0:
            return f"0 steps in {self.fmt}"
        u = 100 * self.underflow_fraction
        return (
            f"{n} steps in {self.fmt}: {int(self.skipped.sum())} skipped "
            f"({int((self.nonfinite_count > 0).sum())} with inf/NaN in the gradients "
            f"themselves); scale {self.scale[0]:g} -> {self.final_scale:g} "
            f"(used {self.scale.min():g} to {self.scale.max():g}); underflow to zero: "
            f"median {np.median(u):.3g}%, max {u.max():.3g}%"
        )

    def __repr__(self) -> str:
        return f"Simulation({self.summary()})"


def _step_arrays(step: Any, i: int) -> list[np.ndarray]:
    """The arrays of one step: an array, a list/tuple of arrays (layers) or a dict of them."""
    if isinstance(step, dict):
        parts = list(step.values())
    elif isinstance(step, list | tuple) and any(np.ndim(p) > 0 for p in step):
        parts = list(step)
    else:
        parts = [step]
    out = []
    for j, p in enumerate(parts):
        try:
            a = as_float_array(p, f"gradient_steps[{i}]")
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"gradient_steps[{i}] must be an array of floats or a list of them "
                f"(part {j}: {err})"
            ) from None
        out.append(np.ascontiguousarray(a).reshape(-1))
    return out


def simulate(
    scaler: LossScaler,
    gradient_steps: Iterable[Any],
    fmt: str | FloatFormat = "fp16",
    *,
    rounding: str = "nearest_even",
) -> Simulation:
    """Run ``scaler`` over recorded (unscaled) gradients, detecting overflow in ``fmt``.

    Each step's gradients (an array, a list of arrays such as one per layer, or a dict of them)
    are multiplied by the current scale (in float64: exact for float32 gradients and
    power-of-two scales) and rounded once to ``fmt`` with IEEE overflow. ``found_inf`` is what
    PyTorch's ``GradScaler`` sees after the cast to fp16: some value became inf or NaN in the
    format (above ``fmt.max`` by at least half an ulp in round-to-nearest: inf in fp16/bf16/e5m2,
    NaN in e4m3; formats without inf or NaN saturate and never overflow). Gradients that are
    inf/NaN already are inf/NaN at every scale. The scaler is then updated with ``found_inf``
    (it is advanced: pass a fresh one) and the step recorded. :func:`diagnose` reads the result.

    >>> g = np.array([2.0**-30, 1e-3], dtype=np.float32)     # 2**-30 is 0 in fp16 unscaled
    >>> r = simulate(DynamicLossScaler(init_scale=1.0, growth_interval=2), [g] * 14, "fp16")
    >>> np.log2(r.scale).astype(int).tolist()
    [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    >>> r.underflow_fraction.tolist()
    [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0]
    """
    if not (hasattr(scaler, "update") and hasattr(scaler, "scale")):
        raise TypeError(
            f"scaler must be a loss scaler (StaticLossScaler, DynamicLossScaler), got {scaler!r}"
        )
    f = _float_format(fmt)
    settings = scaler.state_dict()
    rows: list[tuple[Any, ...]] = []
    for i, step in enumerate(gradient_steps):
        arrays = _step_arrays(step, i)
        scale = float(scaler.scale)
        n = over = bad = lost = live = 0
        amax, amin = 0.0, math.inf
        for a in arrays:
            g = a.astype(np.float64)
            finite = np.isfinite(g)
            mag = np.abs(g[finite & (g != 0)])
            with np.errstate(over="ignore", invalid="ignore"):
                q = round_to(g * scale, f, rounding=rounding)
            n += g.size
            bad += int(g.size - np.count_nonzero(finite))
            over += int(q.size - np.count_nonzero(np.isfinite(q)))
            live += mag.size
            lost += int(np.count_nonzero((q == 0) & finite & (g != 0)))
            if mag.size:
                amax, amin = max(amax, float(mag.max())), min(amin, float(mag.min()))
        found = over > 0
        taken = scaler.update(found)
        rows.append(
            (
                scale,
                float(scaler.scale),
                found,
                not taken,
                over,
                bad,
                lost / live if live else 0.0,
                amax,
                0.0 if amin == math.inf else amin,
                n,
            )
        )
    cols = list(zip(*rows, strict=True)) if rows else [()] * 10
    dt = (float, float, bool, bool, np.int64, np.int64, float, float, float, np.int64)
    arr = [np.array(c, dtype=t) for c, t in zip(cols, dt, strict=True)]
    return Simulation(str(f), repr(scaler), settings, *arr)


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found: ``kinds`` (short names, in order of importance) and
    ``findings`` (one sentence each, with the numbers); ``str()`` gives the text."""

    kinds: tuple[str, ...]
    findings: tuple[str, ...]

    def __str__(self) -> str:
        return "\n".join(f"- {t}" for t in self.findings)


def _pow2_text(v: float, *, code: bool = False) -> str:
    """``2**k`` (``2.0**k`` with ``code``) for powers of two with ``|k| >= 4``, else the number."""
    k = math.log2(v) if v > 0 and math.isfinite(v) else 0.5
    if k == int(k) and abs(k) >= 4:
        return f"2.0**{int(k)}" if code else f"2**{int(k)}"
    return repr(v) if code else f"{v:g}"


def diagnose(result: Simulation, *, underflow_threshold: float = 0.01) -> Diagnosis:
    """Say in words why a simulated run's scale collapses or its gradients vanish.

    Looks for, in this order: inf/NaN in the gradients themselves (skipped at every scale: not
    fixable by scaling), gradients beyond the format's range even unscaled, persistent overflow
    (more than a quarter of the steps skipped), a collapsing scale (down by more than 2**10, or
    to 0/inf/NaN), and vanishing gradients (median underflow fraction over the second half of the
    run above ``underflow_threshold``) with its cause: the scale at its ceiling, growth too slow
    to reach the scale the gradients need, or a gradient range wider than the format's.

    >>> g = np.array([2.0**-30] * 3, dtype=np.float32)
    >>> print(diagnose(simulate(DynamicLossScaler(init_scale=1.0), [g] * 10, "fp16")))
    - vanishing gradients: a median 100% of the non-zero gradients became 0 in fp16 over the
      last 5 steps at scale 1 (smallest |g| 9.31e-10); keeping them needs a scale of at least
      2**6, and the largest gradient allows up to 2**45
    - growth too slow: the scale grows x2 every 2000 clean steps; from 1, reaching 2**6 takes 6
      growth intervals (12000 clean steps): start with init_scale=2**6
    """
    r = result
    n = len(r)
    if n == 0:
        return Diagnosis(("empty",), ("no steps were simulated",))
    f = get_format(r.fmt)
    assert isinstance(f, FloatFormat)
    kinds: list[str] = []
    text: list[str] = []
    cfg = r.settings
    bad = r.nonfinite_count > 0
    if bad.any():
        where = np.flatnonzero(bad)
        first = ", ".join(str(i) for i in where[:5]) + (" ..." if len(where) > 5 else "")
        kinds.append("nonfinite_gradients")
        text.append(
            f"inf/NaN in the gradients themselves: {int(bad.sum())} of {n} steps (steps "
            f"{first}) hold inf/NaN before any scaling; they are skipped at every scale, so this "
            "is not fixable by scaling: find the operation that produces them"
        )
    too_big = r.amax > f.max
    if too_big.any():
        kinds.append("overflow_unscaled")
        text.append(
            f"gradients beyond {f} unscaled: in {int(too_big.sum())} of {n} steps the largest "
            f"|g| (up to {r.amax.max():.6g}) exceeds {f}.max = {f.max:g}; only a scale below 1 "
            "fits them (set min_scale below 1), or use a format with more range (bf16)"
        )
    skipped = int(r.skipped.sum())
    if skipped > n / 4:
        real = int((r.skipped & bad).sum())
        kinds.append("persistent_overflow")
        text.append(
            f"persistent overflow: {skipped} of {n} steps skipped ({real} of them with inf/NaN "
            f"in the gradients themselves), at scales from {r.scale.min():g} to "
            f"{r.scale.max():g}"
        )
    start, end = float(r.scale[0]), r.final_scale
    collapsed = end == 0 or not math.isfinite(end)
    if collapsed or (end > 0 and start / end > 2.0**10):
        kinds.append("scale_collapse")
        cause = (
            "inf/NaN in the gradients themselves"
            if bad.sum() >= skipped / 2 and bad.any()
            else "overflow in the format"
        )
        text.append(
            f"scale collapse: the scale fell from {start:g} to {end:g} over {n} steps "
            f"({skipped} skipped), caused by {cause}"
        )
    tail = slice(n // 2, n)
    u = float(np.median(r.underflow_fraction[tail]))
    if u > underflow_threshold:
        kinds.append("vanishing_gradients")
        at = float(r.scale[-1])
        live = r.amin[tail][r.amin[tail] > 0]
        tiny = float(live.min()) if live.size else 0.0
        big = float(r.amax[tail].max())
        need = math.ceil(math.log2(f.smallest_subnormal / tiny)) if tiny else 0
        room = math.floor(math.log2(f.max / big)) if big else need
        text.append(
            f"vanishing gradients: a median {100 * u:.3g}% of the non-zero gradients became 0 in "
            f"{f} over the last {n - n // 2} steps at scale {_pow2_text(at)} (smallest |g| "
            f"{tiny:.3g}); keeping them needs a scale of at least 2**{need}, and the largest "
            f"gradient allows up to 2**{room}"
        )
        top = cfg.get("max_scale")
        if need > room:
            kinds.append("range_too_narrow")
            text.append(
                f"range too narrow: the gradients span {tiny:.3g} to {big:.3g}, more than "
                f"{f} holds from {f.smallest_subnormal:g} to {f.max:g} at any one scale"
            )
        elif top is not None and at >= top:
            kinds.append("scale_at_ceiling")
            text.append(
                f"scale at its ceiling: max_scale={top!r} stops the scale below 2**{need}; "
                f"raise max_scale to at least 2**{need}"
            )
        elif end < 2.0**need and "growth_interval" in cfg:
            k = math.ceil(math.log(2.0**need / end, cfg["growth_factor"]))
            steps = k * (cfg["growth_interval"] + cfg.get("growth_offset", 0))
            kinds.append("slow_growth")
            text.append(
                f"growth too slow: the scale grows x{cfg['growth_factor']:g} every "
                f"{cfg['growth_interval']} clean steps; from {_pow2_text(end)}, reaching 2**{need} "
                f"takes {k} growth intervals ({steps} clean steps): start with "
                f"init_scale=2**{need}"
            )
    if not kinds:
        kinds.append("healthy")
        text.append(
            f"healthy: {skipped} of {n} steps skipped, scale {start:g} -> {end:g}, median "
            f"underflow {100 * u:.3g}% over the last {n - n // 2} steps"
        )
    return Diagnosis(tuple(kinds), tuple(text))


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
    delayed scaling; current scaling passes ``previous=1``); amax beyond float32's range counts
    as inf (TE's amax is a float32), so it keeps the previous scale too; a scale that overflows
    float32 saturates to float32 max; one that underflows float32 to 0 is a ValueError (a margin
    too large for the data); ``margin`` must be finite with ``|margin| <= 126``; ``amax`` below
    ``amax_epsilon`` is raised to it; ``power_of_two`` rounds the scale down to a power of two
    (TE's ``force_pow_2_scales``: the float32 mantissa cleared).

    >>> scale_from_amax([3.5, 0.0, 1e-45], "e4m3", previous=7.0).tolist()
    [128.0, 7.0, 3.4028234663852886e+38]
    >>> float(scale_from_amax(3.0, "e4m3", power_of_two=True))
    128.0
    """
    f = _float_format(fmt)
    m = _check_margin(margin)
    a = np.asarray(amax, dtype=np.float64)
    if a.dtype.kind != "f":
        raise TypeError(f"amax must be real numbers, got {a.dtype}")
    if (a < 0).any():
        raise ValueError(f"amax must be >= 0 (a maximum of absolute values), got {amax!r}")
    if amax_epsilon < 0 or not math.isfinite(amax_epsilon):
        raise ValueError(f"amax_epsilon must be a finite number >= 0, got {amax_epsilon!r}")
    with np.errstate(over="ignore"):  # beyond float32: inf, as TE's float32 amax would be
        a32 = a.astype(np.float32)
        eps = np.float32(amax_epsilon)
    a32 = np.where(a32 < eps, eps, a32)
    prev = np.broadcast_to(np.asarray(previous, dtype=np.float32), a32.shape)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore", under="ignore"):
        sf = np.float32(f.max) / a32
        sf = sf / np.float32(2.0**m)
    usable = (a32 > 0) & np.isfinite(a32)
    if (usable & (sf == 0)).any():
        worst = float(np.max(np.where(usable, a32, 0)))
        raise ValueError(
            f"the scale underflows float32: {f}.max / amax / 2**margin is below 2**-149 for "
            f"amax={worst:g}, margin={margin!r} (use a smaller margin)"
        )
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
        _check_margin(margin)
        self.margin = margin
        self.scale = _in_dtype("init_scale", _check_positive("init_scale", init_scale), np.float32)  # type: ignore[arg-type]
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
        with np.errstate(over="ignore"):  # beyond float32: inf (keeps the previous scale)
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
        """Restore from :meth:`state_dict`; every field is checked (error naming it)."""
        keys = ("fmt", "amax_history_len", "amax_compute_algo", "margin", "scale")
        _check_state(state, None, (*keys, "amax_history", "steps"))
        fresh = DelayedScaling(*(state[k] for k in keys[:4]), init_scale=state["scale"])
        try:
            with np.errstate(over="ignore"):
                hist = np.asarray(state["amax_history"], dtype=np.float32)
        except (TypeError, ValueError):
            raise TypeError(
                f"state['amax_history'] must be a list of numbers, got {state['amax_history']!r}"
            ) from None
        if hist.shape != (fresh.amax_history_len,):
            raise ValueError(
                f"state['amax_history'] has shape {hist.shape}, expected "
                f"({fresh.amax_history_len},)"
            )
        if (hist < 0).any():
            raise ValueError(f"state['amax_history'] must hold amaxes >= 0, got {hist.tolist()}")
        fresh.amax_history = hist.copy()
        fresh.steps = _check_int("state['steps']", state["steps"], 0)
        self.__dict__.update(fresh.__dict__)

    def __repr__(self) -> str:
        return (
            f"DelayedScaling(fmt={str(self.fmt)!r}, amax_history_len={self.amax_history_len}, "
            f"amax_compute_algo={self.amax_compute_algo!r}, margin={self.margin}; "
            f"scale={_pow2_text(self.scale, code=True)}, steps={self.steps})"
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
