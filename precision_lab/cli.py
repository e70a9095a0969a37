"""The ``precision-lab`` command line.

::

    precision-lab formats [--json]                     the table of every registered format
    precision-lab cast VALUE FORMAT [--rounding R] [--overflow O] [--subnormals S] [--seed N]
                                    [--json]           round one value, show its code and error
    precision-lab figures [--only NAME] [--outdir DIR] [--list]   regenerate figures/REPORT.md
    precision-lab report [--outdir DIR] [--regenerate] [--show]   where the report is (or make it)

``VALUE`` is read exactly: a decimal string is the exact decimal number (``0.1`` is one tenth, not
the float64 nearest to it) and is rounded once, straight to the format; hex floats
(``0x1.8p-3``), ``inf``, ``-inf``, ``nan`` and ``-0`` work too.

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
import json
import math
import os
import re
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from .codec import encode
from .formats import ALIASES, FORMATS, FloatFormat, IntFormat, get_format
from .rounding import OVERFLOW_MODES, ROUNDING_MODES, SUBNORMAL_MODES, check_rounding, round_to

__all__ = ["main", "parse_value"]


# ----- VALUE -------------------------------------------------------------------------------------
def parse_value(text: str) -> tuple[Fraction | None, float]:
    """``(exact value, float64 to round)`` for a decimal, hex-float or special string.

    The float64 is the exact value when it is one; otherwise the exact value rounded to odd (the
    neighbour whose last bit is 1), which keeps what every later rounding to a format of at most
    51 mantissa bits needs, so that rounding is the correct rounding of the exact decimal. The
    exact value is None for inf and NaN. Beyond float64's range the float64 is ±max (odd, so
    still a correct stand-in for every narrower format).

    >>> parse_value("0x1.8p-3")
    (Fraction(3, 16), 0.1875)
    >>> parse_value("0.1")[0], parse_value("0.1")[1] == 0.1
    (Fraction(1, 10), False)
    >>> parse_value("-0")
    (Fraction(0, 1), -0.0)
    """
    s = text.strip().lower().replace("_", "")
    negative = s.startswith("-")
    body = s.lstrip("+-")
    if body in ("inf", "infinity", "nan"):
        return None, float(s)
    try:
        if body.startswith("0x"):
            exact = Fraction(float.fromhex(s))
        else:
            exact = Fraction(s)
    except (ValueError, ZeroDivisionError, OverflowError):
        raise ValueError(
            f"VALUE must be a decimal number, a hex float (0x1.8p-3), inf or nan, got {text!r}"
        ) from None
    if exact == 0:
        return exact, -0.0 if negative else 0.0
    try:
        f = float(exact)  # correctly rounded to nearest
    except OverflowError:  # beyond float64: its max, which is odd, is the sticky stand-in
        f = _F64_MAX if exact > 0 else -_F64_MAX
    if Fraction(f) != exact and int(np.float64(f).view(np.uint64)) % 2 == 0:
        f = float(np.nextafter(f, np.inf if exact > Fraction(f) else -np.inf))
    return exact, f


_F64_MAX = float(np.finfo(np.float64).max)


def _float(v: Fraction) -> float:
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _nearest_float64(exact: Fraction | None, x: float) -> float:
    if exact is None or exact == 0:
        return x
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


# ----- formats -----------------------------------------------------------------------------------
def _format_row(name: str, f: FloatFormat | IntFormat) -> dict[str, Any]:
    aliases = sorted(a for a, target in ALIASES.items() if target == name)
    if isinstance(f, IntFormat):
        return {
            "name": name,
            "kind": "int",
            "bits": f.bits,
            "signed": f.signed,
            "min": f.min,
            "max": f.max,
            "aliases": aliases,
        }
    return {
        "name": name,
        "kind": "float",
        "bits": f.bits,
        "exponent_bits": f.exponent_bits,
        "mantissa_bits": f.mantissa_bits,
        "bias": f.bias,
        "signed": f.signed,
        "max": f.max,
        "smallest_normal": f.smallest_normal,
        "smallest_subnormal": f.smallest_subnormal,
        "eps": f.eps,
        "has_inf": bool(f.has_inf),
        "has_nan": bool(f.has_nan),
        "nan": f.nan,
        "has_subnormals": f.has_subnormals,
        "aliases": aliases,
    }


def _g(v: float) -> str:
    return f"{v:.6g}"


def cmd_formats(args: argparse.Namespace) -> int:
    rows = [_format_row(n, f) for n, f in FORMATS.items()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    head = (
        "name",
        "bits",
        "e",
        "m",
        "bias",
        "max",
        "min normal",
        "min subnormal",
        "eps",
        "inf",
        "NaN",
    )
    lines = [head]
    for r in rows:
        if r["kind"] == "int":
            lo = r["min"]
            lines.append(
                (
                    r["name"],
                    str(r["bits"]),
                    "-",
                    "-",
                    "-",
                    str(r["max"]),
                    f"(min {lo})",
                    "-",
                    "1",
                    "no",
                    "no",
                )
            )
            continue
        sub = _g(r["smallest_subnormal"]) if r["has_subnormals"] and r["mantissa_bits"] else "-"
        lines.append(
            (
                r["name"],
                str(r["bits"]),
                str(r["exponent_bits"]),
                str(r["mantissa_bits"]),
                str(r["bias"]),
                _g(r["max"]),
                _g(r["smallest_normal"]),
                sub,
                _g(r["eps"]),
                "yes" if r["has_inf"] else "no",
                "yes" if r["has_nan"] else "no",
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    for k, row in enumerate(lines):
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        print("  ".join(cells).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
    print("\nAliases: " + ", ".join(f"{a}={t}" for a, t in ALIASES.items()))
    return 0


# ----- cast --------------------------------------------------------------------------------------
def _fields(code: int, value: float, f: FloatFormat | IntFormat) -> dict[str, Any]:
    """Binary split of a code: sign / exponent / mantissa fields, and what they mean."""
    if isinstance(f, IntFormat):
        bits = format(code, f"0{f.bits}b")
        return {"binary": bits, "describe": f"two's complement {int(value)}"}
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
    """Everything ``precision-lab cast`` prints, as a dict."""
    f = get_format(fmt)
    mode = check_rounding(rounding)
    exact, x = parse_value(text)
    inexact = exact is not None and (not math.isfinite(x) or Fraction(x) != exact)
    if inexact and isinstance(f, FloatFormat) and f.mantissa_bits > 51 and mode != "nearest_even":
        # the round-to-odd float64 stand-in needs 2 more bits than the format has
        raise ValueError(
            f"VALUE {text!r} is not a float64 value, and {f} keeps {f.mantissa_bits} mantissa "
            "bits: only --rounding nearest_even can round it exactly (or give a hex float)"
        )
    if inexact and isinstance(f, FloatFormat) and f.mantissa_bits > 51:
        try:
            x = float(exact)  # type: ignore[arg-type]  # Python's correctly rounded conversion
        except OverflowError:
            x = math.inf if exact > 0 else -math.inf  # type: ignore[operator]
    r = float(
        round_to(
            np.float64(x), f, rounding=mode, overflow=overflow, subnormals=subnormals, seed=seed
        )
    )
    out: dict[str, Any] = {
        "input": text.strip(),
        "input_exact": None if exact is None else str(exact),
        "input_float64": _nearest_float64(exact, x),
        "format": str(f),
        "rounding": mode,
        "overflow": overflow,
        "subnormals": subnormals,
        "result": r,
    }
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
    if exact is not None and math.isfinite(r):
        err_abs = abs(Fraction(r) - exact)
        at = float(min(abs(exact), Fraction(f.max)))  # the spacing of the format at |exact|
        ulp = Fraction(float(f.ulp(at))) if isinstance(f, FloatFormat) else Fraction(1)
        out["error"] = {
            "abs": _float(err_abs),
            "rel": _float(err_abs / abs(exact)) if exact != 0 else (0.0 if r == 0 else math.inf),
            "ulps": _float(err_abs / ulp),
            "exact": err_abs == 0,
        }
    else:
        same = (math.isnan(r) and math.isnan(x)) or r == x
        out["error"] = {
            "abs": 0.0 if same else math.inf,
            "rel": None,
            "ulps": None,
            "exact": bool(same),
        }
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
    exact_note = ""
    exact = None if info["input_exact"] is None else Fraction(info["input_exact"])
    if exact is not None and (not math.isfinite(x) or Fraction(x) != exact):
        exact_note = f"  (exact decimal; the nearest float64 is {x!r})"
    print(f"input     {info['input']}{exact_note}")
    print(
        f"format    {info['format']}  rounding {info['rounding']}, overflow {info['overflow']}, "
        f"subnormals {info['subnormals']}"
    )
    print(f"result    {info['result']!r}")
    if info["code"] is None:
        print(f"code      none: {info['code_note']}")
    else:
        print(f"code      {info['hex']}  0b{info['binary']}  ({info['describe']})")
    e = info["error"]
    if e["rel"] is None:
        print(f"error     {'none' if e['exact'] else 'not finite'}")
    elif e["exact"]:
        print("error     0 (exact)")
    else:
        print(f"error     abs {e['abs']:.6g}, rel {e['rel']:.6g}, {e['ulps']:.6g} ulp")
    return 0


# ----- figures / report --------------------------------------------------------------------------
def cmd_figures(args: argparse.Namespace) -> int:
    from . import figures

    if args.list:
        for name, mod in figures.jobs().items():
            print(f"{name:24s} {mod.TITLE}")
        return 0
    report = figures.run(args.outdir, args.only)
    print(report)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    path = Path(args.outdir) / "REPORT.md"
    if args.regenerate:
        from . import figures

        path = figures.run(args.outdir, args.only)
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


# ----- the parser --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="precision-lab",
        description="Bit-exact low-precision formats: tables, casts, figures.",
    )
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
        help=f"one of {', '.join(ROUNDING_MODES)} or rne rna rtz rup rdn rto sr "
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
    p.add_argument("--seed", type=int, default=None, help="seed for --rounding stochastic")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_cast)

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
    add_scaleout_commands(sub)
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
    p.add_argument("spec", metavar="SPEC", help="JSON spec (see precision_lab.grid)")
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
        from .sweep import verify_exhaustive
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
        from .grid import load_spec, run_grid
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
        return int(args.func(args))
    except (ValueError, TypeError) as err:
        print(f"precision-lab {args.command}: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
