"""The format table: range and precision of every named format."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

from ..formats import FORMATS, FloatFormat

TITLE = "Format table: range and precision"
ORDER = 10


def rows() -> list[dict[str, object]]:
    """One row per registered format: bits, max, smallest normal/subnormal, eps, inf/NaN."""
    out = []
    for name, f in FORMATS.items():
        is_float = isinstance(f, FloatFormat)
        out.append(
            {
                "name": name,
                "bits": f.bits,
                "max": f.max,
                "smallest_normal": f.smallest_normal,
                "smallest_subnormal": f.smallest_subnormal,
                "eps": f.eps,
                "decades": f.dynamic_range_decades,
                "inf": bool(f.has_inf),
                "nan": bool(f.has_nan),
                "kind": "float" if is_float else "int",
            }
        )
    return out


def make(outdir: Path) -> str:
    table = [r for r in rows() if r["name"] != "fp64"]
    fig, ax = plt.subplots(figsize=(9, 6.5), constrained_layout=True)
    for i, r in enumerate(table):
        lo, hi = math.log2(float(r["smallest_subnormal"])), math.log2(float(r["max"]))  # type: ignore[arg-type]
        norm = math.log2(float(r["smallest_normal"]))  # type: ignore[arg-type]
        ax.plot([lo, norm], [i, i], color="0.65", lw=6, solid_capstyle="butt")
        ax.plot([norm, hi], [i, i], color="0.15", lw=6, solid_capstyle="butt")
        if r["kind"] == "int":
            label = f"{r['bits']}-bit integer"
        else:
            prec = round(-math.log2(float(r["eps"])))  # type: ignore[arg-type]
            label = f"{r['bits']} bits, {prec} fraction bits"
        ax.text(hi + 2, i, label, va="center", fontsize=8)
    ax.set_yticks(range(len(table)), [str(r["name"]) for r in table])
    ax.invert_yaxis()
    ax.set_xlabel("log2 of magnitude (dark: normal range, grey: subnormal range)")
    ax.set_title("Representable magnitudes of every format (fp32 ... int4)")
    ax.set_xlim(-155, 175)
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(outdir / "format_table.png", dpi=120)
    plt.close(fig)

    lines = [
        "## Format table",
        "",
        "![format table](format_table.png)",
        "",
        "| format | bits | max | smallest normal | smallest subnormal | eps | decades "
        "| inf | NaN |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows():
        lines.append(
            f"| {r['name']} | {r['bits']} | {r['max']:.6g} | {r['smallest_normal']:.6g} | "
            f"{r['smallest_subnormal']:.6g} | {r['eps']:.3g} | {r['decades']:.1f} | "
            f"{'yes' if r['inf'] else 'no'} | {'yes' if r['nan'] else 'no'} |"
        )
    return "\n".join(lines)
