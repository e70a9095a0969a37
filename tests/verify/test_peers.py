"""precision-lab conform --peer: third-party decoders, casts and quantizers over the library's
vectors (precision_lab.verify.peers). Pins what each installed peer was found to do, so the
module docstring and docs/verification.md stay true."""

from __future__ import annotations

import functools
import json

import pytest

from precision_lab.cli import main
from precision_lab.verify.peers import check_peer


@functools.cache
def _checks(peer: str) -> dict:
    return {c.name: c for c in check_peer(peer).checks}


def test_ml_dtypes_departures() -> None:
    pytest.importorskip("ml_dtypes")
    c = _checks("ml_dtypes")
    assert all(c[f"decode_{f}"].ok for f in ("e4m3", "e5m2", "e2m1", "e8m0"))
    assert c["ue4m3_bit7"].ok and "a sign (-s)" in c["ue4m3_bit7"].note
    for f in ("e4m3", "e5m2"):  # IEEE overflow, the library's overflow="ieee"
        assert not c[f"cast_{f}"].ok and "IEEE 754" in c[f"cast_{f}"].note
    assert c["cast_e2m1"].departed == 1 and "NaN gives -0.0" in c["cast_e2m1"].note
    assert not c["e8m0_round"].ok and "rounded up in 20 of 41" in c["e8m0_round"].note


def test_torch_departures() -> None:
    pytest.importorskip("torch")
    c = _checks("torch")
    assert c["cast_e4m3"].ok  # saturating, infinities to 448
    assert "IEEE 754" in c["cast_e5m2"].note
    assert "rounded up" in c["e8m0_round"].note
    assert "cast_e2m1" not in c  # torch's FP4 is packed only


def test_gfloat_and_torchao_agree() -> None:
    pytest.importorskip("gfloat")
    r = check_peer("gfloat")
    assert r.ok and any(n.name.startswith("quantize_mx") for n in r.checks)
    pytest.importorskip("torchao")
    c = _checks("torchao")
    mx = [v for k, v in c.items() if k.startswith("quantize_mx")]
    assert len(mx) == 12 and all(v.ok for v in mx)
    for rule in ("amax", "amax_div"):  # only the 8 all-zero blocks: scale 2**-6, not 0
        v = c[f"quantize_nvfp4[{rule}]"]
        assert v.departed == 8 and "E4M3_EPS" in v.note and "every element code agrees" in v.note


def test_cli_peer(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gfloat")
    assert main(["conform", "--peer", "gfloat", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["peer"] == "gfloat" and out["ok"]
    assert {c["check"] for c in out["checks"]} >= {"e8m0_round", "ue4m3_bit7"}
    assert main(["conform"]) == 1
    assert "needs FILE" in capsys.readouterr().err


def test_unknown_peer() -> None:
    with pytest.raises(ValueError, match="peer must be one of"):
        check_peer("numpy")
