"""Few-bit stochastic rounding: the biases of its variants and its error in summation.

Two published results, recomputed from fixed seeds:

* Fitzgibbon & Felix, "On stochastic rounding with few random bits" (ARITH 2025, arXiv
  2504.20634; derivations in graphcore-research/arith25-stochastic-rounding): the bias of SRFF
  (``rounding="stochastic"`` with ``random_bits=N``), SRF (``"stochastic_offset"``) and SRC
  (``"stochastic_corrected"``) in quanta of the result, for discarded fractions uniform over the
  ``2**D`` values of ``D`` bits (``D = None``: 45 bits, which stands for the paper's
  infinite-precision case to within ``2**-46``). Closed forms (:func:`closed_form_bias`):
  SRFF ``-2**-(N+1) + 2**-(D+1)`` (``D >= N``), SRF ``+2**-(D+1)`` (``D > N``), SRC 0, and 0
  for every variant when ``D <= N`` (the rounding is then exact). :func:`exact_distribution`
  enumerates all ``2**N`` random words through the rounding core and gives each fraction's exact
  probability of rounding away; :func:`measured_bias` draws seeded words.
* El Arar, Fasi, Filip & Mikaitis, "Probabilistic error analysis of limited-precision stochastic
  rounding" (arXiv 2408.03069, SIAM J. Sci. Comput. 2025): recursive summation with ``r`` random
  bits has error ``O(sqrt(n) u_p) + O(n u_{p+r})``; the bias term fades once
  ``r >= ceil(log2(n) / 2)``. :func:`summation_error` measures it. The paper's exact experimental
  setting is not available here; assumed (stated in the result): summands uniform on
  ``[0, 1)`` on a ``2**-24`` grid (so every partial sum is exact in float64 before its one
  rounding), a bfloat16 accumulator (p = 8) rounded after every addition, the mean relative
  error over independent repetitions, and every variant at each ``r``.

>>> float(closed_form_bias("stochastic", 4))
-0.03125
>>> exact_bias("stochastic_corrected", 3, 5) == 0
True
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from ..core.rounding import check_rounding, round_to, round_with_words

__all__ = [
    "SR_VARIANTS",
    "bias_table",
    "closed_form_bias",
    "exact_bias",
    "exact_distribution",
    "measured_bias",
    "summation_error",
]

#: the variants of Fitzgibbon & Felix by precision_lab's mode names
SR_VARIANTS = {"SRFF": "stochastic", "SRF": "stochastic_offset", "SRC": "stochastic_corrected"}

#: fraction bits standing for the infinite-precision inputs (bf16 results of float64 inputs
#: near 1 drop 45 bits)
_D_INF = 45


def closed_form_bias(mode: str, random_bits: int, frac_bits: int | None = None) -> Fraction:
    """The bias (mean of result - input, in quanta) of a variant for fractions uniform over the
    ``2**D`` values of ``D = frac_bits`` bits (``None``: infinite precision).

    >>> closed_form_bias("srf", 2, 3), closed_form_bias("srff", 2, 3)
    (Fraction(1, 16), Fraction(-1, 16))
    """
    m = check_rounding(mode)
    n, d = random_bits, frac_bits
    if d is not None and d <= n:
        return Fraction(0)
    tail = Fraction(0) if d is None else Fraction(1, 2 ** (d + 1))
    if m == "stochastic":
        return tail - Fraction(1, 2 ** (n + 1))
    if m == "stochastic_offset":
        return tail
    if m == "stochastic_corrected":
        return Fraction(0)
    raise ValueError(
        f"mode must be one of {', '.join(SR_VARIANTS)} (or their mode names), got {mode!r}"
    )


def _inputs_near_one(frac: np.ndarray, frac_bits: int) -> np.ndarray:
    """float64 values 1 + (frac / 2**D) bf16 quanta (exact: D <= 45)."""
    return 1.0 + np.ldexp(frac.astype(np.float64), -(7 + frac_bits))


def exact_distribution(mode: str, random_bits: int, frac_bits: int) -> list[Fraction]:
    """P(away) of each fraction ``i / 2**D`` (i = 0 .. 2**D - 1), counted over all ``2**N``
    random words fed through the rounding core (:func:`round_with_words`, bf16 results near 1).

    >>> exact_distribution("stochastic_offset", 1, 2)  # floor(2x + 1/2) / 2 at x = 0, 1/4, 1/2, 3/4
    [Fraction(0, 1), Fraction(1, 2), Fraction(1, 2), Fraction(1, 1)]
    """
    n, d = random_bits, frac_bits
    if not (1 <= n <= 16 and 1 <= d <= 16):
        raise ValueError(f"random_bits and frac_bits must be in 1..16, got {n}, {d}")
    i = np.arange(2**d)
    x = np.repeat(_inputs_near_one(i, d), 2**n)
    words = np.tile(np.arange(2**n, dtype=np.uint64) << np.uint64(64 - n), 2**d)
    r = round_with_words(x, "bf16", words, rounding=mode, random_bits=n)
    away = (r > 1.0).reshape(2**d, 2**n).sum(axis=1)
    return [Fraction(int(c), 2**n) for c in away]


def exact_bias(mode: str, random_bits: int, frac_bits: int) -> Fraction:
    """The exact bias over all ``2**D`` fractions and ``2**N`` words (quanta).

    >>> exact_bias("stochastic", 2, 6)
    Fraction(-15, 128)
    """
    p = exact_distribution(mode, random_bits, frac_bits)
    d = frac_bits
    return sum((pi - Fraction(i, 2**d) for i, pi in enumerate(p)), Fraction(0)) / 2**d


def measured_bias(
    mode: str,
    random_bits: int,
    frac_bits: int | None = None,
    *,
    draws: int = 2**22,
    seed: int = 2025,
) -> float:
    """Mean of (result - input) in quanta over ``draws`` seeded roundings of fractions drawn
    uniformly from the ``2**D`` values of ``D`` bits (None: 45 bits), bf16 results near 1.

    >>> round(measured_bias("stochastic", 3, draws=2**16), 3)  # closed form -1/16
    -0.061
    """
    d = _D_INF if frac_bits is None else frac_bits
    rng = np.random.default_rng(seed)
    frac = rng.integers(0, 2**d, draws, dtype=np.int64)
    x = _inputs_near_one(frac, d)
    r = round_to(x, "bf16", rounding=mode, seed=seed + 1, random_bits=random_bits)
    err = (r - x) * 2.0**7  # exact: both lie within one bf16 quantum of 1
    return float(err.mean())


def bias_table(
    random_bits: tuple[int, ...] = (2, 4, 6, 8),
    frac_bits: tuple[int | None, ...] = (None, 10),
    *,
    draws: int = 2**22,
    seed: int = 2025,
) -> list[dict[str, Any]]:
    """One row per (variant, N, D): measured bias, closed form, difference.

    >>> rows = bias_table((2,), (None,), draws=2**14)
    >>> [(r["variant"], r["closed_form"]) for r in rows]
    [('SRFF', -0.125), ('SRF', 0.0), ('SRC', 0.0)]
    """
    rows = []
    for d in frac_bits:
        for n in random_bits:
            for name, mode in SR_VARIANTS.items():
                meas = measured_bias(mode, n, d, draws=draws, seed=seed)
                cf = float(closed_form_bias(mode, n, d))
                rows.append(
                    {"variant": name, "mode": mode, "N": n, "D": d, "measured": meas,
                     "closed_form": cf, "diff": meas - cf}
                )  # fmt: skip
    return rows


def summation_error(
    n: int = 2**12,
    random_bits: tuple[int | None, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, None),
    *,
    modes: tuple[str, ...] = ("stochastic", "stochastic_offset", "stochastic_corrected"),
    fmt: str = "bf16",
    reps: int = 16,
    seed: int = 2408,
) -> dict[str, Any]:
    """Recursive summation of ``n`` summands in ``fmt`` with few-bit SR: the mean relative error
    over ``reps`` repetitions for each mode and number of random bits (None: exact SR), and
    round-to-nearest for comparison (see the module docstring for the assumed setting).

    The ``reps`` repetitions have their own summands and their own random words: step ``k``
    rounds the ``reps`` partial sums in one call with seed ``seed + 1 + k`` (flat index =
    repetition).

    >>> res = summation_error(64, (2, None), modes=("stochastic",), reps=4)
    >>> sorted(res["error"]["stochastic"]), res["r_star"]
    (['2', 'exact'], 3)
    """
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**24, (n, reps)).astype(np.float64) * 2.0**-24
    exact = x.sum(axis=0)  # exact: multiples of 2**-24 below 2**30

    def run(mode: str, rb: int | None) -> float:
        s = np.zeros(reps)
        for k in range(n):
            kw: dict[str, Any] = {"rounding": mode}
            if mode != "nearest_even":
                kw.update(seed=seed + 1 + k, random_bits=rb)
            s = round_to(s + x[k], fmt, **kw).astype(np.float64)
        return float(np.mean(np.abs(s - exact) / exact))

    out: dict[str, dict[str, float]] = {}
    for mode in modes:
        out[mode] = {("exact" if rb is None else str(rb)): run(mode, rb) for rb in random_bits}
    return {
        "n": n,
        "fmt": fmt,
        "reps": reps,
        "nearest_even": run("nearest_even", None),
        "error": out,
        "r_star": math.ceil(math.log2(n) / 2),
    }


def markdown(*, draws: int = 2**22, n: int = 2**12, reps: int = 16) -> str:
    """The two tables of the report: biases (measured vs closed form) and summation errors.

    ``python -m precision_lab.studies.sr_variants`` prints them (about a minute).
    """
    lines = [
        "| variant | N | D | measured bias | closed form | difference |",
        "|---|---|---|---|---|---|",
    ]
    for r in bias_table(draws=draws):
        d = "inf" if r["D"] is None else r["D"]
        lines.append(
            f"| {r['variant']} | {r['N']} | {d} | {r['measured']:+.6f} | "
            f"{r['closed_form']:+.6f} | {r['diff']:+.6f} |"
        )
    res = summation_error(n, reps=reps)
    keys = list(next(iter(res["error"].values())))
    lines += [
        "",
        f"Recursive summation of n = {res['n']} summands U[0, 1) in {res['fmt']}, mean relative "
        f"error over {res['reps']} repetitions; round to nearest: {res['nearest_even']:.4f}; "
        f"ceil(log2(n) / 2) = {res['r_star']}.",
        "",
        "| mode | " + " | ".join(f"r = {k}" for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for mode, errs in res["error"].items():
        lines.append(f"| {mode} | " + " | ".join(f"{errs[k]:.4f}" for k in keys) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(markdown())
