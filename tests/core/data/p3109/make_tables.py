"""Write ``value_tables.npz`` from the P3109 working group's published value tables.

Source: github.com/P3109/Public, folder ``Value Tables/Hexadecimal`` (one CSV per format
``Binary{K}p{P}{s|u}{e|f}`` for K = 3..16: columns codepoint, value in C's ``%a`` hexadecimal
notation or Inf/-Inf/NaN, and ``*`` for subnormals). Run from the repository root with the path
of a checkout (or of a bare mirror's git directory)::

    python tests/core/data/p3109/make_tables.py /path/to/P3109/Public

Each table becomes four canonical columns, the same ones :mod:`tests.core.test_p3109_tables`
computes from precision_lab: ``kind`` (0 finite, 1 +inf, 2 -inf, 3 NaN), the value ``m * 2**e``
with ``m`` odd (0 and ``e = 0`` for zero and the non-finite kinds) as int64 ``m`` and int32 ``e``,
and ``sub`` (1 for a subnormal). The file holds, per table, the SHA-256 of those four columns
over every code (little-endian bytes, in that order), and the rows themselves for K <= 8 (every
code) and 96 sampled codes for K >= 9 (the first and last 16 of each sign half, and 32 drawn
with a fixed seed). Every published table is in the file: 504 tables, 7,602,160 codes.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

NAME = re.compile(r"Binary(\d+)p(\d+)([su])([ef])\.csv$")
HEX = re.compile(r"(-?)0x([0-9a-f]+)(?:\.([0-9a-f]*))?p([+-]\d+)$")


def canonical(value: str) -> tuple[int, int, int]:
    """(kind, m, e) of one published value."""
    if value == "Inf":
        return 1, 0, 0
    if value == "-Inf":
        return 2, 0, 0
    if value == "NaN":
        return 3, 0, 0
    mt = HEX.match(value)
    if mt is None:
        raise ValueError(f"unexpected value {value!r}")
    sign, whole, frac, exp = mt.groups()
    frac = frac or ""
    m = int(whole + frac, 16)
    e = int(exp) - 4 * len(frac)
    if m == 0:
        return 0, 0, 0
    while m % 2 == 0:
        m //= 2
        e += 1
    return 0, -m if sign else m, e


def digest(kind: np.ndarray, m: np.ndarray, e: np.ndarray, sub: np.ndarray) -> str:
    h = hashlib.sha256()
    for a, dt in ((kind, "<i1"), (m, "<i8"), (e, "<i4"), (sub, "<u1")):
        h.update(np.ascontiguousarray(a, dtype=dt).tobytes())
    return h.hexdigest()


def sample(k: int) -> np.ndarray:
    n = 2**k
    if k <= 8:
        return np.arange(n)
    half = n // 2
    ends = [*range(16), *range(half - 16, half + 16), *range(n - 16, n)]
    rng = np.random.default_rng(3109 + k)
    drawn = rng.choice(np.setdiff1d(np.arange(n), ends), size=32, replace=False)
    return np.sort(np.concatenate([ends, drawn]))


def tables(source: Path) -> dict[str, bytes]:
    """{file name: CSV bytes} from a checkout or a bare git directory."""
    folder = "Value Tables/Hexadecimal"
    if (source / folder).is_dir():
        return {p.name: p.read_bytes() for p in (source / folder).rglob("Binary*.csv")}
    tar = subprocess.run(
        ["git", "--git-dir", str(source), "archive", "HEAD", folder],
        check=True,
        capture_output=True,
    ).stdout
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        for member in tf.getmembers():
            if NAME.search(member.name):
                f = tf.extractfile(member)
                assert f is not None
                out[Path(member.name).name] = f.read()
    return out


def main(source: Path, dest: Path) -> None:
    names, hashes, rows = [], [], []
    for fname, data in sorted(tables(source).items()):
        mt = NAME.search(fname)
        assert mt is not None
        k = int(mt.group(1))
        reader = csv.reader(io.StringIO(data.decode()))
        header = next(reader)
        assert header == ["codepoint", "value", "subnormal"], header
        recs = [(int(c, 16), canonical(v.strip()), s.strip() == "*") for c, v, s in reader]
        assert [r[0] for r in recs] == list(range(2**k)), fname
        kind = np.array([r[1][0] for r in recs], dtype=np.int8)
        m = np.array([r[1][1] for r in recs], dtype=np.int64)
        e = np.array([r[1][2] for r in recs], dtype=np.int32)
        sub = np.array([r[2] for r in recs], dtype=np.uint8)
        name = fname[: -len(".csv")]
        names.append(name)
        hashes.append(digest(kind, m, e, sub))
        idx = sample(k)
        rows.append((np.full(idx.size, len(names) - 1), idx, kind[idx], m[idx], e[idx], sub[idx]))
    cols = [np.concatenate(c) for c in zip(*rows, strict=True)]
    np.savez_compressed(
        dest,
        names=np.array(names),
        sha256=np.array(hashes),
        table=cols[0].astype(np.int16),
        code=cols[1].astype(np.uint16),
        kind=cols[2],
        m=cols[3],
        e=cols[4],
        sub=cols[5],
    )
    print(f"{len(names)} tables, {sum(r[1].size for r in rows)} rows -> {dest}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).with_name("value_tables.npz"))
