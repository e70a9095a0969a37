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
    assert out == pl.formats_table() + "\n"  # the Python function is what the CLI prints
    assert "P3109: p3109_k{k}p{p}{s|u}{e|f}" in out


def test_formats_json_matches_the_registry(capsys):
    rc, out, _ = run(capsys, "formats", "--json")
    assert rc == 0
    assert json.loads(out) == json.loads(json.dumps(pl.format_rows()))
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
    got, x, _ = parse_value(text)
    assert got == exact
    # the float64 is the value itself, or the odd one of the two floats around the exact value
    if Fraction(x) != exact:
        assert int(np.float64(x).view(np.uint64)) % 2 == 1
        other = np.nextafter(x, np.inf if exact > Fraction(x) else -np.inf)
        lo, hi = sorted([Fraction(x), Fraction(float(other))])
        assert lo < exact < hi


def test_parse_value_specials_and_errors():
    assert parse_value("inf") == (None, math.inf, 0)
    assert parse_value("-inf") == (None, -math.inf, 0)
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


def test_cast_nan_in_a_format_without_nan_is_an_error_as_in_encode(capsys):
    """NaN has no int8 or e2m1 value: an error, as encode and the quantizers say; inf saturates."""
    for fmt in ("int8", "e2m1"):
        rc, out, err = run(capsys, "cast", "nan", fmt)
        assert (rc, out) == (1, "") and f"VALUE nan has no {fmt} value" in err
        with pytest.raises(ValueError, match="NaN"):
            pl.encode(np.nan, fmt)
    assert cast_json(capsys, "inf", "int8")["result"] == 127.0
    rc, out, _ = run(capsys, "cast", "nan", "e4m3")
    assert rc == 0 and "result    nan" in out


@pytest.mark.parametrize(
    ("argv", "rc", "match"),
    [
        (["cast", "1", "e4m4"], 1, "unknown format 'e4m4'; did you mean 'e4m3', 'e3m4'"),
        (["cast", "1", "e4m3", "--overflow", "wrap"], 2, "invalid choice: 'wrap'"),
        (["cast"], 2, "the following arguments are required: VALUE, FORMAT"),
        (["probe", "torch", "--input-format", "e4m3"], 1, "--input-format e4m3: probe torch"),
        (["conform", "GARBAGE"], 1, "GARBAGE: not a conformance vector file"),
    ],
)
def test_every_error_is_one_short_line(capsys, tmp_path, argv, rc, match):
    """One line on stderr, 'precision-lab COMMAND: error: ...', no usage block, no list of 48
    names, no allow_pickle advice for a junk file; 2 for a malformed command line, else 1."""
    junk = tmp_path / "garbage.npz"
    junk.write_bytes(bytes(range(256)) * 3)
    argv = [str(junk) if a == "GARBAGE" else a for a in argv]
    match = match.replace("GARBAGE", str(junk))
    try:
        got = main(argv)
    except SystemExit as e:
        got = e.code
    out, err = capsys.readouterr()
    assert got == rc and out == ""
    assert err.count("\n") == 1 and err.startswith(f"precision-lab {argv[0]}: error: "), err
    assert match in err and len(err) < 300 and "allow_pickle" not in err


def test_missing_file_is_one_clean_line(capsys, tmp_path):
    pytest.importorskip("dask", reason="precision-lab grid needs dask")
    rc, _, err = run(capsys, "grid", str(tmp_path / "missing.json"))
    assert rc == 1
    want = f"precision-lab grid: error: {tmp_path / 'missing.json'}: no such file or directory"
    assert err == want + "\n"


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


# ----- issue 10 item 8: exact VALUE parsing with bounded work, one rounding, honest errors -------
def test_cast_hex_input_is_read_exactly(capsys):
    # float.fromhex rounds 0x1.100000000000001p0 to 1.0625 (a tie in e4m3 that goes to 1.0); the
    # exact value is above the tie
    info = cast_json(capsys, "0x1.100000000000001p0", "e4m3")
    assert info["result"] == 1.125
    assert info["error"]["exact"] is False
    assert parse_value("0x1.100000000000001p0").exact == 1 + Fraction(1, 16) + Fraction(1, 2**60)


def test_cast_tiny_hex_is_not_zero(capsys):
    info = cast_json(capsys, "0x1p-2000", "e4m3", "--rounding", "up")
    assert info["result"] == 2.0**-9 and info["error"]["exact"] is False
    info = cast_json(capsys, "-0x1p-2000", "fp64", "--rounding", "down")
    assert info["result"] == -(2.0**-1074) and info["error"]["exact"] is False
    info = cast_json(capsys, "-0x1p-2000", "fp64")
    assert info["result"] == 0.0 and math.copysign(1, info["result"]) == -1
    assert info["error"]["exact"] is False and info["error"]["rel"] == 1.0


def test_cast_overflow_of_a_finite_value_is_not_exact(capsys):
    info = cast_json(capsys, "1e400", "fp64")
    assert info["result"] == "inf" and info["error"]["exact"] is False
    assert info["error"]["abs"] == "inf"
    rc, out, _ = run(capsys, "cast", "1e400", "fp64")
    assert rc == 0 and "error     overflow" in out and "exact" not in out.split("error")[-1]
    info = cast_json(capsys, "1e400", "fp64", "--overflow", "saturate")
    assert info["result"] == np.finfo(np.float64).max and info["error"]["exact"] is False


@pytest.mark.parametrize(
    ("value", "fmt", "mode", "result"),
    [
        ("1e-999999999", "fp16", "nearest_even", 0.0),
        ("1e-999999999", "fp16", "up", 2.0**-24),
        ("-1e-999999999", "fp64", "down", -(2.0**-1074)),
        ("1e999999999", "e4m3", "toward_zero", 448.0),
        ("1e999999999", "fp64", "nearest_even", math.inf),
        ("0x1p-99999999999999999999", "bf16", "up", 2.0**-133),
        ("1e" + "9" * 5000, "fp32", "toward_zero", float(np.finfo(np.float32).max)),
        ("1e-" + "9" * 5000, "fp32", "nearest_even", 0.0),
        ("0." + "0" * 5000 + "1", "fp32", "up", 2.0**-149),
    ],
)
def test_cast_absurd_exponents_are_decided_without_building_the_number(
    capsys, value, fmt, mode, result
):
    info = cast_json(capsys, value, fmt, "--rounding", mode)
    got = info["result"]
    assert (float(got) if isinstance(got, str) else got) == result
    assert math.copysign(1, float(got)) == math.copysign(1, result)
    assert info["error"]["exact"] is False


def _fp64_neighbours(x: float) -> tuple[float, float]:
    return float(np.nextafter(x, -np.inf)), float(np.nextafter(x, np.inf))


@pytest.mark.parametrize("x", [1.0, 0.1, -3.75, 2.0**-1070, -(2.0**-1074), 1e300])
@pytest.mark.parametrize("q", [Fraction(1, 4), Fraction(1, 2), Fraction(3, 4)])
def test_cast_fp64_rounds_the_exact_value_in_every_mode(capsys, x, q):
    # v lies strictly between x and its upper neighbour, q of the way; the referee is plain logic
    _, hi = _fp64_neighbours(x)
    v = Fraction(x) + q * (Fraction(hi) - Fraction(x))
    # the exact rational as a hex float: v = n / 2**k
    k = v.denominator.bit_length() - 1
    assert v.denominator == 1 << k
    text = f"{'-' if v < 0 else ''}0x{abs(v.numerator):x}p-{k}"
    assert parse_value(text).exact == v
    odd = hi if int(np.float64(hi).view(np.uint64)) % 2 else x
    even = x if odd == hi else hi
    away = hi if abs(hi) > abs(x) else x
    near = (x if q < Fraction(1, 2) else hi) if q != Fraction(1, 2) else even
    near_away = (x if q < Fraction(1, 2) else hi) if q != Fraction(1, 2) else away
    towards_zero = x if away == hi else hi
    expected = {
        "nearest_even": near,
        "nearest_away": near_away,
        "toward_zero": towards_zero,
        "up": hi,
        "down": x,
        "odd": odd,
    }
    for mode, want in expected.items():
        info = cast_json(capsys, text, "fp64", "--rounding", mode)
        assert info["result"] == want, mode
        assert info["error"]["abs"] == float(abs(Fraction(want) - v))


@pytest.mark.parametrize(
    "fmt", ["fp16", "e4m3", "e5m2", "e2m1", "bf16", "int8", "uint8", "e8m0", "e4m3fnuz", "e3m2"]
)
def test_exact_stochastic_rounding_matches_round_to(fmt):
    # the exact-rational stochastic path (used for values that are not float64 numbers) agrees
    # with round_to bit for bit on values that are
    from precision_lab.cli import round_exact

    f = pl.get_format(fmt)
    rng = np.random.default_rng(1)
    xs = list(rng.standard_normal(40) * float(min(f.max, 1e4)) / 8)
    xs += [float(f.max) * 1.01, -float(f.max) * 1.03, float(f.smallest_subnormal) / 3]
    if isinstance(f, pl.FloatFormat):
        xs += [float(f.smallest_normal) * 0.99, -float(f.smallest_subnormal) * 0.7]
    xs = [x for x in xs if math.isfinite(x)]
    for seed in range(6):
        for x in xs:
            for sub in ("keep", "flush"):
                for over in ("ieee", "saturate"):
                    want = float(
                        pl.round_to(
                            np.float64(x),
                            f,
                            rounding="stochastic",
                            seed=seed,
                            overflow=over,
                            subnormals=sub,
                        )
                    )
                    got = round_exact(
                        Fraction(x),
                        f,
                        rounding="stochastic",
                        overflow=over,
                        subnormals=sub,
                        seed=seed,
                    )
                    assert (math.isnan(got) and math.isnan(want)) or (
                        got == want and math.copysign(1, got) == math.copysign(1, want)
                    ), (x, seed, sub, over, got, want)


@pytest.mark.parametrize(
    ("text", "exact"),
    [
        (" 1e3 ", Fraction(1000)),
        ("1_000", Fraction(1000)),
        ("\u22122.5", Fraction(-5, 2)),  # unicode minus, as pasted from documents
        ("+.5", Fraction(1, 2)),
        ("5.", Fraction(5)),
        ("0X1P4", Fraction(16)),
        ("0x.8", Fraction(1, 2)),
        ("0x1", Fraction(1)),
        ("1E-3", Fraction(1, 1000)),
        ("-0x0p0", Fraction(0)),
    ],
)
def test_parse_value_accepts(text, exact):
    assert parse_value(text).exact == exact


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "0x",
        "1e",
        "e5",
        ".",
        "-",
        "1__0",
        "_1",
        "1_",
        "0x1p",
        "0x1.8e3p",
        "1e3.5",
        "١٢",
        "1 000",
        "0b101",
        "infinity and beyond",
        "nan1",
        "+-1",
        "1e+-3",
    ],
)
def test_parse_value_rejects(text, capsys):
    with pytest.raises(ValueError, match="VALUE"):
        parse_value(text)
    rc, _, err = run(capsys, "cast", text, "e4m3")
    assert rc == 1 and "precision-lab cast: error: VALUE" in err and "Traceback" not in err


def test_parse_value_specials():
    assert parse_value("nan").exact is None and math.isnan(parse_value("nan").x)
    assert parse_value("-inf").x == -math.inf and parse_value("+Infinity").x == math.inf
    z = parse_value("-0")
    assert z.exact == 0 and math.copysign(1, z.x) == -1
    assert parse_value("\u22120").x == 0 and math.copysign(1, parse_value("\u22120").x) == -1


def test_parse_value_too_many_digits_is_a_clear_error():
    with pytest.raises(ValueError, match="significant digits"):
        parse_value("1." + "1" * 5000)
    # zeros around the digits do not count
    assert parse_value("0." + "0" * 1000 + "1" + "0" * 4500).exact == Fraction(1, 10**1001)
    assert parse_value("1" + "0" * 1000).exact == 10**1000


def test_cast_seed_with_a_deterministic_mode_is_accepted_and_said_unused(capsys):
    """One rule with round_to: a deterministic mode accepts a seed and ignores it (the result is
    round_to's with any seed), and cast says so."""
    rc, out, _ = run(capsys, "cast", "1.3", "e2m1", "--seed", "3")
    assert rc == 0
    assert "seed      3  (unused: nearest_even is deterministic)" in out.splitlines()
    info = cast_json(capsys, "1.3", "e2m1", "--seed", "3", "--rounding", "rtz")
    assert info["seed"] == 3 and info["seed_used"] is False
    assert info["result"] == float(pl.round_to(1.3, "e2m1", rounding="rtz", seed=99)) == 1.0


def test_cast_stochastic_without_seed_prints_the_seed_it_drew(capsys):
    rc, out, _ = run(capsys, "cast", "1.3", "e2m1", "--rounding", "sr")
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("seed"))
    seed = int(line.split()[1])
    result = next(ln for ln in out.splitlines() if ln.startswith("result"))
    # the printed seed repeats the run
    for _ in range(3):
        rc, again, _ = run(capsys, "cast", "1.3", "e2m1", "--rounding", "sr", "--seed", str(seed))
        assert result in again.splitlines()
    info = cast_json(capsys, "1.3", "e2m1", "--rounding", "sr")
    assert isinstance(info["seed"], int) and info["seed_drawn"] is True


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"precision-lab {pl.__version__}"


def test_python_dash_m_precision_lab():
    out = subprocess.run(
        [sys.executable, "-m", "precision_lab", "cast", "0x1.100000000000001p0", "e4m3"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "result    1.125" in out
    proc = subprocess.run(
        [sys.executable, "-m", "precision_lab", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.strip() == f"precision-lab {pl.__version__}"


def test_closed_pipe_ends_quietly():
    """`precision-lab formats | head -2`: the reader is gone before the output is written (its
    end of the pipe closed first, so every write fails); exit 0, nothing on stderr."""
    import os

    procs = []
    for argv in (["formats"], ["tensor-cores"], ["info", "--json"]):
        r, w = os.pipe()
        os.close(r)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "precision_lab", *argv],
                stdout=w,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        os.close(w)
    for argv, proc in zip(("formats", "tensor-cores", "info --json"), procs, strict=True):
        _, err = proc.communicate(timeout=120)
        assert (proc.returncode, err) == (0, ""), argv


@pytest.mark.parametrize(
    "q", [Fraction(1, 2**29), Fraction(1, 3 * 2**20), Fraction(1, 2), Fraction(5, 7)]
)
def test_exact_stochastic_fp64_decides_like_round_to_on_fp32(q):
    # round_to decides stochastic rounding from the fraction q of the way between the neighbours
    # and the random word of (seed, index 0), whatever the format: the fp64 path for exact
    # rationals (no float64 can carry them) must decide as round_to does for fp32, with q cut to
    # the 29 bits a float64 can carry between two fp32 neighbours
    from precision_lab.cli import round_exact

    q29 = Fraction(math.floor(q * 2**29), 2**29)
    v = 1 + q29 * Fraction(2) ** -52
    for seed in range(64):
        up32 = float(pl.round_to(1 + float(q29) * 2.0**-23, "fp32", rounding="sr", seed=seed)) > 1
        up64 = round_exact(v, "fp64", rounding="stochastic", seed=seed) > 1
        assert up32 == up64, seed


def test_figures_without_scikit_learn_skip_with_one_clear_line(capsys, tmp_path, monkeypatch):
    # a base install (no extras) has no scikit-learn: block the import instead of uninstalling
    for mod in [m for m in sys.modules if m == "sklearn" or m.startswith("sklearn.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError):
        import sklearn.datasets  # noqa: F401
    argv = ["figures", "--only", "formats", "--only", "training", "--outdir", str(tmp_path)]
    rc, out, err = run(capsys, *argv)
    # the jobs that can run still run; a job that was asked for and skipped fails the command
    # (issue 22 item 13: it exited 0), with the skip line and one error line
    assert rc == 1 and "Traceback" not in out + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 2, err
    assert "training" in lines[0] and "scikit-learn" in lines[0]
    assert 'pip install "precision_lab[figures]"' in lines[0]
    assert lines[1].startswith("precision-lab figures: error: figure job(s) training did not run")
    report = (tmp_path / "REPORT.md").read_text()
    assert "<!-- section: formats -->" in report and "<!-- section: training -->" not in report
    assert (tmp_path / "format_table.png").exists()


def test_figures_extra_names_scikit_learn():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    assert any(dep.startswith("scikit-learn") for dep in extras["figures"])


def test_cast_fp64_exact_path_flushes_and_saturates(capsys):
    # not float64 values: 2**-1070 + 2**-1100 (subnormal in fp64) and 2**1024 - 2**960 + tiny
    info = cast_json(capsys, "-0x1.000000004p-1070", "fp64", "--subnormals", "flush")
    assert info["result"] == 0.0 and math.copysign(1, info["result"]) == -1
    info = cast_json(capsys, "0x1.fffffffffffff8p1023", "fp64", "--rounding", "rtz")
    assert info["result"] == np.finfo(np.float64).max
    # the tie between max and 2**1024 goes to 2**1024 (even): inf, or max when saturating
    info = cast_json(capsys, "0x1.fffffffffffff8p1023", "fp64")
    assert info["result"] == "inf" and info["error"]["reason"] == "overflow"
    info = cast_json(capsys, "0x1.fffffffffffff8p1023", "fp64", "--overflow", "saturate")
    assert info["result"] == np.finfo(np.float64).max and info["error"]["exact"] is False
    info = cast_json(capsys, "0x1.fffffffffffff7p1023", "fp64")
    assert info["result"] == np.finfo(np.float64).max


# ----- issue 19 item 18 ---------------------------------------------------------------------
def test_cast_stochastic_equal_takes_a_seed_and_prints_the_one_it_drew(capsys):
    """`cast 2.5e-8 fp16 --rounding sre --seed 3` was refused ("only used by --rounding
    stochastic") and without --seed no seed was printed: stochastic_equal could not be rerun."""
    results = set()
    for seed in range(12):
        rc, out, err = run(
            capsys, "cast", "2.5e-8", "fp16", "--rounding", "sre", "--seed", str(seed)
        )
        assert rc == 0 and not err and f"seed      {seed}\n" in out
        r = float(next(ln for ln in out.splitlines() if ln.startswith("result")).split()[1])
        # round_to's rule: the same random word of (seed, index 0) on the same two neighbours
        want = float(pl.round_to(np.float64(2.5e-8), "fp16", rounding="sre", seed=seed))
        assert r == want
        results.add(r)
    assert results == {0.0, 2.0**-24}  # both neighbours occur: the seed is used
    rc, out, _ = run(capsys, "cast", "2.5e-8", "fp16", "--rounding", "stochastic_equal")
    line = next(ln for ln in out.splitlines() if ln.startswith("seed"))
    drawn = int(line.split()[1])
    assert f"(drawn: --seed {drawn} repeats this run)" in line
    r = next(ln for ln in out.splitlines() if ln.startswith("result"))
    for _ in range(3):
        rc, again, _ = run(
            capsys, "cast", "2.5e-8", "fp16", "--rounding", "sre", "--seed", str(drawn)
        )
        assert rc == 0 and r in again.splitlines()
    info = cast_json(capsys, "2.5e-8", "fp16", "--rounding", "sre", "--seed", "5")
    assert info["seed"] == 5 and info["seed_drawn"] is False


@pytest.mark.parametrize("seed", range(8))
def test_exact_stochastic_equal_agrees_with_round_to(seed):
    """Exact values that are not float64 numbers, stochastic_equal: the fp64 path decides with
    round_to's rule (inexact: up iff the top bit of the random word of (seed, 0) is set), as
    the fp32 path does on a float64 input; the stand-in path for narrow formats too."""
    from precision_lab.cli import round_exact

    v = Fraction(1) + Fraction(1, 2**60)  # between 1 and 1 + 2**-52 in fp64
    up = round_exact(v, "fp64", rounding="sre", seed=seed) > 1
    assert up == (float(pl.round_to(1 + 2.0**-30, "fp32", rounding="sre", seed=seed)) > 1)
    assert round_exact(Fraction(1), "fp64", rounding="sre", seed=seed) == 1.0  # exact: stays
    narrow = round_exact(Fraction(1, 10), "e4m3", rounding="sre", seed=seed)
    assert narrow == float(pl.round_to(np.float64(0.1), "e4m3", rounding="sre", seed=seed))
    assert round_exact(v, "fp64", rounding="nearest_zero") == 1.0  # was a KeyError


def test_cast_huge_input_toward_zero_prints_the_exact_error(capsys):
    """`cast 1e400 fp16 --rounding toward_zero` printed "error abs inf, rel 1, inf ulp"."""
    rc, out, _ = run(capsys, "cast", "1e400", "fp16", "--rounding", "toward_zero")
    assert rc == 0 and "result    65504.0" in out
    # exact: |1e400 - 65504| = 1e400 to 6 digits; fp16's spacing at max is 32
    assert "error     abs 1e+400, rel 1, 3.125e+398 ulp" in out
    rc, out, _ = run(capsys, "cast", "-1e-400", "fp16", "--rounding", "down")
    assert "error     abs 5.96046e-08, rel 5.96046e+392, 1 ulp" in out
    rc, out, _ = run(capsys, "cast", "1e999999999", "fp16", "--rounding", "toward_zero")
    assert "error     abs > 2**4095, rel 1 (to 6 digits), > 2**3072 ulp" in out
    rc, out, _ = run(capsys, "cast", "1e-999999999", "fp16", "--rounding", "up")
    assert "error     abs 5.96046e-08 (to 6 digits), rel > 2**3021, 1 ulp" in out
    assert "inf" not in "".join(ln for ln in out.splitlines() if ln.startswith("error"))


def test_sci_formats_any_magnitude():
    from precision_lab.cli import _sci

    assert _sci(Fraction(10) ** 400 - 65504) == "1e+400"
    assert _sci(Fraction(123456789, 1) * Fraction(10) ** 500) == "1.23457e+508"
    assert _sci(Fraction(-999999500, 1) * Fraction(10) ** 400) == "-1e+409"  # ties to even,
    assert _sci(Fraction(-999998500, 1) * Fraction(10) ** 400) == "-9.99998e+408"  # as %g
    assert _sci(Fraction(-9999995, 1) * Fraction(10) ** 400) == "-1e+407"
    assert _sci(Fraction(5, 10**401)) == "5e-401"
    assert _sci(Fraction(1, 3)) == "0.333333" and _sci(Fraction(0)) == "0"


def test_cast_unsigned_integer_is_not_twos_complement(capsys):
    rc, out, _ = run(capsys, "cast", "300", "uint4")
    assert rc == 0 and "(unsigned binary 15)" in out and "two's complement" not in out
    rc, out, _ = run(capsys, "cast", "-3", "int4")
    assert "0xD  0b1101  (two's complement -3)" in out


def test_use_backend_is_case_insensitive_like_the_environment_variable(monkeypatch):
    """`pl.use_backend("NATIVE")` was refused while PRECISION_LAB_BACKEND=NATIVE worked."""
    for name in ("NATIVE", " Native ", "numpy", "NumPy", "AUTO"):
        with pl.use_backend(name):
            assert pl.backend_info()["round_to"].startswith(name.strip().lower()) or name == "AUTO"
    with pl.use_backend("NUMPY"):
        assert pl.backend_info()["round_to"] == "numpy (selected by use_backend)"
    monkeypatch.setenv("PRECISION_LAB_BACKEND", "NUMPY")
    assert pl.backend_info()["round_to"].startswith("numpy")
    with pytest.raises(ValueError, match=r"backend must be one of .*got 'GPU'"):
        with pl.use_backend("GPU"):
            pass


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (("grid", "/nonexistent/spec.json"), "/nonexistent/spec.json: no such file or directory"),
        (("report", "--only", "formats"), "--only names the figure jobs to rerun"),
        (("cast", "1", "e4m3", "--rounding", "bogus"), "rounding must be one of"),
    ],
)
def test_cli_errors_are_one_line(capsys, argv, want):
    """Issue 22 item 13: a missing file, --only without --regenerate: one error line, exit 1."""
    rc, _, err = run(capsys, *argv)
    assert rc == 1 and want in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_missing_torch_and_dead_scheduler_are_one_line(capsys, monkeypatch):
    """verify --against torch without torch, and a scheduler address nobody answers (after the
    connect timeout, not a traceback after 30 s)."""
    import importlib.util

    from precision_lab.verify import progress

    if importlib.util.find_spec("torch") is None:
        rc, _, err = run(capsys, "verify", "e4m3", "--against", "torch", "--input", "float16")
        assert rc == 1 and "needs torch" in err and len(err.strip().splitlines()) == 1
    pytest.importorskip("distributed")
    monkeypatch.setattr(progress, "CONNECT_TIMEOUT", "1s")
    rc, _, err = run(
        capsys, "verify", "e4m3", "--input", "float16", "--scheduler", "tcp://127.0.0.1:1"
    )
    assert rc == 1 and "127.0.0.1:1" in err and len(err.strip().splitlines()) == 1


def test_cli_figures_fails_when_a_requested_job_cannot_run(capsys, monkeypatch, tmp_path):
    """figures --only training without scikit-learn exited 0: a job that was asked for and
    skipped is now an error (a plain `make figures` on a base install still skips it)."""
    from precision_lab import figures

    def no_sklearn(out):
        raise ModuleNotFoundError("No module named 'sklearn'", name="sklearn")

    monkeypatch.setattr(figures.jobs()["training"], "make", no_sklearn)
    rc, _, err = run(capsys, "figures", "--only", "training", "--outdir", str(tmp_path))
    assert rc == 1 and "did not run" in err and "scikit-learn" in err
    assert figures.run(tmp_path, ["training"], quiet=True) == tmp_path / "REPORT.md"
    # nothing was made: no stub REPORT.md (issue 32 item 9), and an existing one is left alone
    assert not (tmp_path / "REPORT.md").exists()
    (tmp_path / "REPORT.md").write_text("kept")
    rc, _, _ = run(capsys, "figures", "--only", "training", "--outdir", str(tmp_path))
    assert rc == 1 and (tmp_path / "REPORT.md").read_text() == "kept"


def test_cli_cast_says_when_an_integer_format_saturates(capsys):
    rc, out, _ = run(capsys, "cast", "1e5", "int8")
    assert rc == 0 and "127" in out and "saturated" in out and "[-128, 127]" in out
    rc, out, _ = run(capsys, "cast", "100", "int8")
    assert "saturated" not in out


def test_probe_prints_the_model_as_the_shortest_call_that_rebuilds_it():
    """`precision-lab probe` ends with the recovered Accumulator as code: only the fields that
    differ from a default Accumulator of its format, formats by name where the name gives them
    back, and evaluating it gives the same model (custom formats, trees, presets)."""
    import precision_lab as pl
    from precision_lab.cli import _as_code
    from precision_lab.core.formats import FloatFormat
    from precision_lab.gemm import Accumulator

    accs = [
        Accumulator("fp32", lanes=8, lane_combine="pairwise", lane_tail="after"),
        Accumulator("fp32", lanes=4, lane_combine=((0, 1), (2, 3)), split_k=448),
        Accumulator("bf16", promote_every=128),
        pl.tensor_core("h100", "e4m3"),  # a custom 14-bit accumulator format
        pl.tensor_core("x86", "bf16", instruction="vdpbf16ps"),
        pl.tensor_core("mi300x", "fp16"),
    ]
    for acc in accs:
        code = _as_code(acc)
        assert code.startswith("Accumulator(") and "=None" not in code, code
        env = {"Accumulator": Accumulator, "FloatFormat": FloatFormat}
        assert eval(code, env) == acc, code
    assert (
        _as_code(accs[0])
        == "Accumulator('fp32', lanes=8, lane_combine='pairwise', lane_tail='after')"
    )
    assert _as_code(Accumulator("fp64")) == "Accumulator('fp64')"
