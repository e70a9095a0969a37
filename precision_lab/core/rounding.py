"""The rounding core: round any float array onto a format's grid, bit-exactly.

Everything else in precision_lab (codecs, quantization, GEMM, scalers, training) calls
:func:`round_to`; nothing re-implements rounding.

How it works. Inputs are viewed as unsigned integers (float32 -> uint32, float64 -> uint64; other
float dtypes are first widened exactly). For results in the format's normal range, rounding is an
integer add-and-mask on the magnitude bits, so the carry into the exponent is free and the input is
rounded once, from its exact value. Results in the format's subnormal range are a fixed quantum
``q = 2**(emin - mantissa_bits)`` and are rounded as ``k * q`` with exact float64 arithmetic;
overflow, infinities and NaN are patched afterwards on the (rare) elements that need it. Arrays are
processed in cache-sized chunks, spread over the CPU cores (numpy releases the GIL).

Stochastic rounding of an element with exact discarded fraction ``f`` (in units of the result's
quantum, ``0 <= f < 1``) rounds away from zero iff ``floor(f * 2**64) + R >= 2**64``, where ``R`` is
the element's 64-bit counter-based random word (see :mod:`precision_lab.core.random_words`) with
its low ``64 - random_bits`` bits cleared. So the probability is ``f`` truncated to ``random_bits``
bits, as in hardware stochastic rounding, and is exact for the default ``random_bits=None`` (64
bits).

>>> import numpy as np
>>> round_to(np.float64(1.0625 + 2**-40), "e4m3")
array(1.125)
>>> round_to(np.array([464.0, 464.0001, -0.0], dtype=np.float32), "e4m3")
array([448., nan, -0.], dtype=float32)
>>> round_to(np.array([61440.0], dtype=np.float32), "e5m2", rounding="rtz")
array([57344.], dtype=float32)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import ml_dtypes
import numpy as np

from .formats import FloatFormat, IntFormat, get_format, p3109
from .inputs import as_input, is_device_array
from .pool import CHUNK, for_chunks
from .random_words import check_seed, random_words
from .scratch import scratch

__all__ = [
    "CORE_ONLY_MODES",
    "MODE_ALIASES",
    "OVERFLOW_MODES",
    "P3109_ROUNDING_MODES",
    "P3109_SATURATION_MODES",
    "ROUNDING_MODES",
    "SR_VARIANT_MODES",
    "STOCHASTIC_MODES",
    "SUBNORMAL_MODES",
    "as_float_array",
    "check_rounding",
    "follows_p3109",
    "is_stochastic",
    "p3109_project",
    "round_to",
    "round_with_words",
]

#: rounding modes; their positions are the mode numbers of the C++/CUDA header (append only)
ROUNDING_MODES = (
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "up",
    "down",
    "odd",
    "stochastic",
    "nearest_zero",
    "stochastic_equal",
    "stochastic_offset",
    "stochastic_corrected",
)
#: the few-bit stochastic rounding variants of Fitzgibbon & Felix (ARITH 2025) beside
#: ``stochastic`` (their SRFF): ``stochastic_offset`` is their SRF, ``stochastic_corrected`` their
#: SRC (see :func:`round_to`); with 64 random bits both are ``stochastic`` itself
#: Modes without a mode number in the C++/CUDA header (not in :data:`ROUNDING_MODES`): the
#: numpy reference computes them, the native backend declines them and CuPy arrays refuse
#: them. ``stochastic_corrected_odd`` is gfloat's ``StochasticOdd`` (P3109 interim report 3.1):
#: SRC with the fraction rounded to N bits ties to odd. With 64 random bits it is
#: ``stochastic`` (:func:`sr_mode`), so every entry point takes it; with fewer bits only
#: :func:`round_to`, :func:`round_with_words` and encode do (the accumulators refuse few-bit SR
#: variants, the block and integer quantizers' kernels take header mode numbers)
CORE_ONLY_MODES = ("stochastic_corrected_odd",)
SR_VARIANT_MODES = ("stochastic_offset", "stochastic_corrected", *CORE_ONLY_MODES)
#: the modes that draw random words (keyed by seed and flat index)
STOCHASTIC_MODES = ("stochastic", "stochastic_equal", *SR_VARIANT_MODES)
_MODE_ALIASES = {
    "rne": "nearest_even",
    "rna": "nearest_away",
    "rtz": "toward_zero",
    "rup": "up",
    "rdn": "down",
    "rto": "odd",
    "sr": "stochastic",
    "nearest": "nearest_even",
    "rnz": "nearest_zero",
    "sre": "stochastic_equal",
    "srff": "stochastic",
    "srf": "stochastic_offset",
    "src": "stochastic_corrected",
    "srco": "stochastic_corrected_odd",
    # P3109's names (interim report 4.0, 4.7.4: StochasticA/B/C; 3.1 and gfloat 0.5.2's
    # RoundMode: StochasticFastest/Fast/Stochastic/StochasticOdd), in snake case; P3109's plain
    # "Stochastic" (SRC) is "stochastic_c" here, as "stochastic" is SRFF (P3109_ROUNDING_MODES)
    "stochastic_a": "stochastic",
    "stochastic_b": "stochastic_offset",
    "stochastic_c": "stochastic_corrected",
    "stochastic_fastest": "stochastic",
    "stochastic_fast": "stochastic_offset",
    "stochastic_odd": "stochastic_corrected_odd",
    "nearest_ties_to_even": "nearest_even",
    "nearest_ties_to_away": "nearest_away",
    "toward_positive": "up",
    "toward_negative": "down",
    "to_odd": "odd",
}
#: P3109's rounding-mode names (interim report 4.0, 4.2 and 4.7.4; 3.1 names as gfloat 0.5.2's
#: ``RoundMode``) -> precision_lab's. ``check_rounding`` takes the left side in snake case
#: (``"stochastic_a"``, ``"stochastic_fastest"``, ``"to_odd"`` ...), except P3109 3.1's
#: ``Stochastic``, which is ``"stochastic_c"``: ``"stochastic"`` is SRFF (StochasticA)
P3109_ROUNDING_MODES = {
    "NearestTiesToEven": "nearest_even",
    "NearestTiesToAway": "nearest_away",
    "TowardPositive": "up",
    "TowardNegative": "down",
    "TowardZero": "toward_zero",
    "ToOdd": "odd",
    "StochasticA": "stochastic",
    "StochasticB": "stochastic_offset",
    "StochasticC": "stochastic_corrected",
    "StochasticFastest": "stochastic",
    "StochasticFast": "stochastic_offset",
    "Stochastic": "stochastic_corrected",
    "StochasticOdd": "stochastic_corrected_odd",
}
#: short and alternative names of the rounding modes (``rne`` -> ``nearest_even`` ...)
MODE_ALIASES = _MODE_ALIASES
#: modes that overflow to inf under overflow="ieee" whatever the sign (round-to-nearest family);
#: in P3109 formats "odd" too (follows_p3109)
_TO_INF_MODES = ("nearest_even", "nearest_away", "nearest_zero", *STOCHASTIC_MODES)
OVERFLOW_MODES = ("ieee", "saturate")
#: P3109's saturation modes (interim report 4.0, 4.2 and 4.7.5), which :func:`round_to` takes as
#: ``overflow`` (snake or P3109 case) and :func:`p3109_project` as ``saturation``; 3.x's
#: ``OvfInf`` is ``overflow="ieee"`` (see :func:`p3109_project`)
P3109_SATURATION_MODES = ("sat_finite", "sat_propagate", "sat_none")
_SATURATION_NAMES = {
    "satfinite": "sat_finite",
    "satpropagate": "sat_propagate",
    "satnone": "sat_none",
}
SUBNORMAL_MODES = ("keep", "flush")

_ML_FLOATS = {
    np.dtype(getattr(ml_dtypes, n))
    for n in dir(ml_dtypes)
    if n.startswith(("float8", "float6", "float4", "bfloat16"))
}


def is_stochastic(rounding: str) -> bool:
    """Whether a rounding mode (or its alias) draws random words.

    >>> is_stochastic("sre"), is_stochastic("nearest_zero")
    (True, False)
    """
    key = rounding.strip().lower() if isinstance(rounding, str) else rounding
    return _MODE_ALIASES.get(key, key) in STOCHASTIC_MODES


def follows_p3109(fmt: FloatFormat | IntFormat) -> bool:
    """Whether ``fmt`` is an IEEE P3109 format, so that overflow follows P3109's rules.

    A format is a P3109 one when it equals ``p3109(k, p, signed=..., domain=...)`` for its width
    ``k``, precision ``p``, signedness and domain (``"extended"`` when it has infinities): the
    special-value layout decides, not the name (formats compare equal whatever their names, so
    ``e4m3fnuz`` and ``e5m2fnuz``, which are P3109 K8P4 and K8P3 in the finite domain, follow
    them too; ``e4m3b11fnuz``, with bias 11, does not).

    The one difference from the IEEE 754 style of the other formats is round to odd under
    ``overflow="ieee"``. IEEE 754 (clause 7.4) lets only the round-to-nearest modes and the
    directed mode pointing outward overflow to infinity, and precision_lab treats ``odd`` like
    ``toward_zero`` there (round to odd is truncation with a sticky last bit: ``±max``).
    P3109 (interim report, "Projection": ``RoundToPrecision`` with an unbounded exponent, then
    ``Saturate`` in the ``OvfInf`` mode) rounds first with an unbounded exponent and sends every
    result beyond the largest finite value to ``±inf`` (NaN in the finite domain), except under
    ``TowardZero`` and the directed mode pointing inward: round to odd included. gfloat's
    ``round_float`` (the P3109 reference code) applies the same rule to its modes.

    >>> follows_p3109(get_format("p3109_k8p4se")), follows_p3109(get_format("e4m3"))
    (True, False)
    >>> follows_p3109(get_format("e5m2fnuz")), follows_p3109(get_format("e4m3b11fnuz"))
    (True, False)
    """
    if not isinstance(fmt, FloatFormat) or fmt.nan not in ("fn", "fnuz"):
        return False
    domain = "extended" if fmt.has_inf else "finite"
    try:
        ref = p3109(fmt.bits, fmt.precision, signed=fmt.signed, domain=domain)
    except ValueError:  # no P3109 format of that width and precision
        return False
    return fmt == ref


def check_rounding(rounding: str) -> str:
    """Canonical name of a rounding mode (aliases ``rne rna rtz rup rdn rto sr rnz sre srff srf
    src srco`` and P3109's names in snake case, :data:`P3109_ROUNDING_MODES`).

    >>> check_rounding("rtz"), check_rounding("stochastic_b")
    ('toward_zero', 'stochastic_offset')
    """
    if isinstance(rounding, str):
        key = rounding.strip().lower()
        key = _MODE_ALIASES.get(key, key)
        if key in ROUNDING_MODES or key in CORE_ONLY_MODES:
            return key
    raise ValueError(
        f"rounding must be one of {', '.join(ROUNDING_MODES + CORE_ONLY_MODES)} "
        f"(or {', '.join(_MODE_ALIASES)}), got {rounding!r}"
    )


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if isinstance(value, str) and value in allowed:
        return value
    raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def check_random_bits(random_bits: int | None) -> int:
    if random_bits is None:
        return 64
    if isinstance(random_bits, bool) or not isinstance(random_bits, int | np.integer):
        raise TypeError(f"random_bits must be an int in 1..64 or None, got {random_bits!r}")
    if not 1 <= random_bits <= 64:
        raise ValueError(f"random_bits must be in 1..64 (None for exact), got {random_bits}")
    return int(random_bits)


@dataclass(frozen=True)
class RoundingOptions:
    """The validated options of one rounding call, shared by round_to, encode and the GPU path."""

    mode: str
    overflow: str
    subnormals: str
    seed: int  # 0 unless stochastic
    random_bits: int

    def words(self, n: int, start: int) -> np.ndarray | None:
        """Random words of flat indices ``start .. start + n - 1`` (stochastic rounding only)."""
        if self.mode not in STOCHASTIC_MODES:
            return None
        return _random_for(word_bits(self.mode, self.random_bits), self.seed, n, start)


def check_options(
    rounding: str, overflow: str, subnormals: str, seed: int | None, random_bits: int | None
) -> RoundingOptions:
    """Validate the keyword options of :func:`round_to` (ValueError/TypeError naming them)."""
    mode = check_rounding(rounding)
    rbits = check_random_bits(random_bits)
    if isinstance(overflow, str) and overflow.strip().lower().replace("_", "") == "ovfinf":
        overflow = "ieee"  # P3109 3.x's OvfInf (p3109_project)
    return RoundingOptions(
        mode=sr_mode(mode, rbits),
        overflow=check_choice("overflow", overflow, OVERFLOW_MODES),
        subnormals=check_choice("subnormals", subnormals, SUBNORMAL_MODES),
        seed=check_seed(seed) if mode in STOCHASTIC_MODES else 0,
        random_bits=rbits,
    )


def sr_mode(mode: str, random_bits: int) -> str:
    """``mode`` (canonical), or ``"stochastic"`` for an SR variant with 64 random bits.

    With 64 random bits the variants decide exactly as ``stochastic`` (the discarded fraction,
    truncated to 64 bits, is their input: SRF's offset of half a random unit, 2**-65, and SRC's
    rounding to 64 bits change nothing), so every path that has no code of its own for them
    (accumulators, ``pl.ops``) serves them as ``stochastic``.

    >>> sr_mode("stochastic_corrected", 64), sr_mode("stochastic_corrected", 4)
    ('stochastic', 'stochastic_corrected')
    """
    return "stochastic" if mode in SR_VARIANT_MODES and random_bits >= 64 else mode


def word_bits(mode: str, random_bits: int) -> int:
    """The ``random_bits`` code the random-word generators take: ``random_bits`` (1..64), or
    ``random_bits + 64`` for an SR variant with fewer than 64 bits, whose words then carry the
    marker bit ``2**(63 - random_bits)`` (``_random_for``; the C++/CUDA header's
    ``pl_random_group`` does the same).

    >>> word_bits("stochastic", 4), word_bits("stochastic_offset", 4)
    (4, 68)
    """
    return random_bits + 64 if mode in SR_VARIANT_MODES and random_bits < 64 else random_bits


def _numpy_reference(
    op: str, x: Any, fmt: FloatFormat | IntFormat, options: RoundingOptions | None
) -> Any:
    return None


#: The backend router of round_to / encode / decode: it returns the result of the chosen
#: backend (native, cupy), or None to let the numpy reference in this module run.
#: precision_lab.backends.dispatch installs it when the package loads; so the backends and the
#: dispatch layer sit above this module and nothing here imports them.
route: Callable[[str, Any, FloatFormat | IntFormat, RoundingOptions | None], Any] = _numpy_reference


def as_float_array(x: Any, name: str = "x") -> np.ndarray:
    """``x`` as a native-byte-order float16/32/64 or ml_dtypes array; TypeError otherwise.

    >>> as_float_array([1, 2])
    Traceback (most recent call last):
    ...
    TypeError: x must hold floating-point numbers, got an array of int64 ...
    """
    a = np.asarray(x)
    dt = a.dtype
    if dt in _ML_FLOATS:
        return a.astype(np.float32)
    if dt.kind != "f" or dt.itemsize > 8:
        what = "complex numbers" if dt.kind == "c" else dt.name
        raise TypeError(
            f"{name} must hold floating-point numbers, got an array of {what} "
            "(expected float16, float32, float64 or an ml_dtypes float)"
        )
    if not dt.isnative:
        a = a.astype(dt.newbyteorder("="))
    return a


def _fits_float32(fmt: FloatFormat) -> bool:
    """Whether float32 holds every value: the quantum of the lowest binade is >= 2**-149."""
    return (
        fmt.mantissa_bits <= 23
        and fmt.max <= float(np.finfo(np.float32).max)
        and fmt.emin - fmt.mantissa_bits >= -149
    )


def working_dtype(in_dtype: np.dtype, fmt: FloatFormat | IntFormat) -> np.dtype:
    """Result dtype of :func:`round_to`: float64 for float64 input or formats beyond float32."""
    if in_dtype == np.float64:
        return np.dtype(np.float64)
    if isinstance(fmt, IntFormat):
        return np.dtype(np.float32) if fmt.bits <= 24 else np.dtype(np.float64)
    return np.dtype(np.float32) if _fits_float32(fmt) else np.dtype(np.float64)


@dataclass(frozen=True)
class _Plan:
    """Constants of one rounding job, in the integer view of the working dtype."""

    fmt: FloatFormat
    mode: str
    overflow: str
    flush: bool
    F: type  # working float type
    U: type  # matching unsigned type
    W: int  # word width
    s: int  # bits dropped in the format's normal range
    threshold: int  # below these bits, the exact float64 path (_low_bits)
    maxbits: int  # bits of fmt.max
    qexp: int  # quantum exponent below the smallest normal
    sign: int
    abs_mask: int
    flip_parity: bool  # exponent-only formats whose bias parity differs from the working dtype's
    zero_is_fast: bool  # ±0 rounds to ±0 (not in fnuz, unsigned or zero-less formats)
    fixed_quantum: bool  # inputs below threshold all round to multiples of 2**qexp
    inf_bits: int
    nan_bits: int  # canonical quiet NaN (positive)
    least_bits: int  # bits of the least positive value (of zero-less formats: where -x goes)
    all_low: bool  # max below the smallest normal (exponent_bits=0): every input is flagged
    p3109: bool  # P3109 overflow rules (follows_p3109): round to odd overflows to inf too


@lru_cache(maxsize=256)
def _plan(fmt: FloatFormat, wdt: str, mode: str, overflow: str, flush: bool) -> _Plan:
    F = np.dtype(wdt).type
    U = np.uint32 if F is np.float32 else np.uint64
    W = 32 if F is np.float32 else 64
    P = 23 if W == 32 else 52

    def bits(v: float) -> int:
        return int(np.array(v, dtype=F).view(U))

    s = max(P - fmt.mantissa_bits, 0)
    bias = fmt.bias
    assert bias is not None
    work_min_normal = float(np.finfo(F).smallest_normal)
    sub_m = fmt.mantissa_bits if fmt.has_subnormals else 0
    return _Plan(
        fmt=fmt,
        mode=mode,
        overflow=overflow,
        flush=flush,
        F=F,
        U=U,
        W=W,
        s=s,
        threshold=bits(max(fmt.smallest_normal, work_min_normal)),
        maxbits=bits(fmt.max),
        qexp=fmt.emin - sub_m,
        sign=1 << (W - 1),
        flip_parity=fmt.mantissa_bits == 0 and (bias - (127 if W == 32 else 1023)) % 2 == 1,
        zero_is_fast=fmt.has_negative_zero,
        fixed_quantum=fmt.has_zero and fmt.smallest_normal >= work_min_normal,
        abs_mask=(1 << (W - 1)) - 1,
        inf_bits=bits(math.inf),
        nan_bits=bits(math.nan) & ((1 << (W - 1)) - 1),
        least_bits=bits(fmt.smallest_subnormal),
        all_low=bits(fmt.max) < bits(max(fmt.smallest_normal, work_min_normal)),
        p3109=follows_p3109(fmt),
    )


def _round_quantum(
    mag: np.ndarray, neg: np.ndarray, qexp: int | np.ndarray, mode: str, rw: np.ndarray | None
) -> np.ndarray:
    """Round finite magnitudes ``mag`` (float64, >= 0) to integer multiples ``k`` of ``2**qexp``.

    Returns ``k`` as float64 integers. ``neg`` tells the sign for the directed modes.
    """
    v = np.ldexp(mag, -qexp)
    if np.any(np.asarray(qexp) > 0):  # scaling a tiny input down can underflow (v < 2**-126):
        lost = np.ldexp(v, qexp) != mag  # 2**-100 stands in for such a v, as every mode decides
        if lost.any():  # the same for any value in (0, 2**-64)
            v = np.where(lost, v.dtype.type(2.0**-100), v)
    if mode == "nearest_even":
        return np.rint(v)
    f = np.floor(v)
    if mode == "toward_zero":
        return f
    if mode == "nearest_away":
        return f + (v - f >= 0.5)
    if mode in ("up", "down"):
        away = ~neg if mode == "up" else neg
        return np.where(away, np.ceil(v), f)
    if mode == "odd":
        return f + ((v != f) & (np.fmod(f, 2.0) == 0.0))
    if mode == "nearest_zero":
        return f + (v - f > 0.5)
    assert rw is not None
    if mode == "stochastic_equal":  # inexact: up iff the top random bit is set
        return f + ((v != f) & (rw >= np.uint64(1 << 63)))
    return f + _sr_up(np.floor(np.ldexp(v - f, 64)).astype(np.uint64), rw, mode)


def _sr_up(frac64: np.ndarray, rw: np.ndarray, mode: str = "stochastic") -> np.ndarray:
    """Stochastic rounding's choice: away from zero iff ``frac64 + R >= 2**64`` (``frac64`` the
    discarded fraction times 2**64, floored; ``R`` the random word).

    ``stochastic_offset`` words carry the marker bit ``2**(63 - N)`` (:func:`_random_for`), which
    is SRF's offset of half a random unit, so the same sum decides it. ``stochastic_corrected``
    first rounds ``frac64`` to its top N bits (nearest, ties to even; the marker bit tells N) and
    then adds the word without the marker: a fraction that rounds up to 1 always goes away.
    """
    zero = np.uint64(0)
    if mode not in ("stochastic_corrected", "stochastic_corrected_odd"):
        return (frac64 != 0) & (rw >= zero - frac64)
    low = rw & (zero - rw)  # the marker 2**(63 - N)
    unit = low << np.uint64(1)  # 2**(64 - N): one unit of the N-bit fraction
    rem = frac64 & (unit - np.uint64(1))
    t = frac64 - rem
    odd_ties = mode == "stochastic_corrected_odd"  # ties to the odd N-bit fraction
    inc = (rem > low) | ((rem == low) & (((t & unit) != zero) != odd_ties))
    c = t + inc.astype(np.uint64) * unit  # 2**64 (all of it) wraps around to 0
    r = rw ^ low
    return (inc & (c == zero)) | ((c != zero) & (r >= zero - c))


def _random_for(plan_rbits: int, seed: int, n: int, start: int) -> np.ndarray:
    """The random words of flat indices ``start .. start + n - 1``, masked to their top
    ``plan_rbits`` bits (1..64); ``plan_rbits`` = N + 64 (:func:`word_bits`): the top N bits and
    the marker bit ``2**(63 - N)`` of the SR variants."""
    rw = random_words(seed, n, start)
    n_bits = plan_rbits - 64 if plan_rbits > 64 else plan_rbits
    if n_bits < 64:
        rw &= np.uint64(((1 << 64) - 1) ^ ((1 << (64 - n_bits)) - 1))
    if plan_rbits > 64:
        rw |= np.uint64(1 << (63 - n_bits))
    return rw


def _special(p: _Plan, u: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """Full result bits (sign included) for inputs that are NaN/inf or overflow the format.

    An overflow is a result beyond the max after rounding with an unbounded exponent. Under
    ``overflow="ieee"`` it is inf (NaN without inf) in the round-to-nearest and stochastic modes
    and the directed mode pointing outward, ``±max`` under ``toward_zero``, the inward directed
    mode and ``odd`` (IEEE 754 clause 7.4); P3109 formats send ``odd`` to inf too
    (:func:`follows_p3109`).
    """
    fmt = p.fmt
    nan_keeps_sign = fmt.nan in ("ieee", "fn") and fmt.signed
    sign_bits = np.where(neg, p.U(p.sign), p.U(0))
    is_nan = u > p.inf_bits
    is_inf = u == p.inf_bits
    if p.overflow == "saturate":
        to_inf = np.zeros(u.shape, dtype=bool)
    elif p.mode in _TO_INF_MODES or (p.mode == "odd" and p.p3109):
        to_inf = np.ones(u.shape, dtype=bool)
    elif p.mode == "up":
        to_inf = ~neg
    elif p.mode == "down":
        to_inf = neg.copy()
    else:  # toward_zero, odd
        to_inf = np.zeros(u.shape, dtype=bool)
    to_inf |= is_inf & (p.overflow == "ieee")
    if fmt.has_inf:
        big = np.where(to_inf, p.U(p.inf_bits), p.U(p.maxbits))
        big_sign = sign_bits
    elif fmt.has_nan:
        big = np.where(to_inf, p.U(p.nan_bits), p.U(p.maxbits))
        big_sign = sign_bits if nan_keeps_sign else np.where(to_inf, p.U(0), sign_bits)
    else:
        big, big_sign = np.full(u.shape, p.maxbits, dtype=p.U), sign_bits
    nan_sign = sign_bits if nan_keeps_sign else p.U(0)
    return np.where(is_nan, p.U(p.nan_bits) | nan_sign, big | big_sign)


_LITTLE = sys.byteorder == "little"


def _scratch(dtype: type, n: int, slot: int = 0) -> np.ndarray:
    """A per-thread scratch array of n elements (chunks reuse it: no malloc per chunk)."""
    return scratch(dtype, n, ("rounding", slot), least=CHUNK)


def _round_float_chunk(
    p: _Plan,
    xc: np.ndarray,
    out: np.ndarray,
    rw: np.ndarray | None,
    *,
    masked: bool = True,
    patch: bool = True,
    fast_zero: bool = True,
) -> np.ndarray | None:
    """Round one contiguous chunk ``xc`` into ``out`` (working dtype, same length).

    The fast path works on the full bit patterns (sign included: adding to the magnitude bits of a
    finite input never carries into the sign). It is right for inputs whose magnitude bits lie in
    ``[threshold, maxbits]``; the others (small, overflowing, inf, NaN, and negative inputs of
    unsigned formats) are flagged and patched by :func:`_patch`. Returns the flagged indices.
    With ``masked=False`` the dropped low bits of unflagged results are left as they are (the
    encoder shifts them out anyway); with ``patch=False`` flagged results are left wrong, for the
    caller to redo them all at once with :func:`repair` (one pass of Python overhead, not one per
    chunk); with ``fast_zero=False`` zeros are flagged too (the encoder needs them).
    """
    U, s, mode, W = p.U, p.s, p.mode, p.W
    wc = xc if xc.dtype == p.F else xc.astype(p.F)
    bits: np.ndarray = wc.view(U)
    r: np.ndarray = out.view(U)
    n = bits.size
    tmp = _scratch(U, n)
    flag = _scratch(np.bool_, n)
    if s == 0:
        np.copyto(r, bits)
    else:
        mask = U((1 << s) - 1)
        notmask = U(((1 << W) - 1) ^ ((1 << s) - 1))
        if mode == "nearest_even":
            np.right_shift(bits, U(s), out=r)
            r &= U(1)
            if p.flip_parity:
                r ^= U(1)
            r += U((1 << (s - 1)) - 1)
            r += bits
        elif mode == "nearest_away":
            np.add(bits, U(1 << (s - 1)), out=r)
        elif mode == "nearest_zero":  # add half the quantum less one: exact ties stay down
            np.add(bits, U((1 << (s - 1)) - 1), out=r)
        elif mode == "toward_zero":
            np.copyto(r, bits)
        elif mode in ("up", "down"):
            np.right_shift(bits, U(W - 1), out=r)  # 1 for negative
            if mode == "up":
                r ^= U(1)
            r *= mask
            r += bits
        elif mode == "odd":  # inexact: the neighbour whose code is odd
            np.bitwise_and(bits, mask, out=tmp)
            np.not_equal(tmp, U(0), out=flag)
            np.bitwise_and(bits, notmask, out=r)
            np.right_shift(r, U(s), out=tmp)
            tmp &= U(1)
            if not p.flip_parity:
                tmp ^= U(1)
            tmp *= flag
            tmp <<= U(s)
            r += tmp
        elif mode in ("stochastic_corrected", "stochastic_corrected_odd"):  # SRC: round the s
            # dropped bits to N (ties to even; to odd for stochastic_corrected_odd), then SRFF
            assert rw is not None
            if n:
                low = int(rw[0]) & -int(rw[0])  # the marker bit 2**(63 - N)
                nb = 64 - low.bit_length()
                top = ((rw ^ np.uint64(low)) >> np.uint64(64 - s)).astype(U)
                if nb < s:  # nearest even at the N-th dropped bit (flip_parity: the kept part's)
                    d = s - nb
                    np.right_shift(bits, U(d), out=r)
                    r &= U(1)
                    if mode == "stochastic_corrected_odd":  # a tie goes up from an even fraction
                        r ^= U(1)
                    r += U((1 << (d - 1)) - 1)
                    r += bits
                    r &= U(((1 << W) - 1) ^ ((1 << d) - 1))
                    r += top
                else:
                    np.add(bits, top, out=r)
        elif mode in ("stochastic", "stochastic_offset"):  # add the top s random bits below the
            # kept part (stochastic_offset's words carry SRF's offset bit)
            assert rw is not None
            if W == 32:  # the high halves of the random words, as a strided uint32 view
                words = rw.view(np.uint32)[1::2] if _LITTLE else rw.view(np.uint32)[0::2]
                np.right_shift(words, U(32 - s), out=r)
            else:
                np.right_shift(rw, U(64 - s), out=r)
            r += bits
        else:  # stochastic_equal: inexact -> add a whole quantum iff the top random bit is set
            assert rw is not None
            np.bitwise_and(bits, mask, out=tmp)
            np.not_equal(tmp, U(0), out=flag)
            np.right_shift(rw, np.uint64(63), out=tmp, casting="unsafe")
            tmp &= flag
            tmp <<= U(s)
            np.add(bits, tmp, out=r)
        if masked or mode in ("toward_zero", "odd"):
            r &= notmask
    # flag inputs outside [threshold, maxbits] (one unsigned compare: below wraps around)
    if p.fmt.signed:
        np.bitwise_and(bits, U(p.abs_mask), out=tmp)
    else:  # negative inputs of unsigned formats are out of range too
        np.copyto(tmp, bits)
    tmp -= U(p.threshold)
    if p.all_low:
        flag.fill(True)
    else:
        np.greater(tmp, U(p.maxbits - p.threshold), out=flag)
    if not flag.any():
        return None
    if fast_zero and p.zero_is_fast:  # the fast path already gives ±0 for ±0: no repair
        flag &= tmp != U((1 << W) - p.threshold)
        if not flag.any():
            return None
    idx = np.flatnonzero(flag)
    if not patch:
        return idx
    r[idx] = _patch(p, bits[idx], r[idx] & U(~((1 << s) - 1) & ((1 << W) - 1)), rw, idx)
    return idx


def repair(
    p: _Plan, src: np.ndarray, flagged: list[tuple[np.ndarray, np.ndarray | None]]
) -> tuple[np.ndarray, np.ndarray]:
    """Round the elements flagged by unpatched chunks: (flat indices, their results)."""
    where = np.concatenate([i for i, _ in flagged])
    words = [w for _, w in flagged if w is not None]
    rw = np.concatenate(words) if words else None
    res: np.ndarray = np.empty(where.size, dtype=p.F)

    def work(lo: int, hi: int) -> None:  # in chunks, on all cores: gradients can be mostly tiny
        with np.errstate(all="ignore"):
            _round_float_chunk(p, src[where[lo:hi]], res[lo:hi], None if rw is None else rw[lo:hi])

    for_chunks(where.size, work)
    return where, res


def _patch(
    p: _Plan, b: np.ndarray, res: np.ndarray, rw: np.ndarray | None, idx: np.ndarray
) -> np.ndarray:
    """Results (full bits) for flagged inputs with bits ``b``; ``res`` holds the fast path's."""
    U, fmt = p.U, p.fmt
    if rw is not None:
        rw = rw[idx]
    u = b & U(p.abs_mask)
    sign = b & U(p.sign)
    neg = sign != 0
    low = u < U(p.threshold)
    if low.any():
        res[low] = _low_bits(p, u[low], neg[low], None if rw is None else rw[low]) | sign[low]
    # overflow, inf and NaN (whose fast-path sums may have wrapped around)
    over = (u > U(p.maxbits)) & ((u >= U(p.inf_bits)) | ((res & U(p.abs_mask)) > U(p.maxbits)))
    if over.any():
        res[over] = _special(p, u[over], neg[over])
    nan = (res & U(p.abs_mask)) > U(p.inf_bits)
    if not fmt.signed:  # unsigned: negative inputs are NaN (or clamp to the least value)
        negative = neg & ~((u == 0) & fmt.has_zero) & (u <= U(p.inf_bits))
        if fmt.has_nan:
            nan |= negative
        else:
            res[negative] = U(0) if fmt.has_zero else U(p.least_bits)
        res[nan] = U(p.nan_bits)
    if p.flush and p.all_low:  # every value is subnormal: saturated results flush too
        res[(res & U(p.abs_mask)) < U(p.inf_bits)] &= U(p.sign)
    if fmt.nan == "fnuz" or not fmt.signed:
        res[(res & U(p.abs_mask)) == 0] = U(0)  # no negative zero
    if fmt.nan not in ("ieee", "fn"):  # NaN without sign
        res[nan] = U(p.nan_bits)
    return res


def _low_bits(p: _Plan, u: np.ndarray, neg: np.ndarray, rw: np.ndarray | None) -> np.ndarray:
    """Magnitude bits of results for inputs below ``p.threshold``, in exact float64 arithmetic.

    These are inputs below the format's smallest normal (fixed quantum ``2**p.qexp``) and, for
    formats whose normal range reaches below the working dtype's (e8m0 from float32), inputs that
    are subnormal in the working dtype (quantum from their own binade).
    """
    fmt = p.fmt
    if p.fixed_quantum and p.mode not in STOCHASTIC_MODES:
        # every input here is below 2**emin: k = |x| / q < 2**mantissa_bits is exact in the
        # working dtype, so is its rounding to an integer, and so is k * q
        k = _round_quantum(u.view(p.F), neg, p.qexp, p.mode, None)
        val = np.ldexp(k, p.qexp)
        if p.flush:
            val[val < fmt.smallest_normal] = 0
        return val.view(p.U)
    mag = u.view(p.F).astype(np.float64)
    e = np.frexp(mag)[1] - 1
    qexp = np.where(e >= fmt.emin, e - fmt.mantissa_bits, p.qexp)
    k = _round_quantum(mag, neg, qexp, p.mode, rw)
    if fmt.mantissa_bits == 0 and p.mode in ("nearest_even", "odd"):
        # exponent-only formats: k is 1 or 2 in the normal range, and "even" is the parity of
        # the code (exponent field), not of k
        v = np.ldexp(mag, -qexp)
        code_odd = (e + fmt.bias) % 2 == 1
        pick = (
            np.where(code_odd, 2.0, 1.0)
            if p.mode == "nearest_even"
            else np.where(code_odd, 1.0, 2.0)
        )
        tie_or_inexact = (v == 1.5) if p.mode == "nearest_even" else (v != np.floor(v))
        k = np.where((e >= fmt.emin) & tie_or_inexact, pick, k)
    val = np.ldexp(k, qexp)
    if not fmt.has_zero:  # e8m0: positive values below 2**emin go to 2**emin; zero is NaN
        zero = np.nan if fmt.has_nan else fmt.smallest_normal  # (or the least value)
        val = np.where(mag == 0, zero, np.maximum(val, fmt.smallest_normal))
    if p.flush:
        val[val < fmt.smallest_normal] = 0.0
    return val.astype(p.F).view(p.U)


def _round_int_chunk(
    fmt: IntFormat, mode: str, xc: np.ndarray, out: np.ndarray, rw: np.ndarray | None
) -> None:
    a = xc.astype(np.float64)
    neg = np.signbit(a)
    finite = np.isfinite(a)
    mag = np.where(finite, np.abs(a), 0.0)
    k = _round_quantum(mag, neg, 0, mode, rw)
    val = np.where(neg, -k, k) + 0.0  # integers have no negative zero
    val = np.where(finite, val, np.where(np.isnan(a), np.nan, np.where(neg, -np.inf, np.inf)))
    out[...] = np.clip(val, fmt.min, fmt.max)  # integers saturate; NaN stays NaN


def _round_big_integers(
    n: np.ndarray, fmt: FloatFormat, o: RoundingOptions, rw: np.ndarray | None
) -> np.ndarray:
    """float64 values of int64/uint64 ``n`` (all with ``|n| > 2**53``) rounded once, from the
    exact integer, onto ``fmt``'s grid with an unbounded exponent (the caller applies overflow).

    ``|n| = k * 2**sh + rem`` with ``k`` the ``precision`` leading bits. The mode decides the
    increment of ``k`` by :func:`_round_quantum` on a float64 stand-in ``parity + g`` whose
    fraction ``g`` is ``rem / 2**sh`` rounded to odd at 51 bits (which keeps zero, the tie and
    either side of it); stochastic rounding uses the exact ``floor(rem / 2**sh * 2**64)``.
    """
    neg = n < 0
    mag = n.astype(np.uint64)  # two's complement: negate the negative ones modulo 2**64
    mag = np.where(neg, np.uint64(0) - mag, mag)
    L = np.frexp((mag >> np.uint64(11)).astype(np.float64))[1] + 11  # bit length (> 53)
    m = fmt.mantissa_bits
    sh = (L - (m + 1)).astype(np.uint64)  # 1 <= sh <= 63
    k = mag >> sh
    rem = mag & ((np.uint64(1) << sh) - np.uint64(1))
    assert fmt.bias is not None
    parity = (k & np.uint64(1)) if m else ((L - 1 + fmt.bias) & 1).astype(np.uint64)
    if o.mode in ("stochastic", *SR_VARIANT_MODES):
        assert rw is not None
        inc = _sr_up(rem << (np.uint64(64) - sh), rw, o.mode)
    else:
        cut = np.maximum(sh.astype(np.int64) - 51, 0).astype(np.uint64)
        sticky = (rem & ((np.uint64(1) << cut) - np.uint64(1))) != 0
        g = np.ldexp(((rem >> cut) | sticky).astype(np.float64), -(sh - cut).astype(np.int64))
        kk = _round_quantum(parity + g, neg, 0, o.mode, rw)
        inc = kk.astype(np.uint64) - parity
    val = np.ldexp((k + inc).astype(np.float64), sh.astype(np.int64))
    return np.where(neg, -val, val)


def _round_integers(a: np.ndarray, fmt: FloatFormat | IntFormat, o: RoundingOptions) -> np.ndarray:
    """:func:`round_to` of an integer or bool array: float64 results, each rounded once from the
    exact integer (int64/uint64 beyond 2**53 through :func:`_round_big_integers`)."""
    kw: dict[str, Any] = {"overflow": o.overflow, "subnormals": o.subnormals}
    kw["random_bits"] = o.random_bits
    out = round_to(a.astype(np.float64), fmt, rounding=o.mode, seed=o.seed, **kw)
    if a.dtype.itemsize < 8 or a.dtype.kind == "b" or not isinstance(fmt, FloatFormat):
        return out  # exact in float64 (integer formats saturate long before 2**53)
    flat = a.reshape(-1)
    big = np.flatnonzero(
        (flat > 2**53) | (flat < -(2**53)) if a.dtype.kind == "i" else flat > 2**53
    )
    if big.size:
        rw = o.words(flat.size, 0)
        grid = _round_big_integers(flat[big], fmt, o, None if rw is None else rw[big])
        # the values are on the (unbounded) grid: this only applies the overflow rules
        mode = "nearest_even" if o.mode in STOCHASTIC_MODES else o.mode
        out.reshape(-1)[big] = round_to(grid, fmt, rounding=mode, **kw)
    return out


#: The Python integers round_to takes exactly (numpy's int64 and uint64 together).
_INT_RANGE = (-(2**63), 2**64 - 1)


def _python_integers(x: Any, name: str = "x") -> Any:
    """Python ints (a list, tuple or object array of them; numpy would make float64 of
    ``[-1, 2**63]`` or ``[2**64 - 1, 1]``, rounding them first, and an object array beyond
    uint64) as one int64 or uint64 array; a ValueError naming the first int outside both
    ranges. Anything else is returned as it is."""
    try:
        a = np.array(x, dtype=object)
    except ValueError:  # ragged
        return x
    flat = a.reshape(-1).tolist()
    if not flat or not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return x
    lo, hi = _INT_RANGE
    bad = next((v for v in flat if not lo <= v <= hi), None)
    if bad is not None:
        raise ValueError(
            f"{name} holds the integer {bad}, outside the range round_to rounds exactly "
            f"(-2**63 .. 2**64 - 1, numpy's int64 and uint64): pass float({name}) to round it "
            "through float64 first (two roundings), or scale it into the range"
        )
    if min(flat) >= 0 and max(flat) > 2**63 - 1:
        return np.array(flat, dtype=np.uint64).reshape(a.shape)
    try:
        return np.array(flat, dtype=np.int64).reshape(a.shape)
    except OverflowError:
        raise ValueError(
            f"{name} mixes negative integers and integers above 2**63 - 1: round_to takes "
            "integers exactly as one int64 or one uint64 array; split it, or pass floats"
        ) from None


def round_to(
    x: Any,
    fmt: str | FloatFormat | IntFormat,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
    random_bits: int | None = None,
) -> np.ndarray:
    """Round ``x`` onto the grid of ``fmt``; the result holds the rounded values exactly.

    Parameters
    ----------
    x:
        Array-like of floats (float16, float32, float64, ml_dtypes floats), integers or bools (see
        Returns), any shape, strides or byte order; or any array that speaks DLPack or the
        array API (torch, JAX, CuPy), converted without a copy where possible. It is never
        modified. Masked arrays raise TypeError (pass ``x.filled(...)`` or ``x.data``).
    fmt:
        A format name (``"e4m3"``, ``"bf16"``, ``"int8"``, ml_dtypes names ...) or a format object.
    rounding:
        ``nearest_even`` (default), ``nearest_away``, ``toward_zero``, ``up``, ``down``, ``odd``,
        ``stochastic`` (probability proportional to the distance), ``nearest_zero`` (ties toward
        zero), ``stochastic_equal`` (an inexact value goes up or down with probability 1/2
        each), or the few-bit SR variants ``stochastic_offset`` and ``stochastic_corrected``
        (below); aliases ``rne rna rtz rup rdn rto sr rnz sre srff srf src``.

        Few-bit stochastic rounding (Fitzgibbon & Felix, "On stochastic rounding with few random
        bits", ARITH 2025, arXiv 2504.20634). Let ``x`` be the discarded fraction in units of
        the result's quantum, truncated to 64 bits (``frac64 = floor(x * 2**64)``: exact
        whenever the fraction has at most 64 bits, as every normal-range result from float32 or
        float64 does), and ``n`` the top ``N = random_bits`` bits of the element's random word
        (uniform in ``0 .. 2**N - 1``). Away from zero iff

        * ``stochastic`` (their SRFF, "add the random bits and truncate"):
          ``x + n * 2**-N >= 1``; P(away) = ``floor(x * 2**N) / 2**N``, bias
          ``-2**-(N+1)`` quanta for uniform ``x`` (``2**-(D+1) - 2**-(N+1)`` for fractions of
          ``D >= N`` bits);
        * ``stochastic_offset`` (SRF, the random bits plus half a random unit):
          ``x + (n + 1/2) * 2**-N >= 1``; P(away) = ``floor(x * 2**N + 1/2) / 2**N`` (ties of
          ``x`` at odd multiples of ``2**-(N+1)`` go away); unbiased for uniform real ``x``,
          bias ``+2**-(D+1)`` for fractions of ``D > N`` bits;
        * ``stochastic_corrected`` (SRC, a deterministic rounding first): ``c + n >= 2**N``
          with ``c = round(x * 2**N)`` to nearest, ties to even (``c = 2**N`` always goes
          away); P(away) = ``c / 2**N``; unbiased for uniform ``x`` of ``D`` bits, any ``D``.

        An exact ``x = 0`` never rounds away. With 64 random bits (the default) all three are
        ``stochastic``. The words of the two variants carry the marker bit ``2**(63 - N)``
        (:func:`word_bits`); ``n`` is the same for all three modes.
    overflow:
        P3109's saturation modes ``"sat_finite"``, ``"sat_propagate"`` and ``"sat_none"``
        (also spelt ``"SatFinite"`` ...) run :func:`p3109_project` (P3109 formats only);
        ``"ovf_inf"`` (P3109 3.x's ``OvfInf``) is ``"ieee"``.
        ``"ieee"``: values beyond the largest finite value become inf (NaN in formats without inf,
        such as e4m3) under the round-to-nearest modes, the stochastic modes and the directed mode
        pointing outward, and ``±max`` under ``toward_zero``, ``odd`` and the inward directed mode
        (IEEE 754 clause 7.4); P3109 formats (:func:`follows_p3109`) round with an unbounded
        exponent and overflow to inf under ``odd`` too, as the P3109 interim report's
        ``Saturate`` in its ``OvfInf`` mode and gfloat do (``p3109_k8p4se``: 224.1 and 232 give
        inf, 224 is the max). ``"saturate"``: every overflow, infinities included, clamps to
        ``±max``. Formats with neither inf nor NaN (e2m1, e2m3, e3m2) and integer formats always
        saturate.
    subnormals:
        ``"keep"``, or ``"flush"``: results that would be subnormal become zero (sign kept).
    seed, random_bits:
        For the stochastic modes: an int seed (``None`` draws one) and the number of random bits
        (1..64; ``None`` for exact probabilities). The random word of each element depends only
        on (seed, flat index). The deterministic modes accept and ignore both (so one set of
        options can sweep the modes; ``precision-lab cast --seed`` follows the same rule and
        prints "unused").

    Returns
    -------
    An array of the input's shape, numpy unless ``x`` was another array type (then that type,
    through DLPack / its array namespace); 0-d for scalar or 0-d input. float64 for float64,
    integer and bool input, else float32 when the format's values fit in float32 (every format
    of 16 bits or fewer), else float64. Integers are rounded once from their exact value, also
    int64/uint64 beyond 2**53, and Python ints from -2**63 to 2**64 - 1 (one array holds
    int64 or uint64 values); a Python int outside that range is a ValueError. Bools are 0 and
    1.

    Special values. NaN stays NaN, keeping its sign where the format can hold it (not in fnuz
    formats or formats without NaN: there the result is a positive NaN, which :func:`encode`
    refuses for formats without NaN). ``-0.0`` stays ``-0.0`` except in formats without negative
    zero. Unsigned formats turn negative numbers into NaN, or into their least value when they
    have no NaN (so does zero in a format without zero). In the unsigned e8m0 scale format
    zero is NaN too and positive numbers below 2**-127 become 2**-127; its ties go to the even
    code under ``nearest_even`` (192 -> 128, as gfloat) and away under ``nearest_away``
    (192 -> 256, as ml_dtypes, torch).

    >>> round_to([0.1, 1e6, -1e6], "fp16")
    array([0.09997559,        inf,       -inf])
    >>> round_to([2.5, -2.5, 300.0], "int8", rounding="nearest_away")
    array([   3.,   -3.,  127.])
    >>> float(round_to(192.0, "e8m0")), float(round_to(192.0, "e8m0", rounding="rna"))
    (128.0, 256.0)
    """
    f = get_format(fmt)
    saturation = p3109_saturation(overflow)
    if saturation is not None:
        if subnormals != "keep":
            raise ValueError(
                f"overflow={overflow!r} is a P3109 saturation mode, and P3109 keeps subnormals: "
                f"subnormals must be 'keep', got {subnormals!r}"
            )
        return p3109_project(
            x, f, rounding=rounding, saturation=saturation, seed=seed, random_bits=random_bits
        )
    o = check_options(rounding, overflow, subnormals, seed, random_bits)
    if isinstance(x, int | list | tuple) and not isinstance(x, bool):
        x = _python_integers(x)
    x, restore = as_input(x)
    if not is_device_array(x) and x.dtype == object:
        x = _python_integers(x)
    if not is_device_array(x) and x.dtype.kind in "biu":
        return restore(_round_integers(x, f, o))  # type: ignore[no-any-return]
    served = route("round_to", x, f, o)
    if served is not None:
        return restore(served)  # type: ignore[no-any-return]
    a = as_float_array(x)
    wdt = working_dtype(a.dtype, f)
    src = np.ascontiguousarray(a).reshape(-1)
    out = np.empty(a.shape, dtype=wdt)
    flat = out.reshape(-1)
    flagged: list[tuple[np.ndarray, np.ndarray | None]] = []

    if isinstance(f, IntFormat):

        def work(lo: int, hi: int) -> None:
            rw = o.words(hi - lo, lo)
            with np.errstate(all="ignore"):
                _round_int_chunk(f, o.mode, src[lo:hi], flat[lo:hi], rw)

    else:
        p = _plan(f, wdt.name, o.mode, o.overflow, o.subnormals == "flush")

        def work(lo: int, hi: int) -> None:
            rw = o.words(hi - lo, lo)
            with np.errstate(all="ignore"):
                idx = _round_float_chunk(p, src[lo:hi], flat[lo:hi], rw, patch=False)
            if idx is not None:
                flagged.append((idx + lo, None if rw is None else rw[idx]))

    for_chunks(src.size, work)
    if flagged:
        with np.errstate(all="ignore"):
            where, res = repair(p, src, flagged)
        flat[where] = res
    return restore(out)  # type: ignore[no-any-return]


def round_with_words(
    x: Any,
    fmt: str | FloatFormat,
    words: Any,
    *,
    rounding: str = "stochastic",
    overflow: str = "ieee",
    subnormals: str = "keep",
    random_bits: int | None = None,
) -> np.ndarray:
    """:func:`round_to` in a stochastic mode with the caller's random words instead of seeded ones.

    ``words`` (uint64, broadcast to x's shape) stand for the elements' 64-bit counter-based words:
    they are masked to their top ``random_bits`` bits (and carry the SR variants' marker bit)
    exactly as seeded words are, so ``round_with_words(x, f, random_words(s, x.size))`` is
    ``round_to(x, f, seed=s)``. It is how every outcome of a few-bit rounding is enumerated:
    the words ``n << (64 - N)`` for ``n`` in ``0 .. 2**N - 1``. The numpy reference computes it
    (float inputs; a float format).

    >>> import numpy as np
    >>> n = np.arange(4, dtype=np.uint64) << np.uint64(62)   # all four 2-bit words
    >>> x = np.full(4, 1.0 + 3 * 2**-10)                     # 3/8 of a bf16 quantum above 1
    >>> round_with_words(x, "bf16", n, random_bits=2).tolist()  # SRFF: floor(3/8 * 4) = 1 of 4
    [1.0, 1.0, 1.0, 1.0078125]
    >>> round_with_words(x, "bf16", n, rounding="src", random_bits=2).tolist()  # round(1.5) = 2
    [1.0, 1.0, 1.0078125, 1.0078125]
    """
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise TypeError(f"fmt must be a float format, got {f}")
    o = check_options(rounding, overflow, subnormals, 0, random_bits)
    if o.mode not in STOCHASTIC_MODES:
        raise ValueError(
            f"rounding must be a stochastic mode ({', '.join(STOCHASTIC_MODES)}), got {rounding!r}"
        )
    a = as_float_array(x)
    w = np.asarray(words)
    if w.dtype.kind not in "ui":
        raise TypeError(f"words must hold unsigned 64-bit integers, got {w.dtype}")
    rw = np.ascontiguousarray(np.broadcast_to(w.astype(np.uint64), a.shape)).reshape(-1)
    n_bits = o.random_bits
    if n_bits < 64:
        rw = rw & np.uint64(((1 << 64) - 1) ^ ((1 << (64 - n_bits)) - 1))
    coded = word_bits(o.mode, n_bits)
    if coded > 64:
        rw = rw | np.uint64(1 << (63 - n_bits))
    wdt = working_dtype(a.dtype, f)
    src = np.ascontiguousarray(a).reshape(-1)
    out = np.empty(a.shape, dtype=wdt)
    p = _plan(f, wdt.name, o.mode, o.overflow, o.subnormals == "flush")
    with np.errstate(all="ignore"):
        _round_float_chunk(p, src, out.reshape(-1), rw)
    return out


def p3109_saturation(overflow: Any) -> str | None:
    """The P3109 saturation mode an ``overflow`` option names (``"sat_none"``, ``"SatNone"``,
    ``"satnone"`` ...: :data:`P3109_SATURATION_MODES`), or None for any other value.

    >>> p3109_saturation("SatPropagate"), p3109_saturation("saturate")
    ('sat_propagate', None)
    """
    if not isinstance(overflow, str):
        return None
    return _SATURATION_NAMES.get(overflow.strip().lower().replace("_", ""))


_MIRROR = {"up": "down", "down": "up"}


def p3109_project(
    x: Any,
    fmt: str | FloatFormat | IntFormat,
    *,
    rounding: str = "nearest_even",
    saturation: str = "sat_none",
    seed: int | None = None,
    random_bits: int | None = None,
) -> np.ndarray:
    """P3109's ``Project``: round ``x`` with an unbounded exponent, then saturate as the
    IEEE P3109 interim report 4.0 specifies (4.7.3 ``ωProject``, 4.7.5 ``ωSaturate``).

    ``round_to(x, fmt, overflow=saturation)`` is the same call. ``fmt`` must be a P3109 format
    (:func:`follows_p3109`: ``pl.p3109(k, p, ...)``, ``"p3109_k8p3se"``, also ``e4m3fnuz`` and
    ``e5m2fnuz``). ``rounding`` takes every mode of :func:`round_to` (P3109's StochasticA/B/C
    are ``stochastic``, ``stochastic_offset``, ``stochastic_corrected``, with ``random_bits``
    as N). Let ``R`` be the rounded value (its sign is ``x``'s, 0 has none) and ``Mlo``,
    ``Mhi`` the least and largest finite values (``Mlo = 0`` in unsigned formats). NaN stays
    NaN, values in ``[Mlo, Mhi]`` stay, and

    * ``"sat_finite"`` (SatFinite): everything else clamps to ``Mlo`` or ``Mhi``, ``±inf``
      included (in an unsigned format every negative input gives 0);
    * ``"sat_propagate"`` (SatPropagate): as sat_finite, but ``+inf`` stays ``+inf`` in the
      extended domain and ``-inf`` stays ``-inf`` in signed extended formats;
    * ``"sat_none"`` (SatNone, 3.x's ``OvfInf``): ``R > Mhi`` gives ``Mhi`` under
      ``toward_zero`` and ``down``, and in unsigned extended formats under ``odd``, else
      ``+inf`` in the extended domain and ``Mhi`` in the finite one; ``R < Mlo`` in a signed
      format gives ``Mlo`` under ``toward_zero`` and ``up``, else ``-inf`` (extended) or
      ``Mlo`` (finite); in an unsigned format ``R < 0`` and ``-inf`` give NaN, but 0 under
      ``toward_zero`` and ``up`` (``-inf`` excepted).

    Where this differs from ``overflow="ieee"`` (which is gfloat 0.5.2's ``sat=False``, the
    3.x rules): the finite domain (4.0 saturates, ieee gives NaN), unsigned formats (negative
    inputs give NaN under ieee whatever they round to; ``-1e-9`` rounds to 0 and gives 0 here)
    and ``odd`` in unsigned extended formats (ieee: inf).

    Returns the values as :func:`round_to` does (``pl.encode(result, fmt)`` gives the codes).

    >>> import numpy as np
    >>> x = np.array([1e6, -np.inf, -1.0])
    >>> p3109_project(x, "p3109_k8p3se", saturation="sat_propagate").tolist()
    [49152.0, -inf, -1.0]
    >>> p3109_project(x, "p3109_k8p3sf", saturation="sat_none").tolist()
    [57344.0, -57344.0, -1.0]
    >>> p3109_project([-1e-11, -1.0], "p3109_k8p3ue", saturation="sat_none").tolist()
    [0.0, nan]
    """
    f = get_format(fmt)
    sat = p3109_saturation(saturation)
    if sat is None:
        raise ValueError(
            f"saturation must be one of {', '.join(map(repr, P3109_SATURATION_MODES))} "
            f"(or SatFinite, SatPropagate, SatNone), got {saturation!r}"
        )
    if not isinstance(f, FloatFormat) or not follows_p3109(f):
        raise ValueError(
            f"fmt must be a P3109 format (pl.p3109(k, p, ...), 'p3109_k8p3se' ...) for the "
            f"P3109 saturation mode {sat!r}, got {f}"
        )
    mode = check_rounding(rounding)
    xa, restore = as_input(x)
    if is_device_array(xa):
        raise ValueError("P3109 saturation modes are computed by numpy: pass a numpy array")
    kw: dict[str, Any] = {"rounding": mode, "seed": seed, "random_bits": random_bits}
    if is_stochastic(mode) and seed is None:
        kw["seed"] = check_seed(None)  # one seed for every rounding below (the same words)
    clamped = round_to(xa, f, overflow="saturate", **kw)
    v = np.asarray(xa)
    if v.dtype == object:
        v = v.astype(np.float64)
    with np.errstate(invalid="ignore"):
        is_inf = np.isinf(v) if v.dtype.kind == "f" else np.zeros(v.shape, dtype=bool)
        neg = v < 0
    out = np.array(clamped, copy=True)
    if sat == "sat_propagate" and f.has_inf:
        keep = is_inf & (~neg | f.signed)
        out[keep] = v[keep]
    elif sat == "sat_none" and f.has_inf:  # extended: overflow to inf (ieee's, P3109 rules)
        ieee = np.asarray(round_to(xa, f, overflow="ieee", **kw))
        take = ~neg if not f.signed else np.ones(v.shape, dtype=bool)
        if not f.signed and mode == "odd":  # unsigned extended, ToOdd: Mhi (R > Mhi only)
            take &= is_inf
        out[take] = ieee[take]
    if not f.signed and neg.any():
        out[neg] = 0.0
        if sat == "sat_none":  # R < 0: NaN, unless R = 0 or the mode points to 0
            mirror = _MIRROR.get(mode, mode)
            mag = np.asarray(round_to(-v, f, overflow="saturate", **{**kw, "rounding": mirror}))
            nan = neg & ((mag != 0) | is_inf)
            if mode in ("toward_zero", "up"):
                nan &= is_inf
            out[nan] = np.nan
    return restore(out)  # type: ignore[no-any-return]
