"""FP8 scaling as in NVIDIA Transformer Engine (TE): per-tensor scales from amax, and block scales.

* :class:`DelayedScaling`: per-tensor scale from a history of amax values (TE's ``DelayedScaling``
  recipe, with TE's PyTorch history update: amax written to slot 0, scale computed, history rolled
  by one and slot 0 zeroed).
* :func:`current_scale` / :func:`quantize_current`: just-in-time per-tensor scaling (TE's
  ``Float8CurrentScaling``, ``compute_scale_from_amax``), optionally rounded down to a power of two.
* :func:`block_scales`: per-tile scales (1x128, 128x128) and MXFP8 E8M0 scales per 32 values; the
  block formats themselves (element codes and scales) live in :mod:`precision_lab.quant`.

Scale arithmetic is float32, as TE computes it.

>>> ds = DelayedScaling("e4m3", amax_history_len=4)
>>> ds.update(3.5)
128.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.formats import FloatFormat
from ..core.rounding import as_float_array, round_to
from ..quant.blocks import get_block_format, quantize_blocks
from .scalers import (
    _F32_MAX,
    _check_int,
    _check_margin,
    _check_positive,
    _check_state,
    _float_format,
    _in_dtype,
    _pow2_text,
)

__all__ = [
    "BlockScales",
    "DelayedScaling",
    "block_scales",
    "current_scale",
    "quantize_current",
    "scale_from_amax",
]

# ----------------------------------------------------------------------------------------------
# FP8 scaling (Transformer Engine)
# ----------------------------------------------------------------------------------------------


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
        """Everything needed to resume (plain Python types), for :meth:`load_state_dict`."""
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
    :mod:`precision_lab.quant.blocks` with the round-up rule of Transformer Engine, so that
    ``amax / X <= fmt.max``; ``scales`` holds the multipliers ``1/X`` applied to x. (DeepSeek-V3's
    own tiles, with the decode scale ``amax / 448`` kept in fp32, are the block formats
    ``"fp8_1x128"`` and ``"fp8_128x128"`` of :mod:`precision_lab.quant.blocks`.)

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
    """MX (E8M0 per 32 values) multipliers ``1/X`` from :mod:`precision_lab.quant.blocks` with the
    round-up rule (``X = 2**ceil(log2(amax / fmt.max))``, so ``amax / X <= fmt.max``)."""
    names = {"e4m3": "mxfp8_e4m3", "e5m2": "mxfp8_e5m2"}
    if str(f) not in names:
        raise ValueError(f"block='mxfp8' needs fmt e4m3 or e5m2, got {f}")
    if a.ndim != 2:
        raise ValueError(f"x must be 2-D for MX scales, got shape {a.shape}")
    bf = get_block_format(names[str(f)], scale_rule="ceil")
    q = quantize_blocks(a, bf, axis=-1, pad=True)
    mult = (1.0 / q.scales).astype(np.float32)  # exact: powers of two within float32
    return BlockScales(scales=mult, block=(1, 32), fmt=f)
