"""FloatFormat.next_up / next_down from the format's bit layout, and formats' place in the layers.

next_up(x) is the least value of the format above x, next_down(x) the greatest below (values from
the codec's decode of every code, an independent oracle), with inf where the format has one and
nothing finite lies further out, NaN where it has none; checked exhaustively on every format of at
most 16 bits here (registry, P3109 K3..K8 both signs and domains, formats without subnormals, zero
or sign), against the rounding core's definition (round up / down, step off grid values) and
Fraction arithmetic, and against numpy's nextafter on fp16/fp32/fp64.
"""

from __future__ import annotations

import ast
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core.formats import FORMATS, FloatFormat, p3109

SMALL = [f for f in FORMATS.values() if isinstance(f, FloatFormat) and f.bits <= 16]
SMALL += [
    p3109(k, p, signed=s, domain=d)
    for k in range(3, 9)
    for p in range(1, k + 1)
    for s in (True, False)
    for d in ("extended", "finite")
    if s or p < k  # (unsigned K_kP_k would have no exponent field and a NaN code only)
]
SMALL += [
    FloatFormat(3, 2, has_subnormals=False),
    FloatFormat(4, 3, nan="fn", has_inf=False, has_subnormals=False),
    FloatFormat(4, 2, nan="none", has_inf=False, signed=False),
    FloatFormat(5, 2, nan="fn", has_inf=False, has_subnormals=False, has_zero=False, signed=False),
    FloatFormat(0, 3, nan="none", has_inf=False),
]


def _decoded(fmt: FloatFormat) -> np.ndarray:
    """Every value of fmt, infinities included, ascending (the codec's decode of every code)."""
    codes = np.arange(1 << fmt.bits, dtype=np.uint64).astype(fmt.code_dtype)
    v = pl.decode(codes, fmt).astype(np.float64)
    return np.unique(v[~np.isnan(v)] + 0.0)


def _inputs(fmt: FloatFormat, grid: np.ndarray) -> np.ndarray:
    """Every value, both zeros, midpoints, float64 neighbours, beyond-range and special inputs."""
    fin = grid[np.isfinite(grid)]
    mids = (fin[:-1] + fin[1:]) / 2
    extra = [0.0, -0.0, np.inf, -np.inf, np.nan, fmt.smallest_subnormal / 3, 2 * fmt.max]
    x = np.concatenate([fin, mids, np.nextafter(fin, np.inf), np.nextafter(fin, -np.inf), extra])
    return np.concatenate([x, -x])


def _expected(grid: np.ndarray, fmt: FloatFormat, x: np.ndarray, up: bool) -> np.ndarray:
    """The set definition: least grid value > x (up) or greatest < x; inf/NaN where none."""
    if up:
        i = np.searchsorted(grid, x, side="right")
        none = i >= grid.size
        v = grid[np.minimum(i, grid.size - 1)]
        v = np.where(none, np.inf if fmt.has_inf else np.nan, v)  # only x = +inf (or > max)
    else:
        i = np.searchsorted(grid, x, side="left") - 1
        none = i < 0
        v = grid[np.maximum(i, 0)]
        v = np.where(none, -np.inf if fmt.has_inf and fmt.signed else np.nan, v)
    zero_from_below = up & (x < 0) & fmt.has_negative_zero
    v = np.where(v == 0, np.where(zero_from_below, -0.0, 0.0), v)
    return np.where(np.isnan(x), np.nan, v)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as float64 bit patterns up to the payload of NaN (so the sign of zero counts)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all(both_nan | (a.view(np.int64) == b.view(np.int64))))


@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f"{f}/{f.bias}/{f.nan}/{int(f.signed)}")
def test_next_up_down_every_value_against_the_decoded_set(fmt):
    grid = _decoded(fmt)
    x = _inputs(fmt, grid)
    for up, fn in ((True, fmt.next_up), (False, fmt.next_down)):
        got, want = fn(x), _expected(grid, fmt, x, up)
        bad = np.flatnonzero(~(np.isnan(got) & np.isnan(want)) & (got != want))
        assert _same(got, want), (up, x[bad[:5]], got[bad[:5]], want[bad[:5]])
    assert fn(np.float64(1.0)).shape == ()  # x's shape, float64
    assert fmt.next_up(x.reshape(2, -1)).shape == (2, x.size // 2)


@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f"{f}/{f.bias}/{f.nan}/{int(f.signed)}")
def test_next_up_down_against_the_rounding_definition(fmt):
    """The rounding core's definition: round up (down) off the grid, and from a grid value
    round its float64 neighbour; for x in [min, max] (outside, rounding has no value to give: a
    negative x of an unsigned format, 0 in e8m0, an infinity of a format without inf, while
    next_up(-1) of an unsigned format is its least value). Where that lands strictly beyond x
    it is the answer; where it does not (saturating formats at max, unsigned or zero-less
    formats at their least value), no finite value of the format lies beyond x."""
    grid = _decoded(fmt)
    x = _inputs(fmt, grid)
    x = x[(x >= fmt.min) & (x <= fmt.max)]
    for up, fn in ((True, fmt.next_up), (False, fmt.next_down)):
        mode, inf = ("up", np.inf) if up else ("down", -np.inf)
        with np.errstate(invalid="ignore"):
            r = pl.round_to(x, fmt, rounding=mode)
            r = np.where(r == x, pl.round_to(np.nextafter(x, inf), fmt, rounding=mode), r)
            beyond = (r > x) if up else (r < x)
        got = fn(x)
        assert _same(got[beyond], r[beyond])
        assert not np.any(np.isfinite(got[~beyond])), x[~beyond & np.isfinite(got)][:5]


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e2m1", "e4m3fnuz", "e8m0", "bf16", "fp16"])
def test_next_up_down_fraction_steps(name):
    """From each positive value below max one step up is ulp(v) away, exactly (Fraction), and
    the midpoint between v and that step goes back to the two neighbours."""
    fmt = pl.get_format(name)
    v = _decoded(fmt)
    v = v[np.isfinite(v) & (v > 0) & (v < fmt.max)]
    up = fmt.next_up(v)
    ulp = fmt.ulp(v)
    for a, b, u in zip(v[:: max(1, v.size // 500)], up[:: max(1, v.size // 500)],
                       ulp[:: max(1, v.size // 500)], strict=True):  # fmt: skip
        assert Fraction(float(b)) - Fraction(float(a)) == Fraction(float(u))
        mid = (Fraction(float(a)) + Fraction(float(b))) / 2
        assert float(mid) == mid  # exact in float64
        assert float(fmt.next_down(float(mid))) == a and float(fmt.next_up(float(mid))) == b


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_next_up_down_match_numpy_nextafter(dtype):
    fmt = pl.get_format(np.dtype(dtype))
    if dtype == np.float16:  # every bit pattern
        x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    else:
        rng = np.random.default_rng(5)
        width = np.dtype(dtype).itemsize * 8
        bits = rng.integers(0, 1 << width, 20000, dtype=np.uint64, endpoint=False)
        x = bits.astype(f"u{width // 8}").view(dtype)
        fi = np.finfo(dtype)
        edges = [0, -0.0, fi.max, -fi.max, fi.smallest_subnormal, np.inf, -np.inf]
        x = np.concatenate([x[~np.isnan(x)], np.array(edges, dtype=dtype)])
    x = x[~np.isnan(x)]
    with np.errstate(over="ignore"):  # nextafter(max, inf) is inf
        up, down = np.nextafter(x, dtype(np.inf)), np.nextafter(x, dtype(-np.inf))
    assert _same(fmt.next_up(x), up.astype(np.float64))
    assert _same(fmt.next_down(x), down.astype(np.float64))


def test_next_up_down_off_grid_float64_inputs_of_wide_formats():
    """Between two float32 values: the float32 neighbours (x not a float32)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal(5000) * 10.0 ** rng.integers(-40, 38, 5000)
    x = x[np.float32(x).astype(np.float64) != x]
    lo = np.float32(x).astype(np.float64)
    lo = np.where(lo > x, np.nextafter(np.float32(x), np.float32(-np.inf)), lo)
    hi = np.nextafter(np.float32(lo), np.float32(np.inf)).astype(np.float64)
    fp32 = pl.get_format("fp32")
    assert _same(fp32.next_down(x), lo) and _same(fp32.next_up(x), hi)
    assert math.isnan(float(pl.get_format("e4m3").next_up(448.0)))


# ----- layering: formats sits below rounding, codec and the GPU module ----------------------
PACKAGE = Path(pl.__file__).resolve().parent

_ISOLATED = """
import importlib, sys, types
import numpy as np
pkg = types.ModuleType("precision_lab")  # the package without its __init__ (which imports all)
pkg.__path__ = [sys.argv[1]]
sys.modules["precision_lab"] = pkg
core = types.ModuleType("precision_lab.core")  # likewise the core's __init__
core.__path__ = [sys.argv[1] + "/core"]
sys.modules["precision_lab.core"] = core
formats = importlib.import_module("precision_lab.core.formats")
for name in ("e4m3", "e5m2", "e8m0", "fp16", "int8", "p3109_k8p3ue"):
    f = formats.get_format(name)
    if isinstance(f, formats.FloatFormat):
        f.next_up([0.0, 1.0, np.inf]), f.next_down([0.0, 1.0, -np.inf]), f.ulp(1.0)
    f.values(), f.max, str(f)
print(" ".join(sorted(m for m in sys.modules if m.startswith("precision_lab"))))
"""


def test_formats_imports_nothing_from_the_package():
    """In a fresh interpreter, formats (loaded without the package's __init__, which imports
    every module) and calls of its methods load no other precision_lab module: no rounding,
    codec or gpu, not even lazily inside a function."""
    r = subprocess.run(
        [sys.executable, "-c", _ISOLATED, str(PACKAGE)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["precision_lab", "precision_lab.core", "precision_lab.core.formats"]


def test_formats_source_has_no_package_import():
    """Static check of every import statement in formats.py, in functions too."""
    tree = ast.parse((PACKAGE / "core" / "formats.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("precision_lab"), (
                node.lineno
            )
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("precision_lab") for a in node.names), node.lineno
