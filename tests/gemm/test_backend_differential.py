"""Backends against each other, by property (issue 31): every row of ``pl.tensor_core.list()``
on every CPU-reachable backend of ``pl.gemm``, bit for bit.

The backends: the numpy reference (``backend="numpy"``), the native kernels (``backend="native"``:
the block-FMA fast path, the per-element kernels of ``pl_gemm.cuh`` and the special kernels,
whichever the call reaches), and the CUDA kernels themselves built for the host
(``tests/cuda_host.py``: ``pl_gemm.cu`` with ``cupy_backend.run``; skipped, with the reason,
where no C++ compiler is found). Hypothesis chooses, per example, a row of the table (the rows
are grouped by the model's structure, one test per group, so that every kind of model, and
every rare one such as the FP8 ``mma`` inner blocks, gets examples in every run), the depth K
(1 to three blocks, and ragged tails: 1, 2, block - 1 ... past a whole block), the shapes (M, N,
a batch), c or none, and one of six input classes:

* ``uniform``: values of a few binades around 1;
* ``bits``: random bit patterns of the input formats (inf, NaN, subnormals where they exist);
* ``spread``: exponents over the whole range of the format;
* ``cancel``: products that cancel in pairs (and c that cancels the rest), up to an ulp;
* ``subnormal``: subnormal inputs beside the smallest normals;
* ``special``: zeros, inf and NaN beside operands near the format's maximum.

Results are compared as bit patterns (NaN == NaN whatever its payload on one backend, -0 != +0).
The presets' values against independent oracles: tests/gemm/test_tensor_core_presets.py and the
measured data sets (tests/gemm/test_tensor_core.py).
"""

from __future__ import annotations

import ctypes
import importlib
import os
from dataclasses import dataclass
from typing import Any

import cuda_host
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import precision_lab as pl
from precision_lab.core.formats import FloatFormat
from precision_lab.gemm.accumulator import reference_only

native_backend = importlib.import_module("precision_lab.gemm.native_backend")
reference = importlib.import_module("precision_lab.gemm.reference")
gemm_lib = cuda_host.gemm_lib  # the CUDA kernels on the host (a session fixture, shared)

CLASSES = ("uniform", "bits", "spread", "cancel", "subnormal", "special")


@dataclass(frozen=True)
class Row:
    """One row of the table: its accumulator, the element formats of a and b, the output format
    and, for block-scaled MMA (``scales="in_block"``), the scale block along K and the scale
    format."""

    acc: Any
    fa: FloatFormat
    fb: FloatFormat
    out: str
    scale_block: int | None
    scale_format: Any
    k_unit: int | None = None  # (spec 3e's models: the depths that reach their splits and tails)

    @property
    def unit(self) -> int:
        """The products of a block along K (sequential chains: 8, so K reaches 3 x 8 + tails)."""
        if self.k_unit is not None:
            return self.k_unit
        return max(int(self.acc.block or self.acc.promote_every or 8), 2)


def _row(r: dict[str, Any]) -> Row:
    fmts = r["input_format"].split(" x ")
    fmt = fmts[0] if len(fmts) == 1 else tuple(fmts)
    acc = pl.tensor_core(
        r["gpus"].split()[0], fmt, out_format=r["out_format"],
        instruction=f"{r['instruction']}.{r['kind']}",
    )  # fmt: skip
    if acc.scales == "in_block":
        blocks = [pl.get_block_format(f) for f in fmts]
        fa, fb = (pl.get_format(b.element) for b in (blocks[0], blocks[-1]))
        sblock = int(blocks[0].block_shape[0])
        return Row(acc, fa, fb, r["out_format"], sblock, pl.get_format(blocks[0].scale))
    fa, fb = (pl.get_format(f) for f in (fmts[0], fmts[-1]))
    return Row(acc, fa, fb, r["out_format"], None, None)


def _family(row: Row) -> str:
    """The model's structure: what the kernels branch on."""
    acc = row.acc
    parts = [acc.order, f"addend={acc.addend}", f"into {acc.format.name}"]
    if acc.scales == "in_block":
        parts.append("scales in block" + (" groups" if acc.group else ""))
    if acc.inner_block:
        parts.append("inner blocks")
    if acc.input_subnormals == "flush":
        parts.append("flushed inputs")
    why = reference_only(acc)
    if why is not None:  # the CPU rules (spec 3c/3d): numpy reference (and native: it hands back)
        parts.append(f"reference only ({why.split('=')[0]})")
    return " ".join(parts)


ROWS = [_row(r) for r in pl.tensor_core.list()]
FAMILIES: dict[str, list[Row]] = {}
for _r in ROWS:
    FAMILIES.setdefault(_family(_r), []).append(_r)


# ----- the input classes ------------------------------------------------------------------------
def _sign(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def _grid(x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """x put on fmt's grid (saturating: the classes choose their infinities themselves)."""
    with pl.use_backend("numpy"), np.errstate(all="ignore"):
        return np.asarray(pl.round_to(x, fmt, overflow="saturate"), dtype=np.float64)


def _values(
    rng: np.random.Generator, kind: str, fmt: FloatFormat, shape: tuple[int, ...], axis: int = 1
):
    """Values of one input class on ``fmt``'s grid (float64); ``axis``: 1 for a (rows along
    K), 0 for b and c."""
    m = fmt.mantissa_bits
    if kind == "bits":
        dtype = np.uint64 if fmt.bits > 32 else np.uint32
        codes = rng.integers(0, 2**fmt.bits, shape, dtype=np.uint64).astype(dtype)
        with np.errstate(all="ignore"):
            return np.asarray(pl.decode(codes, fmt), dtype=np.float64)
    if kind == "spread":
        lo = fmt.emin - m
        hi = int(np.floor(np.log2(fmt.max)))
        e = rng.integers(lo, hi + 1, shape)
        return _grid(_sign(rng, shape) * np.ldexp(1.0 + rng.random(shape), e), fmt)
    if kind == "subnormal":
        sub = fmt.smallest_subnormal * rng.integers(1, 2**m + 1, shape) if m else 0.0
        normal = fmt.smallest_normal * (1.0 + rng.random(shape))
        x = np.where(rng.random(shape) < 0.7, sub, normal)
        x = np.where(rng.random(shape) < 0.1, 0.0, x)
        return _grid(_sign(rng, shape) * x, fmt)
    if kind == "special":  # huge operands, zeros; inf and NaN in some rows (columns) only
        # (a's signs change every 32 k only, b's per column: sums of a block overflow, to
        # infinities of either sign in turn)
        if axis:
            runs = _sign(rng, (*shape[:-1], -(-shape[-1] // 32)))
            sign = np.repeat(runs, 32, axis=-1)[..., : shape[-1]]
        else:
            sign = _sign(rng, (*shape[:-2], 1, shape[-1]))
        x = sign * fmt.max * rng.uniform(0.25, 1.0, shape)
        u = rng.random(shape)
        x = np.where(u < 0.25, 0.0 * _sign(rng, shape), x)
        x = np.where((u >= 0.25) & (u < 0.4), _sign(rng, shape) * rng.uniform(0.5, 2, shape), x)
        lines = rng.random((*shape[:-1], 1) if axis else (*shape[:-2], 1, shape[-1]))
        s = rng.random(shape) * (lines < 0.5)
        x = np.where((s > 0.85) & (s < 0.94), np.inf * _sign(rng, shape), x)
        x = np.where(s >= 0.94, np.nan, x)
        finite = np.isfinite(x)
        x[finite] = _grid(x[finite], fmt)  # (inf, NaN: each backend rounds them to the format)
        return x
    # uniform, and the base of cancel
    scale = 2.0 ** float(rng.integers(-3, 4))
    return _grid(rng.uniform(-1.0, 1.0, shape) * min(scale, fmt.max / 2), fmt)


def _operands(rng: np.random.Generator, row: Row, kind: str, batch, m: int, k: int, n: int):
    a = _values(rng, kind, row.fa, (*batch, m, k))
    b = _values(rng, kind, row.fb, (*batch, k, n), 0)
    if kind == "cancel" and k >= 2:  # products in pairs that cancel, up to an ulp of b
        h = k // 2
        a[..., h : 2 * h] = a[..., :h]
        nudge = (
            1.0
            + rng.choice([-1.0, 0.0, 0.0, 1.0], b[..., :h, :].shape) * 2.0**-row.fb.mantissa_bits
        )
        b[..., h : 2 * h, :] = _grid(-b[..., :h, :] * nudge, row.fb)
    return a, b


def _c(rng: np.random.Generator, row: Row, kind: str, a, b, shape) -> np.ndarray:
    out = pl.get_format(row.out)
    if kind == "cancel":  # c = minus the exact-ish product sum: the result cancels too
        with np.errstate(all="ignore"):
            s = np.nan_to_num(np.matmul(a, b), nan=0.0, posinf=0.0, neginf=0.0)
        return _grid(-np.broadcast_to(s, shape), out)
    return _values(rng, "uniform" if kind == "bits" else kind, out, shape, 0)


def _scales(rng: np.random.Generator, row: Row, kind: str, batch, m: int, k: int, n: int):
    """Scales of block-scaled MMA: (..., M, K blocks) and (..., K blocks, N) on the scale
    format's grid (E8M0: powers of two; NVFP4's UE4M3: positive E4M3 values)."""
    assert row.scale_block is not None
    nk = -(-k // row.scale_block)
    wide = 120 if kind in ("spread", "special") else 12
    shapes = ((*batch, m, nk), (*batch, nk, n))
    if row.scale_format.name == "e8m0":
        return tuple(2.0 ** rng.integers(-wide, wide + 1, s).astype(np.float64) for s in shapes)
    return tuple(_grid(2.0 ** rng.uniform(-9.0, 8.0, s), row.scale_format) for s in shapes)


# ----- the backends -----------------------------------------------------------------------------
def _bits(x: Any) -> np.ndarray:
    x = np.asarray(x)
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize])


def _run(backend: str, lib: ctypes.CDLL | None, a, b, c, kw: dict[str, Any]):
    """The GEMM on one backend, or the exception it raised."""
    try:
        if backend == "header":
            assert lib is not None  # (NaN results: one pattern, as pl.gemm does on CuPy)
            out = cuda_host.emu_gemm(lib, a, b, c, **kw)[0]
            return reference._canonical_nan(out, kw["accumulator"].nan_encoding)
        return pl.gemm(a, b, c, backend=backend, **kw)
    except (ValueError, NotImplementedError, OverflowError) as exc:
        return exc


@pytest.fixture(scope="module")
def header(request: pytest.FixtureRequest) -> ctypes.CDLL | None:
    """The host build of the CUDA kernels, or None where it cannot be built (no compiler)."""
    try:
        return request.getfixturevalue("gemm_lib")
    except pytest.skip.Exception:
        return None


def _k(unit: int) -> st.SearchStrategy[int]:
    """1 to three blocks plus a ragged tail: whole blocks, tails of 1, 2, unit - 1 products
    (where the last block's inner blocks are shortest or empty), or any other."""
    tails = st.one_of(st.sampled_from([0, 1, 2, unit - 1, unit // 2 + 1]), st.integers(0, unit - 1))
    return st.builds(lambda j, r: max(j * unit + r, 1), st.integers(0, 3), tails)


@st.composite
def _cases(
    draw: st.DrawFn, rows: list[Row]
) -> tuple[Row, str, tuple[int, ...], int, int, int, bool, int]:
    row = draw(st.sampled_from(rows))
    kind = draw(st.sampled_from(CLASSES))
    batch = draw(st.sampled_from([(), (), (2,)]))
    m, n = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    k = draw(_k(row.unit))
    with_c = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return row, kind, batch, m, k, n, with_c, seed


def _backends(lib: ctypes.CDLL | None) -> list[str]:
    """The backends compared with the numpy reference: those built here."""
    return [
        name
        for name, built in (("native", native_backend.available()), ("header", lib is not None))
        if built
    ]


def _check(case, lib: ctypes.CDLL | None) -> None:
    row, kind, batch, m, k, n, with_c, seed = case
    rng = np.random.default_rng(seed)
    a, b = _operands(rng, row, kind, batch, m, k, n)
    c = _c(rng, row, kind, a, b, (*batch, m, n)) if with_c else None
    kw: dict[str, Any] = {
        "input_format": (row.fa, row.fb), "accumulator": row.acc, "out_format": row.out,
    }  # fmt: skip
    if row.scale_block is not None:
        sa, sb = _scales(rng, row, kind, batch, m, k, n)
        kw.update(scale_a=sa, scale_b=sb, scale_block=row.scale_block)
    want = _run("numpy", None, a, b, c, kw)
    what = f"{row.acc.name}, {kind}, batch {batch}, M={m} K={k} N={n}, c: {with_c}, seed {seed}"
    results = {
        backend: _run(backend, lib, a, b, c, kw)
        for backend in _backends(lib)
        if backend != "header" or reference_only(row.acc) is None  # (CuPy raises for those)
    }
    # an output depends on its row of a, column of b and c alone: the GEMM of that row and column
    # (one whose own inputs are finite where there is one: other rows' inf or NaN must not reach
    # it)
    fin_a = np.flatnonzero(np.isfinite(a).reshape(-1, m, k).all(axis=(0, 2)))
    fin_b = np.flatnonzero(np.isfinite(b).reshape(-1, k, n).all(axis=(0, 1)))
    i = int(rng.choice(fin_a)) if fin_a.size else int(rng.integers(m))
    j = int(rng.choice(fin_b)) if fin_b.size else int(rng.integers(n))
    one = dict(kw)
    if "scale_a" in kw:
        one.update(scale_a=kw["scale_a"][..., i : i + 1, :], scale_b=kw["scale_b"][..., j : j + 1])
    cij = None if c is None else c[..., i : i + 1, j : j + 1]
    alone = _run("numpy", None, a[..., i : i + 1, :], b[..., j : j + 1], cij, one)
    if not isinstance(want, Exception):
        results[f"numpy on row {i} and column {j} alone"] = alone
    for backend, got in results.items():
        if isinstance(want, Exception):
            assert type(got) is type(want), f"{what}: {backend} gave {got!r}, numpy raised {want!r}"
            continue
        assert not isinstance(got, Exception), f"{what}: {backend} raised {got!r}"
        ref = want[..., i : i + 1, j : j + 1] if "alone" in backend else want
        assert got.dtype == ref.dtype and got.shape == ref.shape, f"{what}: {backend}"
        bad = np.flatnonzero(_bits(got).reshape(-1) != _bits(ref).reshape(-1))
        if bad.size:
            x = bad[:4]
            raise AssertionError(
                f"{what}: {backend} differs from numpy at {bad.size} of {ref.size} outputs: "
                f"got {got.reshape(-1)[x].tolist()}, numpy {ref.reshape(-1)[x].tolist()} "
                f"(bits {[hex(int(v)) for v in _bits(got).reshape(-1)[x]]} vs "
                f"{[hex(int(v)) for v in _bits(ref).reshape(-1)[x]]})"
            )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_backends_agree_bit_for_bit(family: str, header: ctypes.CDLL | None) -> None:
    if not _backends(header):
        pytest.skip("neither the native extension nor the CUDA host harness is built here")

    @settings(
        max_examples=int(os.environ.get("PL_DIFF_EXAMPLES", 20)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(case=_cases(FAMILIES[family]))
    def check(case) -> None:
        _check(case, header)

    check()


# ----- spec 3e and 3f: CPU lanes and split-K, k1_product (the per-element kernels' structured
# path, pl_gemm_structured / pl_gemm_k1) --------------------------------------------------------
def _lane_row(fmt: str, out: str, unit: int, **kw: Any) -> Row:
    f = pl.get_format(fmt)
    return Row(pl.Accumulator(**kw), f, f, out, None, None, unit)


LANE_FAMILIES: dict[str, list[Row]] = {
    "numpy pairwise_sum (lanes 8, tail after, halving split)": [
        _lane_row("bf16", "fp32", 20, format="fp32", lanes=8, lane_combine="pairwise",
                  lane_tail="after", split_k=16, split_combine="halving"),
        _lane_row("fp16", "fp16", 20, format="fp16", rounding="toward_zero", lanes=4,
                  lane_combine="pairwise", lane_tail="after", split_k=8, split_combine="halving"),
    ],
    "OpenBLAS sdot (lanes 8, unroll 16, separate tail, halving lanes)": [
        _lane_row("bf16", "fp32", 20, format="fp32", lanes=8, lane_combine="halving",
                  lane_tail="separate", lane_unroll=16),
        _lane_row("e4m3", "bf16", 12, format="bf16", rounding="down", lanes=3,
                  lane_combine="halving", lane_tail="separate", lane_unroll=6, small_k=5),
    ],
    "torch bf16 (lanes, tail first, small K, promotion, product rounding)": [
        _lane_row("bf16", "bf16", 12, format="bf16", lanes=4, lane_tail="first", lane_unroll=8,
                  small_k=6, product_format="bf16"),
        _lane_row("fp16", "fp32", 12, format="fp32", rounding="up", lanes=2, lane_tail="first",
                  promote_every=10, promote_format="fp32"),
    ],
    "split-K sequential (balanced) and pairwise, pairwise and blocked lanes": [
        _lane_row("bf16", "fp16", 16, format="fp16", order="pairwise", lanes=2, split_k=12,
                  split_balance=4),
        _lane_row("bf16", "fp32", 24, format="fp32", lanes=2, lane_tail="first", lane_unroll=8,
                  split_k=9, split_balance=2, split_half="floor"),
        _lane_row("bf16", "fp32", 12, format="bf16", order="blocked", block=3, lanes=4,
                  split_k=10, split_combine="pairwise"),
        _lane_row("fp16", "fp32", 12, format="fp32", split_k=5, split_combine="sequential"),
        _lane_row("bf16", "fp32", 16, format="fp32", lanes=2, split_k=6, split_equal=2,
                  subnormals="flush"),
        _lane_row("bf16", "fp32", 24, format="fp32", lanes=8, lane_vector=4,
                  lane_tail="separate_first", lane_combine=((0, 4), (1, 5), (2, 6), (3, 7)),
                  order="blocked", block=2),
        _lane_row("fp16", "fp16", 12, format="fp16", lanes=4, lane_vector=2, lane_tail="after"),
    ],
    "explicit lane trees, lanes tail, saturation and zero signs": [
        _lane_row("bf16", "fp32", 16, format="bf16", lanes=8,
                  lane_combine=(((0, 4), (1, 5)), (2, 6, 3), 7), overflow="saturate"),
        _lane_row("e5m2", "fp16", 12, format="fp16", lanes=5, lane_combine=(4, (0, 1, 2), 3),
                  zero_sign="positive", subnormals="flush", split_k=7, split_combine="pairwise"),
    ],
    "k1_product": [
        _lane_row("bf16", "fp32", 2, format="fp32", k1_product=True),
        _lane_row("fp16", "fp16", 2, format="fp16", order="block_fma", block=4, align_bits=24,
                  k1_product=True),
        _lane_row("e4m3", "bf16", 2, format="bf16", lanes=4, k1_product=True,
                  product_format="bf16"),
    ],
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(LANE_FAMILIES))
def test_lanes_and_split_k_agree_bit_for_bit(family: str, header: ctypes.CDLL | None) -> None:
    """Spec 3e (lanes, split-K) and 3f (k1_product): numpy, the native per-element kernels and
    the CUDA kernels on the host, bit for bit, by the input classes above (their special values
    included) at depths through several splits and ragged tails."""
    if not _backends(header):
        pytest.skip("neither the native extension nor the CUDA host harness is built here")
    for row in LANE_FAMILIES[family]:
        assert reference_only(row.acc) is None, row.acc  # (every backend runs it)

    @settings(
        max_examples=int(os.environ.get("PL_DIFF_EXAMPLES", 20)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(case=_cases(LANE_FAMILIES[family]))
    def check(case) -> None:
        _check(case, header)

    check()


def test_every_row_is_in_a_family():
    assert sum(len(v) for v in FAMILIES.values()) == len(pl.tensor_core.list())
    assert len(FAMILIES) >= 10


# ----- the faults this test found, as regression tests (issue 31, items 1 and 2) -----------------
def _all_backends(lib: ctypes.CDLL | None, a, b, c=None, **kw: Any) -> dict[str, np.ndarray]:
    out = {"numpy": pl.gemm(a, b, c, backend="numpy", **kw)}
    if native_backend.available():
        out["native"] = pl.gemm(a, b, c, backend="native", **kw)
    if lib is not None:
        got = cuda_host.emu_gemm(lib, a, b, c, **kw)[0]
        out["header"] = reference._canonical_nan(got, kw["accumulator"].nan_encoding)
    return out


INNER_ROWS = [r for r in ROWS if r.acc.inner_block and r.acc.addend == "after_block"]


@pytest.mark.parametrize("row", INNER_ROWS, ids=lambda r: r.acc.name)
def test_inner_blocks_of_a_last_block_of_one_or_two_products(row: Row, header) -> None:
    """FP8 mma.sync (inner blocks of 16, dealt in pairs): with K % 32 = 1 or 2 the last block's
    second inner block holds no product. The AVX-512 fused unit read its int32 sums
    uninitialised there and added the first inner block's sum again: -0.40625 * 1.125 gave
    -0.9140625 (issue 31 item 1; only where the CPU has AVX-512F). Oracle: the exact dot
    product (multiples of 1/4 below 2**9: every rounding of the model is exact)."""
    assert len(INNER_ROWS) >= 16
    rng = np.random.default_rng(len(row.acc.name))
    grid = np.array([-2.0, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0])
    kw = {"input_format": (row.fa, row.fb), "accumulator": row.acc, "out_format": row.out}
    for k in (1, 2, 3, 34, 65):
        a, b = rng.choice(grid, (3, k)), rng.choice(grid, (k, 2))
        exact = a @ b  # (exact in float64)
        for backend, got in _all_backends(header, a, b, **kw).items():
            np.testing.assert_array_equal(got, exact, err_msg=f"{backend} K={k}")
    # the case (e4m3: -0.45703125; the inputs on each row's grids, the product exact)
    want = float(pl.round_to(-0.40625, row.fa)) * float(pl.round_to(1.125, row.fb))
    one = _all_backends(header, [[-0.40625]], [[1.125]], **kw)
    assert {name: float(d[0, 0]) for name, d in one.items()} == dict.fromkeys(one, want)


AFTER_BLOCK = [
    pl.tensor_core("h100", "e5m2", out_format="fp16", instruction="mma"),
    pl.tensor_core("b200", ("e4m3", "e5m2"), out_format="fp16", instruction="mma"),
    pl.Accumulator(
        "fp16",
        order="block_fma",
        block=8,
        align_bits=25,
        addend="after_block",
        block_rounding="nearest_even",
    ),
]


@pytest.mark.parametrize("acc", AFTER_BLOCK, ids=lambda a: a.name or a.describe())
def test_an_infinite_running_value_meets_the_opposite_infinity_as_nan(acc, header) -> None:
    """addend="after_block": block 0 overflows to +inf, block 1 to -inf; r + t is inf + -inf =
    NaN (spec 5), whether or not another row holds an inf or NaN input. The running value
    ignored t unless some input of the call was special, so one output depended on other rows
    (issue 31 item 2: +inf alone, NaN beside a row with an inf), on every backend."""
    fmt = "e5m2" if (acc.name or "h100").startswith("h100") else ("e4m3", "e5m2")
    n = acc.block
    big = 448.0  # (e4m3's max; in e5m2 too: products 2**17.6 overflow fp16)
    a = np.zeros((3, 2 * n + 1))
    a[:, :n], a[:, n : 2 * n] = big, -big  # row 0: +inf then -inf
    a[1, n : 2 * n] = big  # row 1: +inf then +inf
    a[2, :] = -a[2, :]  # row 2: -inf then +inf
    b = np.full((2 * n + 1, 2), big)
    b[:, 1] = 1.0  # column 1: finite sums
    kw = {"input_format": fmt, "accumulator": acc, "out_format": "fp16"}
    want_nan = np.array([[True, False], [False, False], [True, False]])
    for other in (None, np.inf, np.nan):
        aa = a if other is None else np.vstack([a, np.full((1, 2 * n + 1), other)])
        for backend, d in _all_backends(header, aa, b, **kw).items():
            what = f"{backend}, other row {other}"
            np.testing.assert_array_equal(np.isnan(d[:3]), want_nan, err_msg=what)
            assert d[1, 0] == np.inf and np.isfinite(d[:3, 1]).all(), what


def test_fp64_fma_chain_keeps_the_sign_of_a_zero_sum(header) -> None:
    """FP64 DMMA (s = fma(a_k, b_k, s)): fma(-2**-600, 2**-600, +0) underflows to -0 (the sign of
    the exact result), then fma(0, -1, -0) = -0 + -0 = -0 (IEEE 754 6.3). The reference's
    emulated fma gave +0 there (its rounding-to-odd correction v = +0 was added to th = -0);
    found by test_backends_agree_bit_for_bit (a100 fp64, subnormal inputs: native -0)."""
    acc = pl.tensor_core("a100", "fp64", out_format="fp64")
    a, b = np.array([[-(2.0**-600), 0.0]]), np.array([[2.0**-600], [-1.0]])
    kw = {"input_format": "fp64", "accumulator": acc, "out_format": "fp64"}
    for backend, d in _all_backends(header, a, b, **kw).items():
        assert _bits(d).tolist() == [[0x8000000000000000]], backend
