"""Loss scalers, as small, exact state machines.

Loss scalers (for FP16 training) multiply the loss by ``scale`` before the backward pass so that
small gradients survive the cast to the low format; the optimizer unscales, and a step whose
gradients hold inf/NaN is skipped. Every scaler here has ``.scale``, ``update(found_inf) -> bool``
(was the optimizer step taken?), ``state_dict()`` and ``load_state_dict()``.

* :class:`StaticLossScaler`: a fixed scale.
* :class:`DynamicLossScaler`: back off on overflow, grow after a run of clean steps. Its defaults
  are the exact semantics of PyTorch's ``torch.amp.GradScaler`` (scale kept in float32, init 2**16,
  growth 2, backoff 0.5, interval 2000, the float32 scale times the float64 factor rounded once,
  growth refused when the grown scale is not finite; tests/torch/test_scaler.py runs GradScaler
  and its ``_amp_update_scale_`` kernel beside it). Named
  presets (:meth:`DynamicLossScaler.preset`) reproduce Keras' ``LossScaleOptimizer``, NVIDIA Apex,
  DeepSpeed (hysteresis, ``consecutive_hysteresis``, min scale 1, growth after window + 1 clean
  steps as since DeepSpeed 0.17.1) and Megatron-LM (hysteresis refilled only at growth).

All scale arithmetic is done in the dtype the reference framework uses (float32 for PyTorch, Keras
and Megatron; Python float64 for Apex and DeepSpeed), so trajectories agree bit for bit. FP8
scaling recipes are in :mod:`.fp8`, simulation over gradient steps in :mod:`.simulate`.

>>> s = DynamicLossScaler.preset("torch", growth_interval=4)
>>> [s.update(found_inf) for found_inf in (True, False, False, False, False)]
[False, True, True, True, True]
>>> s.scale
65536.0
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np

from ..core.formats import FloatFormat, get_format
from ..core.rounding import _ML_FLOATS, as_float_array

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


def _float_format(fmt: Any, name: str = "fmt") -> FloatFormat:
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise TypeError(f"{name} must be a floating-point format, got {f}")
    return f


def _pow2_text(v: float, *, code: bool = False) -> str:
    """``2**k`` (``2.0**k`` with ``code``) for powers of two with ``|k| >= 4``, else the number."""
    k = math.log2(v) if v > 0 and math.isfinite(v) else 0.5
    if k == int(k) and abs(k) >= 4:
        return f"2.0**{int(k)}" if code else f"2**{int(k)}"
    return repr(v) if code else f"{v:g}"


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
        """Record one step; returns whether the optimizer step is taken."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:  # pragma: no cover - abstract
        """Everything needed to resume (plain Python types), for :meth:`load_state_dict`."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:  # pragma: no cover - abstract
        """Restore from :meth:`state_dict`."""
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

    Examples
    --------
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
        """Everything needed to resume (plain Python types), for :meth:`load_state_dict`."""
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
    # keras.optimizers.LossScaleOptimizer (Keras 3): float32 variable, no finiteness check; the
    # factors (2, 1/2) are Python floats cast to the variable's float32 by ops.multiply
    "keras": {
        "init_scale": 2.0**15,
        "growth_interval": 2000,
        "dtype": "float32",
        "check_finite_growth": False,
        "round_factors": True,
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
        # growth_factor / backoff_factor are float32 tensors (torch.tensor([f], dtype=torch.float)
        # in DynamicGradScaler.__init__): float32 scale times float32 factor
        "round_factors": True,
    },
}


class DynamicLossScaler(LossScaler):
    """Dynamic loss scaling; the defaults are exactly PyTorch's ``torch.amp.GradScaler``
    (tests/torch/test_scaler.py runs it beside them).

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
    round_factors:
        With ``dtype="float32"``: False (default), the float32 scale times the factor as given
        (a float64), the product rounded once to float32, as PyTorch's ``_amp_update_scale_``
        kernel does (``static_cast<float>(scale * growth_factor)``, both factors ``double``);
        True, the factors rounded to float32 first and a float32 product (Megatron-LM's factor
        tensors, Keras). The two differ for factors float32 cannot hold (1.1, 0.3, 0.1): growth
        1.1 after backoff 0.1 from 2**16 gives 7208.9599609375 and 7208.96044921875.
        tests/torch/test_scaler.py runs ``torch.amp.GradScaler`` beside it.
    raise_at_min_scale:
        DeepSpeed: raise :class:`LossScaleError` on an overflow that would back off while the
        scale is already at ``min_scale``.
    on_collapse:
        What to do when the scale becomes 0, inf or NaN (possible without a floor or ceiling,
        e.g. PyTorch after 166 overflows in a row from 2**16): ``"warn"`` (default, a
        :class:`LossScaleCollapseWarning`), ``"raise"`` (:class:`LossScaleError`) or ``"ignore"``.
        ``collapsed`` tells afterwards.

    Examples
    --------
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
        round_factors: bool = False,
        on_collapse: Literal["warn", "raise", "ignore"] = "warn",
        name: str | None = None,
    ) -> None:
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
        F = np.float32 if dtype == "float32" else np.float64
        init = _in_dtype("init_scale", _check_positive("init_scale", init_scale), F)  # type: ignore[arg-type]
        self.round_factors = _check_flag("round_factors", round_factors)
        gf = _in_dtype("growth_factor", _check_positive("growth_factor", growth_factor), F)  # type: ignore[arg-type]
        bf = _in_dtype("backoff_factor", _check_positive("backoff_factor", backoff_factor), F)  # type: ignore[arg-type]
        # a factor that the dtype rounds to 1 is refused even where the product is rounded once
        # (it would move almost no scale: 1 + 1e-9 leaves every float32 scale as it is)
        if not gf > 1.0:
            raise ValueError(f"growth_factor must be > 1 in {dtype}, got {growth_factor!r}")
        if not bf < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1) in {dtype}, got {backoff_factor!r}")
        if not self.round_factors:  # kept as given (float64): the product is rounded once
            gf, bf = float(growth_factor), float(backoff_factor)
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

    def _mul(self, scale: float, factor: float) -> float:
        """``scale * factor`` in the scale's dtype: the float64 product rounded once (factor as
        given), or with ``round_factors`` the product of the factor rounded to the dtype."""
        with np.errstate(over="ignore", under="ignore"):
            if self.round_factors:
                return float(self._F(scale) * self._F(factor))
            return float(self._F(np.float64(scale) * np.float64(factor)))

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
        "round_factors",
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
        # round_factors came later: a state without it is read with the default
        state = {"round_factors": False, **_check_state(state, "dynamic", ())}
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
        growth_interval=4, hysteresis=2, min_scale=1.0, check_finite_growth=False,
        round_factors=True; steps=0, skipped=0)
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
            "round_factors": False,
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
