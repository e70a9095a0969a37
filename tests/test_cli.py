"""The precision-lab command line: main([...]) output, exact VALUE parsing, and one run of the
installed console script."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.cli import main, parse_value


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ----- formats -----------------------------------------------------------------------------------
def test_formats_table_lists_every_format(capsys):
    rc, out, _ = run(capsys, "formats")
    assert rc == 0
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    for name in pl.FORMATS:
        assert name in lines
    assert lines["e4m3"][1:6] == ["8", "4", "3", "7", "448"]
    assert lines["e4m3"][-2:] == ["no", "yes"]  # no inf, NaN
    assert lines["e5m2"][5] == "57344" and lines["e5m2"][-2:] == ["yes", "yes"]
    assert lines["e2m1"][-2:] == ["no", "no"]
    assert lines["fp16"][5:9] == ["65504", "6.10352e-05", "5.96046e-08", "0.000976562"]
    assert "float8_e4m3fn=e4m3" in out


def test_formats_json_matches_the_registry(capsys):
    rc, out, _ = run(capsys, "formats", "--json")
    assert rc == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert set(rows) == set(pl.FORMATS)
    for name, r in rows.items():
        f = pl.get_format(name)
        assert r["bits"] == f.bits and r["max"] == f.max
        if r["kind"] == "float":
            assert r["smallest_normal"] == f.smallest_normal
            assert r["smallest_subnormal"] == f.smallest_subnormal
            assert r["eps"] == f.eps and r["has_inf"] == f.has_inf and r["has_nan"] == f.has_nan
    assert rows["e4m3"]["aliases"] == ["e4m3fn", "float8_e4m3fn", "fp8_e4m3"]
    assert rows["int8"]["min"] == -128


# ----- VALUE parsing -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "exact"),
    [
        ("0.1", Fraction(1, 10)),
        ("1e-3", Fraction(1, 1000)),
        ("-2.5", Fraction(-5, 2)),
        ("0x1.8p-3", Fraction(3, 16)),
        ("-0x1p+4", Fraction(-16)),
        ("1_000", Fraction(1000)),
        ("1.0625000000000000000001", Fraction("1.0625000000000000000001")),
    ],
)
def test_parse_value_exact(text, exact):
    got, x = parse_value(text)
    assert got == exact
    # the float64 is the value itself, or the odd one of the two floats around the exact value
    if Fraction(x) != exact:
        assert int(np.float64(x).view(np.uint64)) % 2 == 1
        other = np.nextafter(x, np.inf if exact > Fraction(x) else -np.inf)
        lo, hi = sorted([Fraction(x), Fraction(float(other))])
        assert lo < exact < hi


def test_parse_value_specials_and_errors():
    assert parse_value("inf") == (None, math.inf)
    assert parse_value("-inf") == (None, -math.inf)
    assert math.isnan(parse_value("nan")[1])
    assert math.copysign(1.0, parse_value("-0")[1]) == -1.0
    assert parse_value("1e400")[1] == np.finfo(np.float64).max
    with pytest.raises(ValueError, match="VALUE must be a decimal number"):
        parse_value("one")


# ----- cast --------------------------------------------------------------------------------------
def cast_json(capsys, *argv: str) -> dict:
    rc, out, err = run(capsys, "cast", *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def test_cast_rounds_the_exact_decimal_once(capsys):
    # the float64 nearest to this decimal is 1.0625, a tie in e4m3 that rounds to 1.0; the exact
    # decimal is above the tie and rounds to 1.125 (DESIGN.md's first trap, from text)
    info = cast_json(capsys, "1.0625000000000000000001", "e4m3")
    assert info["result"] == 1.125 and info["input_float64"] == 1.0625
    assert info["code"] == 0x39 and info["hex"] == "0x39" and info["binary"] == "0_0111_001"
    assert (info["sign"], info["exponent_field"], info["mantissa_field"]) == (0, 7, 1)
    assert info["error"]["abs"] == float(Fraction(1, 16) - Fraction("1e-22"))
    assert cast_json(capsys, "1.0625", "e4m3")["result"] == 1.0


def test_cast_text_output(capsys):
    rc, out, _ = run(capsys, "cast", "464", "e4m3")
    assert rc == 0
    assert "result    448.0" in out
    assert "code      0x7E  0b0_1111_110  (sign 0, exponent field 15, mantissa field 6;" in out
    assert "normal: 1.110b * 2**8" in out
    assert "error     abs 16, rel 0.0344828, 0.5 ulp" in out
    rc, out, _ = run(capsys, "cast", "0.25", "e4m3")
    assert "error     0 (exact)" in out


@pytest.mark.parametrize(
    ("argv", "result", "code"),
    [
        (["464.0001", "e4m3"], "nan", 0x7F),
        (["464.0001", "e4m3", "--overflow", "saturate"], 448.0, 0x7E),
        (["61440", "e5m2"], "inf", 0x7C),
        (["61440", "e5m2", "--rounding", "rtz"], 57344.0, 0x7B),
        (["-0", "fp16"], -0.0, 0x8000),
        (["192", "e8m0"], 128.0, 0x86),
        (["192", "e8m0", "--rounding", "nearest_away"], 256.0, 0x87),
        (["-3.7", "int8", "--rounding", "toward_zero"], -3.0, 0xFD),
        (["300", "int8"], 127.0, 0x7F),
        (["0.1", "bf16"], 0.10009765625, 0x3DCD),
        (["-1e-30", "e5m2", "--rounding", "up"], -0.0, 0x80),
        (["-1e-30", "e5m2", "--rounding", "down"], -(2.0**-16), 0x81),
        (["1e-30", "e5m2", "--subnormals", "flush", "--rounding", "up"], 0.0, 0x00),
        (["1e400", "e4m3", "--rounding", "rtz"], 448.0, 0x7E),
        (["-inf", "e4m3", "--overflow", "saturate"], -448.0, 0xFE),
        (["0x1.8p-3", "e2m1"], 0.0, 0x0),
        (["0.75", "e2m1"], 1.0, 0x2),
        (["0.1", "fp64"], 0.1, 0x3FB999999999999A),
    ],
)
def test_cast_results_and_codes(capsys, argv, result, code):
    info = cast_json(capsys, *argv)
    assert info["result"] == result
    if isinstance(result, float):
        assert math.copysign(1, info["result"]) == math.copysign(1, result)
    assert info["code"] == code
    # the code decodes to the result
    f = pl.get_format(argv[1])
    back = float(pl.decode(np.array(code, dtype=f.code_dtype), f))
    assert (math.isnan(back) and result == "nan") or back == float(result)


def test_cast_error_in_ulps(capsys):
    info = cast_json(capsys, "0.1", "bf16")
    err = Fraction(0.10009765625) - Fraction(1, 10)
    assert info["error"]["abs"] == float(err)
    assert info["error"]["rel"] == float(err * 10)
    assert info["error"]["ulps"] == float(err / Fraction(2**-11))  # bf16 spacing at 0.1


def test_cast_nan_in_a_format_without_nan(capsys):
    rc, out, _ = run(capsys, "cast", "nan", "e2m1")
    assert rc == 0 and "result    nan" in out and "code      none:" in out


def test_cast_stochastic_is_seeded(capsys):
    a = cast_json(capsys, "1.3", "e2m1", "--rounding", "sr", "--seed", "3")["result"]
    b = cast_json(capsys, "1.3", "e2m1", "--rounding", "sr", "--seed", "3")["result"]
    assert a == b and a in (1.0, 1.5)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["cast", "1", "e9m9"], "unknown format 'e9m9'"),
        (["cast", "1", "e4m3", "--rounding", "banker"], "rounding must be one of"),
        (["cast", "abc", "e4m3"], "VALUE must be a decimal number"),
        (["cast", "0.1", "fp64", "--rounding", "rtz"], "only --rounding nearest_even"),
    ],
)
def test_cast_bad_input_exits_1(capsys, argv, match):
    rc, _, err = run(capsys, *argv)
    assert rc == 1 and match in err


def test_argparse_errors_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["cast", "1", "e4m3", "--overflow", "wrap"])
    assert e.value.code == 2
    for argv in ([], ["formats"], ["cast"], ["figures"], ["report"]):
        with pytest.raises(SystemExit) as e:
            main([*argv, "--help"])
        assert e.value.code == 0
        assert "usage: precision-lab" in capsys.readouterr().out


# ----- figures / report --------------------------------------------------------------------------
def test_figures_and_report(capsys, tmp_path):
    rc, out, _ = run(capsys, "figures", "--list")
    assert rc == 0 and out.split()[0] == "formats"
    rc, _, err = run(capsys, "report", "--outdir", str(tmp_path))
    assert rc == 1 and "does not exist" in err
    rc, out, _ = run(capsys, "figures", "--only", "formats", "--outdir", str(tmp_path))
    assert rc == 0 and (tmp_path / "REPORT.md").exists()
    assert list(tmp_path.glob("*.png"))
    rc, out, _ = run(capsys, "report", "--outdir", str(tmp_path))
    assert rc == 0 and out.strip() == str(tmp_path / "REPORT.md")
    rc, out, _ = run(capsys, "report", "--outdir", str(tmp_path), "--show")
    assert rc == 0 and out.startswith("# precision_lab report")
    rc, _, err = run(capsys, "figures", "--only", "nosuch", "--outdir", str(tmp_path))
    assert rc == 1 and "unknown figure" in err


# ----- the installed console script --------------------------------------------------------------
def test_console_script_installed():
    exe = shutil.which("precision-lab") or str(Path(sys.executable).with_name("precision-lab"))
    if not Path(exe).exists():
        pytest.skip("the precision-lab console script is not installed (pip install -e .)")
    out = subprocess.run(
        [exe, "cast", "-1e-30", "e5m2", "--rounding", "down"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "result    -1.52587890625e-05" in out and "0x81" in out
