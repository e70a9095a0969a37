"""precision_lab's P3109 formats against the working group's published value tables.

The P3109 working group publishes every code of every format of K = 3..16 bits, signed and
unsigned, finite and extended domain (github.com/P3109/Public, ``Value Tables/Hexadecimal``: 504
tables). tests/core/data/p3109/value_tables.npz holds, per table, the SHA-256 of its canonical
columns over every code, every row for K <= 8 and 96 sampled rows for K >= 9 (make_tables.py
beside it writes it; README.md there says where the data comes from and under what terms).

* Every format precision_lab can hold (values within float64: 454 of the 504) decodes every code
  to the published value and subnormal flag: the hash of all codes matches, and each shipped row.
* The other 50 (K >= 12, few precision bits: exponents beyond float64's) are refused with a
  ValueError naming float64; their shipped rows are checked against the report's own definition
  (tests/p3109_spec.py), as are the rows of every table: so the transcription used as the
  referee in test_p3109_v4.py agrees with the published data too.
"""

from __future__ import annotations

import hashlib
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from p3109_spec import v4_decode

import precision_lab as pl

DATA = Path(__file__).parent / "data" / "p3109" / "value_tables.npz"
NAME = re.compile(r"Binary(\d+)p(\d+)([su])([ef])$")


def _load() -> dict[str, np.ndarray]:
    with np.load(DATA) as z:
        return {k: z[k] for k in z.files}


T = _load()
NAMES = [str(n) for n in T["names"]]


def _params(name: str) -> tuple[int, int, bool, bool]:
    mt = NAME.match(name)
    assert mt is not None, name
    return int(mt.group(1)), int(mt.group(2)), mt.group(3) == "s", mt.group(4) == "e"


def _canonical(v: np.ndarray, fmt: pl.FloatFormat) -> tuple[np.ndarray, ...]:
    """(kind, m, e, sub) of float64 values, as make_tables.py writes the published ones."""
    kind = np.zeros(v.shape, dtype=np.int8)
    kind[v == np.inf] = 1
    kind[v == -np.inf] = 2
    kind[np.isnan(v)] = 3
    fin = kind == 0
    mant, ex = np.frexp(np.where(fin, v, 0.0))
    m = (mant * 2.0**53).astype(np.int64)
    e = (ex - 53).astype(np.int64)
    nz = m != 0
    low = np.where(nz, m & -m, 1)  # the lowest set bit: m / low is odd
    tz = np.log2(low.astype(np.float64)).astype(np.int64)
    m = np.where(nz, m >> tz, 0)
    e = np.where(nz, e + tz, 0).astype(np.int32)
    sub = (fin & nz & (np.abs(v) < fmt.smallest_normal)).astype(np.uint8)
    return kind, m, e, sub


def _digest(kind: np.ndarray, m: np.ndarray, e: np.ndarray, sub: np.ndarray) -> str:
    h = hashlib.sha256()
    for a, dt in ((kind, "<i1"), (m, "<i8"), (e, "<i4"), (sub, "<u1")):
        h.update(np.ascontiguousarray(a, dtype=dt).tobytes())
    return h.hexdigest()


def _fmt(k: int, p: int, signed: bool, ext: bool) -> pl.FloatFormat:
    return pl.p3109(k, p, signed=signed, domain="extended" if ext else "finite")


def _fits(params: tuple[int, int, bool, bool]) -> bool:
    try:
        _fmt(*params)
    except ValueError:
        return False
    return True


def test_every_published_table_is_shipped() -> None:
    want = {
        f"Binary{k}p{p}{s}{d}"
        for k in range(3, 17)
        for p in range(1, k + 1)
        for s in "su"
        for d in "ef"
        if not (s == "s" and p == k)  # 4.0: signed formats need P < K
    }
    assert set(NAMES) == want
    assert len(NAMES) == 504
    assert sum(not _fits(_params(n)) for n in NAMES) == 50


@pytest.mark.parametrize("k", range(3, 17))
def test_decode_every_code_equals_the_published_table(k: int) -> None:
    checked = 0
    for i, name in enumerate(NAMES):
        params = _params(name)
        if params[0] != k or not _fits(params):
            continue
        fmt = _fmt(*params)
        codes = np.arange(2**k, dtype=fmt.code_dtype)
        cols = _canonical(np.asarray(pl.decode(codes, fmt), dtype=np.float64), fmt)
        rows = T["table"] == i
        idx = T["code"][rows].astype(np.int64)
        for col, key in zip(cols, ("kind", "m", "e", "sub"), strict=True):
            bad = col[idx] != T[key][rows]
            assert not bad.any(), (name, key, idx[bad][:4], col[idx][bad][:4])
        assert _digest(*cols) == str(T["sha256"][i]), name
        checked += 1
    assert checked == sum(_params(n)[0] == k and _fits(_params(n)) for n in NAMES) > 0


def test_formats_beyond_float64_are_refused_clearly() -> None:
    for name in NAMES:
        params = _params(name)
        if not _fits(params):
            with pytest.raises(ValueError, match="outside float64"):
                _fmt(*params)


@pytest.mark.parametrize("k", range(3, 17))
def test_shipped_rows_equal_the_report_definition(k: int) -> None:
    """The referee of test_p3109_v4.py (tests/p3109_spec.py) against the published rows."""
    for i, name in enumerate(NAMES):
        kk, p, signed, ext = _params(name)
        if kk != k:
            continue
        rows = np.flatnonzero(T["table"] == i)
        for r in rows:
            code = int(T["code"][r])
            want = v4_decode(code, k, p, signed, ext)
            kind, m, e = int(T["kind"][r]), int(T["m"][r]), int(T["e"][r])
            if isinstance(want, Fraction):
                assert kind == 0 and want == m * Fraction(2) ** e, (name, code)
                bias = 2 ** (k - p - 1) if signed else 2 ** (k - p)
                sub = want != 0 and abs(want) < Fraction(2) ** (1 - bias)
                assert bool(T["sub"][r]) == sub, (name, code)
            elif np.isnan(want):
                assert kind == 3, (name, code)
            else:
                assert kind == (1 if want > 0 else 2), (name, code)


def test_the_hash_changes_with_one_code() -> None:
    """The hash comparison can fail: one value moved by one ulp gives another digest."""
    i = NAMES.index("Binary8p3se")
    fmt = _fmt(8, 3, True, True)
    v = np.asarray(pl.decode(np.arange(256, dtype=np.uint8), fmt), dtype=np.float64)
    assert _digest(*_canonical(v, fmt)) == str(T["sha256"][i])
    v[5] = v[6]  # code 5 takes code 6's value
    assert _digest(*_canonical(v, fmt)) != str(T["sha256"][i])
