"""Overflow of P3109 formats follows P3109, not IEEE 754 (issue 19, item 19).

P3109 rounds with an unbounded exponent and then, without saturation, sends a result beyond the
largest finite value to inf (NaN in the finite domain) in every rounding mode but toward zero and
the directed mode pointing inward: round to odd included, where IEEE-style formats give ``±max``.
Checked against the issue's values, the exact referee (tests/referee.py, which knows the rule from
the P3109 format definition on its own) and gfloat (the P3109 reference code: every mode it has).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from referee import is_p3109, referee, referee_all, referee_formula, referee_table

import precision_lab as pl
from precision_lab import FloatFormat
from precision_lab.backends import native
from precision_lab.core.rounding import follows_p3109

BACKENDS = ["numpy"] + (["native"] if native.ext is not None else [])

#: the issue's cases: (format, input, result under rounding="odd", overflow="ieee")
ISSUE = [
    ("p3109_k8p4se", 224.1, math.inf),
    ("p3109_k8p4se", 232.0, math.inf),
    ("p3109_k8p4se", -232.0, -math.inf),
    ("p3109_k8p4se", 240.0, math.inf),
    ("p3109_k8p4se", -240.0, -math.inf),
    ("p3109_k8p4se", 224.0, 224.0),  # the max itself
    ("p3109_k4p2se", 2.01, math.inf),
    ("p3109_k4p2ue", 8.0, math.inf),
    ("p3109_k4p2ue", 6.5, 6.0),  # max (code 13) is odd: (6, 8) rounds to odd 6, no overflow
    ("p3109_k8p4sf", 256.0, math.nan),  # finite domain: NaN
    ("p3109_k8p4sf", 241.0, 240.0),  # max 240 has the odd code 0x7F: (240, 256) rounds to it
    ("e4m3fnuz", 256.0, math.nan),  # e4m3fnuz is P3109 K8P4 (finite domain)
    ("e4m3", 460.0, 448.0),  # IEEE-style formats keep max
    ("e5m2", 1e6, 57344.0),
    ("fp16", 70000.0, 65504.0),
    ("e4m3b11fnuz", 1e6, 30.0),  # fnuz but not P3109 (bias 11)
]


def _same(got: float, want: float) -> bool:
    return (math.isnan(got) and math.isnan(want)) or got == want


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_issue_values_round_to_odd(backend: str, dtype: type) -> None:
    for name, x, want in ISSUE:
        with pl.use_backend(backend):
            got = float(pl.round_to(np.array(x, dtype=dtype), name, rounding="odd"))
            sat = float(pl.round_to(np.array(x, dtype=dtype), name, rounding="odd",
                                    overflow="saturate"))  # fmt: skip
        fmt = pl.get_format(name)
        assert _same(got, want), (backend, name, x, got, want)
        assert _same(got, referee(x, fmt, "odd")), (backend, name, x, got)
        assert abs(sat) <= fmt.max, (backend, name, x, sat)  # saturate: never inf or NaN


@pytest.mark.parametrize("backend", BACKENDS)
def test_encode_gives_the_inf_code(backend: str) -> None:
    fmt = pl.get_format("p3109_k8p4se")
    with pl.use_backend(backend):
        codes = pl.encode(np.array([224.1, -232.0, 224.0, 1e30, -np.inf]), fmt, rounding="odd")
    assert codes.tolist() == [0x7F, 0xFF, 0x7E, 0x7F, 0xFF]


def test_follows_p3109_agrees_with_the_referee() -> None:
    """The core's rule (equality with p3109(k, p, ...)) and the referee's (the definition's
    fields), over every P3109 format up to 10 bits and look-alikes that are not P3109."""
    fmts = [
        pl.p3109(k, p, signed=s, domain=d)
        for k in range(2, 11)
        for p in range(1, k + 1)
        for s in (True, False)
        for d in ("extended", "finite")
        if not (k == 2 and s and d == "extended")  # k2 signed extended has no finite value
    ]
    assert all(follows_p3109(f) and is_p3109(f) for f in fmts)
    others = [
        f for f in (pl.get_format(n) for n in pl.known_formats()) if isinstance(f, FloatFormat)
    ]
    others += [
        FloatFormat(4, 3, bias=7, nan="fnuz", has_inf=True),
        FloatFormat(4, 2, bias=5, nan="fn", has_inf=True, signed=False),
        FloatFormat(4, 3, bias=8, nan="fnuz", has_subnormals=False),
        FloatFormat(5, 2, bias=16, nan="fn", has_inf=True),  # signed fn
    ]
    for f in others:
        assert follows_p3109(f) == is_p3109(f), f
    assert {f.name for f in others if follows_p3109(f)} >= {"e4m3fnuz", "e5m2fnuz"}
    assert not follows_p3109(pl.get_format("e4m3b11fnuz"))


GFLOAT_CASES = "k8p4se k8p3se k8p1se k4p2se k4p2ue k6p3ue k8p4sf k8p1uf k3p2sf".split()


@pytest.mark.parametrize("name", [f"p3109_{c}" for c in GFLOAT_CASES])
def test_every_value_above_max_against_gfloat(name: str) -> None:
    """Inputs around and beyond the overflow threshold: the core (both backends) equals the
    referee in every deterministic mode, and gfloat in every mode gfloat has."""
    gfloat = pytest.importorskip("gfloat")
    from gfloat import RoundMode, round_float
    from gfloat.formats import format_info_p3109

    fmt = pl.get_format(name)
    g = pl.p3109
    assert fmt == g(fmt.bits, fmt.precision, signed=fmt.signed,
                    domain="extended" if fmt.has_inf else "finite")  # fmt: skip
    fi = format_info_p3109(
        fmt.bits, fmt.precision,
        gfloat.Signedness.Signed if fmt.signed else gfloat.Signedness.Unsigned,
        gfloat.Domain.Extended if fmt.has_inf else gfloat.Domain.Finite,
    )  # fmt: skip
    mx = fmt.max
    top = mx + float(fmt.ulp(mx))
    base = np.array([mx, (mx + top) / 2, top, 1.5 * top, 4 * mx, 1e30, np.inf])
    x = np.concatenate([base, np.nextafter(base, 0), np.nextafter(base, np.inf)])
    x = np.concatenate([x, -x]) if fmt.signed else x
    modes = {
        "nearest_even": RoundMode.TiesToEven,
        "nearest_away": RoundMode.TiesToAway,
        "toward_zero": RoundMode.TowardZero,
        "up": RoundMode.TowardPositive,
        "down": RoundMode.TowardNegative,
    }
    table = referee_table(x, fmt)
    for backend in BACKENDS:
        for mode in ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd",
                     "nearest_zero"):  # fmt: skip
            for overflow in ("ieee", "saturate"):
                with pl.use_backend(backend):
                    got = pl.round_to(x, fmt, rounding=mode, overflow=overflow)
                want = table[mode, overflow]
                np.testing.assert_array_equal(got, want, err_msg=f"{backend} {mode} {overflow}")
                for v, r in zip(x, got, strict=True):
                    assert _same(r, referee_all(float(v), fmt)[mode, overflow])
                    if fmt.signed and fmt.mantissa_bits:  # (the formula: parity of k)
                        assert _same(r, referee_formula(float(v), fmt, mode, overflow))
                    if mode in modes:
                        ref = round_float(fi, float(v), modes[mode], sat=overflow == "saturate")
                        assert _same(r, ref), (backend, mode, overflow, v, r, ref)


def test_round_to_odd_overflow_in_ieee_formats_is_unchanged() -> None:
    """IEEE-style formats keep ±max under odd, also where the unbounded result is beyond max
    (fp16: 2**16 is exact with an unbounded exponent; IEEE round to odd truncates to max)."""
    for name, x in (("fp16", 65536.0), ("bf16", 1e39), ("e5m2", 65536.0), ("e4m3", 512.0)):
        fmt = pl.get_format(name)
        for backend in BACKENDS:
            with pl.use_backend(backend):
                got = pl.round_to(np.array([x, -x]), fmt, rounding="odd")
            assert got.tolist() == [fmt.max, -fmt.max], (name, backend)
