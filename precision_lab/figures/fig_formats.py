"""The format table: range and precision of every named format."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

from ..core.formats import FORMATS, FloatFormat

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


def _label(r: dict[str, object]) -> str:
    """``"e2m1 (4 bits, 1 fraction bit)"``: the y tick label of a format."""
    if r["kind"] == "int":
        return f"{r['name']} ({r['bits']}-bit integer)"
    prec = round(-math.log2(float(r["eps"])))  # type: ignore[arg-type]
    return f"{r['name']} ({r['bits']} bits, {prec} fraction bit{'' if prec == 1 else 's'})"


#: x range of the zoomed panel (log2 of magnitude): the 4- to 8-bit formats and fp16
ZOOM = (-27.0, 19.0)


def make(outdir: Path) -> str:
    table = [r for r in rows() if r["name"] != "fp64"]
    fig, axes = plt.subplots(
        1,
        2,
        figsize=(12, 6.8),
        sharey=True,
        constrained_layout=True,
        gridspec_kw={"width_ratios": [1.1, 1]},
    )
    for ax in axes:
        for i, r in enumerate(table):
            lo = math.log2(float(r["smallest_subnormal"]))  # type: ignore[arg-type]
            hi = math.log2(float(r["max"]))  # type: ignore[arg-type]
            norm = math.log2(float(r["smallest_normal"]))  # type: ignore[arg-type]
            sub_label = "subnormal range" if i == 0 else None
            norm_label = "normal range" if i == 0 else None
            ax.plot([lo, norm], [i, i], color="0.65", lw=7, solid_capstyle="butt", label=sub_label)
            ax.plot([norm, hi], [i, i], color="0.15", lw=7, solid_capstyle="butt", label=norm_label)
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlabel("log2 of magnitude")
    axes[0].set_yticks(range(len(table)), [_label(r) for r in table])
    axes[0].invert_yaxis()
    axes[0].set_xlim(-155, 135)
    axes[0].set_title("full range")
    axes[0].legend(loc="lower left", fontsize=8)
    axes[1].set_xlim(*ZOOM)
    axes[1].set_title(f"zoom on log2 |x| in [{ZOOM[0]:.0f}, {ZOOM[1]:.0f}] (bars cut at the edges)")
    fig.suptitle("Representable magnitudes of every format (fp32 ... int4)")
    fig.savefig(outdir / "format_table.png", dpi=110)
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
