"""What a format does to numbers: underflow statistics, loss-scale choice, error measures, bounds.

* :func:`underflow_stats`: cast (scaled) gradients to a format with the rounding core, once, and
  count what vanished, what went subnormal, what overflowed; errors and a log2 histogram.
* :func:`zero_threshold` and :func:`analytic_zero_fraction`: the exact magnitude below which a
  format's rounding gives zero, and the zero fraction of log-normal values in closed form.
* :func:`pick_loss_scale`: the largest power-of-two loss scale that keeps ``max|g| * S`` below
  ``fmt.max`` by a margin (Micikevicius et al. 2018), or the smallest that meets a target
  underflow fraction, with the reason.
* :func:`error_stats`: absolute, relative, ULP, normwise errors and SNR of an approximation;
  :func:`quant_error`: relative quadratic error, QSNR (dB) and effective bits, per tensor or per
  block (the measures of the FP4 papers).
* :func:`gamma_n`, :func:`sqrt_n_u`: the worst-case bound ``n u / (1 - n u)`` and the
  probabilistic ``sqrt(n) u`` of a length-n sum or dot product (Higham 2002; Higham & Mary 2019).

>>> import numpy as np
>>> st = underflow_stats(np.array([1e-8, 1e-3, 1e5], dtype=np.float32), "fp16")
>>> st.zero_fraction, st.overflow_fraction
(0.3333333333333333, 0.3333333333333333)
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.exact import odd_collapse, two_product_error
from ..core.formats import FloatFormat, get_format
from ..core.rounding import as_float_array, check_rounding, for_chunks, is_stochastic, round_to

__all__ = [
    "ErrorStats",
    "LossScaleChoice",
    "QuantError",
    "UnderflowStats",
    "analytic_zero_fraction",
    "error_stats",
    "gamma_n",
    "pick_loss_scale",
    "quant_error",
    "sqrt_n_u",
    "underflow_stats",
    "zero_threshold",
]


def _float_format(fmt: Any, name: str = "fmt") -> FloatFormat:
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise TypeError(f"{name} must be a floating-point format, got {f} (an integer format)")
    return f


def _check_scale(scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, int | float | np.integer | np.floating):
        raise TypeError(f"scale must be a positive finite number, got {scale!r}")
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return s


def _is_pow2(s: float) -> bool:
    return math.frexp(s)[0] == 0.5


# ----------------------------------------------------------------------------------------------
# thresholds and closed forms
# ----------------------------------------------------------------------------------------------


def zero_threshold(
    fmt: str | FloatFormat,
    rounding: str = "nearest_even",
    subnormals: str = "keep",
) -> tuple[float, bool]:
    """The magnitude ``t`` at which rounding to ``fmt`` starts giving zero, and whether ``t``
    itself goes to zero: ``|x| <= t`` (inclusive) or ``|x| < t`` gives ``±0``.

    For ``nearest_even`` it is half the smallest subnormal, inclusive (the tie goes to the even
    value 0): ``2**-25`` for fp16. ``nearest_away``: the same, exclusive. ``toward_zero``: the
    smallest subnormal, exclusive. With ``subnormals="flush"`` every result below the smallest
    normal becomes zero. The directed modes ``up``/``down``, ``odd`` and ``stochastic`` have no
    magnitude threshold (ValueError).

    >>> zero_threshold("fp16")
    (2.9802322387695312e-08, True)
    >>> zero_threshold("e4m3", "toward_zero", "flush")
    (0.015625, False)
    """
    f = _float_format(fmt)
    mode = check_rounding(rounding)
    if subnormals not in ("keep", "flush"):
        raise ValueError(f"subnormals must be 'keep' or 'flush', got {subnormals!r}")
    if not f.has_zero:
        raise ValueError(f"{f} has no zero: nothing rounds to zero")
    q = f.smallest_subnormal  # the quantum below the smallest normal
    sn = f.smallest_normal
    flush = subnormals == "flush" and f.has_subnormals and f.mantissa_bits > 0
    if mode == "nearest_even":
        return (sn - q / 2, False) if flush else (q / 2, True)
    if mode == "nearest_away":
        return (sn - q / 2, False) if flush else (q / 2, False)
    if mode == "toward_zero":
        return (sn, False) if flush else (q, False)
    raise ValueError(
        f"rounding={mode!r} has no magnitude threshold to zero (it depends on the sign or is "
        "random); use nearest_even, nearest_away or toward_zero"
    )


def _phi(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def analytic_zero_fraction(
    mu: float,
    sigma: float,
    fmt: str | FloatFormat,
    scale: float = 1.0,
    *,
    rounding: str = "nearest_even",
    subnormals: str = "keep",
) -> float:
    """Fraction of log-normal values (``log2|g| ~ N(mu, sigma)``) that ``scale * g`` rounded to
    ``fmt`` turns into zero: ``Phi((log2(t / scale) - mu) / sigma)``, t from
    :func:`zero_threshold`.

    >>> round(analytic_zero_fraction(-25.0, 3.0, "fp16"), 6)
    0.5
    >>> round(analytic_zero_fraction(-25.0, 3.0, "fp16", scale=2.0**9), 4)
    0.0013
    """
    t, _ = zero_threshold(fmt, rounding, subnormals)
    s = _check_scale(scale)
    if not (sigma > 0):
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    return _phi((math.log2(t / s) - mu) / sigma)


# ----------------------------------------------------------------------------------------------
# underflow statistics
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnderflowStats:
    """What casting ``scale * grads`` to ``fmt`` did (fractions are of the non-zero finite inputs).

    ``hist_log2[i]`` is the bin ``[2**k, 2**(k+1))`` with ``k = hist_log2[i]`` of the *unscaled*
    input magnitudes; ``hist_counts``, ``hist_zero``, ``hist_subnormal`` count the inputs in each
    bin, and those of them that became zero or subnormal.
    """

    fmt: str
    scale: float
    rounding: str
    n: int  #: number of inputs
    n_nonzero: int  #: non-zero finite inputs (the denominator of the fractions)
    n_nonfinite: int  #: inf/NaN inputs (not counted anywhere else)
    zero_fraction: float  #: became ±0
    subnormal_fraction: float  #: became a non-zero subnormal of fmt
    overflow_fraction: float  #: overflowed (to inf/NaN, or to ±max when saturating)
    rel_l1_error: float  #: ``sum|q/scale - g| / sum|g|`` over inputs that did not overflow
    rel_l2_error: float  #: ``||q/scale - g||_2 / ||g||_2`` over inputs that did not overflow
    hist_log2: np.ndarray = field(repr=False)
    hist_counts: np.ndarray = field(repr=False)
    hist_zero: np.ndarray = field(repr=False)
    hist_subnormal: np.ndarray = field(repr=False)

    @property
    def lost_fraction(self) -> float:
        """Zero plus overflow: values whose information is gone."""
        return self.zero_fraction + self.overflow_fraction

    def summary(self) -> str:
        """One line for reports."""
        return (
            f"{self.fmt} x{self.scale:g}: {100 * self.zero_fraction:.3g}% -> 0, "
            f"{100 * self.subnormal_fraction:.3g}% subnormal, "
            f"{100 * self.overflow_fraction:.3g}% overflow (of {self.n_nonzero} non-zero)"
        )


def _wide(f: FloatFormat) -> FloatFormat:
    """The format with one more exponent bit, same bias: fmt's grid with an unbounded top."""
    return FloatFormat(
        f.exponent_bits + 1,
        f.mantissa_bits,
        bias=f.bias,
        nan="ieee",
        has_inf=True,
        has_subnormals=f.has_subnormals,
    )


def underflow_stats(
    grads: Any,
    fmt: str | FloatFormat,
    scale: float = 1.0,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> UnderflowStats:
    """Cast ``scale * grads`` to ``fmt`` (once, with :func:`~precision_lab.round_to`) and count
    what happened to the non-zero values.

    Parameters
    ----------
    grads:
        Array-like of floats (any shape; float32 or float64 preferred). Not modified.
    fmt:
        A floating-point format.
    scale:
        The loss scale ``S`` (positive, finite). ``scale * grads`` is rounded once, from its
        exact value: for a power-of-two ``S`` it is exact (in float32 for float32 input when
        the format cannot see below float32's normal range), for another ``S`` it is formed as
        its float64 round-to-odd (``_odd_product``), which every format of at most 51
        significant bits rounds as it would the exact product. Products beyond float64's range
        count as overflow.
    rounding, overflow, subnormals, seed:
        As in :func:`~precision_lab.round_to`.

    Notes
    -----
    Overflow means that the result with an unbounded exponent would exceed ``fmt.max`` (IEEE
    754's definition): the value became inf/NaN, or ±max under ``overflow="saturate"``, the
    inward directed modes and ``toward_zero``; for stochastic rounding, ``|S g| > fmt.max``.

    Examples
    --------
    >>> g = np.array([2.0**-26, 2.0**-25, 2.0**-24, 0.0, 1.0], dtype=np.float32)
    >>> st = underflow_stats(g, "fp16")
    >>> st.n_nonzero, st.zero_fraction, st.subnormal_fraction
    (4, 0.5, 0.25)
    >>> underflow_stats(g, "fp16", scale=2.0).zero_fraction
    0.25
    """
    f = _float_format(fmt)
    s = _check_scale(scale)
    mode = check_rounding(rounding)
    x = as_float_array(grads, "grads")
    flat = np.ascontiguousarray(x).reshape(-1)
    if flat.dtype == np.float16:
        flat = flat.astype(np.float32)  # exact
    pow2 = _is_pow2(s)
    # x * S in float32 is exact for a power-of-two S unless it lands below float32's normal
    # range; that only matters to formats that see values down there, or to modes that do not
    # send such tiny values to zero anyway
    f32_ok = (
        flat.dtype == np.float32
        and pow2
        and mode in ("nearest_even", "nearest_away", "toward_zero")
        and f.smallest_subnormal / 2 >= 2.0**-126
    )
    if s == 1.0:
        xs = flat
    elif f32_ok:
        with np.errstate(over="ignore"):
            xs = flat * np.float32(s)
    else:
        xs = _odd_product(flat.astype(np.float64), s)
    q = round_to(xs, f, rounding=mode, overflow=overflow, subnormals=subnormals, seed=seed)
    if q.dtype != xs.dtype:  # formats wider than float32 from float32 input
        xs = xs.astype(q.dtype)
    acc = _Accumulator(flat, xs, q, f, mode)
    with np.errstate(all="ignore"):
        for_chunks(flat.size, acc.work, chunk=1 << 16)
    return acc.result(s, str(f), mode)


_Term = tuple[float, int]  # the value m * 2**e


class _ScaledSums:
    """Sums of non-negative terms kept as ``m * 2**e`` (float m, int e): no overflow or
    underflow whatever the magnitudes (float64 sums of squares of 1e-160 or 1e160 do both).

    :meth:`of` gives ``sum|v|`` and ``sum v**2`` of a chunk after scaling ``v`` by the power of
    two that brings its largest magnitude to [0.5, 1); terms it makes underflow are below
    ``2**-1074`` of the largest one (of its square: ``2**-1074`` of the largest square), far
    below the sums' float64 rounding. :meth:`add` adds such terms into running totals.

    >>> t = _ScaledSums(1)
    >>> t.add(_ScaledSums.of(np.ldexp([3.0, 4.0], -700))[1])  # 25 * 2**-1400: below float64
    >>> _ratio(t.terms[0], _ScaledSums.of(np.ldexp([5.0], -700))[1], sqrt=True)
    1.0
    """

    def __init__(self, n: int) -> None:
        self.terms: list[_Term] = [(0.0, 0)] * n

    @staticmethod
    def of(v: np.ndarray) -> tuple[_Term, _Term]:
        """(sum|v|, sum v**2) of finite float64 ``v`` as ``(m, e)`` pairs."""
        top = float(np.max(np.abs(v))) if v.size else 0.0
        if top == 0:
            return (0.0, 0), (0.0, 0)
        e = math.frexp(top)[1]
        w = np.ldexp(v.astype(np.float64, copy=False), -e)  # exact but for negligible terms
        return (float(np.abs(w).sum()), e), (float(np.dot(w, w)), 2 * e)

    def add(self, *terms: _Term) -> None:
        """Add one term to each running total (in order)."""
        self.terms = [_add_scaled(a, b) for a, b in zip(self.terms, terms, strict=True)]


def _add_scaled(a: _Term, b: _Term) -> _Term:
    if a[0] == 0:
        return b
    if b[0] == 0:
        return a
    e = max(a[1], b[1])
    return math.ldexp(a[0], a[1] - e) + math.ldexp(b[0], b[1] - e), e


def _ratio(num: _Term, den: _Term, *, sqrt: bool = False) -> float:
    """``num / den`` (its square root with ``sqrt``) of two scaled sums; 0.0 when den is 0, inf
    beyond float64's range."""
    if den[0] == 0:
        return 0.0 if num[0] == 0 else math.inf
    if num[0] == 0 or math.isnan(num[0]) or math.isnan(den[0]):
        return 0.0 if num[0] == 0 else math.nan
    m, e = num[0] / den[0], num[1] - den[1]
    if sqrt:  # e is even for sums of squares
        m, e = (math.sqrt(m), e // 2) if e % 2 == 0 else (math.sqrt(2 * m), (e - 1) // 2)
    try:
        return math.ldexp(m, e)
    except OverflowError:
        return math.inf


def _odd_product(x: np.ndarray, s: float) -> np.ndarray:
    """``x * s`` (float64 x, s > 0) as the float64 round-to-odd of the exact product.

    Rounding the result to a format of at most 51 significant bits, in any mode, gives the
    rounding of the exact product (Boldo & Melquiond: round-to-odd at p + 2 bits, then to p
    bits). The product of the frexp mantissas (in [1/4, 1)) and its exact error (Dekker) never
    under- or overflow; scaling back by the exponents is exact within float64's normal range;
    beyond it the result is ±inf (an overflow in every format), and below it the value is
    rounded to float64's subnormals (only formats reaching down there, such as fp64, see the
    difference) but never to zero.

    >>> x = np.array([1.0 / 3.0, -1e-321, 1e308])
    >>> p = _odd_product(x, 3.0)       # 3 * fl(1/3) is just below 1: its round-to-odd too
    >>> bool(p[0] < 1.0), float(np.nextafter(p[0], 2.0)), float(p[1]), float(p[2])
    (True, 1.0, -3e-321, inf)
    """
    ms, es = math.frexp(s)
    out = np.empty(x.shape)

    def work(lo: int, hi: int) -> None:  # in cache-sized chunks, on all cores
        xc = x[lo:hi]
        finite = np.isfinite(xc)
        mx, ex = np.frexp(np.where(finite, xc, 0.0))
        p = mx * ms
        z = odd_collapse(p, two_product_error(mx, np.float64(ms), p))
        o = np.where(finite, np.ldexp(z, ex + es), xc * s)
        lost = (o == 0) & (xc != 0)  # below float64's subnormals: keep sign and non-zero
        if lost.any():
            o[lost] = np.copysign(math.ulp(0.0), xc[lost])
        out[lo:hi] = o

    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for_chunks(x.size, work)
    return out


def _bits(v: float, dt: np.dtype) -> int:
    U = np.uint32 if dt == np.float32 else np.uint64
    return int(np.array(v, dtype=dt).view(U))


class _Accumulator:
    """Chunk worker of :func:`underflow_stats`: one bincount of (input exponent, result class).

    Result classes: 0 normal, 1 subnormal, 2 zero, 3 at or beyond fmt.max (inf/NaN included).
    Errors are accumulated in the scaled domain (``q - S x`` against ``S x``): the relative L1
    and L2 errors are the same. The sums are kept as scaled sums (:class:`_ScaledSums`), so
    they neither overflow nor underflow for any finite input and scale.
    """

    def __init__(
        self,
        x: np.ndarray,
        xs: np.ndarray,
        q: np.ndarray,
        f: FloatFormat,
        mode: str,
    ) -> None:
        self.x, self.xs, self.q, self.f, self.mode = x, xs, q, f, mode
        xw = 32 if x.dtype == np.float32 else 64
        self.XU = np.uint32 if xw == 32 else np.uint64
        self.xsh = 23 if xw == 32 else 52
        self.xbias = 127 if xw == 32 else 1023
        self.xexpall = 255 if xw == 32 else 2047
        self.xabs = self.XU((1 << (xw - 1)) - 1)
        self.kmin = 1 - self.xbias - self.xsh  # exponent of the smallest subnormal of x's dtype
        qw = 32 if q.dtype == np.float32 else 64
        self.QU = np.uint32 if qw == 32 else np.uint64
        self.qabs = self.QU((1 << (qw - 1)) - 1)
        self.snb = self.QU(_bits(f.smallest_normal, q.dtype))
        self.maxb = self.QU(_bits(f.max, q.dtype))
        nbins = self.xexpall + 1
        self.counts = np.zeros((nbins, 4), dtype=np.int64)
        # exact log2 bins of inputs that are subnormal in their own dtype (rare)
        self.fine = np.zeros((self.xbias + self.xsh, 4), dtype=np.int64)
        self.n_xzero = 0
        self.n_over = 0
        self.sums = _ScaledSums(4)  # sum|d|, sum d^2, sum|xs|, sum xs^2
        self.lock = threading.Lock()

    def _classes(self, qc: np.ndarray) -> np.ndarray:
        qb = qc.view(self.QU) & self.qabs
        cls = (qb < self.snb).view(np.uint8) + (qb == 0).view(np.uint8)
        cls += (qb >= self.maxb).view(np.uint8) * np.uint8(3)
        return cls

    def work(self, lo: int, hi: int) -> None:
        xc, xsc, qc = self.x[lo:hi], self.xs[lo:hi], self.q[lo:hi]
        xb = xc.view(self.XU) & self.xabs
        ex = xb >> self.XU(self.xsh)
        cls = self._classes(qc)
        key = (ex << self.XU(2)) | cls
        counts = np.bincount(key, minlength=4 * (self.xexpall + 1)).reshape(-1, 4)
        n_xzero = (hi - lo) - int(np.count_nonzero(xb))
        fine = None
        if counts[0].sum() > n_xzero:  # inputs subnormal in their dtype: exact exponents
            idx = np.flatnonzero((ex == 0) & (xb != 0))
            k = np.frexp(xc[idx])[1].astype(np.int64) - 1 - self.kmin
            fine = np.bincount(k * 4 + cls[idx], minlength=self.fine.size).reshape(-1, 4)
        n_over = 0
        if counts[:, 3].any():
            finite = ex != self.xexpall
            cand = np.flatnonzero((cls == 3) & finite & (xb != 0))
            over = np.zeros(hi - lo, dtype=bool)
            if cand.size:
                over_c = self._overflowed(xsc[cand])
                over[cand[over_c]] = True
                n_over = int(np.count_nonzero(over_c))
            ok = finite & ~over
            d = np.where(ok, qc - xsc.astype(np.float64), 0.0)
            xo = np.where(ok, xsc, 0.0)
        else:
            d = qc - xsc.astype(np.float64)  # q - S x: correctly rounded (exact in most cases)
            xo = xsc
        sums = (*_ScaledSums.of(d), *_ScaledSums.of(xo))
        with self.lock:
            self.counts += counts
            if fine is not None:
                self.fine += fine
            self.n_xzero += n_xzero
            self.n_over += n_over
            self.sums.add(*sums)

    def _overflowed(self, v: np.ndarray) -> np.ndarray:
        """IEEE overflow of the scaled values v (candidates: result at or beyond fmt.max)."""
        f = self.f
        big = np.abs(v.astype(np.float64)) > f.max
        if is_stochastic(self.mode):
            return big
        out = np.zeros(v.shape, dtype=bool)
        if big.any():
            unbounded = round_to(v[big].astype(np.float64), _wide(f), rounding=self.mode)
            out[big] = ~(np.abs(unbounded) <= f.max)
        return out

    def result(self, s: float, fmt: str, mode: str) -> UnderflowStats:
        cnt = self.counts
        n = int(cnt.sum())
        n_nonfinite = int(cnt[self.xexpall].sum())
        n_nz = n - n_nonfinite - self.n_xzero
        n_zero = int(cnt[: self.xexpall, 2].sum()) - self.n_xzero
        n_sub = int(cnt[: self.xexpall, 1].sum())
        # histogram over k = floor(log2|x|): normal bins from the exponent field, plus fine bins
        k_all = np.arange(self.kmin, self.xexpall - self.xbias, dtype=np.int64)
        h = np.zeros((k_all.size, 4), dtype=np.int64)
        h[: self.fine.shape[0]] += self.fine
        h[1 - self.xbias - self.kmin :] += cnt[1 : self.xexpall]
        tot = h.sum(axis=1)
        used = np.flatnonzero(tot)
        lo_b, hi_b = (int(used[0]), int(used[-1]) + 1) if used.size else (0, 0)
        l1d, l2d, l1x, l2x = self.sums.terms
        denom = max(n_nz, 1)
        return UnderflowStats(
            fmt=fmt,
            scale=s,
            rounding=mode,
            n=n,
            n_nonzero=n_nz,
            n_nonfinite=n_nonfinite,
            zero_fraction=n_zero / denom,
            subnormal_fraction=n_sub / denom,
            overflow_fraction=self.n_over / denom,
            rel_l1_error=_ratio(l1d, l1x),
            rel_l2_error=_ratio(l2d, l2x, sqrt=True),
            hist_log2=k_all[lo_b:hi_b],
            hist_counts=tot[lo_b:hi_b],
            hist_zero=h[lo_b:hi_b, 2],
            hist_subnormal=h[lo_b:hi_b, 1],
        )


# ----------------------------------------------------------------------------------------------
# loss-scale choice
# ----------------------------------------------------------------------------------------------


def _scale_range(scale_dtype: Any) -> tuple[int, int, str]:
    """``(lo, hi, name)``: the exponents of the normal powers of two of the float dtype a loss
    scale is kept in (float32: 2**-126 .. 2**127)."""
    try:
        dt = np.dtype(scale_dtype)
    except TypeError as exc:
        raise TypeError(
            f"scale_dtype must be a float dtype (float16, float32 or float64), got {scale_dtype!r}"
        ) from exc
    if dt not in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(
            f"scale_dtype must be a float dtype (float16, float32 or float64), got {dt.name}"
        )
    fi = np.finfo(dt)
    return int(fi.minexp), int(fi.maxexp) - 1, dt.name


def _ldexp(x: float, k: int) -> float:
    """``x * 2**k``, inf beyond float64's range (math.ldexp raises OverflowError there)."""
    try:
        return math.ldexp(x, k)
    except OverflowError:
        return math.copysign(math.inf, x)


@dataclass(frozen=True)
class LossScaleChoice:
    """A loss scale ``scale = 2**log2_scale`` and why (see :func:`pick_loss_scale`)."""

    scale: float
    log2_scale: int
    rule: str  #: "max" (Micikevicius et al.) or "underflow" (target met) or "underflow-unmet"
    reason: str
    max_abs: float  #: ``max |g|`` of the (finite) gradients
    headroom_log2: float  #: binades left before overflow, ``log2(fmt.max / (max|g| * scale))``
    zero_fraction: float
    subnormal_fraction: float
    overflow_fraction: float
    #: the rule asked for a larger scale than ``scale_dtype`` holds: capped at its largest power
    #: of two (the reason says so)
    capped: bool = False

    def __float__(self) -> float:
        return self.scale


def pick_loss_scale(
    grads: Any,
    fmt: str | FloatFormat = "fp16",
    *,
    margin: int = 1,
    target_underflow: float | None = None,
    rounding: str = "nearest_even",
    subnormals: str = "keep",
    scale_dtype: Any = "float32",
) -> LossScaleChoice:
    """Choose a power-of-two loss scale for ``grads`` in ``fmt``.

    Default rule (Micikevicius et al. 2018): the largest ``S = 2**k`` with
    ``max|g| * S <= fmt.max / 2**margin`` (``margin`` binades of headroom for the gradients to
    grow). With ``target_underflow``: the smallest ``S`` (so the most headroom) whose zero
    fraction is at most the target, never above the max rule's ``S``; if even that ``S`` misses
    the target, it is returned with ``rule="underflow-unmet"``.

    Scales are the normal powers of two of ``scale_dtype``, the type the scale is kept in:
    float32 by default, as PyTorch's ``GradScaler``, Keras, Megatron-LM and Transformer Engine
    keep it (``2**-126 .. 2**127``; ``"float64"`` for Apex/DeepSpeed's Python floats,
    ``2**-1022 .. 2**1023``). A rule that asks for more is capped at the largest one, with
    ``capped=True`` and the reason saying so (bf16 gradients often ask for ``2**130`` and
    more: bf16 shares float32's exponent range); a ``margin`` that asks for less than the
    smallest is a ValueError.

    >>> g = np.array([3.0e-7, 1.0e-3, 2.0], dtype=np.float32)
    >>> c = pick_loss_scale(g, "fp16")
    >>> c.scale, c.rule
    (8192.0, 'max')
    >>> pick_loss_scale(g, "fp16", target_underflow=0.0).scale  # 3e-7 * S > 2**-25
    0.125
    >>> tiny = g * 1e-20                   # bf16 would take 2**192: a float32 scale stops at 2**127
    >>> c, c64 = pick_loss_scale(tiny, "bf16"), pick_loss_scale(tiny, "bf16", scale_dtype="float64")
    >>> c.log2_scale, c.capped, c64.log2_scale
    (127, True, 192)
    """
    f = _float_format(fmt)
    s_lo, s_hi, s_name = _scale_range(scale_dtype)
    mode = check_rounding(rounding)
    if isinstance(margin, bool) or not isinstance(margin, int | np.integer):
        raise TypeError(f"margin must be an integer number of binades, got {margin!r}")
    if target_underflow is not None and not 0.0 <= float(target_underflow) <= 1.0:
        raise ValueError(f"target_underflow must be in [0, 1], got {target_underflow!r}")
    a = np.abs(as_float_array(grads, "grads").astype(np.float64, copy=False)).reshape(-1)
    a = a[np.isfinite(a) & (a != 0)]
    if a.size == 0:
        return LossScaleChoice(
            1.0, 0, "max", "no non-zero finite gradients: scale 1", 0.0, math.inf, 0.0, 0.0, 0.0
        )
    amax = float(a.max())
    # the largest k with amax * 2**k <= fmt.max / 2**margin, from the exponents (exact for any
    # margin: fmt.max / 2**margin need not be a float64)
    (ma, ea), (mf, ef) = math.frexp(amax), math.frexp(f.max)
    k = ef - ea - int(margin) - (ma > mf)
    if k < s_lo:
        raise ValueError(
            f"margin={margin} asks for max|g| * S <= {f}.max / 2**{margin}, so S <= 2**{k}: "
            f"below the smallest normal {s_name} 2**{s_lo} (max|g| = {amax:g}); "
            "use a smaller margin (or a wider scale_dtype)"
        )
    rule = "max"
    if target_underflow is not None:
        target = float(target_underflow)
        try:
            t, inclusive = zero_threshold(f, mode, subnormals)
            srt = np.sort(a)

            def zero_frac(kk: int) -> float:
                lim = _ldexp(t, -kk)
                if inclusive:
                    return int(np.searchsorted(srt, lim, side="right")) / srt.size
                return int(np.searchsorted(srt, lim, side="left")) / srt.size

        except ValueError:  # no magnitude threshold: measure with the core

            def zero_frac(kk: int) -> float:
                return underflow_stats(
                    a, f, math.ldexp(1.0, kk), rounding=mode, subnormals=subnormals, seed=0
                ).zero_fraction

        if zero_frac(k) > target:
            rule = "underflow-unmet"
        else:
            # below lo every value is (for deterministic modes) zero: zero_frac(lo) = 1
            t0 = zero_threshold(f, "toward_zero", subnormals)[0]
            lo, hi = min(math.floor(math.log2(t0) - math.log2(amax)) - 1, k), k
            if zero_frac(lo) <= target:
                hi = lo
            while hi - lo > 1:  # invariant: zero_frac(hi) <= target < zero_frac(lo)
                mid = (lo + hi) // 2
                if zero_frac(mid) <= target:
                    hi = mid
                else:
                    lo = mid
            k = hi
            rule = "underflow"
    capped = k > s_hi
    k = max(min(k, s_hi), s_lo)
    S = math.ldexp(1.0, k)
    st = underflow_stats(a, f, S, rounding=mode, subnormals=subnormals, seed=0)
    headroom = math.log2(f.max) - math.log2(amax) - k
    why = {
        "max": f"largest 2**k with max|g|*S <= {f}.max/2**{margin}",
        "underflow": f"smallest 2**k with zero fraction <= {target_underflow}",
        "underflow-unmet": (
            f"target zero fraction {target_underflow} unreachable without overflow: "
            f"largest 2**k with max|g|*S <= {f}.max/2**{margin}"
        ),
    }[rule]
    if capped:
        why += (
            f", capped at 2**{s_hi}, the largest power of two a {s_name} loss scale holds "
            "(scale_dtype)"
        )
    reason = (
        f"S = 2**{k} ({why}): max|g|*S = {amax * S:.4g} leaves {headroom:.2f} binades below "
        f"{f}.max = {f.max:g}; {100 * st.zero_fraction:.3g}% of non-zero gradients underflow "
        f"to 0, {100 * st.subnormal_fraction:.3g}% are subnormal"
    )
    return LossScaleChoice(
        scale=S,
        log2_scale=k,
        rule=rule,
        reason=reason,
        max_abs=amax,
        headroom_log2=headroom,
        zero_fraction=st.zero_fraction,
        subnormal_fraction=st.subnormal_fraction,
        overflow_fraction=st.overflow_fraction,
        capped=capped,
    )


# ----------------------------------------------------------------------------------------------
# error measures and bounds
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorStats:
    """Errors of an approximation against a reference (all in float64)."""

    n: int
    max_abs: float
    mean_abs: float
    max_rel: float  #: over reference != 0
    mean_rel: float  #: over reference != 0
    max_ulp: float  #: ``|approx - ref| / ulp_fmt(ref)``
    mean_ulp: float
    normwise: float  #: ``||approx - ref||_2 / ||ref||_2``
    snr_db: float  #: 10 log10(sum ref^2 / sum (approx - ref)^2); inf when exact
    fmt: str  #: the format of the ULPs


#: the narrower formats error_stats recognises in float32/float64 results, narrowest first
_GRIDS = ("e3m2", "e2m3", "e4m3", "e5m2", "bf16", "fp16", "tf32")  # FP4: too few values
#: fewer distinct non-zero finite values than this say nothing about the format they came from
_GRID_MIN_VALUES = 8


def _fmt_of(a: np.ndarray) -> FloatFormat:
    """The ULP unit of ``a``: its dtype's format, or the narrower format of :data:`_GRIDS` whose
    grid holds every finite value of a float32/float64 ``a`` (with at least
    :data:`_GRID_MIN_VALUES` distinct non-zero ones, the narrowest format alone at its width);
    where two formats of the narrowest width both hold them, the dtype's format is kept (the
    result's ``.fmt`` says which unit was used)."""
    name = a.dtype.name
    try:
        own = _float_format(name)
    except (ValueError, TypeError):
        own = _float_format("fp32")
    if a.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return own
    v = np.unique(np.abs(a[np.isfinite(a) & (a != 0)]).astype(np.float64))
    if v.size < _GRID_MIN_VALUES:
        return own
    holding: list[FloatFormat] = []
    for g in _GRIDS:
        f = _float_format(g)
        if holding and f.bits > holding[0].bits:
            break
        with np.errstate(all="ignore"):
            on = bool(np.array_equal(round_to(v, f, overflow="saturate"), v))
        if on:
            holding.append(f)
    return holding[0] if len(holding) == 1 else own


def error_stats(approx: Any, reference: Any, *, fmt: str | FloatFormat | None = None) -> ErrorStats:
    """Error measures of ``approx`` against ``reference`` (same shape), computed in float64.

    ``fmt`` sets the ULP unit. By default it is the format of ``approx``'s dtype (float16 ->
    fp16, bfloat16 -> bf16, float32 -> fp32, float64 -> fp64), except that float32/float64
    values that all lie on a narrower format's grid (``round_to(x, "e4m3")`` is float32) are
    counted in that format: the narrowest of e3m2, e2m3, e4m3, e5m2, bf16, fp16, tf32 that holds
    every finite value, when at least 8 distinct non-zero values pin it down (never FP4, whose 7
    magnitudes cannot) and no other format of the same width holds them too (else the dtype's
    format: pass ``fmt=``). The ULP of a
    reference value is the spacing of ``fmt`` at it (:meth:`FloatFormat.ulp`); ``.fmt`` of the
    result names the unit used. Sums of squares are kept scaled, so
    ``normwise`` and ``snr_db`` are right for any finite magnitudes (1e-160 or 1e300 included).

    Special values follow ``numpy.testing.assert_allclose(..., equal_nan=True)``: where both are
    NaN, or both the same infinity, the position is exact (error 0) and left out of the
    reference's norm; anywhere else an inf or NaN propagates into the results (a NaN where the
    reference is finite gives NaN statistics).

    >>> r = np.array([1.0, 2.0, -4.0])
    >>> e = error_stats(r + np.array([2.0**-10, 0.0, 2.0**-8]), r, fmt="fp16")
    >>> e.max_abs, e.max_rel, e.max_ulp, round(e.snr_db, 1)
    (0.00390625, 0.0009765625, 1.0, 61.1)
    >>> x = np.linspace(0.1, 3.0, 50, dtype=np.float32)
    >>> e = error_stats(round_to(x, "e4m3"), x)      # float32 values on the e4m3 grid
    >>> e.fmt, e.max_ulp <= 0.5
    ('e4m3', True)
    """
    a_raw, r_raw = np.asarray(approx), np.asarray(reference)
    if a_raw.shape != r_raw.shape:
        raise ValueError(
            f"approx and reference must have the same shape, got {a_raw.shape} and {r_raw.shape}"
        )
    uf = _float_format(fmt) if fmt is not None else _fmt_of(a_raw)
    a = as_float_array(a_raw, "approx").astype(np.float64).reshape(-1)
    r = as_float_array(r_raw, "reference").astype(np.float64).reshape(-1)
    n = a.size
    if n == 0:
        nan = math.nan
        return ErrorStats(0, nan, nan, nan, nan, nan, nan, nan, nan, str(uf))
    with np.errstate(all="ignore"):
        agree = (np.isnan(a) & np.isnan(r)) | (np.isinf(r) & (a == r))
        d = np.where(agree, 0.0, np.abs(a - r))
        nz = r != 0
        rel = np.where(agree, 0.0, d / np.abs(r))[nz]
        ulp = np.where(agree, 0.0, d / uf.ulp(r))
        num = _ScaledSums.of(d)[1]
        den = _ScaledSums.of(np.where(agree, 0.0, r))[1]
    normwise = _ratio(num, den, sqrt=True)
    snr = _snr_db(num, den)
    return ErrorStats(
        n=n,
        max_abs=float(d.max()),
        mean_abs=float(d.mean()),
        max_rel=float(rel.max()) if rel.size else math.nan,
        mean_rel=float(rel.mean()) if rel.size else math.nan,
        max_ulp=float(ulp.max()),
        mean_ulp=float(ulp.mean()),
        normwise=normwise,
        snr_db=snr,
        fmt=str(uf),
    )


def _snr_db(num: _Term, den: _Term) -> float:
    """``10 log10(den / num)`` of two scaled sums of squares (inf when num is 0)."""
    (mn, en), (md, ed) = num, den
    if mn == 0:
        return math.inf
    if math.isnan(mn) or math.isnan(md) or (math.isinf(mn) and math.isinf(md)):
        return math.nan
    if math.isinf(mn) or md == 0:
        return -math.inf
    if math.isinf(md):
        return math.inf
    return 10.0 * (math.log10(md / mn) + (ed - en) * math.log10(2.0))


def _unit_roundoff(u: Any) -> float:
    if isinstance(u, str | FloatFormat):
        return _float_format(u, "u").unit_roundoff
    v = float(u)
    if not (math.isfinite(v) and 0 < v < 1):
        raise ValueError(f"u must be a unit roundoff in (0, 1) or a format, got {u!r}")
    return v


def _check_len(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    return int(n)


def gamma_n(n: int, u: float | str | FloatFormat) -> float:
    """Worst-case relative error bound ``gamma_n = n u / (1 - n u)`` of a length-n sum or dot
    product with unit roundoff ``u`` (a number, or a format whose ``unit_roundoff`` is used).
    ``inf`` when ``n u >= 1`` (the bound says nothing).

    >>> gamma_n(1024, "fp16")  # 1024 * 2**-11 = 0.5
    1.0
    """
    n, uu = _check_len(n), _unit_roundoff(u)
    nu = n * uu
    return math.inf if nu >= 1 else nu / (1 - nu)


def sqrt_n_u(n: int, u: float | str | FloatFormat, lam: float = 1.0) -> float:
    """Probabilistic bound ``lam * sqrt(n) * u`` (Higham & Mary 2019: holds with probability
    close to 1 for modest ``lam``, e.g. ``lam = 1`` in practice for random data).

    >>> sqrt_n_u(1024, "fp16")
    0.015625
    """
    n, uu = _check_len(n), _unit_roundoff(u)
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam must be a positive finite number, got {lam!r}")
    return lam * math.sqrt(n) * uu


# ----- quantization error: relative quadratic error, QSNR, effective bits ------------------------
@dataclass(frozen=True)
class QuantError:
    """Quantization error of a tensor (floats) or of each of its blocks (float64 arrays).

    ``rqe = ||q - x||^2 / ||x||^2`` (relative quadratic error, the "MSE / signal power" of the
    Quartet and NVFP4 papers), ``qsnr_db = -10 log10(rqe)``, and ``effective_bits =
    -log2(rqe) / 2``: the bits of a uniform quantizer whose noise power relative to the signal
    were ``rqe`` (each bit halves the error, quarters its power; Quartet II quotes NVFP4's
    9.0e-3 as 3.394 bits). An exact ``q`` gives rqe 0, qsnr and effective bits inf; an all-zero
    ``x`` with a non-zero error gives rqe inf, and with none NaN.
    """

    rqe: Any
    qsnr_db: Any
    effective_bits: Any


def _check_block(block: Any, length: int) -> int:
    if isinstance(block, bool) or not isinstance(block, int | np.integer) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    if length % int(block):
        raise ValueError(f"the axis has length {length}, not a multiple of block={block}")
    return int(block)


def quant_error(
    approx: Any, reference: Any, *, block: int | None = None, axis: int = -1
) -> QuantError:
    """Relative quadratic error, QSNR (dB) and effective bits of ``approx`` against ``reference``.

    Per tensor (``block=None``: floats) or per block of ``block`` consecutive values along
    ``axis`` (float64 arrays of the block grid: ``axis`` divided by ``block``). Sums of squares
    are kept scaled (no overflow or underflow at any finite magnitude); NaN or inf inputs give
    NaN/inf measures. Companion of :func:`error_stats` (whose ``snr_db`` is the same QSNR).

    >>> x = np.array([1.0, -2.0, 3.0, 0.5])
    >>> e = quant_error(x + np.array([0.1, 0.0, -0.1, 0.0]), x)
    >>> round(e.rqe, 6), round(e.qsnr_db, 3), round(e.effective_bits, 3)
    (0.001404, 28.528, 4.738)
    >>> quant_error(x * 1.5, x, block=2).rqe
    array([0.25, 0.25])
    """
    a_raw, r_raw = np.asarray(approx), np.asarray(reference)
    if a_raw.shape != r_raw.shape:
        raise ValueError(
            f"approx and reference must have the same shape, got {a_raw.shape} and {r_raw.shape}"
        )
    a = as_float_array(a_raw, "approx").astype(np.float64)
    r = as_float_array(r_raw, "reference").astype(np.float64)
    with np.errstate(all="ignore"):
        d = a - r
    if block is None:
        num = _ScaledSums.of(d.reshape(-1))[1] if np.isfinite(d).all() else (math.nan, 0)
        den = _ScaledSums.of(r.reshape(-1))[1] if np.isfinite(r).all() else (math.nan, 0)
        rqe = _rqe(num, den)
        return QuantError(rqe, _qsnr(rqe), _effective_bits(rqe))
    if r.ndim == 0:
        raise ValueError("block needs an array of at least one dimension")
    ax = axis % r.ndim if -r.ndim <= axis < r.ndim else None
    if ax is None:
        raise ValueError(f"axis {axis} is out of range for an array of {r.ndim} dimension(s)")
    n = _check_block(block, r.shape[ax])
    dm, rm = np.moveaxis(d, ax, -1), np.moveaxis(r, ax, -1)
    dm = dm.reshape(*dm.shape[:-1], -1, n)
    rm = rm.reshape(*rm.shape[:-1], -1, n)
    with np.errstate(all="ignore"):
        top = np.maximum(np.abs(rm).max(axis=-1), np.abs(dm).max(axis=-1))
        e = np.frexp(np.where(np.isfinite(top) & (top > 0), top, 1.0))[1][..., None]
        ds, rs = np.ldexp(dm, -e), np.ldexp(rm, -e)  # a power of two per block: same ratio
        rqe = (ds * ds).sum(axis=-1) / (rs * rs).sum(axis=-1)
        rqe = np.moveaxis(rqe, -1, ax)
        return QuantError(rqe, -10.0 * np.log10(rqe), -0.5 * np.log2(rqe))


def _rqe(num: _Term, den: _Term) -> float:
    (mn, en), (md, ed) = num, den
    if math.isnan(mn) or math.isnan(md):
        return math.nan
    if md == 0:
        return math.nan if mn == 0 else math.inf
    if mn == 0:
        return 0.0
    return math.ldexp(mn / md, en - ed)


def _qsnr(rqe: float) -> float:
    if math.isnan(rqe):
        return math.nan
    return math.inf if rqe == 0 else (-math.inf if math.isinf(rqe) else -10.0 * math.log10(rqe))


def _effective_bits(rqe: float) -> float:
    if math.isnan(rqe):
        return math.nan
    return math.inf if rqe == 0 else (-math.inf if math.isinf(rqe) else -0.5 * math.log2(rqe))
