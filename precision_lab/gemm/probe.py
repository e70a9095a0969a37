"""Why does my GEMM differ? Recover the accumulation model of a black-box matmul.

Given a callable ``fn(a, b) -> d`` (numpy/BLAS, torch, a CuPy/cuBLAS call, or an emulation),
:func:`probe_gemm` looks for an :class:`~precision_lab.gemm.accumulator.Accumulator` that
reproduces ``fn`` bit for bit, with targeted inputs first and random inputs last:

1. **Summation tree** (FPRev, Xie et al., USENIX ATC 2025). For every pair of leaves ``(i, j)``
   (the ``K`` products, and ``c`` when ``fn`` takes one) the inputs put ``+M`` at ``i``, ``-M`` at
   ``j`` and a small unit ``u`` everywhere else, with ``M / u`` so large that a unit meeting
   ``M`` is absorbed. ``M`` and ``-M`` cancel exactly where their paths meet, so the result
   counts the units added outside that meeting point: ``K - result / u`` is the number of leaves
   under the lowest common ancestor of ``i`` and ``j``. That matrix determines the tree (a
   multi-term fused node, as in a tensor core's block FMA, shows up as one node with many
   children). The probe compares it with the tree of every order the Accumulator family has
   (sequential, pairwise, blocked with each block length, block FMA with each block length
   with the running sum aligned in the block or added after it, chained inner blocks) and of
   where ``c`` enters. Units of both signs are tried, so directed rounding does not defeat it.
2. **Accumulator precision** (Fasi et al. 2021, "Numerical behavior of NVIDIA tensor cores"):
   ``1 + 2**-j`` summed in one step and ``-1`` in a later one gives ``2**-j`` exactly while
   ``j`` is below the accumulator's precision (the output format's does not limit it: the
   result is small).
3. **Alignment bits** (block FMA): ``1 + 2**-j - 1`` inside one block gives ``2**-j`` exactly
   while ``j`` is at most the number of fraction bits kept after alignment.
4. **Exact products**: ``(1 + 2**-h)**2 - (1 + 2**-(h-1))`` is ``2**-2h`` only when the product
   is not rounded before the addition (``h`` the input format's fraction bits).
5. **Rounding mode, exponent range, overflow, rounding of a block sum**: the candidates left
   (every rounding mode but stochastic; exponent widths; ``ieee``/``saturate`` overflow) are run
   on the targeted cases and on random inputs of moderate and of extreme exponent spread, in
   order of plausibility; the first that reproduces every case is the model.
6. **Special values** (the fields of the Accumulator spec, section 5): overflowing sums,
   exact cancellation and sums that round to zero (the sign of zero), ``-0`` products, ``inf *
   0`` and opposite infinities (the NaN's encoding), and zero products beside a huge partner
   next to terms with low bits (whether a zero takes part in a block FMA's anchor). The
   model's ``overflow``, exponent width, ``zero_sign``, ``zeros_in_anchor`` and
   ``nan_encoding`` are chosen to reproduce them (the search of step 5 compares only finite,
   non-zero results, so that these rules are decided here, on inputs made for them).
7. **Confirmation**: the model is run on ``cases`` fresh random inputs (``K`` from 1 to
   ``max_k``, varied distributions); the confidence is the fraction reproduced bit for bit.
8. **Named models**, tried whole when steps 1-7 find none (and early, once 100 candidates of
   step 5 failed): every preset of :func:`~precision_lab.tensor_core` whose operands are the
   input format(s) (block-scaled kinds excepted: they run through ``gemm_blocks``), each
   output format, then plain ``sequential``, ``pairwise``, ``compensated`` and
   ``exact_block`` (blocks of 2 .. 256) accumulators in fp32, fp64, fp16, bf16 and tf32 with
   every probed rounding mode. Each must reproduce every call made so far (tree, targeted,
   special-value and random inputs) and then the confirmation. This is where orders whose
   pair counts are no tree are found (an ``exact_block`` sum keeps every unit inside a block,
   Kahan summation gives the lost units back), and boxes whose inputs cannot show the order.
   ``addend="separate"`` block FMAs (AMD CDNA3) are step-5 candidates of a block-FMA tree.

Every result says which of three it is (:attr:`ProbeResult.outcome`): ``"reproduced"``;
``"outside"`` what the probe tries (the verdict names what it tried and the property that
failed: an order, a format or rounding, a special-value rule, the confirmation, the tree at
long K); or ``"cannot
measure"``: the tree probe needs ``M / u`` of at least ``2**(log2 K + 5)`` on products of two
input values, and narrow formats cannot give it (e2m1's products span only ``2**-2 .. 36``;
e3m2's allow ``2**16``, too little to absorb a unit in a 25-bit block FMA), so the order is not
measured, and no named model reproduces the box. With such inputs a named model that
reproduces every case is reported as reproduced, with the evidence that the order was not
measured (every FP4 ``kind::f8f6f4`` GEMM into fp32 is exact at small ``K``, so other orders
reproduce it too).

What the probe cannot express is reported, not forced: when no model reproduces fn,
``accumulator`` is ``None``, ``failed`` names the property, and ``closest`` is the best
candidate with its confidence (decision: an honest "no" with the numbers beats a model that is
wrong in a fraction of cases).

**CPU libraries** (spec 3e of :mod:`~precision_lab.gemm.accumulator`) keep interleaved
SIMD-lane partial sums. When the measured tree is none of the orders above, the probe reads
the lane count off it (the first product meets first the product one lane-width later), takes
the lanes' combination tree from the tree restricted to the lanes' first products (named
``sequential``, ``pairwise`` or ``halving`` where it is one of them, else the explicit tree),
and tries each tail rule (``lanes``, ``after``, ``first``, ``separate``, with main-loop steps
of 1, 2, 4 and 8 lane widths), each per-lane order (sequential, blocks of 2 and 4, pairwise)
and K-splits (powers of two, combined sequentially, pairwise or by numpy's halving). A kernel
that changes with K is looked for too: at every shorter K the first product's pairs are
measured and compared with the lanes' and a plain chain's; where a chain holds below some K
and the lanes from it on, that K is the model's ``small_k``, otherwise the evidence names the
K where neither holds. numpy's float32 reduction (``np.sum`` over a contiguous axis,
``pairwise_sum`` in ``numpy/_core/src/umath/loops_utils.h``) is recovered this way: 8 lanes
combined pairwise, the ``K mod 8`` remainder added after them (and halving above 128 terms).
``K = 1`` taken as a plain product (a ``-0`` product stays ``-0``; spec 3f) is one of the
special-value rules.

A model found is valid for the shape and the ``K <= max_k`` it was probed with: BLAS libraries
pick kernels by shape, and a block longer than ``max_k`` cannot be told from one block.
Stochastic rounding is not probed (a seeded stochastic ``fn`` is deterministic but its random
words are not the counter-based ones of :mod:`precision_lab.core.random_words`).

>>> import precision_lab as pl
>>> hidden = pl.tensor_core("a100", "fp16")
>>> fn = lambda a, b: pl.gemm(a, b, input_format="fp16", accumulator=hidden)
>>> res = pl.probe_gemm(fn, input_format="fp16", max_k=20, cases=256)
>>> rules = ("overflow", "zeros_in_anchor", "zero_exponent", "zero_sign", "nan_encoding")
>>> res.accumulator.replace(**{r: getattr(hidden, r) for r in rules}) == hidden, res.confidence
(True, 1.0)
>>> print(res.accumulator.describe())
block FMA of 8 products, 24 fraction bits kept after alignment, normalised into fp32
(toward_zero); NaN is 0x7fffffff

The preset's other special-value rules (overflow to inf, zeros in the alignment anchor, +0)
cannot show with fp16 inputs and no c (fp16 products never reach fp32's overflow): the probe
keeps the IEEE defaults there, which reproduce every special input it tried.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.formats import FloatFormat, get_format
from ..core.pool import use_workers
from .accumulator import (
    LANE_COMBINES,
    SPLIT_HALVES,
    Accumulator,
    _float_format,
    _format_pair,
    combine_tree,
    halving_cut,
    join_tail,
    prune_tree,
    split_chunks,
)
from .reference import _EXACT_PRODUCT_BITS, gemm
from .tensor_core import FP8_ACCUMULATOR

__all__ = ["ProbeResult", "probe_gemm"]

#: rounding modes the probe tells apart (stochastic ones are not probed)
PROBE_MODES = ("nearest_even", "toward_zero", "nearest_away", "up", "down", "odd")

_NAMED_ACCUMULATORS = ("fp32", "tf32", "fp16", "bf16")
_FP32 = _float_format("fp32", "format")
_FP64 = _float_format("fp64", "format")

Case = tuple[np.ndarray, np.ndarray, float]  # (a_k, b_k, c) of one inner product
Tree = Any  # a leaf index (int) or a tuple of subtrees


@dataclass
class ProbeResult:
    """What :func:`probe_gemm` found.

    Attributes
    ----------
    accumulator:
        The model that reproduced every targeted and random case bit for bit, or ``None``.
    closest:
        The best candidate (the ``accumulator`` when one was found); ``None`` when the probe
        stopped before any candidate (no usable tree).
    confidence:
        ``reproduced / tried`` of ``closest`` on the fresh random confirmation cases.
    reproduced, tried:
        Output elements reproduced bit for bit, and elements compared.
    evidence:
        Per property (``tree``, ``products``, ``precision``, ``alignment``, ``rounding``,
        ``confirmation`` ...), what was measured.
    failed:
        ``None``, or the property no model the probe tried fits (``"summation tree"``,
        ``"format and rounding"``, ``"special values"``, ``"confirmation"``, ``"long K"``
        (the tree at ``long_k`` is none of the model's K-splits), ``"named models"``).
    tree:
        The recovered summation tree: leaves are the product indices ``0 .. K-1`` and ``c``,
        a parenthesised group is one addition (a fused node when it has more than two
        children).
    verdict:
        One plain-language paragraph that starts with the outcome.
    outcome:
        ``"reproduced"`` (``accumulator`` reproduced every case), ``"outside"`` (no model the
        probe tries reproduces fn: the verdict names what it tried and the property that
        failed) or ``"cannot measure"`` (the inputs the probe needs cannot be formed, e.g. the
        input format's range is too narrow for the summation-order probe, and no named model
        reproduces fn: the verdict says which inputs and why).
    """

    accumulator: Accumulator | None
    closest: Accumulator | None
    confidence: float
    reproduced: int
    tried: int
    evidence: dict[str, str] = field(default_factory=dict)
    failed: str | None = None
    tree: str = ""
    verdict: str = ""
    outcome: str = "reproduced"

    def __str__(self) -> str:
        lines = [self.verdict, ""]
        lines += [f"  {key}: {text}" for key, text in self.evidence.items()]
        return "\n".join(lines)


# ----- the black box -----------------------------------------------------------------------------
def _dtype_for(fmt: FloatFormat) -> np.dtype:
    """The numpy (or ml_dtypes) dtype inputs on ``fmt``'s grid are handed to ``fn`` in."""
    import ml_dtypes

    table: dict[str, Any] = {
        "fp64": np.float64,
        "fp32": np.float32,
        "tf32": np.float32,
        "fp16": np.float16,
        "bf16": ml_dtypes.bfloat16,
        "e4m3": ml_dtypes.float8_e4m3fn,
        "e5m2": ml_dtypes.float8_e5m2,
        "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
        "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    }
    name = str(fmt)
    if name in table and get_format(name) == fmt:
        return np.dtype(table[name])
    fits32 = fmt.precision <= 24 and fmt.emax <= 127 and fmt.emin - fmt.mantissa_bits >= -149
    return np.dtype(np.float32 if fits32 else np.float64)


def _dtypes_text(dtypes: tuple[np.dtype, np.dtype]) -> str:
    return str(dtypes[0]) if dtypes[0] == dtypes[1] else f"{dtypes[0]} x {dtypes[1]}"


def _fins_text(fins: tuple[FloatFormat, FloatFormat]) -> str:
    return str(fins[0]) if fins[0] == fins[1] else f"{fins[0]} x {fins[1]}"


def _common_grid(fa: FloatFormat, fb: FloatFormat) -> FloatFormat:
    """A format whose every value lies on both ``fa``'s and ``fb``'s grids (mixed operands:
    the targeted inputs are built on it, so that each factor fits either operand): the IEEE
    format with the fewer exponent and fraction bits of the two."""
    f = FloatFormat(
        min(fa.exponent_bits, fb.exponent_bits),
        min(fa.mantissa_bits, fb.mantissa_bits),
    )
    inside = all(
        f.emin >= g.emin
        and f.emax <= g.emax
        and f.max <= g.max
        and f.emin - f.mantissa_bits >= g.emin - g.mantissa_bits
        for g in (fa, fb)
    )
    if not inside:  # pragma: no cover - every pair of the library's formats has one
        raise ValueError(f"input_format: no common grid of {fa} and {fb} for the probe's inputs")
    return f


def _same(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Bitwise equality of float64 arrays (any NaN equals any NaN; the sign of zero counts)."""
    return (x.view(np.int64) == y.view(np.int64)) | (np.isnan(x) & np.isnan(y))


class _Box:
    """Calls ``fn`` with inputs of the right dtype and checks what comes back."""

    def __init__(
        self,
        fn: Callable[..., Any],
        fin: FloatFormat,
        fout: FloatFormat | None,
        in_dtype: tuple[np.dtype, np.dtype],
        shape: tuple[int, int],
        with_c: bool,
        max_calls: int,
    ) -> None:
        self.fn, self.fin, self.fout = fn, fin, fout
        self.in_dtype, self.shape, self.with_c = in_dtype, shape, with_c
        self.out_dtype: np.dtype | None = None
        self.calls, self.max_calls = 0, max_calls

    def c_array(self, c: np.ndarray) -> np.ndarray:
        dt = self.out_dtype if self.out_dtype is not None else np.dtype(np.float32)
        return c.astype(dt)

    def __call__(self, a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> np.ndarray:
        if self.calls >= self.max_calls:
            raise RuntimeError(
                f"probe_gemm: more than {self.max_calls} calls of fn (max_calls); "
                "raise max_calls or lower max_k"
            )
        self.calls += 1
        m, k = a.shape
        n = b.shape[1]
        args = [a.astype(self.in_dtype[0]), b.astype(self.in_dtype[1])]
        if self.with_c:
            assert c is not None
            args.append(self.c_array(c))
        try:
            with np.errstate(all="ignore"):  # the inputs overflow on purpose
                out = self.fn(*args)
        except Exception as exc:
            raise RuntimeError(
                f"fn raised {type(exc).__name__} on a of shape ({m}, {k}) and b of shape "
                f"({k}, {n}) (dtype {_dtypes_text(self.in_dtype)}): {exc}"
            ) from exc
        try:
            d = np.asarray(out)
        except Exception as exc:
            raise TypeError(
                f"fn must return an array numpy.asarray accepts, got {type(out).__name__}: {exc}"
            ) from None
        if d.shape != (m, n):
            raise ValueError(
                f"fn returned shape {d.shape} for a of shape ({m}, {k}) and b of shape "
                f"({k}, {n}); expected ({m}, {n})"
            )
        if self.out_dtype is None:
            self.out_dtype = d.dtype
        elif d.dtype != self.out_dtype:
            raise ValueError(
                f"fn returned dtype {d.dtype} after returning {self.out_dtype}: the output "
                "type must not change between calls"
            )
        try:
            d64 = d.astype(np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"fn must return floating-point values, got dtype {d.dtype}") from None
        if d.dtype.kind in "iub":
            raise TypeError(f"fn must return floating-point values, got dtype {d.dtype}")
        return d64


# ----- inputs -------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _split(x: float, fin: FloatFormat) -> tuple[float, float] | None:
    """``(a, b)`` on ``fin``'s grid with ``a * b == x`` (x a short-significand number), or None."""
    if x == 0:
        return 0.0, 1.0
    mant, e = math.frexp(abs(x))
    sig, ex = mant * 2, e - 1  # x = sig * 2**ex, 1 <= sig < 2
    if (sig * 2**fin.mantissa_bits) % 1:
        return None
    sign = -1.0 if x < 0 else 1.0
    sub = fin.emin - fin.mantissa_bits  # exponent of the smallest subnormal

    def on_grid(v: float, e: int) -> bool:  # v = (significand) * 2**e
        return v <= fin.max and (v / 2.0 ** (max(e, fin.emin) - fin.mantissa_bits)) % 1 == 0

    for ea in sorted(range(sub, fin.emax + 1), key=lambda t: abs(t - ex / 2)):
        eb = ex - ea
        a = sig * 2.0**ea
        if sub <= eb <= fin.emax and on_grid(a, ea):
            return sign * a, 2.0**eb
    return None


def _vectors(values: Sequence[float], fin: FloatFormat) -> tuple[np.ndarray, np.ndarray] | None:
    """Factor each term ``values[k]`` into ``a_k * b_k`` (None if one cannot be factored)."""
    a = np.zeros(len(values))
    b = np.ones(len(values))
    for k, v in enumerate(values):
        ab = _split(v, fin)
        if ab is None:
            return None
        a[k], b[k] = ab
    return a, b


class _Lab:
    """Packs inner products into calls of ``fn`` (one per diagonal element) and runs models."""

    def __init__(
        self,
        box: _Box,
        fin: FloatFormat,
        shape: tuple[int, int],
        fins: tuple[FloatFormat, FloatFormat] | None = None,
    ) -> None:
        self.box, self.fin = box, fin
        #: the operands' formats (``fin`` is their common grid when they differ)
        self.fins = fins if fins is not None else (fin, fin)
        self.m, self.n = shape
        self.calls: list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]] = []
        self.fout: FloatFormat = _FP32
        self._masks: dict[int, np.ndarray] = {}
        #: the special-value calls (indices), fn's results on them, and how many inputs
        self.special: tuple[list[int], np.ndarray, int] | None = None
        #: the diagonal places that hold the cases (those whose order is element (0, 0)'s)
        self.diag: list[int] = list(range(min(self.m, self.n)))

    def run_cases(self, label: str, cases: Sequence[Case], k: int) -> np.ndarray:
        """Results of ``fn`` on each case (its own a row and b column), in order."""
        per = len(self.diag)
        out = np.empty(len(cases))
        for start in range(0, len(cases), per):
            chunk = cases[start : start + per]
            a = np.zeros((self.m, k))
            b = np.zeros((k, self.n))
            c = np.zeros((self.m, self.n))
            idx = np.asarray(self.diag[: len(chunk)], dtype=np.intp)
            for i, (av, bv, cv) in zip(idx, chunk, strict=True):
                a[i, : len(av)] = av
                b[: len(bv), i] = bv
                c[i, i] = cv
            d = self.box(a, b, c)
            out[start : start + len(chunk)] = d[idx, idx]
            mask = np.zeros((self.m, self.n), dtype=bool)
            mask[idx, idx] = True
            self.calls.append((label, a, b, c, d, False))
            self._masks[len(self.calls) - 1] = mask
        return out

    def run_random(self, label: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        d = self.box(a, b, c)
        self.calls.append((label, a, b, c, d, True))
        return d

    def model(self, acc: Accumulator, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"), use_workers(1):  # small calls: threads cost more
            d = gemm(
                a,
                b,
                c if self.box.with_c else None,
                input_format=self.fins if self.fins[0] != self.fins[1] else self.fin,
                accumulator=acc,
                out_format=self.fout,
            )
        return np.asarray(d, dtype=np.float64)

    def agree(self, acc: Accumulator, calls: Sequence[int]) -> int:
        """Output elements of these calls the model reproduces."""
        total = 0
        for i in calls:
            _, a, b, c, d, _ = self.calls[i]
            try:
                total += int(_same(self.model(acc, a, b, c), d).sum())
            except (ValueError, TypeError, NotImplementedError):
                pass
        return total

    def score(
        self, acc: Accumulator, calls: Sequence[int], *, finite_only: bool = False
    ) -> tuple[bool, float, str]:
        """(reproduces every call?, calls reproduced (fractional), label of the first miss).

        ``finite_only``: compare only where ``fn`` gave a finite non-zero number (zeros,
        infinities and NaNs are the special-value rules' business, decided afterwards).
        """
        done = 0.0
        for i in calls:
            label, a, b, c, d, full = self.calls[i]
            try:
                got = self.model(acc, a, b, c)
            except (ValueError, TypeError, NotImplementedError):
                return False, done, label
            same = _same(got, d)
            if finite_only:
                same |= ~np.isfinite(d) | (d == 0)
            if not full:
                same = same[self._masks[i]]
            if not same.all():
                return False, done + float(same.mean()), label
            done += 1
        return True, done, ""


def _grid(x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    from ..core.rounding import round_to

    with np.errstate(all="ignore"):
        return np.asarray(round_to(x, fmt, overflow="saturate"), dtype=np.float64)


def _random_inputs(
    rng: np.random.Generator,
    fins: tuple[FloatFormat, FloatFormat],
    fout: FloatFormat,
    m: int,
    k: int,
    n: int,
    kind: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random a, b (on their formats' grids) and c (on ``fout``'s) of one of several
    distributions."""
    fa, fb = fins
    span = {"moderate": 3, "wide": None, "cancel": 3, "ints": 0}[kind]
    if span is None:  # exponents over most of the input range (products over and under flow)
        ea = rng.integers(max(fa.emin - 2, -60), min(fa.emax, 60) + 1, size=(m, k))
        eb = rng.integers(max(fb.emin - 2, -60), min(fb.emax, 60) + 1, size=(k, n))
    else:
        ea = rng.integers(-span, span + 1, size=(m, k))
        eb = rng.integers(-span, span + 1, size=(k, n))
    if kind == "ints":
        a = rng.integers(-8, 9, size=(m, k)).astype(np.float64)
        b = rng.integers(-8, 9, size=(k, n)).astype(np.float64)
    else:
        a = rng.choice([-1.0, 1.0], size=(m, k)) * rng.uniform(1, 2, size=(m, k)) * 2.0**ea
        b = rng.choice([-1.0, 1.0], size=(k, n)) * rng.uniform(1, 2, size=(k, n)) * 2.0**eb
    if kind == "cancel" and k > 1:  # a large first term and its near-negative further on
        a[:, 0] *= 2.0**10
        j = rng.integers(1, k, size=m)
        a[np.arange(m), j] = -a[:, 0] * rng.uniform(0.98, 1.02, size=m)
        b[j, :] = b[0, :]
    a, b = _grid(a, fa), _grid(b, fb)
    c = _grid(rng.standard_normal((m, n)) * 2.0 ** rng.integers(-3, 4, size=(m, n)), fout)
    if kind == "cancel":
        c = _grid(c * 2.0**8, fout)
    return a, b, c


# ----- summation trees ---------------------------------------------------------------------------
def _chain(start: Tree | None, items: Sequence[Tree]) -> Tree | None:
    node = start
    for it in items:
        node = it if node is None else (node, it)
    return node


def _fused(start: Tree | None, items: Sequence[Tree]) -> Tree | None:
    kids = ([start] if start is not None else []) + list(items)
    if not kids:
        return start
    return kids[0] if len(kids) == 1 else tuple(kids)


#: the structural fields of spec 3e (lanes and split-K) a probe spec may hold
_LANE_FIELDS = (
    "lanes",
    "lane_combine",
    "lane_tail",
    "lane_unroll",
    "lane_run",
    "lane_vector",
    "small_k",
    "split_k",
    "split_combine",
    "split_balance",
    "split_half",
    "split_equal",
)
#: a separate lane tail's own format (no part of the tree)
_TAIL_FIELDS = ("tail_format", "tail_product_format")


def _lane_value(ks: list[int], spec: dict[str, Any]) -> Tree:
    """Spec 3e's tree of the products ``ks`` from 0: lanes (each a chain), their tree, the
    tail added after; without lanes (or below ``small_k``) a chain."""
    L = spec.get("lanes")
    if L is None or len(ks) < (spec.get("small_k") or 0):
        return _chain(None, ks)
    rule = spec.get("lane_tail", "lanes")
    full = len(ks) if rule == "lanes" else len(ks) - len(ks) % (spec.get("lane_unroll") or L)
    V = spec.get("lane_vector")  # a cleanup loop into lanes 0 .. V - 1
    full2 = len(ks) - len(ks) % V if V else full
    tail = ks[full2:]
    R = spec.get("lane_run")
    if R is not None:  # runs of R products, run r in lane r mod L, each run summed first
        runs = [_chain(None, ks[j : j + R]) for j in range(0, len(ks), R)]
        chains = [_chain(None, runs[i::L]) for i in range(min(L, len(runs)))]
        tree = prune_tree(combine_tree(spec.get("lane_combine", "sequential"), L), len(chains))
        return _tree_of(tree, chains)
    members = [ks[i:full:L] for i in range(max(min(L, full), min(V or 0, full2 - full)))]
    if rule == "first":
        members = [members[0] + tail, *members[1:]] if members else [tail]
    lanes = [
        _chain(_lane_order(m, spec) if m else None, ks[full + i : full2 : V] if V and i < V else [])
        for i, m in enumerate(members)
    ]
    if rule == "separate_first" and tail:  # the tail's chain joins the tree's first child
        whole = join_tail(combine_tree(spec.get("lane_combine", "sequential"), L), V, -1)
        pruned = prune_tree(whole, len(lanes))
        assert pruned is not None
        return _tree_of(pruned, [*lanes, _chain(None, tail)])
    node: Tree | None = None
    if lanes:
        tree = prune_tree(combine_tree(spec.get("lane_combine", "sequential"), L), len(lanes))
        node = _tree_of(tree, lanes)
    if rule == "separate" and tail:
        return _chain(node, [_chain(None, tail)])
    return node if rule == "first" else _chain(node, tail)


def _lane_order(members: list[int], spec: dict[str, Any]) -> Tree:
    """One lane's tree: its products by the per-lane order (sequential, pairwise, blocked)."""
    if spec["order"] == "pairwise":
        return _tree_of(combine_tree("pairwise", len(members)), members)
    if spec["order"] == "blocked":
        b = spec["block"]
        return _chain(None, [_chain(None, members[i : i + b]) for i in range(0, len(members), b)])
    return _chain(None, members)


def _tree_of(tree: Tree, items: Sequence[Tree]) -> Tree:
    """A combination tree over ``items`` (a tuple's children added left to right)."""
    if not isinstance(tree, tuple):
        return items[tree]
    return _chain(None, [_tree_of(ch, items) for ch in tree])


def _lane_family_tree(spec: dict[str, Any], k: int, with_c: bool) -> Tree:
    """The summation tree of spec 3e (lanes, split-K), ``c`` the leaf ``k``."""
    c = k if with_c else None
    ks = list(range(k))
    S, how = spec.get("split_k"), spec.get("split_combine", "sequential")
    if S is None:
        return _chain(c, [_lane_value(ks, spec)])
    if how == "sequential":
        parts, j0 = [], 0
        for step in split_chunks(
            k, S, spec.get("split_balance"), spec.get("split_equal"), spec.get("split_half", "ceil")
        ):
            parts.append(_lane_value(ks[j0 : j0 + step], spec))
            j0 += step
        return _chain(c, parts)
    if how == "pairwise":
        parts = [_lane_value(ks[j : j + S], spec) for j in range(0, k, S)]
        return _chain(c, [_tree_of(combine_tree("pairwise", len(parts)), parts)])

    def halves(part: list[int]) -> Tree:
        h = halving_cut(len(part), spec.get("lanes"))
        if len(part) <= S or h < 1:
            return _lane_value(part, spec)
        return (halves(part[:h]), halves(part[h:]))

    return _chain(c, [halves(ks)])


def _family_tree(spec: dict[str, Any], k: int, with_c: bool) -> Tree:
    """The summation tree of an Accumulator order (spec of its structural fields)."""
    if any(f in spec for f in _LANE_FIELDS):
        return _lane_family_tree(spec, k, with_c)
    c = k if with_c else None
    prods = list(range(k))
    order = spec["order"]
    if order == "sequential":
        return _chain(c, prods)
    if order == "pairwise":
        level: list[Tree] = list(prods)
        while len(level) > 1:
            nxt = [(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return _chain(c, level)
    blk = spec["block"]
    starts = range(0, k, blk)
    if order == "blocked":
        return _chain(c, [_chain(None, prods[s : s + blk]) for s in starts])
    if spec.get("addend", "in_block") == "in_block":
        node: Tree | None = c
        for s in starts:
            node = _fused(node, prods[s : s + blk])
        return node
    inner, runs = spec.get("inner_block"), spec.get("inner_interleave")
    sums = []
    for s in starts:
        members = prods[s : s + blk]
        if inner is None:
            sums.append(_fused(None, members))
            continue
        parts = blk // inner
        q = runs or inner
        t: Tree | None = None
        for i in range(parts):
            t = _fused(t, [p for p in members if ((p - s) // q) % parts == i])
        sums.append(t)
    return _chain(c, sums)


def _lca_sizes(tree: Tree, n: int) -> np.ndarray:
    """Matrix of leaf counts under the lowest common ancestor of each pair of leaves."""
    out = np.zeros((n, n), dtype=np.int64)

    def walk(node: Tree) -> list[int]:
        if not isinstance(node, tuple):
            return [node]
        kids = [walk(ch) for ch in node]
        size = sum(len(x) for x in kids)
        for x, y in itertools.combinations(kids, 2):
            out[np.ix_(x, y)] = size
            out[np.ix_(y, x)] = size
        return [leaf for x in kids for leaf in x]

    if n:
        walk(tree)
    return out


def _structures(k: int) -> Iterator[dict[str, Any]]:
    """Every structure of the family, simplest first."""
    yield {"order": "sequential"}
    yield {"order": "pairwise"}
    for b in range(2, k):
        yield {"order": "blocked", "block": b}
    for b in range(1, k + 1):
        yield {"order": "block_fma", "block": b, "addend": "in_block"}
    for b in range(2, k + 1):
        yield {"order": "block_fma", "block": b, "addend": "after_block"}
    for b in (2**i for i in range(2, 8)):
        if b > k:
            break
        for inner in (2**i for i in range(1, 7)):
            if inner >= b:
                break
            for runs in (2**i for i in range(0, 7)):
                if runs > inner:
                    break
                if runs == inner:
                    runs_field = None
                else:
                    runs_field = runs
                yield {
                    "order": "block_fma",
                    "block": b,
                    "addend": "after_block",
                    "inner_block": inner,
                    "inner_interleave": runs_field,
                }


def _tree_from_sizes(sizes: np.ndarray) -> Tree | None:
    """Rebuild a tree from its LCA leaf counts (None when they are not those of a tree)."""
    n = len(sizes)
    clusters = {frozenset(range(n))}
    for i in range(n):
        for s in sorted(set(sizes[i].tolist()) - {0}):
            group = frozenset([i] + [j for j in range(n) if j != i and sizes[i, j] <= s])
            if len(group) != s:
                return None
            clusters.add(group)
    ordered = sorted(clusters, key=len)
    for x, y in itertools.combinations(ordered, 2):
        if x & y and not x <= y:
            return None

    def build(group: frozenset[int]) -> Tree:
        inside = [g for g in ordered if g < group]
        maximal = [g for g in inside if not any(g < h for h in inside)]
        covered = set().union(*maximal) if maximal else set()
        kids = [build(g) for g in maximal] + [j for j in group if j not in covered]
        kids.sort(key=lambda t: min(_leaves(t)))
        return tuple(kids)

    return build(frozenset(range(n))) if n > 1 else 0


def _leaves(t: Tree) -> list[int]:
    return [t] if not isinstance(t, tuple) else [x for ch in t for x in _leaves(ch)]


def _render(t: Tree, k: int) -> str:
    if not isinstance(t, tuple):
        return "c" if t == k else str(t)
    return "(" + " ".join(_render(ch, k) for ch in t) + ")"


def _spec_text(spec: dict[str, Any]) -> str:
    if any(f in spec for f in _LANE_FIELDS):
        inner = _spec_text({k: v for k, v in spec.items() if k not in _LANE_FIELDS})
        return inner + Accumulator(**spec)._lanes_text()
    if spec["order"] in ("sequential", "pairwise"):
        return spec["order"]
    if spec["order"] == "blocked":
        return f"blocked, block {spec['block']}"
    txt = f"block FMA of {spec['block']} products, accumulator {spec['addend'].replace('_', ' ')}"
    if spec.get("inner_block"):
        txt += f", {spec['block'] // spec['inner_block']} chained inner blocks"
        txt += f" of {spec['inner_block']} (runs of {spec.get('inner_interleave') or 'all'})"
    return txt


# ----- the probe ---------------------------------------------------------------------------------
def probe_gemm(
    fn: Callable[..., Any],
    *,
    input_format: str | FloatFormat | tuple[str | FloatFormat, str | FloatFormat] = "fp32",
    out_format: str | FloatFormat | None = None,
    max_k: int = 64,
    seed: int = 0,
    with_c: bool = False,
    cases: int = 2048,
    shape: tuple[int, int] = (8, 8),
    max_calls: int = 20000,
    long_k: int | None = None,
) -> ProbeResult:
    """Find an :class:`Accumulator` that reproduces the matmul ``fn`` bit for bit.

    Parameters
    ----------
    fn:
        ``fn(a, b) -> d`` with ``a`` of shape ``(M, K)``, ``b`` of shape ``(K, N)`` and ``d`` of
        shape ``(M, N)`` (``fn(a, b, c)`` with ``with_c=True``: ``d = c + a @ b``, ``c`` of shape
        ``(M, N)`` in ``d``'s dtype). ``a`` and ``b`` come in the dtype of ``input_format``
        (float32 for fp32/tf32, float16, ml_dtypes bfloat16/float8 types). ``d`` may be any
        float array ``numpy.asarray`` accepts. ``fn`` must be deterministic.
    input_format:
        The format of ``a`` and ``b`` (every input lies on its grid), or a pair ``(format_a,
        format_b)`` for mixed operands (FP8 x FP6 ...: the targeted inputs then lie on a grid
        inside both, and the named models are the presets of that pair): ``fp32``, ``tf32``,
        ``fp16``, ``bf16``, FP8, FP6, FP4 ... or ``fp64`` (inputs of more than 26 significant
        bits: :func:`gemm` models them only as a chain of fp64 fused multiply-adds, which is the
        one model the probe then tries).
    out_format:
        The format of ``d`` (and ``c``); ``None``: that of the dtype ``fn`` returns. Give it when
        ``fn`` returns, say, fp16 values in float32 arrays.
    max_k:
        The longest reduction probed (2 to 256); the model is valid for ``K <= max_k``. The tree
        probe costs ``max_k**2 / 2`` inner products.
    seed:
        Seed of the random confirmation inputs.
    with_c:
        Call ``fn(a, b, c)`` and find where ``c`` enters.
    cases:
        Output elements compared on fresh random inputs to confirm the model (the confidence).
    shape:
        ``(M, N)`` of every call (BLAS libraries choose kernels by shape: probe the shape you
        care about).
    max_calls:
        Upper bound on calls of ``fn``.
    long_k:
        A long reduction (``max_k < long_k <= 8192``) on which a model found is checked too:
        the first product's pairs at ``K = long_k`` (``long_k - 1`` inner products) show
        K-blocking past ``max_k`` (a split where they first depart from the model's tree:
        ``split_k``, sequential with or without OpenBLAS's balanced rest, pairwise or
        halving), then fresh random inputs with K up to ``long_k`` confirm it. ``None``: not
        checked.

    Returns
    -------
    ProbeResult
        ``accumulator`` (or ``None``), ``closest``, ``confidence``, ``evidence`` per property,
        ``failed`` and a plain-language ``verdict``.

    Raises
    ------
    ValueError
        A bad argument, ``fn`` returning the wrong shape or not deterministic.
    TypeError
        ``fn`` returning something that is not a float array.
    RuntimeError
        ``fn`` raised (the message names the shapes it was called with), or more than
        ``max_calls`` calls.

    Examples
    --------
    >>> import numpy as np, precision_lab as pl
    >>> def loop(a, b):   # a plain float32 loop: products rounded to float32, then added
    ...     d = np.zeros((a.shape[0], b.shape[1]), np.float32)
    ...     for k in range(a.shape[1]):
    ...         d += a[:, k : k + 1] * b[k : k + 1, :]
    ...     return d
    >>> res = pl.probe_gemm(loop, input_format="fp32", max_k=12, cases=256)
    >>> print(res.accumulator.describe())
    sequential sum in fp32 (nearest_even), products rounded to fp32 (nearest_even)
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    fins = _format_pair(input_format)
    # the grid of the targeted inputs: the operands' format, or a grid inside both
    fin = fins[0] if fins[0] == fins[1] else _common_grid(*fins)
    # fp64 inputs: an fp64 FMA chain only
    wide = max(f.precision for f in fins) > _EXACT_PRODUCT_BITS
    if isinstance(max_k, bool) or not isinstance(max_k, int) or not 2 <= max_k <= 256:
        raise ValueError(f"max_k must be an int in 2..256, got {max_k!r}")
    if isinstance(cases, bool) or not isinstance(cases, int) or cases < 1:
        raise ValueError(f"cases must be a positive int, got {cases!r}")
    if (
        not isinstance(shape, tuple)
        or len(shape) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape)
    ):
        raise ValueError(f"shape must be a pair of positive ints (M, N), got {shape!r}")
    if long_k is not None and (
        isinstance(long_k, bool) or not isinstance(long_k, int) or not max_k < long_k <= 8192
    ):
        raise ValueError(f"long_k must be None or an int in {max_k + 1}..8192, got {long_k!r}")
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
        raise ValueError(f"max_calls must be a positive int, got {max_calls!r}")
    if not isinstance(with_c, bool):
        raise TypeError(f"with_c must be a bool, got {with_c!r}")
    rng = np.random.default_rng(seed)
    fout_given = None if out_format is None else _float_format(out_format, "out_format")
    dtypes = (_dtype_for(fins[0]), _dtype_for(fins[1]))
    box = _Box(fn, fin, fout_given, dtypes, shape, with_c, max_calls)
    lab = _Lab(box, fin, shape, fins)
    m, n = shape
    evidence: dict[str, str] = {}

    # 0. what fn returns, and whether it is deterministic
    a0, b0, _ = _random_inputs(rng, fins, _FP32, m, max_k, n, "moderate")
    c0 = np.zeros((m, n))
    first = box(a0, b0, c0)
    assert box.out_dtype is not None
    if fout_given is None:
        try:
            fout = _float_format(box.out_dtype.name, "out_format")
        except (TypeError, ValueError):
            raise TypeError(
                f"out_format: fn returns dtype {box.out_dtype}, not a float format; pass out_format"
            ) from None
    else:
        fout = fout_given
    lab.fout = fout
    if not _same(first, box(a0, b0, c0)).all() or not _same(first, box(a0, b0, c0)).all():
        raise ValueError(
            "fn is not deterministic: two calls on the same a and b gave different results "
            "(run-to-run variation, e.g. atomics or split-K); probe_gemm needs a "
            "deterministic fn"
        )
    if not np.isfinite(first).all():
        raise ValueError(
            "fn returned inf or NaN on small random inputs: is input_format right? "
            f"(got {_fins_text(fins)}, inputs in {_dtypes_text(box.in_dtype)})"
        )

    # 0b. one order for every output element?
    places = None if wide else _position_check(lab, fin, fout, max_k)
    if places is not None:
        evidence["places"] = places

    # 1. the summation tree (FPRev)
    kp = max_k
    nleaves = kp + (1 if with_c else 0)
    structures = list(_structures(kp))
    family = [_lca_sizes(_family_tree(st, kp, with_c), nleaves) for st in structures]
    sizes, scale_txt = _probe_tree(lab, fin, fout, kp, with_c, family)
    unmeasurable: str | None = None  # why the order could not be measured
    failed: str | None = None
    specs: list[dict[str, Any]] = []
    dist: list[tuple[int, int, dict[str, Any]]] = []
    tree_txt = ""
    below: tuple[int, dict[str, Any]] | None = None  # a kernel of fewer lanes at small K
    if sizes is None:
        unmeasurable = scale_txt
        failed = "summation tree"
        evidence["tree"] = scale_txt
    else:
        measured = _tree_from_sizes(sizes)
        tree_txt = _render(measured, kp) if measured is not None else "(not a tree)"
        specs = [st for st, f in zip(structures, family, strict=True) if np.array_equal(f, sizes)]
        if not specs and not wide:  # interleaved lanes, split-K (spec 3e)
            specs = _lane_specs(measured, sizes, kp, with_c)
            if specs:
                kernels = _small_k(lab, fin, specs, kp, with_c, scale_txt)
                specs = [kernels.pop("_spec")]
                below = specs[0].pop("_below", None)
                evidence.update(kernels)
        if specs:
            evidence["tree"] = (
                f"{nleaves * (nleaves - 1) // 2} pairs of +-M among units ({scale_txt}) at "
                f"K={kp}: {_spec_text(specs[0])}"
                + (f" (or {len(specs) - 1} equivalent)" if len(specs) > 1 else "")
            )
        else:
            dist = [
                (int((f != sizes).sum()), i, st)
                for i, (st, f) in enumerate(zip(structures, family, strict=True))
            ]
            dist.sort(key=lambda t: (t[0], t[1]))
            specs = [dist[0][2]]
            failed = "summation tree"
            evidence["tree"] = (
                f"{nleaves * (nleaves - 1) // 2} pairs of +-M among units ({scale_txt}) at "
                f"K={kp}: the pair counts are none of the family's trees (orders with exact "
                f"block sums or compensation show as no tree); nearest: {_spec_text(specs[0])} "
                f"({dist[0][0] // 2} of {nleaves * (nleaves - 1) // 2} pairs differ); "
                f"measured: {_shorten(tree_txt)}"
            )
            twos = [j for j in range(1, kp) if sizes[0, j] == 2]
            if len(twos) == 1 and twos[0] >= 2 and 2 * twos[0] > kp:
                evidence["tree"] += (
                    f"; the first product meets product {twos[0]} first: {twos[0]} lanes, "
                    f"which the probe reads with max_k >= {2 * twos[0]} (two products a lane; "
                    "torch.sum has 32)"
                )

    # 2-5. per structure: targeted measurements, then candidates (6: special values below)
    rand_calls = _random_battery(lab, rng, fin, fout, kp)
    best: tuple[float, Accumulator | None, str] = (-1.0, None, "")
    found: Accumulator | None = None
    spec_evidence: dict[str, str] = {}
    searched = 0  # structural candidates scored

    # 8 (also run early, see below). named models: the library's presets for these inputs and
    # plain accumulators, tried whole (orders whose pair counts are no tree, such as
    # exact_block and compensated, and inputs whose range cannot show the order are found here)
    catalogue = _catalogue(fins, fout, kp)
    cat_out: set[int] = set()  # entries that failed a case (cases only accumulate)
    cat_near: list[tuple[float, int, Accumulator, int, int]] = []  # failed confirmations

    def catalogue_pass() -> tuple[str, Accumulator, int, int] | None:
        """The first named model that reproduces every call so far and the confirmation."""
        _special_calls(lab, fin, fout, kp, with_c)
        head = rand_calls[:1]
        everything = head + [i for i in range(len(lab.calls)) if i not in head]
        for i, (label, acc) in enumerate(catalogue):
            if i in cat_out:
                continue
            ok, _, _ = lab.score(acc, everything)
            if not ok:
                cat_out.add(i)
                continue
            got_r, got_t = _confirm(lab, acc, rng, fin, fout, max_k, cases)
            if got_r == got_t:
                return label, acc, got_r, got_t
            cat_out.add(i)
            cat_near.append((got_r / got_t, -i, acc, got_r, got_t))
            if len(cat_near) >= 3:  # each confirmation costs calls of fn
                break
        return None

    hit: tuple[str, Accumulator, int, int] | None = None
    if wide:
        evidence["search"] = (
            f"{_fins_text(fins)} inputs have more than {_EXACT_PRODUCT_BITS} significant bits: "
            "pl.gemm models them only as a chain of fp64 fused multiply-adds, so the probe tries "
            "only the named models"
        )
    elif sizes is not None and failed is None:  # the family's tree: first candidate that fits
        for spec in specs[:6]:
            measures = _measure(lab, fin, fout, spec, kp, with_c)
            targeted = measures.pop("_calls")
            order = rand_calls[:1] + list(targeted) + rand_calls[1:]
            pool_acc = itertools.chain(
                itertools.islice(_candidates(spec, measures, fin), 600),
                itertools.islice(_separate_candidates(spec, measures), 400),
            )
            for acc in pool_acc:
                searched += 1
                if searched == _EARLY_CATALOGUE:  # a long search: the named models first
                    hit = catalogue_pass()
                    if hit is not None:
                        break
                ok, score, _ = lab.score(acc, order, finite_only=True)
                if ok:
                    found = acc
                    break
                if score > best[0]:
                    best = (score, acc, lab.calls[order[int(score)]][0])
                    spec_evidence = measures["_evidence"]
            if found is not None:
                spec_evidence = measures["_evidence"]
            if found is not None or hit is not None:
                break
    elif sizes is not None:  # not the family's: the closest model, by random cases reproduced
        pool = [d[2] for d in dist[:2]] + [{"order": "sequential"}, {"order": "pairwise"}]
        seen_specs: list[dict[str, Any]] = []
        for spec in pool:
            if spec in seen_specs:
                continue
            seen_specs.append(spec)
            measures = _measure(lab, fin, fout, spec, kp, with_c)
            measures.pop("_calls")
            for acc in itertools.islice(_candidates(spec, measures, fin), 40):
                searched += 1
                agree = lab.agree(acc, rand_calls[:2])
                if agree > best[0]:
                    best = (agree, acc, "")
                    spec_evidence = measures["_evidence"]
    evidence.update(spec_evidence)
    for key in list(evidence):
        if key.startswith("_"):
            del evidence[key]
    if hit is None and found is not None and failed is None:
        assert isinstance(found.format, FloatFormat)
        evidence["rounding"] = (
            f"{found.rounding} (of {', '.join(PROBE_MODES)}), {found.format.precision} "
            f"significant bits: the first candidate reproducing every targeted case and the "
            f"finite non-zero results of {sum(lab.calls[i][4].size for i in rand_calls)} "
            "random ones"
        )
    elif failed is None and not wide:
        failed = "format and rounding"
        evidence["rounding"] = (
            f"no candidate reproduced every case; the best failed on the '{best[2]}' cases"
            if hit is None
            else f"none of the first {searched - 1} candidates reproduced every case"
        )
    if hit is None and found is not None and failed is None:  # the special-value rules
        refined, text = _special_values(lab, found, fin, fout, kp, with_c, rand_calls)
        evidence["special values"] = text
        if refined is None:
            failed = "special values"
        else:
            found = refined
    chosen = found if found is not None and failed is None else best[1]

    # 7. confirmation on fresh random inputs
    reproduced = tried_n = 0
    if found is not None and failed is None and below is not None:  # a small-K kernel (3g)
        found = chosen = _attach_below(found, below)
    if hit is None and found is not None and failed is None:
        reproduced, tried_n = _confirm(lab, found, rng, fin, fout, max_k, cases)
        if reproduced != tried_n:
            failed = "confirmation"

    # 8. the named models, when the structural search found nothing
    if wide and failed is None:
        failed = "named models"
    if hit is None and failed is not None:
        hit = catalogue_pass()
    if hit is not None:
        label, acc, reproduced, tried_n = hit
        found, chosen, failed = acc, acc, None
        evidence["named model"] = (
            f"{label}: the first of {len(catalogue)} named models ({_catalogue_text(fins)}) "
            f"to reproduce every case so far (the tree, targeted, special-value and random "
            f"inputs of {len(lab.calls)} calls)"
        )
        if unmeasurable is not None:
            evidence["named model"] += (
                "; the order was not measured, so other orders may reproduce fn too"
            )
    elif failed is not None:
        evidence["named models"] = (
            f"none of {len(catalogue)} named models ({_catalogue_text(fins)}) reproduces every case"
        )
        if cat_near and (chosen is None or tried_n == 0 or max(cat_near)[0] > reproduced / tried_n):
            _, _, chosen, reproduced, tried_n = max(cat_near)
        elif chosen is None and catalogue:  # the named model closest on the random cases
            scores = [(lab.agree(acc, rand_calls[:2]), -i) for i, (_, acc) in enumerate(catalogue)]
            chosen = catalogue[-max(scores)[1]][1]
    if chosen is not None and tried_n == 0:
        reproduced, tried_n = _confirm(lab, chosen, rng, fin, fout, max_k, cases)

    # 7b. long reductions: K-blocking past max_k
    if long_k is not None and found is not None and failed is None:
        longer, ok_long, txt, r_long, t_long = _long_k(
            lab, fin, fout, found, long_k, with_c, scale_txt if sizes is not None else "",
            rng, cases, max_k,
        )  # fmt: skip
        evidence["long K"] = txt
        reproduced, tried_n = reproduced + r_long, tried_n + t_long
        if ok_long:
            found = chosen = longer
        else:
            wrong_tree = "the probe tries gives them" in txt or "is not the model's" in txt
            failed = "long K" if wrong_tree else "confirmation"
            chosen = longer

    if places is None and long_k is not None and not wide:
        places = _position_check(lab, fin, fout, long_k)
        if places is not None:
            evidence["places"] = places
    if places is not None:  # one order per element is what the family has: never reproduced
        failed, unmeasurable = "places", None
    if not _same(first, box(a0, b0, c0)).all():
        raise ValueError(
            "fn is not deterministic: the first inputs gave a different result at the end of "
            "the probe; probe_gemm needs a deterministic fn"
        )
    if tried_n:
        evidence["confirmation"] = (
            f"{reproduced}/{tried_n} output elements of fresh random inputs (K = 1..{max_k}, "
            "moderate, wide-exponent, cancelling and integer values) reproduced bit for bit"
        )
    if failed is None:
        outcome = "reproduced"
    elif unmeasurable is not None:
        outcome = "cannot measure"
    else:
        outcome = "outside"
    tried_txt = (
        (
            ""
            if wide
            else "the summation-tree probe (FPRev) at every scale the formats allow, "
            if unmeasurable is not None
            else f"{len(structures)} summation orders of the family (FPRev), "
        )
        + (f"{searched} accumulator candidates for the measured order, " if searched else "")
        + f"{len(catalogue)} named models ({_catalogue_text(fins)})"
    )
    return _result(
        found if failed is None else None,
        chosen,
        reproduced,
        tried_n,
        evidence,
        failed,
        tree_txt,
        lab,
        fin,
        fout,
        outcome=outcome,
        tried_models=tried_txt,
        why=unmeasurable,
    )


def _position_check(lab: _Lab, fin: FloatFormat, fout: FloatFormat, k: int) -> str | None:
    """Whether ``fn`` sums every output element in one order: the same inner products in
    every row and column (``+M``, ``-M`` and units, three placements), each output compared
    with element ``(0, 0)``. Where they differ, the cases go only to the diagonal places that
    agree with ``(0, 0)`` (``lab.diag``), and a sentence names the places that differ
    (measured: numpy 2.4.6's OpenBLAS float32 on an AMD Zen 3, 24 x 24: rows in blocks of 6,
    columns in blocks of 8, two orders, the register tiles' edge kernels). ``None`` where
    every element agrees."""
    hi = min(2 * fin.emax, fout.emax, 40)
    lo = max(hi - 64, 2 * (fin.emin - fin.mantissa_bits), fout.emin - fout.mantissa_bits)
    ua, ma, na = _split(2.0**lo, fin), _split(2.0**hi, fin), _split(-(2.0**hi), fin)
    if ua is None or ma is None or na is None or hi - lo < 8 or k < 3:
        return None
    agree = np.ones((lab.m, lab.n), dtype=bool)
    for p, j in ((0, 1), (0, k - 1), (1, k // 2)):
        av, bv = np.full(k, ua[0]), np.full(k, ua[1])
        av[p], bv[p] = ma
        av[j], bv[j] = na
        a = np.tile(av, (lab.m, 1))
        b = np.tile(bv[:, None], (1, lab.n))
        d = lab.box(a, b, np.zeros((lab.m, lab.n)))
        agree &= _same(d, np.full_like(d, d[0, 0]))
    if agree.all():
        return None
    lab.diag = [i for i in range(min(lab.m, lab.n)) if agree[i, i]]
    rows = [i for i in range(lab.m) if not agree[i].all()]
    cols = [j for j in range(lab.n) if not agree[:, j].all()]
    return (
        f"the same inner products (K = {k}) in every row and column give other sums than at "
        f"(0, 0) at {int((~agree).sum())} of {agree.size} output places (rows {_ranges(rows)}, "
        f"columns {_ranges(cols)}): fn sums output elements in different orders by their "
        f"place (a BLAS kernel's edge tiles); the cases were put at the {len(lab.diag)} "
        "diagonal places that agree with (0, 0)"
    )


def _ranges(xs: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: list[str] = []
    for x in xs:
        if out and x == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{x}"
        else:
            out.append(str(x))
    return ", ".join(out)


def _shorten(txt: str, limit: int = 400) -> str:
    return txt if len(txt) <= limit else txt[: limit - 5] + " ...)"


#: what each failed property means, for the verdict
_FAILED_TEXT = {
    "summation tree": "fn sums in an order none of these models has",
    "format and rounding": "no accumulator format, rounding mode, alignment or product "
    "rounding reproduces the targeted cases",
    "special values": "no combination of the special-value rules reproduces the special inputs",
    "confirmation": "a model reproduced the targeted cases but not every fresh random one",
    "long K": "the summation tree at K = long_k is none of the model's K-splits (a kernel "
    "that changes with K, beyond the family)",
    "named models": "none reproduces every case",
    "places": "fn sums different output elements in different orders (BLAS kernels tile the "
    "output, and edge tiles run other kernels); every model of the family gives each element "
    "one order: probe a shape whose elements share one kernel, or one element",
}


def _result(
    acc: Accumulator | None,
    closest: Accumulator | None,
    reproduced: int,
    tried: int,
    evidence: dict[str, str],
    failed: str | None,
    tree: str,
    lab: _Lab,
    fin: FloatFormat,
    fout: FloatFormat,
    *,
    outcome: str,
    tried_models: str = "",
    why: str | None = None,
) -> ProbeResult:
    conf = reproduced / tried if tried else 0.0
    io = f"({_fins_text(lab.fins)} inputs, {fout} output)"
    if acc is not None:
        verdict = (
            f"Reproduced: fn {io} is reproduced bit for bit by Accumulator: {acc.describe()}; "
            f"{reproduced}/{tried} fresh random cases reproduced (confidence {conf:.4f})."
        )
    else:
        if outcome == "cannot measure":
            reason = (why or "").removeprefix("cannot measure the summation order: ")
            verdict = (
                f"Cannot measure: the summation order of fn {io}: {reason}; and no model tried "
                "without it reproduces fn."
            )
        else:
            verdict = (
                f"Outside what the probe tries: no model it tried reproduces fn {io}; the property "
                f"that failed: {failed} ({_FAILED_TEXT.get(failed or '', failed)})."
            )
        verdict += f" Tried: {tried_models}."
        if closest is not None:
            verdict += (
                f" Closest: {closest.describe()}, reproducing {reproduced}/{tried} fresh random "
                f"cases ({100 * conf:.1f}%)."
            )
    return ProbeResult(
        accumulator=acc,
        closest=closest,
        confidence=conf,
        reproduced=reproduced,
        tried=tried,
        evidence=dict(evidence, calls=f"{lab.box.calls} calls of fn"),
        failed=failed,
        tree=tree,
        verdict=verdict,
        outcome=outcome,
    )


def _probe_tree(
    lab: _Lab,
    fin: FloatFormat,
    fout: FloatFormat,
    k: int,
    with_c: bool,
    family: Sequence[np.ndarray],
) -> tuple[np.ndarray | None, str]:
    """FPRev: the LCA leaf counts of every pair of leaves.

    Scales ``M / u`` from wide to narrow and both signs of the units are tried; the first whose
    counts are those of a tree of the family wins, else the first that gives a tree at all.
    A unit that meets ``-M`` under a directed rounding (toward zero: ``-M + u`` rounds to
    ``-(M - ulp)``) shifts the big values by whole ulps of ``M``, not by units: with
    ``ulp(M) / u`` a multiple of ``2**bits`` (``2**bits > K``) the count of units is the result
    in units modulo ``2**bits``, whatever the ulps.
    """
    n = k + (1 if with_c else 0)
    bits = max(1, (n - 1).bit_length())
    hmax = min(2 * fin.emax, fout.emax)  # M must come back in the output (see the screen)
    lo_min = max(2 * (fin.emin - fin.mantissa_bits), fout.emin - fout.mantissa_bits)
    tries: list[tuple[int, int]] = []
    # up to 2**64: a unit beside M must be absorbed by an fp64 accumulator too
    for ratio in range(64, bits + 4, -1):
        for hi in (min(hmax, 40), min(hmax, 14)):
            lo = hi - ratio
            if lo >= lo_min and (hi, lo) not in tries:
                tries.append((hi, lo))
    pairs = list(itertools.combinations(range(n), 2))
    screen = sorted({(0, n - 1), (0, 1), (n // 2, n - 1), (1, n // 2), (n - 2, n - 1)} & set(pairs))
    span = (
        f"{fin}'s products and {fout}'s range allow M up to 2**{hmax} and units down to 2**{lo_min}"
    )
    need = f"the tree probe needs M / u of at least 2**{bits + 5} at K = {k}"
    ran: list[int] = []  # the ratios whose inputs lie on the input grid (and were run)

    def why_not() -> str:
        if not ran:
            return (
                f"cannot measure the summation order: {span}, and {need}; no such M and u "
                f"are products of two {fin} numbers (the input format's range is too narrow)"
            )
        widest = max(ran)
        return (
            f"cannot measure the summation order: {span}; at every ratio M / u tried (2**{widest} "
            f"down to 2**{bits + 5}) a unit beside M was not absorbed or the units did not "
            "count (fn keeps more bits than the ratio, or sums exactly)"
            + (
                f": the input format's range is too narrow to measure an accumulator wider than "
                f"about {widest} bits"
                if widest < 64
                else ""
            )
        )

    fallback: tuple[np.ndarray, str] | None = None
    full_runs = 0

    def case(vals: list[float]) -> Case | None:
        prods, c = (vals[:k], vals[k]) if with_c else (vals, 0.0)
        ab = _vectors(prods, fin)
        return None if ab is None else (ab[0], ab[1], c)

    def counts(res: np.ndarray, unit: float) -> np.ndarray | None:
        q = res / unit
        if not np.all(np.isfinite(q)) or np.any(q != np.round(q)):
            return None
        cnt = np.mod(np.round(q).astype(np.int64), 2**bits)
        return None if np.any(cnt > n - 2) else cnt

    # after a tree that is not the family's, only narrower scales that suit a directed rounding
    # of a common precision p: ulp(M) / u just above 2**bits, so that the ulps the big values
    # gain stay exact next to the units
    allowed: set[int] | None = None
    for hi, lo in tries:
        if allowed is not None and hi - lo not in allowed:
            continue
        for sign in (1.0, -1.0):
            unit, big = sign * 2.0**lo, 2.0**hi
            chosen = pairs if len(pairs) <= len(screen) else screen
            # the screen: all units (they must add up exactly), M among units (M must come
            # back: an accumulator that overflows, or saturates like toward_zero, would lose
            # every unit and fake a single fused node), then a few pairs
            todo = [case([unit] * n), case([big] + [unit] * (n - 1))] + [
                case([big if t == i else -big if t == j else unit for t in range(n)])
                for i, j in chosen
            ]
            if any(x is None for x in todo):
                continue
            ran.append(hi - lo)
            res = lab.run_cases("tree", [x for x in todo if x is not None], k)
            near = bool(np.isfinite(res[1]) and abs(res[1] - big) <= big * 2.0**-6)
            res = np.delete(res, 1)
            if res[0] != n * unit or not near or counts(res[1:], unit) is None:
                continue
            if chosen is not pairs:
                full_runs += 1
                if full_runs > 12 and fallback is not None:
                    return fallback
                full = [
                    case([big if t == i else -big if t == j else unit for t in range(n)])
                    for i, j in pairs
                ]
                res = np.concatenate(
                    [[0.0], lab.run_cases("tree", [x for x in full if x is not None], k)]
                )
            cnt = counts(res[1:], unit)
            if cnt is None:
                continue
            sizes = np.zeros((n, n), dtype=np.int64)
            for (i, j), v in zip(pairs, cnt, strict=True):
                sizes[i, j] = sizes[j, i] = n - int(v)
            text = f"M = 2**{hi}, unit = {'-' if sign < 0 else ''}2**{lo}"
            if any(np.array_equal(sizes, f) for f in family):
                return sizes, text
            allowed = {
                p - 1 + bits + d
                for p in (53, 24, 14, 11, 8, 4)
                for d in (1, 2, 3)
                if p - 1 + bits + d < hi - lo
            } - ({hi - lo} if allowed is None else set())
            if fallback is None and _tree_from_sizes(sizes) is not None:
                fallback = (sizes, text)
            break
    if fallback is not None:
        return fallback
    return None, why_not()


def _restrict(tree: Tree, keep: int) -> Tree | None:
    """The tree restricted to the leaves ``0 .. keep-1`` (one-child nodes collapsed)."""
    return prune_tree(tree, keep)


def _lane_specs(
    measured: Tree | None, sizes: np.ndarray, k: int, with_c: bool
) -> list[dict[str, Any]]:
    """Spec 3d structures (lanes, their combination tree, the tail, split-K) whose pair counts
    are the measured ones. The lane count is read off the tree: with lanes, the first product
    meets first the product one lane-width later (``sizes[0, L] == 2``); the lanes' tree is
    the measured tree restricted to the lanes' first products ``0 .. L-1`` (a named tree where
    it is one); the tail (``"lanes"`` or ``"after"``) and K-splits (powers of two, combined
    sequentially, pairwise or by halving) are tried and compared with the measured counts."""
    if measured is None or k < 4:
        return []
    n = len(sizes)
    row = sizes[0, 1:k]
    twos = [j + 1 for j, v in enumerate(row.tolist()) if v == 2]
    if len(twos) != 1 or twos[0] < 2 or 2 * twos[0] > k:
        return []
    L = twos[0]
    sub = _restrict(measured, L)
    if sub is None or not isinstance(sub, tuple):
        return []
    comb: Any = sub
    for name in LANE_COMBINES:
        if np.array_equal(
            _lca_sizes(_tree_of(combine_tree(name, L), list(range(L))), L),
            _lca_sizes(sub, L),
        ):
            comb = name
            break
    found: list[dict[str, Any]] = []
    splits: list[tuple[int | None, str]] = [(None, "sequential")]
    splits += [
        (S, how)
        for S in (2**i for i in range(1, 13))
        if L <= S < k
        for how in ("sequential", "pairwise", "halving")
    ]
    tails: list[dict[str, Any]] = [{"lane_tail": "lanes"}]
    tails += [
        {"lane_tail": rule, **({"lane_unroll": u} if u != L else {})}
        for rule in ("after", "first", "separate", "separate_first")
        for u in (L, 2 * L, 4 * L, 8 * L)
        if u <= k
    ]
    # a cleanup loop of one vector accumulator (torch.sum: 32 lanes, then vectors of 8)
    tails += [
        {"lane_tail": rule, "lane_vector": v}
        for v in (L // 2, L // 4, L // 8)
        if v >= 2 and L % v == 0
        for rule in ("after", "separate", "separate_first")
    ]
    orders: list[dict[str, Any]] = [
        {"order": "sequential"},
        {"order": "blocked", "block": 2},
        {"order": "blocked", "block": 4},
        {"order": "pairwise"},
    ]
    shapes = [(o, S, how) for o in orders for S, how in splits[:1]]
    shapes += [(orders[0], S, how) for S, how in splits[1:]]
    for order, S, how in shapes:
        for tail in tails if S is None else tails[:4]:
            spec: dict[str, Any] = {**order, "lanes": L, "lane_combine": comb, **tail}
            if S is not None:
                spec.update(split_k=S, split_combine=how)
            try:
                Accumulator(**spec)
            except ValueError:
                continue
            if np.array_equal(_lca_sizes(_family_tree(spec, k, with_c), n), sizes):
                found.append(spec)
        if found:
            break
    return found


def _small_k(
    lab: _Lab,
    fin: FloatFormat,
    specs: list[dict[str, Any]],
    kp: int,
    with_c: bool,
    scale_txt: str,
) -> dict[str, Any]:
    """Whether the lanes hold at every shorter K (a kernel that changes with K): for each
    ``K' < kp``, the pair counts of the first product with every other one (``K' - 1`` inner
    products) are compared with each candidate structure's (they may differ only below
    ``kp``, as the tail rules do) and with a plain chain. ``small_k`` is the least K from
    which on the lanes hold, when a chain holds below it. Returns the chosen spec (``_spec``)
    and its evidence (``kernels``)."""
    import re

    got = re.search(r"M = 2\*\*(-?\d+), unit = (-?)2\*\*(-?\d+)", scale_txt)
    if got is None:  # pragma: no cover - the tree probe's own text
        return {"_spec": specs[0]}
    big = 2.0 ** int(got.group(1))
    unit = (-1.0 if got.group(2) else 1.0) * 2.0 ** int(got.group(3))
    rows: dict[int, np.ndarray | None] = {}
    for kk in range(2, kp):
        row = _first_row(lab, fin, big, unit, kk, with_c)
        if row is None:  # (M or the unit has no factors in the input format)
            return {"_spec": specs[0]}
        rows[kk] = row if isinstance(row, np.ndarray) else None

    def kinds(spec: dict[str, Any]) -> dict[int, str]:
        out = {}
        for kk, row in rows.items():
            n = kk + (1 if with_c else 0)
            lanes_row = _lca_sizes(_family_tree(spec, kk, with_c), n)[0, 1:]
            chain_row = _lca_sizes(_family_tree({"order": "sequential"}, kk, with_c), n)[0, 1:]
            out[kk] = (
                "other"
                if row is None
                else "lanes"
                if np.array_equal(row, lanes_row)
                else "chain"
                if np.array_equal(row, chain_row)
                else "other"
            )
        return out

    best: tuple[int, dict[str, Any], str] | None = None
    for spec in specs:
        kd = kinds(spec)
        differ = [kk for kk in kd if kd[kk] != "lanes"]
        if not differ:
            return {
                "_spec": dict(spec),
                "kernels": f"the lanes hold at every K from 2 to {kp} (pairs of the first product)",
            }
        last = max(differ)
        if all(kd[kk] == "chain" or kd[kk] == "lanes" for kk in range(2, last + 1)):
            # a chain below last + 1 (where lanes and a chain agree, either)
            cand = dict(spec, small_k=last + 1)
            txt = (
                f"the kernel changes with K: a plain chain (one accumulator) for K < {last + 1}, "
                f"the lanes from K = {last + 1} on (pairs of the first product at every K < {kp})"
            )
            score = 1
        else:
            cand = dict(spec)
            odd = [kk for kk in differ if kd[kk] == "other"][:8]
            txt = (
                f"the kernel changes with K: at K = {', '.join(map(str, odd))} the first "
                "product's pairs are neither the lanes' nor a chain's"
            )
            score = 2 + len(odd)
            below = _small_kernel(rows, max(differ), int(spec["lanes"]), with_c)
            if below is not None:  # another lane kernel up to K = max(differ) (spec 3g)
                cand["_below"] = (max(differ), below)
                txt = (
                    f"the kernel changes with K: up to K = {max(differ)} "
                    f"{_spec_text(below)}; from K = {max(differ) + 1} the lanes (pairs of the "
                    f"first product at every K < {kp})"
                )
                score = 1
        if best is None or score < best[0]:
            best = (score, cand, txt)
    assert best is not None
    return {"_spec": best[1], "kernels": best[2]}


def _small_kernel(
    rows: dict[int, np.ndarray | None], s: int, lanes: int, with_c: bool
) -> dict[str, Any] | None:
    """A lane kernel of fewer lanes whose first-product pairs are ``rows`` at every K up to
    ``s`` (measured: torch 2.13's ``torch.sum`` on an Intel Xeon: 4 lanes, the tail added to
    lane 0, below K = 8, and 4 x 8 lanes from K = 8 on); ``None`` where none is."""
    cands: list[dict[str, Any]] = [{"order": "sequential"}]
    cands += [
        {"order": "sequential", "lanes": m, "lane_combine": comb, "lane_tail": tail}
        for m in (2, 4, 8, 16)
        if m < lanes
        for tail in ("lanes", "first", "after", "separate")
        for comb in LANE_COMBINES
    ]
    for spec in cands:
        ok = True
        for kk in range(2, s + 1):
            row = rows.get(kk)
            n = kk + (1 if with_c else 0)
            if row is None or not np.array_equal(
                row, _lca_sizes(_family_tree(spec, kk, with_c), n)[0, 1:]
            ):
                ok = False
                break
        if ok:
            return spec
    return None


def _attach_below(acc: Accumulator, below: tuple[int, dict[str, Any]] | None) -> Accumulator:
    """``acc`` as the kernel past ``K = s`` of a model whose kernel up to ``s`` has the lane
    structure ``below`` and ``acc``'s arithmetic (spec 3g)."""
    if below is None:
        return acc
    s, spec = below
    small = _without_lanes(
        acc,
        order=spec["order"],
        lanes=spec.get("lanes"),
        lane_combine=spec.get("lane_combine", "sequential"),
        lane_tail=spec.get("lane_tail", "lanes"),
        block=None,
    )
    return small.replace(switch_k=s, long_kernel=acc)


def _lca_row0(tree: Tree, n: int) -> np.ndarray:
    """Leaf counts under the lowest common ancestor of leaf 0 and each leaf (iterative:
    chains thousands deep)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:  # post-order: the leaf count of every node
        node, done = stack.pop()
        if not isinstance(node, tuple):
            continue
        if done:
            sizes[id(node)] = sum(1 if not isinstance(ch, tuple) else sizes[id(ch)] for ch in node)
        else:
            stack.append((node, True))
            stack.extend((ch, False) for ch in node)
    out = np.zeros(n, dtype=np.int64)
    node = tree
    while isinstance(node, tuple):  # down the path to leaf 0
        size = sizes[id(node)]
        nxt = None
        for ch in node:
            if nxt is None and _holds_zero(ch):
                nxt = ch
                continue
            for leaf in _leaves_iter(ch):
                out[leaf] = size
        node = nxt
    return out


def _holds_zero(t: Tree) -> bool:
    return any(leaf == 0 for leaf in _leaves_iter(t))


def _leaves_iter(t: Tree) -> Iterator[int]:
    stack = [t]
    while stack:
        x = stack.pop()
        if isinstance(x, tuple):
            stack.extend(x)
        else:
            yield x


def _without_lanes(acc: Accumulator, **fields: Any) -> Accumulator:
    """``acc`` with spec 3e's structure (the lane and split fields, a tail's own format) at
    their defaults, then ``fields``: one chain, or the structure ``fields`` give."""
    defaults = Accumulator()
    plain = {f: getattr(defaults, f) for f in (*_LANE_FIELDS, *_TAIL_FIELDS)}
    return acc.replace(**{**plain, **fields})


def _spec_of(acc: Accumulator) -> dict[str, Any]:
    """The structural fields of ``acc`` as a probe spec (for its tree)."""
    spec: dict[str, Any] = {"order": acc.order}
    if acc.block is not None:
        spec["block"] = acc.block
    if acc.order == "block_fma":
        spec["addend"] = acc.addend
        if acc.inner_block is not None:
            spec["inner_block"] = acc.inner_block
            spec["inner_interleave"] = acc.inner_interleave
    defaults = Accumulator()
    for f in _LANE_FIELDS:
        if getattr(acc, f) != getattr(defaults, f):
            spec[f] = getattr(acc, f)
    return spec


def _long_k(
    lab: _Lab,
    fin: FloatFormat,
    fout: FloatFormat,
    acc: Accumulator,
    long_k: int,
    with_c: bool,
    scale_txt: str,
    rng: np.random.Generator,
    cases: int,
    max_k: int,
) -> tuple[Accumulator, bool, str, int, int]:
    """The model at ``K = long_k``: K-blocking read off the first product's pairs, then fresh
    random inputs of long K. Returns (model, reproduced?, evidence, reproduced, tried)."""
    import re

    got = re.search(r"M = 2\*\*(-?\d+), unit = (-?)2\*\*(-?\d+)", scale_txt)
    txt = ""
    small = None  # a kernel of fewer lanes up to some K below max_k (spec 3g), kept as it is
    if acc.switch_k is not None and acc.switch_k < max_k:
        small, acc = acc, acc.for_k(max_k)
    model = acc
    row_ok = True
    # the count of units must come back exactly: a narrow output (bf16) measures the order
    # only up to K = 2**p - 2, and says so
    k_top = min(long_k, 2**fout.precision - 2)
    if k_top <= max_k:
        txt = f"K-blocking not measured: counts past K = {k_top} are not exact in {fout} output"
    elif got is not None and acc.order in ("sequential", "pairwise", "blocked"):
        big = 2.0 ** int(got.group(1))
        unit = (-1.0 if got.group(2) else 1.0) * 2.0 ** int(got.group(3))
        row = _first_row(lab, fin, big, unit, k_top, with_c)
        if isinstance(row, str):
            txt = row
        elif row is not None:
            explained, txt = _long_k_model(lab, fin, big, unit, acc, row, k_top, with_c, max_k)
            if explained is None:
                row_ok = False  # the model is known wrong at long K, whatever random inputs say
            else:
                model = explained
            if k_top < long_k:
                txt += (
                    f" (the pairs measured up to K = {k_top}: counts past it are not exact in "
                    f"{fout} output)"
                )
                if row_ok:
                    bad = _sparse_fprev(lab, fin, big, unit, model, k_top, long_k, rng)
                    txt += (
                        f"; {bad}"
                        if bad
                        else (
                            f"; past it, +M and -M among a few units agree with the model up to "
                            f"K = {long_k}"
                        )
                    )
                    row_ok = not bad
    if small is not None:
        model = small.replace(long_kernel=model)
    # fresh random inputs of long K
    same = done = 0
    kinds = ("moderate", "cancel", "ints")
    for i, kk in enumerate(
        [long_k, long_k - 1] + [int(x) for x in rng.integers(_long_min(long_k), long_k, size=2)]
    ):
        a, b, c = _random_inputs(rng, lab.fins, fout, lab.m, kk, lab.n, kinds[i % 3])
        d = lab.box(a, b, c)
        same += int(_same(lab.model(model, a, b, c), d).sum())
        done += d.size
    txt = (txt + "; " if txt else "") + (
        f"{same}/{done} output elements of fresh random inputs with K up to {long_k} "
        "reproduced bit for bit"
    )
    return model, row_ok and same == done, txt, same, done


def _row_of(model: Accumulator, k: int, with_c: bool) -> np.ndarray:
    """The first product's pairs of ``model`` at ``K = k`` (its family tree)."""
    return _lca_row0(_family_tree(_spec_of(model), k, with_c), k + (1 if with_c else 0))[1:]


def _structure_at(
    lab: _Lab,
    fin: FloatFormat,
    big: float,
    unit: float,
    bases: Sequence[Accumulator],
    row: np.ndarray,
    k: int,
    with_c: bool,
) -> tuple[Accumulator | None, str]:
    """The first of ``bases``, or of their K-splits, whose first-product pairs at ``K = k`` are
    ``row``; ``None`` where none. Returns (model, evidence of the split's size)."""
    for base in bases:
        mine = _row_of(base, k, with_c)
        if np.array_equal(row, mine):
            return base, ""
        j0 = int(np.argmax(row != mine)) + 1
        # the block length: where the pairs depart (a chain), or the leaves under the first
        # departing pair (lanes: product 1 meets product 0 when its block's lanes combine)
        sizes = [j0] + [v for v in (int(row[j0 - 1]),) if 1 < v < k and v != j0]
        tries: list[dict[str, Any]] = [
            {"split_k": S, "split_combine": how}
            for S in sizes
            for how in ("sequential", "halving", "pairwise")
        ] + [
            {"split_k": S, "split_combine": "sequential", "split_balance": u, "split_half": h}
            for S in sizes
            for u in _BALANCE_UNITS
            for h in SPLIT_HALVES
            if u < S
        ]
        # a halving or pairwise split departs before its block length: try them all
        tries += [
            {"split_k": 2**e, "split_combine": how}
            for e in range(3, 13)
            if 2**e < k
            for how in ("halving", "pairwise", "sequential")
        ]
        for extra in tries:
            try:
                cand = base.replace(**extra)
            except (ValueError, TypeError):
                continue
            if np.array_equal(row, _row_of(cand, k, with_c)):
                txt = ""
                if extra.get("split_combine") == "sequential" and j0 == extra["split_k"]:
                    cand, txt = _split_size(lab, fin, big, unit, base, cand, j0, k, with_c)
                if cand.split_balance is not None:
                    cand, more = _balance_unit(lab, fin, big, unit, cand, row, k, with_c)
                    txt += more
                return cand, txt
    return None, ""


def _sparse_fprev(
    lab: _Lab,
    fin: FloatFormat,
    big: float,
    unit: float,
    model: Accumulator,
    k_top: int,
    long_k: int,
    rng: np.random.Generator,
) -> str:
    """The order past ``k_top`` where a narrow output cannot count every unit: ``+M`` and
    ``-M`` at random positions among ``k_top // 2`` units (zeros elsewhere), at ``K = 2**e``,
    ``2**e + 1`` and ``long_k``, the model against fn case by case. A sentence naming the
    first K where they differ, or ``""``."""
    ua, ma, na = _split(unit, fin), _split(big, fin), _split(-big, fin)
    if ua is None or ma is None or na is None:
        return ""
    ks = sorted({k for e in range(1, 14) for k in (2**e, 2**e + 1) if k_top < k < long_k})
    for k in [*ks, long_k]:
        cases: list[Case] = []
        for t in range(2 * min(lab.m, lab.n)):
            av, bv = np.zeros(k), np.zeros(k)
            units = rng.choice(k, min(k, k_top // 2), replace=False)
            av[units], bv[units] = ua
            p = 0 if t % 2 == 0 else int(rng.integers(0, k))
            q = p
            while q == p:
                q = int(rng.integers(0, k))
            av[p], bv[p] = ma
            av[q], bv[q] = na
            cases.append((av, bv, 0.0))
        got = lab.run_cases("long K (few units)", cases, k)
        a = np.zeros((len(cases), k))
        b = np.zeros((k, len(cases)))
        for i, (av, bv, _) in enumerate(cases):
            a[i], b[:, i] = av, bv
        want = lab.model(model, a, b, np.zeros((len(cases), len(cases)))).diagonal()
        if not _same(want, got).all():
            n_bad = int((~_same(want, got)).sum())
            return (
                f"past it, +M and -M among {min(k, k_top // 2)} units give other sums than the "
                f"model's at K = {k} ({n_bad} of {len(cases)} cases): the order past K = "
                f"{k_top} is not the model's"
            )
    return ""


def _long_k_model(
    lab: _Lab,
    fin: FloatFormat,
    big: float,
    unit: float,
    acc: Accumulator,
    row: np.ndarray,
    long_k: int,
    with_c: bool,
    max_k: int,
) -> tuple[Accumulator | None, str]:
    """The model whose first-product pairs are the library's at ``long_k`` and at the K
    between ``max_k`` and it: ``acc``, a K-split of it or, with lanes, a chain (the lanes'
    order in one lane), each the kernel of a range of K (spec 3g). The kernel of ``long_k`` is
    found first; then the pairs at ``K = 2**e`` and ``2**e + 1`` below it (and at ``max_k``)
    are compared with the kernel found above them, and where they differ, bisection on K
    finds the switch (measured: torch 2.13's float16 matmul on an Intel Xeon with
    AVX512-FP16: lanes to K = 64, a chain in K-blocks of 512 to K = 1024, blocks of 1024
    beyond). ``None`` where no model the probe tries gives some K's pairs. Returns (model,
    evidence)."""
    bases = [acc]
    if acc.lanes is not None and acc.order == "sequential" and acc.lane_run is None:
        # each lane in blocks (torch.sum)
        bases += [acc.replace(order="blocked", block=b) for b in (4, 8, 16, 32, 64)]
    if acc.lanes is not None:  # a long-K kernel that is one chain
        bases.append(_without_lanes(acc))
    if isinstance(acc.format, FloatFormat):
        bases += _cpu_kernels(fin, acc.format)
    top, more = _structure_at(lab, fin, big, unit, bases, row, long_k, with_c)
    if top is not None and top.split_k is not None and top.split_combine == "sequential":
        top, eq = _equal_split(lab, fin, big, unit, top, long_k, with_c, max_k)
        more += eq
    if np.array_equal(row, _row_of(acc, long_k, with_c)):
        txt = f"the first product's pairs at K = {long_k} are the model's"
    else:
        j0 = int(np.argmax(row != _row_of(acc, long_k, with_c))) + 1
        txt = f"the first product's pairs at K = {long_k} depart from the model's at product {j0}"
    if top is None:
        return None, txt + ": no split the probe tries gives them"
    txt += more
    checks = sorted(
        {k for e in range(1, 14) for k in (2**e, 2**e + 1) if max_k < k < long_k} | {max_k},
        reverse=True,
    )
    pieces: list[tuple[int, Accumulator]] = [(long_k, top)]  # (the largest K, the kernel)
    cur, upper, measured = top, long_k, 0
    rows: dict[int, np.ndarray] = {long_k: row}

    def row_at(k: int) -> np.ndarray | None:
        nonlocal measured
        if k not in rows:
            got = _first_row(lab, fin, big, unit, k, with_c)
            measured += 1
            if not isinstance(got, np.ndarray):
                return None
            rows[k] = got
        return rows[k]

    for k in checks:
        r = row_at(k)
        if r is None:
            return None, txt + f": the units did not count at K = {k}"
        while not np.array_equal(r, _row_of(cur, k, with_c)):
            lo, hi = k, upper  # lo: not cur's pairs; hi: cur's
            while hi - lo > 1:
                mid = (lo + hi) // 2
                rm = row_at(mid)
                if rm is None:
                    return None, txt + f": the units did not count at K = {mid}"
                if np.array_equal(rm, _row_of(cur, mid, with_c)):
                    hi = mid
                else:
                    lo = mid
            r_lo = rows[lo]
            below, _ = _structure_at(lab, fin, big, unit, bases, r_lo, lo, with_c)
            if below is None:
                return None, txt + f": at K = {lo} no model the probe tries gives them"
            pieces.append((lo, below))
            cur, upper = below, lo
    model = top
    for k_max, kernel in pieces[1:]:
        model = kernel.replace(switch_k=k_max, long_kernel=model)
    if len(pieces) > 1:
        ranges = "; ".join(
            f"K <= {k_max}: {kern._lanes_text().lstrip(', ') or 'one chain'}"
            for k_max, kern in reversed(pieces[1:])
        )
        txt += (
            f": the kernel changes with K ({measured} more K measured): {ranges}; "
            f"beyond: {top._lanes_text().lstrip(', ') or 'one chain'}"
        )
    elif top is not acc:
        per_lane = (
            f"each lane summed in blocks of {top.block}, "
            if top.order == "blocked" and acc.order != "blocked"
            else ""
        )
        txt += f": K-blocking, {per_lane}{top._lanes_text().lstrip(', ')}"
    return model, txt


def _cpu_kernels(fin: FloatFormat, out: FloatFormat) -> list[Accumulator]:
    """The CPU instructions' presets (``precision_lab.gemm.cpu_instructions``) for these
    inputs and output: a library's long-K kernel is often the CPU's own instruction (measured:
    torch 2.13's bfloat16 matmul on an Intel Xeon with AMX-BF16 runs TDPBF16PS tiles past
    K = 64)."""
    from .cpu_instructions import cpu_rows

    found: list[Accumulator] = []
    for _, _, _, inputs, outputs, builder, _ in cpu_rows():
        names = {x if isinstance(x, str) else None for x in inputs}
        if fin.name in names and out.name in outputs:
            acc = builder(out.name)
            if acc not in found:
                found.append(acc)
    return found


def _equal_split(
    lab: _Lab,
    fin: FloatFormat,
    big: float,
    unit: float,
    top: Accumulator,
    long_k: int,
    with_c: bool,
    max_k: int,
) -> tuple[Accumulator, str]:
    """Whether K-blocks of ``S`` become ``ceil(K / S)`` equal ones where they fit (spec 3e's
    ``split_equal``), told at ``K = 3 (S - 2)`` and ``3 (S - 1)``: three equal blocks there,
    or blocks of ``S`` and a rest."""
    S = top.split_k
    assert S is not None
    if top.split_balance is not None or top.split_equal is not None:
        return top, ""
    for k, e in ((3 * (S - 2), 2), (3 * (S - 1), 1)):
        if not max_k < k < long_k or S < 4:
            continue
        row = _first_row(lab, fin, big, unit, k, with_c)
        if not isinstance(row, np.ndarray) or np.array_equal(row, _row_of(top, k, with_c)):
            continue
        cand = top.replace(split_equal=e)
        if np.array_equal(row, _row_of(cand, k, with_c)):
            return cand, f"; K = {k} is three equal blocks of {k // 3}: equal blocks where they fit"
    return top, ""


def _first_row(
    lab: _Lab, fin: FloatFormat, big: float, unit: float, k: int, with_c: bool
) -> np.ndarray | str | None:
    """The first product's pairs at ``K = k`` (FPRev): for each later leaf ``j`` (products, then
    C), the leaf count under the node where ``+M`` at product 0 meets ``-M`` at ``j``, read off
    the units added after they cancel. A sentence where the units did not count; ``None`` where
    the input format cannot hold ``M`` or the unit."""
    ua, ma, na = _split(unit, fin), _split(big, fin), _split(-big, fin)
    if ua is None or ma is None or na is None:
        return None
    n = k + (1 if with_c else 0)
    cases: list[Case] = []
    for j in range(1, n):
        av = np.full(k, ua[0])
        bv = np.full(k, ua[1])
        av[0], bv[0] = ma
        cv = 0.0
        if j < k:
            av[j], bv[j] = na
        else:
            cv = -big
        if with_c and j < k:
            cv = unit
        cases.append((av, bv, cv))
    q = lab.run_cases("first product's pairs", cases, k) / unit
    if not (np.all(np.isfinite(q)) and np.all(q == np.round(q))):
        return f"the units did not count at K = {k}: K-blocking not measured"
    return n - np.round(q).astype(np.int64)


def _split_size(
    lab: _Lab,
    fin: FloatFormat,
    big: float,
    unit: float,
    acc: Accumulator,
    cand: Accumulator,
    j0: int,
    long_k: int,
    with_c: bool,
) -> tuple[Accumulator, str]:
    """The K-blocking where ``cand`` (``acc`` split at ``j0``) gives the pairs at ``long_k``:
    ``cand`` where those pairs tell the splits apart; else (``j0`` is half of ``long_k``)
    chunks of ``j0`` then the rest, or a balanced split of any block size ``S`` in ``j0 ..
    long_k - 1`` (OpenBLAS's driver: a remainder between ``S`` and ``2S`` halved). Told apart
    at ``K = j0 + j0 // 2``, then ``S`` by bisection on K: the least K cut in two is ``S + 1``
    (measured: torch 2.13's float32 matmul on an Intel Xeon with AVX-512, ``S = 384``)."""
    seq = acc.replace(split_k=j0, split_combine="sequential")
    if long_k not in (2 * j0 - 1, 2 * j0) or j0 < 2:
        return cand, ""  # (the pairs at long_k tell the candidates apart)

    def status(k: int) -> str | None:
        row = _first_row(lab, fin, big, unit, k, with_c)
        if not isinstance(row, np.ndarray):
            return None
        if np.array_equal(row, _row_of(seq, k, with_c)):
            return "chunks"
        if np.array_equal(row, _row_of(acc, k, with_c)):
            return "whole"
        if np.array_equal(
            row, _row_of(acc.replace(split_k=-(-k // 2), split_combine="sequential"), k, with_c)
        ):
            return "halves"
        return None

    k2 = j0 + j0 // 2
    first = status(k2)
    if first == "chunks" or first is None:
        return seq, (
            "" if first else f" (the pairs at K = {k2} fit no split: block size not pinned)"
        )
    lo, hi = (k2, long_k) if first == "whole" else (j0, k2)
    steps = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        st = status(mid)
        steps += 1
        if st == "whole":
            lo = mid
        elif st == "halves":
            hi = mid
        else:
            return seq, f" (the pairs at K = {mid} fit no split: block size not pinned)"
    model = acc.replace(split_k=lo, split_combine="sequential", split_balance=1)
    return model, (
        f"; a remainder is halved, and the least K cut in two is {hi} ({steps} more K measured)"
    )


#: the multiples a balanced K-block is rounded up to (OpenBLAS's GEMM_UNROLL_M)
_BALANCE_UNITS = (1, 2, 4, 8, 16, 32, 64)


def _balance_unit(
    lab: _Lab,
    fin: FloatFormat,
    big: float,
    unit: float,
    acc: Accumulator,
    row: np.ndarray,
    k: int,
    with_c: bool,
) -> tuple[Accumulator, str]:
    """OpenBLAS's balanced K-blocking (spec 3e's ``split_balance`` ``u`` and ``split_half``):
    of the unit and half rule (u a power of two to 64, the half rounded up or down) those
    whose pairs at ``K = k`` are ``row``, told apart at K between ``S`` and ``2S`` where
    their blocks differ (measured: numpy 2.4.6's OpenBLAS on an AMD Zen 3, single-thread
    driver: float32 ``u = 8``, float64 ``u = 4``, the half rounded down; its threaded driver
    on an Intel Xeon: ``u = 1``, rounded up). Returns (model, evidence)."""
    S = acc.split_k
    assert S is not None
    cands = [
        acc.replace(split_balance=u, split_half=h)
        for u in _BALANCE_UNITS
        for h in SPLIT_HALVES
        if u < S
    ]
    cands = [c for c in cands if np.array_equal(row, _row_of(c, k, with_c))]
    if len(cands) <= 1:
        return (cands[0] if cands else acc), ""
    measured: list[int] = []
    while len(cands) > 1 and len(measured) < 6:
        best_k, best_groups = 0, 1
        for kk in range(S + 1, 2 * S):  # the first block is the balanced half
            groups = len({tuple(split_chunks(kk, S, c.split_balance, None, c.split_half))
                          for c in cands})  # fmt: skip
            if groups > best_groups:
                best_k, best_groups = kk, groups
            if groups == len(cands):
                break
        if not best_k:
            break
        got = _first_row(lab, fin, big, unit, best_k, with_c)
        if not isinstance(got, np.ndarray):
            break
        measured.append(best_k)
        keep = [c for c in cands if np.array_equal(got, _row_of(c, best_k, with_c))]
        if not keep:
            break
        cands = keep
    c = cands[0]
    return c, (
        f"; the rest under {2 * S} halved ({c.split_half}) then rounded up to a multiple of "
        f"{c.split_balance} (K = {', '.join(map(str, measured))} measured)"
        if measured
        else ""
    )


def _long_min(long_k: int) -> int:
    """The least K of the long confirmation inputs."""
    return max(2, long_k // 4)


def _positions(spec: dict[str, Any], k: int) -> tuple[list[int], list[int] | None]:
    """Positions for 'x, y in one step, z in a later step' and for 'x, y, z in one fused step'."""
    if any(f in spec for f in _LANE_FIELDS) and k >= 3:
        # lanes: y the product that meets the first one first, z one that meets them later
        row = _lca_row0(_family_tree(spec, k, False), k)
        y = min(range(1, k), key=lambda j: (row[j], j))
        later = [j for j in range(1, k) if row[j] > row[y]]
        return ([0, y, later[0]] if later else [0, 1, 2]), None
    if spec["order"] != "block_fma":
        return [0, 1, 2], None
    blk = spec["block"]
    cross = [0, 1, blk] if blk >= 2 else [0, 1, 2]
    if cross[2] >= k:
        cross = []
    inner = spec.get("inner_block")
    if inner is not None:
        parts, q = blk // inner, spec.get("inner_interleave") or inner
        same = [p for p in range(min(blk, k)) if (p // q) % parts == 0][:3]
    else:
        same = list(range(min(blk, k)))[:3]
    return cross, (same if len(same) == 3 else None)


def _measure(
    lab: _Lab, fin: FloatFormat, fout: FloatFormat, spec: dict[str, Any], k: int, with_c: bool
) -> dict[str, Any]:
    """Targeted measurements for one structure: precision, alignment bits, exact products."""
    ev: dict[str, str] = {}
    calls_before = len(lab.calls)
    s = max(0, min(2 * fin.emax, 14, fout.emax - 1))  # the 'one' of the tests: 2**s
    lo_prod = 2 * (fin.emin - fin.mantissa_bits)
    lo_out = fout.emin - fout.mantissa_bits
    jmax = max(0, min(60, s - lo_prod, s - lo_out))

    def threshold(pos: list[int], label: str) -> int | None:
        """Largest j with 2**s + 2**(s-j) - 2**s exact for every smaller j."""
        cases: list[Case] = []
        for j in range(1, jmax + 1):
            vals = [0.0] * k
            vals[pos[0]], vals[pos[1]], vals[pos[2]] = 2.0**s, 2.0 ** (s - j), -(2.0**s)
            ab = _vectors(vals, fin)
            if ab is None:
                break
            cases.append((ab[0], ab[1], 0.0))
        if not cases:
            return None
        res = lab.run_cases(label, cases, k)
        t = 0
        for j, v in enumerate(res, start=1):
            if v != 2.0 ** (s - j):
                break
            t = j
        return t

    cross, same = _positions(spec, k)
    fused = spec["order"] == "block_fma"
    t_cross = threshold(cross, "precision") if cross else None
    t_same = threshold(same, "alignment") if fused and same else None
    out: dict[str, Any] = {}
    if t_cross is not None:
        ev["precision"] = (
            f"2**{s} + 2**({s}-j) then -2**{s} in a later step is exact up to j = {t_cross}"
            + (" (the most the formats let the probe test)" if t_cross >= jmax else "")
            + (
                f": {t_cross + 1} significant bits"
                if not fused
                else f": min(precision - 1, alignment bits) = {t_cross}"
            )
        )
    if fused:
        if t_same is not None:
            ev["alignment"] = (
                f"2**{s} + 2**({s}-j) - 2**{s} inside one block is exact up to j = {t_same}: "
                f"{t_same} fraction bits kept after alignment"
            )
        else:
            ev["alignment"] = "block too short for the in-block test: alignment bits searched"
    out["t_cross"], out["t_same"], out["jmax"] = t_cross, t_same, jmax

    # exact products: (1 + 2**-h)**2 - (1 + 2**-(h-1)) = 2**-2h
    limit = [fin.mantissa_bits]
    if t_cross is not None:
        limit.append(t_cross if not fused else t_cross + 1)
    if fused:
        limit.append((t_same if t_same is not None else (t_cross or 0)) // 2)
    h = min(limit)
    prod_exact: bool | None = None
    if h >= 1 and 2 * h <= jmax + s:
        cases = []
        # the second product in the first one's accumulator (its lane: one lane-width on)
        second = spec.get("lanes") or 1
        for hh in range(1, h + 1):
            av = np.zeros(k)
            bv = np.zeros(k)
            av[0], bv[0] = -(1 + 2.0 ** -(hh - 1)), 1.0
            av[second] = bv[second] = 1 + 2.0**-hh
            cases.append((av, bv, 0.0))
        res = lab.run_cases("products", cases, k)
        exact = [bool(v == 2.0 ** (-2 * hh)) for hh, v in enumerate(res, start=1)]
        prod_exact = all(exact)
        first_bad = exact.index(False) + 1 if not prod_exact else None
        ev["products"] = (
            f"(1 + 2**-h)**2 - (1 + 2**-(h-1)) gives 2**-2h for h = 1..{h}: products exact"
            if prod_exact
            else f"(1 + 2**-h)**2 - (1 + 2**-(h-1)) loses 2**-2h from h = {first_bad}: "
            "products are rounded before they are added"
        )
    else:
        ev["products"] = "not testable with these formats: exact products assumed"
    out["prod_exact"] = prod_exact
    out["_calls"] = list(range(calls_before, len(lab.calls)))
    out["_evidence"] = ev
    return out


def _random_battery(
    lab: _Lab, rng: np.random.Generator, fin: FloatFormat, fout: FloatFormat, k: int
) -> list[int]:
    """Random calls the candidates must reproduce (moderate first: the most telling)."""
    start = len(lab.calls)
    for kind, kk in (
        ("moderate", k),
        ("moderate", max(1, k - 3)),
        ("cancel", k),
        ("moderate", max(1, k // 2 + 1)),
        ("wide", k),
        ("ints", k),
        ("wide", max(1, k - 1)),
    ):
        a, b, c = _random_inputs(rng, lab.fins, fout, lab.m, kk, lab.n, kind)
        lab.run_random(f"random {kind} K={kk}", a, b, c)
    return list(range(start, len(lab.calls)))


def _formats(precision: int) -> list[FloatFormat]:
    """Accumulator formats of a given precision, named ones first."""
    out: list[FloatFormat] = []
    for name in _NAMED_ACCUMULATORS:
        f = _float_format(name, "format")
        if f.precision == precision:
            out.append(f)
    if FP8_ACCUMULATOR.precision == precision:
        out.append(FP8_ACCUMULATOR)
    for e in (8, 5, 11, 6, 7, 4, 10):
        try:
            f = FloatFormat(e, precision - 1)
        except ValueError:
            continue
        if f not in out:
            out.append(f)
    return out


def _separate_candidates(spec: dict[str, Any], meas: dict[str, Any]) -> Iterator[Accumulator]:
    """``addend="separate"`` block FMAs (AMD CDNA3: the block's products aligned to their own
    anchor, then the block sum and the running value cut at their common anchor; spec section
    3) with this block length, likeliest first. Their pair counts are those of a block FMA
    with the accumulator in the block or after it, so they follow those structures'
    candidates (tried only when none of those fits). ``sum_bits``: MMA-Sim's F2 = 31 for
    CDNA3 first, then the alignment bits and the widths around them; ``align_rounding``:
    truncation or floor (MMA-Sim's GTR-FDPA)."""
    if spec["order"] != "block_fma" or spec.get("inner_block") or spec["block"] < 2:
        return
    t_cross, t_same = meas["t_cross"], meas["t_same"]
    if t_cross is None:
        return
    if t_same is not None and t_cross < t_same:  # the precision shows below the alignment
        precs = [t_cross]
    else:  # min(precision - 1, alignment bits): fp32's and e8m13's first
        precs = sorted(range(t_cross, min(t_cross + 9, 51)), key=lambda p: (p != 23, p != 13, p))
    aligns = [t_same] if t_same is not None else list(range(t_cross, min(t_cross + 8, 50)))
    for p in precs[:3]:
        for fmt in _formats(p + 1)[:2] if p + 1 <= 51 else []:
            for align in aligns:
                sums = [31, align] + [b for b in range(align + 1, min(align + 12, 53)) if b != 31]
                for mode in PROBE_MODES:
                    for sb in dict.fromkeys(b for b in sums if b >= align):
                        for ar in ("toward_zero", "down"):
                            for ovf in ("ieee", "saturate"):
                                try:
                                    yield Accumulator(
                                        fmt,
                                        mode,
                                        order="block_fma",
                                        block=spec["block"],
                                        align_bits=align,
                                        addend="separate",
                                        sum_bits=sb,
                                        align_rounding=ar,
                                        overflow=ovf,
                                    )
                                except ValueError:
                                    continue


def _candidates(
    spec: dict[str, Any], meas: dict[str, Any], fin: FloatFormat
) -> Iterator[Accumulator]:
    """Accumulators with this structure consistent with the measurements, likeliest first."""
    fused = spec["order"] == "block_fma"
    t_cross, t_same, jmax = meas["t_cross"], meas["t_same"], meas["jmax"]
    # precision - 1 candidates
    if t_cross is None:
        precs = list(range(3, 52))
    elif not fused:
        precs = [t_cross] if t_cross < jmax else list(range(t_cross, 51))
    elif t_same is not None and t_cross < t_same:
        precs = [t_cross]
    else:
        base = t_cross
        precs = sorted(range(base, min(base + 9, 51)), key=lambda p: (p != 23, p != 13, p))
    if fused:
        nb = spec["block"].bit_length()
        if t_same is not None:
            aligns = [t_same]
        else:
            lo = t_cross if t_cross is not None else 0
            aligns = list(range(lo, min(lo + 14, 50 - nb) + 1))
    else:
        aligns = [None]
    products: list[tuple[Any, str]] = [(None, "nearest_even")]
    if meas["prod_exact"] is False:
        products = [
            (f, r)
            for f in ("fp32", fin, "bf16", "fp16", "tf32")
            for r in ("nearest_even", "toward_zero")
        ]
    addend = spec.get("addend", "in_block")
    block_modes = PROBE_MODES if fused and addend == "after_block" else ("toward_zero",)
    extra = {k: v for k, v in spec.items() if k != "order"}
    seen: set[Accumulator] = set()
    for p in precs:
        fmts = _formats(p + 1) if p + 1 <= 51 else [_FP64]
        for fmt in fmts:
            for align in aligns:
                for mode in PROBE_MODES:
                    for bmode in block_modes:
                        for pf, pr in products:
                            for ovf in ("ieee", "saturate"):
                                kw = dict(extra)
                                if fused:
                                    kw["align_bits"] = align
                                    if addend == "after_block":
                                        kw["block_rounding"] = bmode
                                try:
                                    acc = Accumulator(
                                        fmt,
                                        mode,
                                        order=spec["order"],
                                        product_format=pf,
                                        product_rounding=pr,
                                        overflow=ovf,
                                        **kw,
                                    )
                                except ValueError:
                                    continue
                                if acc in seen:
                                    continue
                                seen.add(acc)
                                yield acc
                                if kw.get("lane_tail") == "separate" and pf is None:
                                    # the tail in a C double of float products (OpenBLAS
                                    # sdot): exact or rounded products
                                    for tpf in (fmt, None):
                                        yield acc.replace(
                                            tail_format=_FP64, tail_product_format=tpf
                                        )
                                if spec["order"] == "blocked":
                                    # the same tree: a sequential sum promoted every block
                                    # into a wider accumulator (DeepSeek-V3's FP8 GEMM)
                                    for wide in (_FP32, _FP64):
                                        if wide.precision > fmt.precision:
                                            yield Accumulator(
                                                fmt,
                                                mode,
                                                promote_every=spec["block"],
                                                promote_format=wide,
                                                product_format=pf,
                                                product_rounding=pr,
                                                overflow=ovf,
                                            )


#: structural candidates scored before the named models are tried (then the search goes on)
_EARLY_CATALOGUE = 100
#: accumulator formats of the plain named models, and the block lengths of their exact_block
_PLAIN_FORMATS = ("fp32", "fp64", "fp16", "bf16", "tf32")
_PLAIN_BLOCKS = (2, 4, 8, 16, 32, 64, 128, 256)


def _catalogue_text(fins: tuple[FloatFormat, FloatFormat]) -> str:
    return (
        f"the presets of pl.tensor_core.list() whose operands are {_fins_text(fins)} (every "
        "GPU, instruction "
        f"and output format), and plain sequential, pairwise, compensated and exact_block "
        f"(blocks of {', '.join(map(str, _PLAIN_BLOCKS))}) accumulators in "
        f"{', '.join(_PLAIN_FORMATS)} with every rounding mode the probe tells apart"
    )


def _catalogue(
    fins: tuple[FloatFormat, FloatFormat], fout: FloatFormat, k: int
) -> list[tuple[str, Accumulator]]:
    """Named models tried whole: the library's presets for ``fin`` operands (those with
    ``fout`` as their output first), then plain accumulators. Inputs of more than 26 bits get
    only the models :func:`gemm` takes for them (an fp64 FMA chain)."""
    from .tensor_core import PRESETS, instruction_name

    wide = max(f.precision for f in fins) > _EXACT_PRODUCT_BITS
    presets: list[tuple[bool, str, Accumulator]] = []
    for p in PRESETS.values():
        if p.block_scaled:
            continue
        try:
            fa, fb = (get_format(x) for x in p.input_format)
        except (TypeError, ValueError):
            continue
        if (fa, fb) != fins:
            continue
        gpu = p.gpus[0] if p.gpus else p.arch
        acc = p.accumulator
        acc = dataclasses.replace(acc, name=(acc.name or "").replace("{gpu}", gpu))
        operands = p.input_format[0] if fa == fb else p.input_format
        label = (
            f"pl.tensor_core({gpu!r}, {operands!r}, out_format={p.out_format!r}, "
            f"instruction={p.instruction + '.' + p.kind!r}) "
            f"[{instruction_name(p.instruction, p.kind)}]"
        )
        presets.append((get_format(p.out_format) != fout, label, acc))
    presets.sort(key=lambda t: t[0])  # stable: the table's order within each group
    out: list[tuple[str, Accumulator]] = []
    seen: set[Accumulator] = set()

    def add(label: str, acc: Accumulator) -> None:
        if acc not in seen:
            seen.add(acc)
            out.append((label, acc))

    for _, label, acc in presets:
        add(label, acc)
    blocks = [b for b in _PLAIN_BLOCKS if b < k] + [next((b for b in _PLAIN_BLOCKS if b >= k), k)]
    for name in _PLAIN_FORMATS:
        fmt = _float_format(name, "format")
        for mode in PROBE_MODES:
            kinds: list[tuple[str, dict[str, Any]]] = [("sequential", {})]
            if not wide:
                kinds += [("pairwise", {}), ("compensated", {})]
                kinds += [(f"exact_block, block {b}", {"block": b}) for b in blocks]
            for what, kw in kinds:
                order = what.split(",")[0]
                try:
                    acc = Accumulator(fmt, mode, order=order, **kw)
                except ValueError:
                    continue
                if wide and not (fmt == _FP64 and mode == "nearest_even"):
                    continue
                add(
                    f"Accumulator({name!r}, {mode!r}, order={order!r}"
                    + (f", block={kw['block']})" if kw else ")"),
                    acc,
                )
    return out


def _special_cases(fin: FloatFormat, fout: FloatFormat, k: int, with_c: bool) -> list[Case]:
    """Inputs that tell the special-value rules apart: overflow of the accumulator, signed
    zeros (exact cancellation, underflow, negative zeros), NaN and infinities, and zero
    products whose partner is huge (a zero in a block FMA's alignment anchor)."""
    cases: list[Case] = []

    def add(vals: Sequence[float], c: float = 0.0) -> None:
        if len(vals) > k:
            return
        ab = _vectors(list(vals) + [0.0] * (k - len(vals)), fin)
        if ab is not None:
            cases.append((ab[0], ab[1], c))

    top = min(2 * fin.emax, 1023)  # float64's range (fp64 inputs)
    for e in sorted({top, min(top, 15), min(top, 127)}):
        big = 2.0**e
        add([big, big])
        add([big, big, -big])
        add([big, big, -big, -big])
        add([-big, -big, big])
        add([1.5 * big, 1.5 * big] if fin.mantissa_bits else [big, big])
    tiny = 2.0 ** (2 * (fin.emin - fin.mantissa_bits))
    # sums that round to zero (a negative one: -0 or +0?), at the output's and at fp16's
    # smallest subnormal
    near_zero = [
        m * 2.0 ** (e - d)
        for e in {fout.emin - fout.mantissa_bits, -24}
        for d, m in ((1, 1.0), (1, 1.5), (2, 1.0))
    ]
    for x in (1.0, 2.0**-20, tiny, *sorted(near_zero)):
        add([x, -x])
        add([-x, x])
        add([-x])
    add([-tiny, -tiny])
    # negative zeros: a = -0, b = 1
    zeros = np.zeros(k)
    cases.append((-zeros, np.ones(k), 0.0))
    cases.append((zeros, np.ones(k), 0.0))
    # NaN and infinities (formats without inf: their NaN)
    special = math.inf if fin.has_inf else math.nan
    one = np.zeros(k)
    cases.append((np.r_[special, one[1:]], np.r_[0.0, one[1:]], 0.0))  # inf * 0
    if k >= 2:
        cases.append((np.r_[special, -special, one[2:]], np.r_[1.0, 1.0, one[2:]], 0.0))
        cases.append((np.r_[special, 1.0, one[2:]], np.r_[1.0, 1.0, one[2:]], 0.0))
    # zero products with a huge partner, next to terms with low bits (zeros_in_anchor)
    ea = fin.emax
    h = min(fin.mantissa_bits, 3)
    for shift in range(2, 60, 3):
        low = (1 + 2.0**-h) ** 2 * 2.0 ** (ea - 126 - shift)
        ab = _vectors([low], fin)
        if ab is not None and k >= 2:
            a = np.zeros(k)
            b = np.zeros(k)
            a[0], a[1], b[1] = 2.0**ea, ab[0][0], ab[1][0]
            cases.append((a, b, 0.0))
        if with_c:
            c = (1 + 2.0**-20) * 2.0 ** (ea - 126 - shift)
            c = float(_grid(np.array([c]), fout)[0])
            cases.append((np.r_[2.0**ea, np.zeros(k - 1)], np.zeros(k), c))
    # a zero c beside two products that sum to the output's least grain 2**q exactly, one just
    # below it (2**q - 2**(q - j)): a zero's exponent (zero_exponent, MMA-Sim's e_zero) above
    # theirs truncates the first to below 2**q (zeros_in_anchor and which e_zero)
    q = fout.emin - fout.mantissa_bits
    for j in range(2, 2 * fin.precision + 1 if fin.precision <= 12 else 2):
        n = 2**j - 1  # 2**q - 2**(q - j) = n * 2**(q - j): n = d * (n // d), each d < 2**p
        top = 2**fin.precision
        d = next((d for d in range(1, top) if n % d == 0 and n // d < top), 0)
        if not d or k < 2:
            continue
        e = q - j
        a = np.array([d * 2.0 ** (e // 2), 2.0 ** (e // 2)])
        b = np.array([(n // d) * 2.0 ** (e - e // 2), 2.0 ** (e - e // 2)])
        if (_grid(a, fin) == a).all() and (_grid(b, fin) == b).all():
            cases.append((np.r_[a, np.zeros(k - 2)], np.r_[b, np.zeros(k - 2)], 0.0))
    return cases


def _special_calls(
    lab: _Lab, fin: FloatFormat, fout: FloatFormat, k: int, with_c: bool
) -> list[int]:
    """Run the special inputs once (later calls reuse them): their indices in ``lab.calls``."""
    if lab.special is None:
        cases = _special_cases(fin, fout, k, with_c)
        start = len(lab.calls)
        got = lab.run_cases("special values", cases, k)
        # single products without padding (zeros beside them can change a block's anchor)
        singles = [x for x in _special_cases(fin, fout, 1, False) if x[0].size == 1]
        got = np.concatenate([got, lab.run_cases("special values K=1", singles, 1)])
        lab.special = (list(range(start, len(lab.calls))), got, len(cases) + len(singles))
    return list(lab.special[0])


def _special_values(
    lab: _Lab,
    base: Accumulator,
    fin: FloatFormat,
    fout: FloatFormat,
    k: int,
    with_c: bool,
    rand_calls: Sequence[int],
) -> tuple[Accumulator | None, str]:
    """The special-value fields of ``base`` that reproduce ``fn`` on special inputs (and on
    the zeros, infinities and NaNs of the random ones)."""
    special_calls = _special_calls(lab, fin, fout, k, with_c)
    assert lab.special is not None
    _, got, n_special = lab.special
    calls = special_calls + list(rand_calls)
    fields = {f.name for f in dataclasses.fields(Accumulator)}
    assert isinstance(base.format, FloatFormat)
    options: dict[str, tuple[Any, ...]] = {
        # subnormal results and inputs flushed to zero (AMD CDNA2): the slowest-varying
        # options, so the common case (kept) is tried first
        "input_subnormals": ("keep", "flush"),
        "subnormals": ("keep", "flush"),
        # the exponent range shows where sums overflow or underflow: formats of the precision
        "format": (base.format, *_formats(base.format.precision)),
        "overflow": (base.overflow, "ieee", "saturate"),
    }
    if "zero_sign" in fields:
        options["overflow"] += ("infinity",)
        options["zero_sign"] = ("ieee", "positive")
        if base.order == "block_fma":
            options["zeros_in_anchor"] = (False, True)
            # MMA-Sim 2.1.1's e_zero: a constant per architecture and output type
            e_zero = (-19, -20, -21) if base.format.emin > -126 else (-131, -132, -133, -139)
            options["zero_exponent"] = (base.zero_exponent, *e_zero)
    # K = 1 as an outer product (spec 3f): varied fastest, it changes only K = 1's -0
    options["k1_product"] = (False, True)
    names = list(options)
    tried: set[Accumulator] = set()
    for combo in itertools.islice(
        itertools.product(*(dict.fromkeys(options[n]) for n in names)), 800
    ):
        try:
            acc = dataclasses.replace(base, **dict(zip(names, combo, strict=True)))
        except ValueError:
            continue
        if acc in tried:
            continue
        tried.add(acc)
        ok, _, _ = lab.score(acc, calls)
        if not ok:
            continue
        # NaN encoding: the bits of the NaNs fn returns
        nans = got[np.isnan(got)]
        nan_txt = "no NaN results"
        if nans.size:
            bits = sorted({f"0x{int(v):016x}" for v in nans.view(np.uint64)})
            nan_txt = f"NaN results {', '.join(bits)} (float64 bits)"
            if "nan_encoding" in fields:
                for enc in ("quiet", "nvidia"):
                    trial = dataclasses.replace(acc, nan_encoding=enc)
                    model = np.concatenate(
                        [lab.model(trial, *lab.calls[i][1:4])[lab._masks[i]] for i in special_calls]
                    )
                    if np.array_equal(model[np.isnan(model)].view(np.uint64), nans.view(np.uint64)):
                        acc = trial
                        nan_txt += f": nan_encoding {enc!r}"
                        break
                else:
                    nan_txt += ": payload matches no nan_encoding (NaN compared as NaN)"
        rules = ", ".join(
            f"{n} {getattr(acc, n)!r}" if n != "format" else f"format {acc.format}" for n in names
        )
        return acc, (
            f"{n_special} special inputs (accumulator overflow, exact "
            "cancellation, underflow, -0, inf and NaN, zero products beside huge partners) "
            "reproduced with "
            f"{rules}; {nan_txt}"
        )
    return None, (
        f"{n_special} special inputs (overflow, signed zeros, inf and NaN, "
        f"zeros beside huge partners): no combination of {', '.join(names)} reproduces them"
    )


def _confirm(
    lab: _Lab,
    acc: Accumulator,
    rng: np.random.Generator,
    fin: FloatFormat,
    fout: FloatFormat,
    max_k: int,
    cases: int,
) -> tuple[int, int]:
    kinds = ("moderate", "wide", "cancel", "moderate", "ints")
    done = same = 0
    i = 0
    while done < cases:
        kk = max_k if i == 0 else int(rng.integers(1, max_k + 1))
        a, b, c = _random_inputs(rng, lab.fins, fout, lab.m, kk, lab.n, kinds[i % len(kinds)])
        d = lab.box(a, b, c)
        got = lab.model(acc, a, b, c)
        same += int(_same(got, d).sum())
        done += d.size
        i += 1
    return same, done
