"""Exhaustive checks of the rounding core: every float16 and every bfloat16 bit pattern, rounded to
every format of 16 bits or fewer, in every deterministic mode and both overflow modes, against the
exact referee in tests/referee.py (its vectorised referee_table, which tests/core/test_referee.py
checks against the scalar Fraction referee); nearest_even/ieee against ml_dtypes and numpy too."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from referee import DETERMINISTIC, KEYS, referee_table

import precision_lab as pl

# signalling NaNs among the bit patterns make numpy's casts warn
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast")

SMALL_FORMATS = [n for n, f in pl.FORMATS.items() if f.bits <= 16]
ML_DTYPES = {
    "fp16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz,
    "e4m3ieee": ml_dtypes.float8_e4m3,
    "e3m4": ml_dtypes.float8_e3m4,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e8m0": ml_dtypes.float8_e8m0fnu,
}


def all_patterns(source: str) -> np.ndarray:
    codes = np.arange(1 << 16, dtype=np.uint16)
    dtype = np.float16 if source == "fp16" else ml_dtypes.bfloat16
    return codes.view(dtype).astype(np.float32)


def same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Elementwise identity of values: NaN matches NaN, and the sign of zero counts."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(got) & np.isnan(want)
    return both_nan | ((got == want) & (np.signbit(got) == np.signbit(want)))


@pytest.fixture(scope="module", params=["fp16", "bf16"])
def source(request: pytest.FixtureRequest) -> tuple[str, np.ndarray]:
    return request.param, all_patterns(request.param)


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_every_pattern_every_mode_matches_referee(source, name):
    src_name, x = source
    fmt = pl.get_format(name)
    table = referee_table(x, fmt)
    for mode, overflow in KEYS:
        want = table[mode, overflow]
        for dtype in (np.float32, np.float64):  # float64 input takes the uint64 path
            got = pl.round_to(x.astype(dtype), fmt, rounding=mode, overflow=overflow)
            ok = same(got, want)
            if not ok.all():
                i = np.flatnonzero(~ok)[:5]
                pytest.fail(
                    f"{src_name} -> {name} {mode}/{overflow} ({np.dtype(dtype).name}): "
                    f"{(~ok).sum()} wrong, e.g. x={x[i]} got={got[i]} want={want[i]}"
                )


@pytest.mark.parametrize("name", list(ML_DTYPES))
def test_nearest_even_matches_ml_dtypes(source, name):
    _, x = source
    fmt = pl.get_format(name)
    # e8m0 has no agreed tie rule: ml_dtypes rounds ties up, which is our nearest_away
    mode = "nearest_away" if name == "e8m0" else "nearest_even"
    if not fmt.has_nan:  # ml_dtypes turns NaN into a number for formats without NaN
        x = x[~np.isnan(x)]
    with np.errstate(all="ignore"):
        ref = x.astype(ML_DTYPES[name])
    for dtype in (np.float32, np.float64):
        xi = x.astype(dtype)
        got_codes = pl.encode(xi, fmt, rounding=mode)
        want_codes = ref.view(np.uint8 if fmt.bits <= 8 else np.uint16)
        if name == "fp16":  # numpy keeps NaN payloads; we (like ml_dtypes) give the quiet NaN
            keep = ~np.isnan(xi)
            got_codes, want_codes = got_codes[keep], want_codes[keep]
        np.testing.assert_array_equal(got_codes, want_codes)
        got = pl.round_to(xi, fmt, rounding=mode)
        assert same(got, ref.astype(np.float32)).all()


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_decode_inverts_encode(source, name):
    _, x = source
    fmt = pl.get_format(name)
    if not fmt.has_nan:
        x = x[~np.isnan(x)]
    for mode in DETERMINISTIC:
        codes = pl.encode(x, fmt, rounding=mode)
        assert codes.dtype == fmt.code_dtype
        assert same(pl.decode(codes, fmt), pl.round_to(x, fmt, rounding=mode)).all()


@pytest.mark.parametrize("name", [n for n in SMALL_FORMATS if pl.FORMATS[n].bits <= 16])
def test_every_code_round_trips(name):
    fmt = pl.get_format(name)
    codes = np.arange(1 << fmt.bits, dtype=np.uint32).astype(fmt.code_dtype)
    values = pl.decode(codes, fmt)
    finite = np.isfinite(values)
    again = pl.encode(values[finite], fmt)
    if isinstance(fmt, pl.FloatFormat) and fmt.nan == "fnuz":
        pass  # every finite code is canonical
    np.testing.assert_array_equal(pl.decode(again, fmt), values[finite])
    # codes of finite non-zero values are canonical, so they come back unchanged
    nonzero = finite & (values != 0)
    np.testing.assert_array_equal(pl.encode(values[nonzero], fmt), codes[nonzero])
