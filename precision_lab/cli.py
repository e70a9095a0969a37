"""The ``precision-lab`` command line (also ``python -m precision_lab``).

::

    precision-lab formats [--json]                     the table of every registered format
    precision-lab cast VALUE FORMAT [--rounding R] [--overflow O] [--subnormals S] [--seed N]
                                    [--json]           round one value, show its code and error
    precision-lab figures [--only NAME] [--outdir DIR] [--list]   regenerate figures/REPORT.md
    precision-lab report [--outdir DIR] [--regenerate] [--show]   where the report is (or make it)
    precision-lab --version
    precision-lab info [--json]                        which backend serves each operation
    precision-lab tensor-cores [GPU]                   the matrix-core presets and their evidence
    precision-lab conform FILE                         check a block quantizer's codes and scales
    precision-lab conform --peer torch                 where a third-party decoder/cast departs
    precision-lab verify FORMAT ...                    exhaustive check against an oracle (Dask)
    precision-lab grid SPEC ...                        an experiment grid (Dask)
    precision-lab probe LIBRARY ...                    the accumulation model of a matmul (or sum)

``formats`` prints :func:`precision_lab.formats_table` (``--json``:
:func:`precision_lab.format_rows`).

``VALUE`` is read exactly: a decimal string is the exact decimal number (``0.1`` is one tenth, not
the float64 nearest to it), a hex float (``0x1.8p-3``) the exact binary number, and either is
rounded once, straight to the format, in every mode (fp64 included); ``inf``, ``-inf``, ``nan``
and ``-0`` work too. Any exponent is fine (``1e-999999999`` is decided at once); the error is
reported against the exact input (an overflow of a finite value is never "exact").

``--seed`` is used by the stochastic modes (``stochastic``, ``stochastic_equal`` ...); with a
deterministic mode it is accepted and changes nothing, as ``seed=`` in Python (one rule for both:
a seed belongs to a configuration that may sweep rounding modes), and ``cast`` says so on its
``seed`` line ("unused"). A stochastic mode without ``--seed`` draws a seed and prints it, so the
run can be repeated.

Exit status (also in ``--help``): 0 done; 1 the command failed (a bad value, format or file, a
missing optional package, vectors that do not conform); 2 the command line is malformed (an
unknown option, a missing argument, an invalid choice: argparse finds it before anything runs).
Every error is one line on stderr, ``precision-lab COMMAND: error: ...``, never a traceback; an
unknown format name suggests the closest names. Output piped into a reader that stops early
(``| head``) ends quietly with status 0. NaN cast into a format without NaN (the integer
formats, e2m1 ...) is an error, as in ``encode`` and the quantizers; ``inf`` saturates there.

>>> main(["cast", "1.0625000000000000000001", "e4m3"])
input     1.0625000000000000000001  (exact decimal; the nearest float64 is 1.0625)
format    e4m3  rounding nearest_even, overflow ieee, subnormals keep
result    1.125
code      0x39  0b0_0111_001  (sign 0, exponent field 7, mantissa field 1; normal: 1.001b * 2**0)
error     abs 0.0625, rel 0.0588235, 0.5 ulp
0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import secrets
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np

from .core.codec import encode
from .core.formats import FloatFormat, IntFormat, format_rows, formats_table, get_format
from .core.random_words import check_seed, random_words
from .core.rounding import (
    MODE_ALIASES,
    OVERFLOW_MODES,
    ROUNDING_MODES,
    SUBNORMAL_MODES,
    check_choice,
    check_rounding,
    is_stochastic,
    round_to,
    sr_mode,
)

__all__ = ["Value", "cast", "main", "parse_value", "round_exact"]


# ----- VALUE -------------------------------------------------------------------------------------
#: Values of magnitude beyond 2**±_LIMIT (far outside every format, fp64 included: 2**-1074 to
#: 2**1024) are never built: a stand-in of the same sign beyond the same limit rounds the same way
#: in every mode and gives the same float64 errors. So ``1e-999999999`` costs no more than ``1``.
_LIMIT = 4096
#: Significant digits read from a decimal or hex mantissa (leading and trailing zeros are free).
_MAX_DIGITS = 4000
_DIGITS = r"[0-9](?:_?[0-9])*"
_XDIGITS = r"[0-9a-f](?:_?[0-9a-f])*"
_DECIMAL = re.compile(
    rf"(?:(?P<i>{_DIGITS})(?:\.(?P<f>{_DIGITS})?)?|\.(?P<g>{_DIGITS}))(?:e(?P<e>[+-]?{_DIGITS}))?",
    re.ASCII,
)
_HEXFLOAT = re.compile(
    rf"0x(?:(?P<i>{_XDIGITS})(?:\.(?P<f>{_XDIGITS})?)?|\.(?P<g>{_XDIGITS}))(?:p(?P<e>[+-]?{_DIGITS}))?",
    re.ASCII,
)
_BAD_VALUE = (
    "VALUE must be a decimal number (1.5, -2e-3, 1_000), a hex float (0x1.8p-3), inf, -inf or "
    "nan, got {!r}"
)


class Value(NamedTuple):
    """A parsed VALUE: ``exact`` (None for inf and NaN), the float64 ``x`` to hand to round_to
    (the exact value when it is a float64, else the exact value rounded to odd) and ``beyond``:
    0, or -1 / +1 when ``|value|`` is below ``2**-_LIMIT`` / above ``2**_LIMIT`` and ``exact`` is
    a stand-in of the same sign beyond the same limit (see ``_LIMIT``)."""

    exact: Fraction | None
    x: float
    beyond: int = 0


def _exponent(text: str | None) -> int:
    """The exponent of a VALUE, clamped to ±10**18 (far beyond anything that is not 0 or inf)."""
    if not text:
        return 0
    t = text.replace("_", "")
    sign = -1 if t.startswith("-") else 1
    digits = t.lstrip("+-").lstrip("0") or "0"
    return sign * (10**18 if len(digits) > 18 else int(digits))


def parse_value(text: str) -> Value:
    """Read VALUE exactly, with bounded work: a decimal, a hex float or a special string.

    Accepted: surrounding spaces, a sign (``-``, ``+`` or the Unicode minus ``−``), ``_``
    between digits, ``inf``/``infinity``/``nan`` in any case. The exponent may be anything:
    magnitudes beyond ``2**±4096`` are decided without building the number. At most 4000
    significant digits.

    >>> parse_value("0x1.8p-3")
    Value(exact=Fraction(3, 16), x=0.1875, beyond=0)
    >>> v = parse_value("0.1"); v.exact, v.x == 0.1
    (Fraction(1, 10), False)
    >>> parse_value("-0")
    Value(exact=Fraction(0, 1), x=-0.0, beyond=0)
    >>> parse_value("1e-999999999").beyond
    -1
    >>> parse_value("0x")
    Traceback (most recent call last):
    ...
    ValueError: VALUE must be a decimal number (1.5, -2e-3, 1_000), a hex float ..., got '0x'
    """
    s = text.strip().lower().replace("\u2212", "-")
    negative = s.startswith("-")
    body = s[1:] if s[:1] in ("-", "+") else s
    if body in ("inf", "infinity", "nan"):
        return Value(None, float(("-" if negative else "") + body))
    hexa = body.startswith("0x")
    m = (_HEXFLOAT if hexa else _DECIMAL).fullmatch(body)
    if m is None:
        raise ValueError(_BAD_VALUE.format(text))
    frac = (m["f"] or m["g"] or "").replace("_", "")
    digits = ((m["i"] or "").replace("_", "") + frac).lstrip("0")
    exp = _exponent(m["e"])  # binary for hex floats, decimal otherwise
    step = 4 if hexa else 1  # exponent units per digit
    exp -= step * len(frac)
    kept = digits.rstrip("0")
    exp += step * (len(digits) - len(kept))
    if not kept:
        return Value(Fraction(0), -0.0 if negative else 0.0)
    if len(kept) > _MAX_DIGITS:
        raise ValueError(
            f"VALUE has {len(kept)} significant digits; at most {_MAX_DIGITS} are read, "
            f"got {text[:40]!r}..."
        )
    mant = int(kept, 16 if hexa else 10)
    log2 = mant.bit_length() - 1 + (exp if hexa else exp * math.log2(10))  # within 2 of log2|v|
    beyond = 1 if log2 > _LIMIT + 4 else -1 if log2 < -_LIMIT - 4 else 0
    if beyond:
        exact = Fraction(2) ** (beyond * (_LIMIT + 8))
    elif hexa:
        exact = Fraction(mant) * Fraction(2) ** exp
    else:
        exact = Fraction(mant) * Fraction(10) ** exp
    exact = -exact if negative else exact
    return Value(exact, _odd_float64(exact), beyond)


def _odd_float64(v: Fraction) -> float:
    """``v`` if it is a float64, else the float64 next to it whose last bit is 1 (round to odd):
    it keeps what every later rounding to a format of at most 51 mantissa bits needs. Beyond
    float64's range: ±max, which is odd."""
    try:
        f = float(v)  # correctly rounded to nearest
    except OverflowError:
        return _F64_MAX if v > 0 else -_F64_MAX
    if Fraction(f) != v and int(np.float64(f).view(np.uint64)) % 2 == 0:
        f = float(np.nextafter(f, np.inf if v > Fraction(f) else -np.inf))
    return f


_F64_MAX = float(np.finfo(np.float64).max)


def _float(v: Fraction) -> float:
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _sci(v: Fraction, digits: int = 6) -> str:
    """``v`` to ``digits`` significant digits like ``%g``, at any magnitude (``1e+400`` where
    float64 would say inf, ``1e-400`` where it would say 0).

    >>> _sci(Fraction(10) ** 400 - 65504), _sci(Fraction(1, 3)), _sci(Fraction(-3, 10**500))
    ('1e+400', '0.333333', '-3e-500')
    """
    if v == 0:
        return "0"
    f = _float(v)
    if math.isfinite(f) and abs(f) >= 1e-300:
        return f"{f:.{digits}g}"
    a = abs(v)
    e10 = len(str(a.numerator)) - len(str(a.denominator))  # within 1 of floor(log10 a)
    while a >= Fraction(10) ** (e10 + 1):
        e10 += 1
    while a < Fraction(10) ** e10:
        e10 -= 1
    mant = round(a / Fraction(10) ** (e10 - digits + 1))  # digits significant digits
    if mant >= 10**digits:
        mant, e10 = mant // 10, e10 + 1
    text = str(mant)
    body = text[0] + ("." + text[1:].rstrip("0") if text[1:].rstrip("0") else "")
    return f"{'-' if v < 0 else ''}{body}e{'+' if e10 >= 0 else '-'}{abs(e10):02d}"


# ----- rounding an exact rational ----------------------------------------------------------------
def _is_fp64_grid(f: FloatFormat | IntFormat) -> bool:
    """Formats whose values the float64 round-to-odd stand-in cannot round exactly."""
    return isinstance(f, FloatFormat) and f.mantissa_bits > 51


def _floor_log2(a: Fraction) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > a else e


def _ulp_at(f: FloatFormat | IntFormat, a: Fraction) -> Fraction:
    """The spacing of ``f`` at magnitude ``a`` (that of the top binade beyond max)."""
    if isinstance(f, IntFormat):
        return Fraction(1)
    top = Fraction(f.max)
    e = _floor_log2(min(a, top)) if a > 0 else f.emin
    return Fraction(2) ** (max(e, f.emin) - f.mantissa_bits)


def _fp64_neighbours(a: Fraction) -> tuple[Fraction, Fraction]:
    """The float64 magnitudes just below and above ``a > 0`` (not a float64); above the
    largest float64 the upper one is 2**1024, the value an unbounded exponent would give."""
    top = Fraction(2) ** 1024
    if a > Fraction(_F64_MAX):
        return Fraction(_F64_MAX), top
    f = float(a)  # correctly rounded: one of the two neighbours
    other = float(np.nextafter(f, 0.0 if Fraction(f) > a else np.inf))
    lo, hi = sorted((Fraction(f), Fraction(other) if math.isfinite(other) else top))
    return lo, hi


def _fp64_odd(v: Fraction) -> bool:
    if v >= Fraction(_F64_MAX):  # max is odd, 2**1024 even
        return v == Fraction(_F64_MAX)
    return int(np.float64(float(v)).view(np.uint64)) % 2 == 1


def round_exact(
    v: Fraction,
    fmt: str | FloatFormat | IntFormat,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> float:
    """The exact rational ``v`` rounded once to ``fmt``: :func:`round_to` semantics for a value
    that no float64 may hold.

    Deterministic modes to formats of at most 51 mantissa bits round the float64 round-to-odd
    stand-in with :func:`round_to` (exact: the stand-in keeps the sticky bit). fp64 and
    stochastic rounding choose between the two neighbours of ``v`` from exact distances
    (stochastic: with round_to's rule and random word for ``(seed, index 0)``).

    >>> round_exact(Fraction(1) + Fraction(1, 2**60), "fp64", rounding="up") == 1 + 2**-52
    True
    >>> round_exact(Fraction(1, 10), "e4m3")
    0.1015625
    """
    f = get_format(fmt)
    mode = sr_mode(check_rounding(rounding), 64)  # the SR variants with 64 bits: stochastic
    overflow = check_choice("overflow", overflow, OVERFLOW_MODES)
    subnormals = check_choice("subnormals", subnormals, SUBNORMAL_MODES)
    x = _odd_float64(v)
    opts: dict[str, Any] = {"overflow": overflow, "subnormals": subnormals}
    wide = _is_fp64_grid(f)
    # the round-to-odd stand-in decides every mode but "stochastic" (whose probability needs the
    # exact distance) for formats of at most 51 mantissa bits; stochastic_equal only asks
    # "inexact?", which the stand-in's sticky bit answers
    if v == 0 or (mode != "stochastic" and not wide) or (wide and Fraction(x) == v):
        return float(round_to(np.float64(x), f, rounding=mode, seed=seed, **opts))
    if isinstance(f, FloatFormat) and wide and (f.exponent_bits, f.mantissa_bits) != (11, 52):
        raise ValueError(f"cannot round a value that is not a float64 exactly to {f}")
    negative = v < 0
    a = abs(v)
    outward = "down" if negative else "up"
    if wide:
        lo, hi = _fp64_neighbours(a)
        lo_r = -float(lo) if negative else float(lo)
        if hi > Fraction(_F64_MAX):  # overflow: inf, or max when saturating
            hi_r = -_F64_MAX if negative else _F64_MAX
            hi_r = hi_r if overflow == "saturate" else math.copysign(math.inf, hi_r)
        else:
            hi_r = -float(hi) if negative else float(hi)
    else:  # stochastic: the stand-in lies between the same two neighbours
        lo_r = float(round_to(np.float64(x), f, rounding="toward_zero", overflow="saturate"))
        hi_r = float(round_to(np.float64(x), f, rounding=outward, overflow=overflow))
        if math.isnan(lo_r):  # no such value (a negative number in an unsigned format)
            return lo_r
        lo = Fraction(abs(lo_r))
        if math.isfinite(hi_r):
            hi = Fraction(abs(hi_r))
            if hi <= lo:  # one candidate only (saturated, or clamped to the least value)
                return _flush(lo_r, f, subnormals)
        else:  # overflow: the value above max an unbounded exponent would give
            hi = Fraction(f.max) + _ulp_at(f, Fraction(f.max))
    if is_stochastic(mode):  # round_to's rules, with the random word of (seed, index 0)
        word = int(random_words(check_seed(seed), 1, 0)[0])
        if a >= hi:
            up = True
        elif mode == "stochastic_equal":  # inexact: up iff the top random bit is set
            up = a != lo and word >= 2**63
        else:
            frac64 = math.floor((a - lo) / (hi - lo) * 2**64)
            up = frac64 != 0 and word >= 2**64 - frac64
    else:
        lo_odd = _fp64_odd(lo)
        away = a - lo > hi - a or (a - lo == hi - a and mode == "nearest_away")
        tie_even = a - lo == hi - a and mode == "nearest_even" and lo_odd
        choice = {
            "nearest_even": away or tie_even,
            "nearest_away": away,
            "nearest_zero": a - lo > hi - a,
            "toward_zero": False,
            "up": not negative,
            "down": negative,
            "odd": not lo_odd,
        }
        up = choice[mode]
    return _flush(hi_r if up else lo_r, f, subnormals)


def _flush(r: float, f: FloatFormat | IntFormat, subnormals: str) -> float:
    """A subnormal result flushed to the format's zero of its sign (``subnormals="flush"``)."""
    if (
        subnormals == "flush"
        and isinstance(f, FloatFormat)
        and r != 0
        and abs(r) < f.smallest_normal
    ):
        return float(round_to(np.float64(math.copysign(0.0, r)), f))
    return r


# ----- formats -----------------------------------------------------------------------------------
def cmd_formats(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(format_rows(), indent=2))
    else:
        print(formats_table())
    return 0


# ----- cast --------------------------------------------------------------------------------------
def _fields(code: int, value: float, f: FloatFormat | IntFormat) -> dict[str, Any]:
    """Binary split of a code: sign / exponent / mantissa fields, and what they mean."""
    if isinstance(f, IntFormat):
        bits = format(code, f"0{f.bits}b")
        kind = "two's complement" if f.signed else "unsigned binary"
        return {"binary": bits, "describe": f"{kind} {int(value)}"}
    e, m = f.exponent_bits, f.mantissa_bits
    sign = code >> (e + m) if f.signed else 0
    ef = (code >> m) & ((1 << e) - 1)
    mf = code & ((1 << m) - 1)
    parts = ([str(sign)] if f.signed else []) + [format(ef, f"0{e}b")]
    if m:
        parts.append(format(mf, f"0{m}b"))
    assert f.bias is not None
    if math.isnan(value):
        kind = "NaN"
    elif math.isinf(value):
        kind = "infinity"
    elif value == 0:
        kind = "zero"
    elif ef == 0 and f.has_zero:
        kind = f"subnormal: 0.{format(mf, f'0{m}b')}b * 2**{f.emin}"
    else:
        frac = f".{format(mf, f'0{m}b')}" if m else ""
        kind = f"normal: 1{frac}b * 2**{ef - f.bias}"
    fields = [f"sign {sign}"] if f.signed else []
    fields.append(f"exponent field {ef}")
    if m:
        fields.append(f"mantissa field {mf}")
    return {
        "binary": "_".join(parts),
        "sign": sign,
        "exponent_field": ef,
        "mantissa_field": mf,
        "describe": f"{', '.join(fields)}; {kind}",
    }


def _num(v: float | Fraction | None) -> Any:
    """JSON-safe number: floats as floats, non-finite ones as strings."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else str(v)


def cast(
    text: str,
    fmt: str,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> dict[str, Any]:
    """Everything ``precision-lab cast`` prints, as a dict.

    ``seed`` is used by the stochastic modes; with a deterministic mode it changes nothing, as
    in :func:`~precision_lab.round_to`, and the result says so (``seed_used`` False). A
    stochastic mode without a seed draws one and reports it (``seed_drawn``), so the run can be
    repeated.

    >>> r = cast("2.5e-8", "fp16", rounding="sre", seed=3)
    >>> r["seed"], r["result"] == cast("2.5e-8", "fp16", rounding="sre", seed=3)["result"]
    (3, True)
    """
    f = get_format(fmt)
    mode = check_rounding(rounding)
    overflow = check_choice("overflow", overflow, OVERFLOW_MODES)
    subnormals = check_choice("subnormals", subnormals, SUBNORMAL_MODES)
    stochastic = is_stochastic(mode)
    if seed is not None:
        seed = check_seed(seed)
    drawn = stochastic and seed is None
    if drawn:
        seed = secrets.randbits(32)
    val = parse_value(text)
    exact, x = val.exact, val.x
    if math.isnan(x) and not (isinstance(f, FloatFormat) and f.has_nan):
        raise ValueError(
            f"VALUE nan has no {f} value: {f} has no NaN (encode and the quantizers refuse it "
            "too; inf and -inf saturate to the largest magnitude)"
        )
    opts: dict[str, Any] = {"rounding": mode, "overflow": overflow, "subnormals": subnormals}
    if exact is None or exact == 0:
        r = float(round_to(np.float64(x), f, seed=seed, **opts))
    else:
        r = round_exact(exact, f, seed=seed, **opts)
    out: dict[str, Any] = {
        "input": text.strip(),
        "input_exact": None if exact is None or val.beyond else str(exact),
        "input_float64": x if exact is None or exact == 0 else _float(exact),
        "input_beyond": (
            None
            if not val.beyond
            else f"|value| {'<' if val.beyond < 0 else '>'} 2**"
            f"{val.beyond * _LIMIT}: decided without building it (errors saturate alike)"
        ),
        "format": str(f),
        "rounding": mode,
        "overflow": overflow,
        "subnormals": subnormals,
        "result": r,
    }
    if stochastic or seed is not None:
        out["seed"] = seed
        out["seed_drawn"] = drawn
        out["seed_used"] = stochastic
    try:
        code = int(encode(np.float64(r), f, overflow=overflow))
    except ValueError as err:  # NaN in a format without NaN
        out["code"] = None
        out["code_note"] = str(err)
    else:
        digits = -(-f.bits // 4)
        out["code"] = code
        out["hex"] = f"0x{code:0{digits}X}"
        out.update(_fields(code, r, f))
    out["error"] = _error(exact, x, r, f, val.beyond)
    return out


def _error(
    exact: Fraction | None, x: float, r: float, f: FloatFormat | IntFormat, beyond: int = 0
) -> dict:
    """The error of the result ``r`` against the exact input: float64 numbers (inf where they
    overflow float64) and ``text``, the line ``cast`` prints, exact to 6 digits at any
    magnitude (``1e400`` cast toward zero to fp16 is 1e+400 off, not "inf"). For an input
    beyond ``2**±_LIMIT`` (``beyond``) the exact value was never built: the text gives bounds."""
    if exact is None:  # inf or NaN in: exact when it comes out as itself
        same = (math.isnan(r) and math.isnan(x)) or r == x
        return {"abs": 0.0 if same else math.inf, "rel": None, "ulps": None, "exact": bool(same)}
    if not math.isfinite(r):  # a finite value became inf or NaN
        bad = math.inf if math.isinf(r) else math.nan
        reason = "overflow" if abs(exact) > Fraction(f.max) else "no such value"
        return {"abs": bad, "rel": bad, "ulps": bad, "exact": False, "reason": reason}
    err = abs(Fraction(r) - exact)
    rel = err / abs(exact) if exact != 0 else None
    ulps = err / _ulp_at(f, abs(exact))
    out: dict[str, Any] = {
        "abs": _float(err),
        "rel": _float(rel) if rel is not None else (0.0 if r == 0 else math.inf),
        "ulps": _float(ulps),
        "exact": err == 0,
    }
    if beyond > 0:  # |input| > 2**_LIMIT, the result finite: the error is about the input
        out["text"] = f"abs > 2**{_LIMIT - 1}, rel 1 (to 6 digits), > 2**{_LIMIT - 1024} ulp"
    elif beyond < 0:  # 0 < |input| < 2**-_LIMIT
        if r == 0:
            out["text"] = f"abs < 2**-{_LIMIT}, rel 1"
        else:
            abs_r = _sci(Fraction(abs(r)))
            rel_bound = f"2**{_LIMIT - 1075}"
            out["text"] = f"abs {abs_r} (to 6 digits), rel > {rel_bound}, {_sci(ulps)} ulp"
    else:
        parts = (_sci(v) if v else "~0" for v in (err, rel if rel is not None else err, ulps))
        abs_, rel_, ulps_ = parts
        out["text"] = f"abs {abs_}, rel {rel_ if rel is not None else 'inf'}, {ulps_} ulp"
    return out


def cmd_cast(args: argparse.Namespace) -> int:
    info = cast(
        args.value,
        args.format,
        rounding=args.rounding,
        overflow=args.overflow,
        subnormals=args.subnormals,
        seed=args.seed,
    )
    if args.json:
        safe = {k: _num(v) if isinstance(v, float) else v for k, v in info.items()}
        safe["error"] = {
            k: _num(v) if isinstance(v, float) else v for k, v in info["error"].items()
        }
        print(json.dumps(safe, indent=2))
        return 0
    x = info["input_float64"]
    note = ""
    if info["input_beyond"] is not None:
        note = f"  ({info['input_beyond']})"
    elif info["input_exact"] is not None and (
        not math.isfinite(x) or Fraction(info["input_exact"]) != Fraction(x)
    ):
        kind = "hex float" if "0x" in info["input"].lower() else "decimal"
        note = f"  (exact {kind}; the nearest float64 is {x!r})"
    print(f"input     {info['input']}{note}")
    print(
        f"format    {info['format']}  rounding {info['rounding']}, overflow {info['overflow']}, "
        f"subnormals {info['subnormals']}"
    )
    if "seed" in info:
        again = f"  (drawn: --seed {info['seed']} repeats this run)" if info["seed_drawn"] else ""
        if not info["seed_used"]:
            again = f"  (unused: {info['rounding']} is deterministic)"
        print(f"seed      {info['seed']}{again}")
    print(f"result    {info['result']!r}")
    if info["code"] is None:
        print(f"code      none: {info['code_note']}")
    else:
        print(f"code      {info['hex']}  0b{info['binary']}  ({info['describe']})")
    exact = info["input_exact"]
    fmt = get_format(info["format"])
    if isinstance(fmt, IntFormat) and exact is not None:
        lo, hi = fmt.min, fmt.max
        if not lo <= Fraction(exact) <= hi:
            print(
                f"note      saturated: the input lies outside {info['format']}'s range "
                f"[{lo:g}, {hi:g}]; integer formats clamp to it (no inf or NaN to overflow to)"
            )
    e = info["error"]
    if "reason" in e:
        what = "overflow" if e["reason"] == "overflow" else "not finite"
        print(f"error     {what}: the finite input became {info['result']!r}")
    elif e["rel"] is None:
        print(f"error     {'none' if e['exact'] else 'not finite'}")
    elif e["exact"]:
        print("error     0 (exact)")
    else:
        print(f"error     {e['text']}")
    return 0


# ----- figures / report --------------------------------------------------------------------------
def cmd_figures(args: argparse.Namespace) -> int:
    from . import figures

    if args.list:
        for name, mod in figures.jobs().items():
            print(f"{name:24s} {mod.TITLE}")
        return 0
    report = figures.run(args.outdir, args.only, strict=bool(args.only))
    print(report)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    path = Path(args.outdir) / "REPORT.md"
    if args.only and not args.regenerate:
        raise ValueError(
            "--only names the figure jobs to rerun, so it needs --regenerate (without it, "
            "report prints the existing report whole)"
        )
    if args.regenerate:
        from . import figures

        path = figures.run(args.outdir, args.only, strict=bool(args.only))
    elif not path.exists():
        print(
            f"precision-lab: error: {path} does not exist; run `precision-lab figures` "
            "or `precision-lab report --regenerate`",
            file=sys.stderr,
        )
        return 1
    if args.show:
        print(path.read_text())
    else:
        print(path)
    return 0


# ----- info --------------------------------------------------------------------------------------
def cmd_info(args: argparse.Namespace) -> int:
    """Print :func:`precision_lab.backend_info`: the backend of each operation, and why."""
    from .backends.dispatch import backend_info

    info = backend_info()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        width = max(map(len, info))
        for op, backend in info.items():
            print(f"{op:{width}s}  {backend}")
    return 0


# ----- conform -----------------------------------------------------------------------------------
def cmd_conform(args: argparse.Namespace) -> int:
    """Check a third-party quantizer's codes and scales (npz or CSV) against precision_lab, or
    (``--peer``) run an installed peer's decoders, casts and quantizer over the library's vectors
    and name where it departs."""
    from .verify.conformance import check_conformance, load_vector

    if args.peer is not None:
        if args.file is not None:
            raise ValueError("conform takes FILE or --peer, not both")
        from .verify.peers import check_peer

        rep = check_peer(args.peer)
        if args.json:
            checks = [
                {"check": c.name, "ok": c.ok, "checked": c.checked, "departed": c.departed,
                 "note": c.note, "examples": [list(map(str, e)) for e in c.examples]}
                for c in rep.checks
            ]  # fmt: skip
            print(json.dumps({"peer": rep.peer, "version": rep.version, "ok": rep.ok,
                              "checks": checks}, indent=2))  # fmt: skip
        else:
            print(rep.summary())
        return 0 if rep.ok else 1
    if args.file is None:
        raise ValueError("conform needs FILE (an .npz or .csv) or --peer NAME")
    case = load_vector(args.file)
    fmt = args.format or case.block_format
    if fmt is None:
        raise ValueError(f"{args.file}: the file names no block format: pass --format")
    report = check_conformance(
        case.inputs,
        case.codes,
        case.scale_codes,
        fmt,
        scale_rule=args.scale_rule or case.scale_rule,
        rounding=args.rounding or case.rounding,
        seed=args.seed if args.seed is not None else case.seed,
        random_bits=args.random_bits if args.random_bits is not None else case.random_bits,
        hadamard=case.hadamard,
        **({"hadamard_seed": case.hadamard_seed} if case.hadamard_seed is not None else {}),
        show=args.show,
    )
    if args.json:
        info = {
            "ok": report.ok,
            "format": report.block_format,
            "rounding": report.rounding,
            "blocks": report.blocks,
            "bad_blocks": report.bad_blocks,
            "bad_scales": report.bad_scales,
            "elements": report.elements,
            "bad_elements": report.bad_elements,
            "causes": dict(report.causes),
            "differences": report.differences,
        }
        print(json.dumps(info, indent=2))
    else:
        print(report.summary())
    return 0 if report.ok else 1


# ----- the parser --------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit status 2), as the commands' own errors (status 1)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


#: What the exit status says (the parser's epilog: ``--help`` and docs/cli.md show it).
EXIT_STATUS = (
    "Exit status: 0 done; 1 the command failed (a bad value, format or file, a missing "
    "optional package, vectors that do not conform); 2 the command line itself is malformed "
    "(an unknown option, a missing argument, an invalid choice), found before anything runs. "
    "Every error is one line on stderr, 'precision-lab COMMAND: error: ...', never a "
    "traceback. Output piped into a reader that stops early (| head) ends quietly with 0."
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="precision-lab",
        description="Bit-exact low-precision formats: tables, casts, figures.",
        epilog=EXIT_STATUS,
    )
    from .core.version import __version__

    parser.add_argument("--version", action="version", version=f"precision-lab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "formats",
        help="table of every registered format",
        description="Print bits, range and precision of every registered format.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_formats)

    p = sub.add_parser(
        "cast",
        help="round one value to a format",
        description="Round VALUE (read exactly) to FORMAT; print the result, its code and the "
        "error.",
    )
    p.add_argument(
        "value", metavar="VALUE", help="decimal (read exactly), hex float 0x1.8p-3, inf, -inf, nan"
    )
    p.add_argument("format", metavar="FORMAT", help="format name, e.g. e4m3, bf16, int8")
    p.add_argument(
        "--rounding",
        default="nearest_even",
        help=f"one of {', '.join(ROUNDING_MODES)}, or an alias: {' '.join(MODE_ALIASES)} "
        "(default nearest_even)",
    )
    p.add_argument(
        "--overflow",
        default="ieee",
        choices=OVERFLOW_MODES,
        help="ieee (inf/NaN) or saturate (clamp to ±max); default ieee",
    )
    p.add_argument(
        "--subnormals",
        default="keep",
        choices=SUBNORMAL_MODES,
        help="keep or flush (to zero); default keep",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the stochastic modes (stochastic, stochastic_equal ...; accepted and "
        "unused with a deterministic mode, as round_to's seed=); without it a stochastic mode "
        "draws a seed and prints it, so the run can be repeated",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_cast)

    p = sub.add_parser(
        "tensor-cores",
        help="table of the matrix-core presets (pl.tensor_core) and their evidence",
        description="Print every GPU x instruction x input/output format preset of "
        "pl.tensor_core: products per block, fraction bits kept, rounding, special-value "
        "rules and the evidence (measured data set, published model, or inferred).",
    )
    p.add_argument("--gpu", default=None, help="only this GPU or CPU (e.g. b200, mi300x, x86, arm)")
    p.add_argument(
        "--instruction",
        default=None,
        choices=(
            "mma",
            "wgmma",
            "tcgen05",
            "mfma",
            "vdpbf16ps",
            "bfmmla",
            "bfdot",
            "bfmlal",
            "fdot",
            "fmlal",
            "fmlall",
        ),
        help="only this instruction",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_tensor_cores)

    p = sub.add_parser(
        "figures",
        help="regenerate the figures and figures/REPORT.md",
        description="Run the figure jobs (all, or --only NAME).",
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this figure job (repeatable; see --list)",
    )
    p.add_argument("--outdir", default="figures", help="output folder (default figures)")
    p.add_argument("--list", action="store_true", help="list the figure jobs and exit")
    p.set_defaults(func=cmd_figures)

    p = sub.add_parser(
        "report",
        help="path of figures/REPORT.md (or regenerate it)",
        description="Print the path of REPORT.md; --show prints it, "
        "--regenerate runs the figure jobs first.",
    )
    p.add_argument("--outdir", default="figures", help="report folder (default figures)")
    p.add_argument("--regenerate", action="store_true", help="run the figure jobs first")
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="with --regenerate: only this figure job (repeatable)",
    )
    p.add_argument("--show", action="store_true", help="print the report instead of its path")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "conform",
        help="check a block quantizer's codes and scales against precision_lab",
        description="Compare the element codes and block scales in FILE (npz with inputs, codes, "
        "scale_codes; or CSV rows input,code,scale_code with '# format=...' header lines) with "
        "precision_lab's for the same inputs, and report the first differences with their likely "
        "cause (scale rule, tie rule, saturation). Exit status 0 when everything matches, 1 on a "
        "mismatch or a bad file.",
    )
    p.add_argument("file", metavar="FILE", nargs="?", help="an .npz or .csv file")
    p.add_argument("--peer", choices=("ml_dtypes", "torch", "gfloat", "torchao"),
                   help="instead of FILE: run this installed third-party decoder / quantizer "
                   "over precision_lab's codes, probes and shipped vectors and name where it "
                   "departs (exit status 1 if it does)")  # fmt: skip
    p.add_argument("--format", help="block format (nvfp4, mxfp4_e2m1, mxfp8_e4m3 ...), if the "
                   "file names none or to override it")  # fmt: skip
    p.add_argument("--scale-rule", help="scale rule (default: the file's, else the format's)")
    p.add_argument("--rounding", help="element rounding mode (default: the file's, else "
                   "nearest_even)")  # fmt: skip
    p.add_argument("--seed", type=int, help="seed of stochastic rounding (default: the file's)")
    p.add_argument("--random-bits", type=int, help="random bits of stochastic rounding")
    p.add_argument("--show", type=int, default=5, help="differences to list (default 5)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_conform)

    p = sub.add_parser(
        "info",
        help="which backend (native, numpy, cupy) serves each operation",
        description="Print the backend of round_to, encode and decode, and why.",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)

    add_scaleout_commands(sub)
    add_probe_command(sub)
    return parser


# ----- verify / grid (Dask) ----------------------------------------------------------------------
def add_scaleout_commands(sub: Any) -> None:
    """The ``verify`` and ``grid`` subcommands (they need the ``[dask]`` extra)."""
    p = sub.add_parser(
        "verify",
        help="check round_to/encode on every input bit pattern (Dask)",
        description="Compare round_to and encode on every float32 (or float16/bfloat16) input "
        "with an independent oracle, in chunks, as Dask tasks. Exit status 1 on mismatches. "
        'Needs pip install "precision_lab[dask]".',
    )
    p.add_argument("format", metavar="FORMAT", help="format name, e.g. e4m3, bf16")
    p.add_argument(
        "--mode",
        action="append",
        metavar="MODE",
        help="rounding mode to check (repeatable; default nearest_even)",
    )
    p.add_argument(
        "--overflow",
        action="append",
        choices=OVERFLOW_MODES,
        help="overflow switch to check (repeatable; default ieee)",
    )
    p.add_argument("--subnormals", default="keep", choices=SUBNORMAL_MODES)
    p.add_argument(
        "--against",
        default="referee",
        choices=("referee", "ml_dtypes", "torch"),
        help="the oracle (default referee: exact float64 arithmetic)",
    )
    p.add_argument(
        "--input",
        default="float32",
        choices=("float32", "float16", "bfloat16"),
        help="which bit patterns to walk (default float32: all 2**32)",
    )
    p.add_argument("--chunk", type=lambda t: int(t, 0), default=2**24, help="patterns per task")
    p.add_argument("--start", type=lambda t: int(t, 0), default=0, help="first bit pattern")
    p.add_argument("--stop", type=lambda t: int(t, 0), default=None, help="end bit pattern")
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="Dask scheduler address (default: local threads; or threads, processes, sync)",
    )
    p.add_argument("--out", default=None, metavar="DIR", help="checkpoint folder (resumable)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "grid",
        help="run an experiment grid from a JSON SPEC (Dask)",
        description="Run the training or GEMM-error configurations of SPEC as Dask tasks; "
        "write results.csv (and results.parquet with pyarrow), failures.json and a cache "
        "to --out. Exit status 1 when a run failed. "
        'Needs pip install "precision_lab[dask]".',
    )
    p.add_argument("spec", metavar="SPEC", help="JSON spec (see precision_lab.verify.grid)")
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="Dask scheduler address (default: local processes; or threads, processes, sync)",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="output folder (default SPEC-stem-results)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_grid)


def _needs_dask(command: str, err: ImportError) -> int:
    print(f"precision-lab {command}: error: {err}", file=sys.stderr)
    return 1


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        from .verify.sweep import verify_exhaustive
    except ImportError as err:
        return _needs_dask("verify", err)
    res = verify_exhaustive(
        args.format,
        modes=args.mode or ("nearest_even",),
        overflow=args.overflow or ("ieee",),
        subnormals=args.subnormals,
        against=args.against,
        input=args.input,
        chunk=args.chunk,
        start=args.start,
        stop=args.stop,
        client=args.scheduler,
        out=args.out,
        quiet=args.quiet,
    )
    if args.json:
        info = {
            "ok": res.ok,
            "format": res.fmt,
            "input": res.input,
            "against": res.against,
            "checked": res.checked,
            "skipped": res.skipped,
            "counts": {f"{m}/{o}": c for (m, o), c in res.counts.items()},
            "mismatches": res.mismatches,
            "computed_chunks": res.computed,
            "reused_chunks": res.reused,
            "seconds": res.seconds,
            "path": res.path,
        }
        print(json.dumps(info, indent=2))
    else:
        print(res.summary())
    return 0 if res.ok else 1


def cmd_grid(args: argparse.Namespace) -> int:
    try:
        from .verify.grid import load_spec, run_grid
    except ImportError as err:
        return _needs_dask("grid", err)
    configs = load_spec(args.spec)
    out = args.out or f"{Path(args.spec).stem}-results"
    res = run_grid(configs, client=args.scheduler, out=out, quiet=args.quiet)
    print(
        f"{len(res.rows)} runs finished ({res.computed} computed, {res.reused} from the cache), "
        f"{len(res.failures)} failed; table: {Path(out) / 'results.csv'}"
    )
    for f in res.failures:
        print(f"failed: {f}", file=sys.stderr)
    return 0 if not res.failures else 1


def cmd_tensor_cores(args: argparse.Namespace) -> int:
    from .gemm.tensor_core import format_table, tensor_core_list

    rows = tensor_core_list(args.gpu)
    if args.instruction:
        rows = [r for r in rows if r["instruction"] == args.instruction]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(format_table(rows))
    return 0


# ----- probe: which accumulator model does a library's matmul follow? ----------------------------
def add_probe_command(sub: Any) -> None:
    """The ``probe`` subcommand: :func:`precision_lab.probe_gemm` on numpy, torch or CuPy."""
    p = sub.add_parser(
        "probe",
        help="recover the accumulation model of numpy's, torch's or CuPy's matmul",
        description="Run probe_gemm on LIBRARY's matmul (numpy: numpy.matmul on the CPU; torch: "
        "torch.matmul on the CPU; cupy: cupy.matmul, cuBLAS, on the GPU) and print the "
        "Accumulator that reproduces it bit for bit, or why none does (exit status 1).",
    )
    p.add_argument(
        "library",
        choices=("numpy", "torch", "cupy"),
        metavar="LIBRARY",
        help="numpy, torch or cupy",
    )
    p.add_argument(
        "--input-format",
        default="fp32",
        help="fp32 (default), fp64, fp16 or bf16 (torch): the operands' dtype",
    )
    p.add_argument(
        "--max-k",
        type=int,
        default=32,
        help="longest reduction probed (default 32; the tree probe costs K**2/2 products)",
    )
    p.add_argument(
        "--cases",
        type=int,
        default=2048,
        help="random output elements that confirm the model (default 2048)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument(
        "--shape",
        type=int,
        nargs=2,
        default=(8, 8),
        metavar=("M", "N"),
        help="M and N of every call (default 8 8)",
    )
    p.add_argument(
        "--long-k",
        type=int,
        default=None,
        metavar="K",
        help="also check a long reduction of K products (K-blocking past --max-k; up to 8192)",
    )
    p.add_argument(
        "--op",
        choices=("matmul", "sum"),
        default="matmul",
        help="matmul (default), or sum: the elementwise products summed by the library's sum "
        "over a contiguous axis (np.sum, torch.sum)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_probe)


def _library_matmul(library: str, input_format: str, op: str = "matmul") -> tuple[Any, str | None]:
    """``fn(a, b)`` calling LIBRARY's matmul (or, with ``op="sum"``, its sum of the
    elementwise products over a contiguous axis) on numpy inputs, and the output format to
    probe."""
    fmt = str(get_format(input_format))
    if op == "sum" and library == "cupy":
        raise ValueError("--op sum: probe numpy or torch")
    if library == "numpy":
        if op == "sum":

            def np_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
                p = a[:, None, :] * np.ascontiguousarray(b.T)[None, :, :]
                return np.sum(p, axis=-1)

            return np_sum, None
        return (lambda a, b: np.matmul(a, b)), None
    if library == "torch":
        if fmt not in ("fp64", "fp32", "fp16", "bf16"):  # refused before any work
            raise ValueError(
                f"--input-format {input_format}: probe torch runs torch.matmul on the CPU, "
                "which takes fp64, fp32, fp16 or bf16 operands"
            )
        import torch

        def torch_mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            if fmt == "bf16":
                ta = torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
                tb = torch.from_numpy(b.astype(np.float32)).to(torch.bfloat16)
            else:
                ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            if op == "sum":
                out = torch.sum(ta[:, None, :] * tb.T.contiguous()[None, :, :], dim=-1)
            else:
                out = torch.matmul(ta, tb)
            return out.float().numpy() if fmt == "bf16" else out.numpy()

        return torch_mm, ("bf16" if fmt == "bf16" else None)
    import cupy

    def cupy_mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return cupy.asnumpy(cupy.matmul(cupy.asarray(a), cupy.asarray(b)))

    return cupy_mm, None


def _as_code(acc: Any) -> str:
    """``acc`` as the shortest call that rebuilds it: the fields that differ from a default
    ``Accumulator`` of the same format, formats by name where the name gives them back (the
    full repr where the call would not rebuild ``acc``)."""
    from .gemm.accumulator import Accumulator

    def text(value: Any) -> str:
        if isinstance(value, Accumulator):
            return _as_code(value)
        name = getattr(value, "name", None)
        if isinstance(value, FloatFormat | IntFormat) and isinstance(name, str):
            try:
                if get_format(name) == value:
                    return repr(name)
            except ValueError:
                pass
        return repr(value)

    base = Accumulator(acc.format)
    parts = [text(acc.format)]
    for f in dataclasses.fields(acc):
        value = getattr(acc, f.name)
        if f.name != "format" and f.init and value != getattr(base, f.name):
            parts.append(f"{f.name}={text(value)}")
    code = f"Accumulator({', '.join(parts)})"
    names = {"Accumulator": Accumulator, "FloatFormat": FloatFormat, "IntFormat": IntFormat}
    try:
        same = eval(code, names) == acc  # our own text, not input
    except Exception:
        same = False
    return code if same else repr(acc)


def cmd_probe(args: argparse.Namespace) -> int:
    from .gemm.probe import probe_gemm

    fn, out_format = _library_matmul(args.library, args.input_format, args.op)
    try:
        res = probe_gemm(
            fn,
            input_format=args.input_format,
            out_format=out_format,
            max_k=args.max_k,
            seed=args.seed,
            cases=args.cases,
            shape=tuple(args.shape),
            long_k=args.long_k,
        )
    except (RuntimeError, ArithmeticError) as err:  # the library's matmul raised, or the call
        # budget ran out: one line, never a traceback
        print(f"precision-lab probe: error: {err}", file=sys.stderr)
        return 1
    if args.json:
        acc = res.accumulator
        info = {
            "library": args.library,
            "found": acc is not None,
            "outcome": res.outcome,
            "accumulator": None if acc is None else acc.describe(),
            "closest": None if res.closest is None else res.closest.describe(),
            "confidence": res.confidence,
            "reproduced": res.reproduced,
            "tried": res.tried,
            "failed": res.failed,
            "tree": res.tree,
            "evidence": res.evidence,
            "verdict": res.verdict,
        }
        print(json.dumps(info, indent=2))
    else:
        print(res)
        if res.accumulator is not None:
            print(f"\n{_as_code(res.accumulator)}")
    if res.accumulator is None:  # nothing reproduces the box: a failure, in one line
        what = {"outside": "outside what the probe tries"}.get(res.outcome, res.outcome)
        print(
            f"precision-lab probe: no model reproduces {args.library}'s matmul ({what}; "
            f"failed: {res.failed}; closest reproduces {100 * res.confidence:.1f}% of "
            f"{res.tried} cases)",
            file=sys.stderr,
        )
        return 1
    return 0


_NEGATIVE_VALUE = re.compile(r"^-(\d|\.\d|inf|nan|0x)", re.IGNORECASE)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``precision-lab`` console script; returns the exit status.

    Negative VALUEs such as ``-1e-30`` or ``-inf`` are taken as values, not options.
    """
    parser = build_parser()
    raw = sys.argv[1:] if argv is None else list(argv)
    # argparse reads "-1e-30" as an option: a leading space keeps it a value (parse_value strips)
    args = parser.parse_args([" " + a if _NEGATIVE_VALUE.match(a) else a for a in raw])
    try:
        rc = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at exit
        return rc
    except BrokenPipeError:
        # output piped into `head` and the like: stop quietly with exit 0 (Python's advice for
        # SIGPIPE: point stdout at devnull so that the flush at exit does not fail again)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, ImportError, OSError) as err:
        # bad input, a missing optional package (torch, dask, scikit-learn), a file that is not
        # there, a scheduler that does not answer: one line, never a traceback
        what = str(err) or type(err).__name__
        if isinstance(err, OSError) and err.filename is not None and err.strerror:
            what = f"{err.filename}: {err.strerror.lower()}"  # not "[Errno 2] ..."
        elif isinstance(err, OSError) and err.strerror:
            what = f"{type(err).__name__}: {what}"
        print(f"precision-lab {args.command}: error: {what}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
