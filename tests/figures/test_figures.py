"""The committed report reproduces: one cheap figure job, regenerated into a temporary directory,
gives its section of figures/REPORT.md byte for byte (the job includes a real FP16 training run,
so this also checks that the training emulation gives the same bits on this machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sklearn")

from precision_lab import figures

REPORT = Path(__file__).resolve().parents[2] / "figures" / "REPORT.md"


def _section(text: str, name: str) -> str:
    marker = f"<!-- section: {name} -->\n"
    assert marker in text, f"no section {name!r} in the report"
    body = text.split(marker, 1)[1]
    return body.split("<!-- section: ", 1)[0].strip()


@pytest.mark.parametrize("job", ["formats", "loss_scale"])
def test_a_figure_job_reproduces_its_committed_section(job: str, tmp_path: Path) -> None:
    report = figures.run(tmp_path, only=[job], quiet=True)
    assert (tmp_path / "format_table.png").exists() or job != "formats"
    assert _section(report.read_text(), job) == _section(REPORT.read_text(), job)


def test_every_figure_of_the_report_is_committed() -> None:
    import re

    names = set(re.findall(r"\]\(([\w.]+\.png)\)", REPORT.read_text()))
    assert names, "the report shows no figure"
    missing = sorted(n for n in names if not (REPORT.parent / n).exists())
    assert not missing, f"figures named in REPORT.md but not committed: {missing}"


def test_no_signed_zero_differences_in_the_report() -> None:
    import re

    text = REPORT.read_text()
    bad = re.findall(r"(?<![\d.e])[-+]0\.0+(?![\d])", text)
    assert not bad, f"signed zeros in REPORT.md: {bad[:5]}"


def test_the_report_agrees_with_itself_on_fp8() -> None:
    """The training section's FP8 gap and the policies table's fp8_hybrid row are the rows
    'as reported' of the FP8 ablation (one set of runs, one story)."""
    import re

    text = REPORT.read_text()
    training = _section(text, "training")
    policies = _section(text, "policies")
    gap = re.search(r"FP8 with delayed scaling ([-+]?\d+\.\d\d) pp", training)
    assert gap, "the training section states no FP8 gap"
    row_t = re.search(r"\| training \| as reported \|(?:[^|]*\|){7} ([-+]?\d+\.\d\d) ±", policies)
    assert row_t and row_t.group(1) == gap.group(1)
    hybrid = re.search(
        r"\| fp8_hybrid \(E4M3 fwd, E5M2 bwd, delayed\) \| [^|]* \| ([^|]*) \|", policies
    )
    row_p = re.search(r"\| policies \| as reported \|(?:[^|]*\|){7} ([^|]*) \|", policies)
    assert hybrid and row_p and hybrid.group(1).strip() == row_p.group(1).strip()


def test_signed_never_prints_a_signed_zero() -> None:
    from precision_lab.studies.text import signed

    for x in (0.0, -0.0, 1e-9, -1e-9, -0.004999):
        assert signed(x) == "0.00"
    assert signed(-0.005000001) == "-0.01" and signed(0.006) == "+0.01"
    assert signed(-1e-4, 4) == "-0.0001" and signed(-1e-5, 4) == "0.0000"
