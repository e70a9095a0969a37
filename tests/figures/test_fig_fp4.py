"""The FP4-era section of figures/REPORT.md (figure job ``fp4``): its numbers regenerate, its
prose follows its own tables, and docs/reproductions.md states the same numbers.

The error half of the section (Quartet II, the SR settings tried, MX scale rules; a few seconds)
regenerates byte for byte; the training half would take a minute, so two of its recipes are
rerun (``slow``) and their per-seed accuracies compared with the committed table.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from precision_lab.figures import fig_fp4
from precision_lab.studies import fp4

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "figures" / "REPORT.md"
REPRODUCTIONS = ROOT / "docs" / "reproductions.md"


def _section() -> str:
    text = REPORT.read_text()
    marker = "<!-- section: fp4 -->\n"
    assert marker in text, "no fp4 section in figures/REPORT.md (precision-lab figures --only fp4)"
    return text.split(marker, 1)[1].split("<!-- section: ", 1)[0].strip()


def _rows(text: str, first_cell: str) -> list[list[str]]:
    """Cells of the Markdown table rows whose first cell matches ``first_cell`` (a regex)."""
    out = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if re.fullmatch(first_cell, cells[0]):
                out.append(cells)
    return out


def _e3(cell: str) -> float:
    """``"9.03e-3"`` -> 0.00903."""
    return float(cell)


@pytest.fixture(scope="module")
def errors(quartet2_numbers, quartet2_sr_attempts) -> tuple:
    """The error half's three studies at their defaults (the first two: session fixtures of
    tests/conftest.py, shared with tests/studies/test_fp4_numbers.py)."""
    return quartet2_numbers, quartet2_sr_attempts, fp4.mx_scale_rule_numbers()


def test_the_error_half_of_the_section_regenerates_byte_for_byte(errors) -> None:
    text = "\n".join(fig_fp4.errors_text(*errors)).strip()
    section = _section()
    assert section.startswith(text), "the fp4 section's error tables differ from a fresh run"


def test_quartet2_numbers_are_pinned(errors) -> None:
    """The committed values (independent of the report's formatting)."""
    q2, tries, mx = errors
    got = {k: f"{v.rqe * 1e3:.2f}" for k, v in q2.items()}
    assert got == {
        "nvfp4_rtn": "9.03",
        "nvfp4_4over6": "7.56",
        "nvfp4_16x16": "12.37",
        "hadamard128_rtn": "9.02",
        "hadamard128_sr": "23.59",
        "hadamard128_rtn_code": "8.96",
    }
    assert f"{mx['mxfp4_e2m1']['floor']['clipped']:.4f}" == "0.2942"
    assert f"{mx['mxfp8_e4m3']['floor']['clipped']:.4f}" == "0.1680"
    # only the two settings with the 17/16 headroom of Quartet II's code give the published SR
    # error (23.5e-3) within half a unit of its last digit plus 3 standard errors
    hit = {k for k, n in tries.items() if abs(n.rqe - 23.5e-3) <= 0.05e-3 + 3 * n.stderr}
    assert hit == {"sr_headroom_17_16", "sr_quartet2_code"}
    assert f"{tries['sr'].rqe * 1e3:.2f}" == "18.77"  # NVIDIA's rule: amax to 6


def test_reproduced_verdicts_follow_the_numbers_in_the_table() -> None:
    """Re-derived from the printed cells: within half a unit of the paper's last digit plus
    three printed standard errors (widened by the printing's own rounding)."""
    rows = _rows(_section(), r"(nvfp4|hadamard128)_\w+")
    assert len(rows) == len(fp4.QUARTET2_PUBLISHED)
    for key, _setting, ours, bits, paper, paper_bits, verdict in rows:
        m = re.fullmatch(r"([\d.]+e-3) ± ([\d.]+e-3)", ours)
        assert m, ours
        rqe, se = float(m.group(1)), float(m.group(2))
        ok = abs(rqe - float(paper)) <= 0.05e-3 + 3 * (se + 0.005e-3) + 0.005e-3
        if paper_bits:
            se_bits = (se + 0.005e-3) / (2 * 0.6931471805599453 * rqe)
            ok = ok and abs(float(bits) - float(paper_bits)) <= 0.0005 + 3 * se_bits + 0.0005
        assert verdict == ("yes" if ok else "**no**"), (key, ours, paper, verdict)


def test_the_sr_row_names_its_convention() -> None:
    """The SR row is reproduced with Quartet II's code's convention, and the section says so
    and gives NVIDIA's rule's value beside it."""
    section = _section()
    assert "Every row is reproduced." in section
    sr = _rows(section, "hadamard128_sr")[0]
    assert sr[2].startswith("23.59e-3") and sr[4] == "23.5e-3" and sr[-1] == "yes"
    assert "`nvfp4_quartet2_code`" in sr[1]
    assert "with NVIDIA's scale rule (block amax to 6, tensor amax to 448 * 6) gives 18.77e-3" in (
        section
    )
    assert "give the published value (within half a unit of its last digit plus three " in (section)
    assert "standard errors): sr_headroom_17_16, sr_quartet2_code." in section


def test_mx_prose_follows_the_table() -> None:
    section = _section()
    rows = {(r[0], r[1]): r for r in _rows(section, r"mxfp\w+")}
    f4 = rows[("mxfp4_e2m1", "floor")]
    f8 = rows[("mxfp8_e4m3", "floor")]
    assert f"clips {float(f4[2]):.1f}% of MXFP4 blocks and {float(f8[2]):.1f}% of MXFP8" in section
    for fmt in ("mxfp4_e2m1", "mxfp8_e4m3"):
        best = max(fp4.MX_RULES, key=lambda r: float(rows[(fmt, r)][3]))
        word = "MXFP4" if fmt == "mxfp4_e2m1" else "MXFP8"
        assert f"{best} for {word}" in section


def test_training_prose_follows_the_table() -> None:
    section = _section()
    rows = _rows(section, "|".join(re.escape(label) for label in fig_fp4.LABELS.values()))
    assert len(rows) == len(fig_fp4.RECIPES)
    within = [r[0] for r in rows if r[0] != "FP32" and float(r[2]) >= -fig_fp4.TOLERANCE_PP]
    below = [r[0] for r in rows if float(r[2]) < -fig_fp4.TOLERANCE_PP]
    if within:
        assert f"of FP32's mean: {', '.join(within)}." in section
    if below:
        assert f"below: {', '.join(below)}." in section
    for r in rows:  # the gap is the difference of the printed means
        mean = float(r[1].split(" ± ")[0])
        base = float(rows[0][1].split(" ± ")[0])
        assert abs(float(r[2]) - (mean - base)) <= 0.011, r


def test_reproductions_page_states_the_report_numbers() -> None:
    """Each Quartet II row of docs/reproductions.md gives the report's value for it."""
    page = REPRODUCTIONS.read_text()
    for key, _setting, ours, *_ in _rows(_section(), r"(nvfp4|hadamard128)_\w+"):
        value = ours.split(" ± ")[0]
        line = next((ln for ln in page.splitlines() if f"`{key}`" in ln), None)
        assert line is not None, f"docs/reproductions.md has no row for {key}"
        assert value in line, (key, value)
    assert "not reproduced" in page.lower()


@pytest.mark.slow  # two recipes x two seeds x 40 epochs: about 30 s on two cores
def test_training_rows_regenerate() -> None:
    pytest.importorskip("sklearn")
    res = fp4.recipe_training(("fp32", "te_nvfp4"), seeds=fig_fp4.SEEDS, epochs=fig_fp4.EPOCHS)
    rows = {r[0]: r for r in _rows(_section(), r"(FP32|TE NVFP4).*")}
    for name, runs in res.items():
        per = ", ".join(f"{100 * a:.2f}" for a in runs["test_acc"])
        assert rows[fig_fp4.LABELS[name]][1].endswith(f"[{per}]"), (name, per)


def test_sr_bias_verdicts_follow_the_table() -> None:
    rows = _rows(_section(), "SR(FF|F|C)")
    assert len(rows) == len(fig_fp4.SR_BITS) * 2 * 3
    for variant, n, d, measured, closed, diff, verdict in rows:
        m, c, df = float(measured), float(closed), float(diff)
        assert abs((m - c) - df) <= 1.5e-6, (variant, n, d)
        assert verdict == ("yes" if abs(df) < 1e-3 else "**no**"), (variant, n, d)
        if variant == "SRFF" and d == "inf":  # the published closed form -2**-(N+1)
            assert c == pytest.approx(-(2.0 ** -(int(n) + 1)), abs=5e-7)


def test_one_sr_bias_regenerates() -> None:
    """One row of the bias table recomputed (one rounding of 2**22 values)."""
    from precision_lab.studies import sr_variants

    b = sr_variants.measured_bias("stochastic", 2, None, draws=fig_fp4.SR_DRAWS)
    row = next(r for r in _rows(_section(), "SRFF") if r[1] == "2" and r[2] == "inf")
    assert row[3] == f"{b:+.6f}"


def test_summation_prose_follows_the_table() -> None:
    section = _section()
    rows = {r[0]: r[1:] for r in _rows(section, "stochastic(_offset|_corrected)?")}
    header = next(ln for ln in section.splitlines() if ln.startswith("| mode | r = 1"))
    keys = [c.strip()[4:] for c in header.strip("|").split("|")[1:]]
    ff = dict(zip(keys, map(float, rows["stochastic"]), strict=True))
    r_star = int(re.search(r"ceil\(log2\(n\) / 2\) = (\d+)\.", section).group(1))
    ratio = ff[str(r_star)] / ff["exact"]
    assert f"= {r_star} has {ratio:.2f}x the error of exact SR" in section
    rn = float(re.search(r"Round to nearest: ([\d.]+);", section).group(1))
    if ff["1"] == rn:
        assert "SRFF gives exactly round to nearest's error" in section


@pytest.mark.slow  # the SR studies of the section: about 40 s on two cores
def test_the_sr_part_of_the_section_regenerates_byte_for_byte() -> None:
    text = "\n".join(fig_fp4.sr_text(*fig_fp4.sr_numbers())).strip()
    assert text in _section()


def test_gradient_noise_prose_follows_its_table() -> None:
    """The ratio range, the crossing verdict and the switch epoch printed in the prose are
    those of the table's rows (a subset of the epochs: the prose's range may only be wider)."""
    section = _section()
    part = section.split("### When FP4 training stops improving", 1)[1]
    rows = _rows(part, r"\d+( \(switch\))?")
    assert rows, "no gradient-noise table in the fp4 section"
    ratios = [float(r[1]) for r in rows]
    switch = [int(r[0].split()[0]) for r in rows if r[0].endswith("(switch)")]
    assert len(switch) == 1
    assert f"switching the backward to fp32 at epoch {switch[0]}" in part.lower()
    if min(ratios) >= math.sqrt(3):
        m = re.search(r"never falls below sqrt\(3\) = 1\.73: it stays between ([\d.]+) ", part)
        assert m and float(m.group(1)) <= min(ratios)
        assert "sqrt(3) criterion does not predict it" in part or "recovers" in part
    fp32 = [float(r[3]) for r in rows]
    assert f"to {fp32[-1]:.4f}"[:8] in part  # the final FP32 loss (printed with 5 decimals)


@pytest.mark.slow  # the gradient-noise study of the section: about 25 s on two cores
def test_the_gradient_noise_part_of_the_section_regenerates_byte_for_byte() -> None:
    from precision_lab.studies import gradient_noise

    text = "\n".join(fig_fp4.noise_text(gradient_noise.gradient_noise_study())).strip()
    assert text in _section()


def test_srf_below_exact_sr_is_explained_with_its_counter_example() -> None:
    """Where one-bit SRF/SRC beat exact SR in the table, the section gives the reason and the
    past-the-barrier run (n = 1536) that shows it is this n's, not the rounding's."""
    section = _section()
    rows = {r[0]: r[1:] for r in _rows(section, "stochastic(_offset|_corrected)?")}
    header = next(ln for ln in section.splitlines() if ln.startswith("| mode | r = 1"))
    keys = [c.strip()[4:] for c in header.strip("|").split("|")[1:]]
    off = dict(zip(keys, map(float, rows["stochastic_offset"]), strict=True))
    if off["1"] < 0.8 * off["exact"]:
        assert "a property of this n, not of the rounding" in section
        m = re.search(r"with n = (\d+), expected sum (\d+), the same rounding gives ([\d.]+) "
                      r"against exact SR's ([\d.]+)\)", section)  # fmt: skip
        assert m and int(m.group(1)) == 1536 and int(m.group(2)) == 768
        assert float(m.group(3)) > 4 * float(m.group(4))
