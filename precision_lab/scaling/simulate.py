"""Simulating a loss scaler over recorded (or generated) gradient steps, and diagnosing the run.

:func:`simulate` multiplies each step's gradients by the scaler's scale, casts them to the
low format, counts overflow and underflow, and feeds ``found_inf`` back to the scaler;
:func:`diagnose` reads the resulting :class:`Simulation` and names what went wrong (scale
collapse, persistent underflow, overflow storms) with the fix.

>>> import precision_lab as pl
>>> from precision_lab.scaling.gradients import lognormal
>>> steps = [lognormal(1000, mu=-20.0, sigma=1.0, seed=i) for i in range(4)]
>>> r = simulate(pl.scaling.StaticLossScaler(2.0**10), steps, "fp16")
>>> r.skipped.tolist()
[False, False, False, False]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.formats import FloatFormat, get_format
from ..core.rounding import as_float_array, round_to
from .scalers import LossScaler, _float_format, _pow2_text

__all__ = ["Diagnosis", "Simulation", "diagnose", "simulate"]

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

        >>> from precision_lab.scaling import DynamicLossScaler
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
    >>> from precision_lab.scaling import DynamicLossScaler
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


def diagnose(result: Simulation, *, underflow_threshold: float = 0.01) -> Diagnosis:
    """Say in words why a simulated run's scale collapses or its gradients vanish.

    Looks for, in this order: inf/NaN in the gradients themselves (skipped at every scale: not
    fixable by scaling), gradients beyond the format's range even unscaled, persistent overflow
    (more than a quarter of the steps skipped), a collapsing scale (down by more than 2**10, or
    to 0/inf/NaN), and vanishing gradients (median underflow fraction over the second half of the
    run above ``underflow_threshold``) with its cause: the scale at its ceiling, growth too slow
    to reach the scale the gradients need, or a gradient range wider than the format's.

    >>> g = np.array([2.0**-30] * 3, dtype=np.float32)
    >>> from precision_lab.scaling import DynamicLossScaler
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
