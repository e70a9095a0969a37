"""Live: :func:`precision_lab.probe_gemm` against the numpy and torch installed here (issue 33).

These tests measure this machine: the CPU's SIMD width and the BLAS/oneDNN kernels decide the
summation order, so nothing here is an expected answer. Each test probes a library's GEMM or
sum (float32/float64 matmul, ``np.sum`` of the products, torch float32/bfloat16/float16 matmul
and ``torch.sum``), then checks the recovered model on fresh random inputs of many shapes that
the probe never saw (K = 1, primes, K past the probe's ``max_k`` and past the K-blocking it
found, up to 4096), bit for bit, on the numpy reference. The versions and the CPU flags are in
every message (and printed: ``pytest -s``/``-rP``).

BLAS and oneDNN pick kernels by M and N too (edge kernels for the rows and columns past the
last full register tile): a model is recovered for one (M, N) and checked at that (M, N) with
every K, and with the other M, N that the same kernel serves where the test says so.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import precision_lab as pl

RNG_SEED = 20261207

#: K of the fresh shapes: 1, small, primes, around lane widths, past the probes' max_k and
#: past every K-blocking threshold seen so far (OpenBLAS 448, oneDNN 192), up to 4096
FRESH_K = (
    1, 2, 3, 4, 5, 7, 8, 9, 11, 13, 15, 16, 17, 23, 29, 31, 32, 33, 37, 41, 47, 53, 61, 63, 64,
    65, 97, 127, 128, 129, 191, 192, 193, 211, 255, 256, 257, 383, 384, 385, 447, 448, 449,
    511, 601, 895, 896, 897, 1021, 1337, 2048, 4096,
)  # fmt: skip


@functools.cache
def machine() -> str:
    """The CPU, its SIMD flags and the libraries' versions (in every message)."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    simd = [
        f
        for f in ("fma", "avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")
        if f in flags
    ]
    blas = "?"
    try:
        cfg = np.show_config(mode="dicts")
        dep = cfg["Build Dependencies"]["blas"]
        blas = f"{dep.get('name')} {dep.get('version')}"
    except Exception:
        pass
    cpu = platform.processor() or platform.machine()
    txt = f"{cpu}, flags {' '.join(simd) or 'none'}; numpy {np.__version__} ({blas})"
    try:
        import torch

        mkldnn = torch.backends.mkldnn.is_available()
        txt += f"; torch {torch.__version__} (mkldnn {mkldnn}, threads 1)"
    except ImportError:
        txt += "; torch not installed"
    return txt


# ----- the black boxes ---------------------------------------------------------------------------
def _torch() -> Any:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    torch.set_num_threads(1)  # one thread: the kernel does not depend on the machine's load
    return torch


def np_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a, b)


def np_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.sum over a contiguous axis of the elementwise float32 products (numpy's pairwise_sum)."""
    return np.sum(a[:, None, :] * np.ascontiguousarray(b.T)[None, :, :], axis=-1)


def np_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.dot of contiguous 1-D float32 vectors (OpenBLAS ``sdot``), one per output element."""
    bt = np.ascontiguousarray(b.T)
    return np.array([[np.dot(a[i], bt[j]) for j in range(len(bt))] for i in range(len(a))],
                    dtype=a.dtype)  # fmt: skip


def torch_matmul(dtype: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    torch = _torch()
    dt = getattr(torch, dtype)

    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ta = torch.from_numpy(np.asarray(a, np.float32)).to(dt)
        tb = torch.from_numpy(np.asarray(b, np.float32)).to(dt)
        return torch.matmul(ta, tb).float().numpy()

    return fn


def torch_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    torch = _torch()
    ta, tb = torch.from_numpy(a), torch.from_numpy(np.ascontiguousarray(b.T))
    return torch.sum(ta[:, None, :] * tb[None, :, :], dim=-1).numpy()


@dataclass(frozen=True)
class Box:
    name: str
    make: Callable[[], Callable[[np.ndarray, np.ndarray], np.ndarray]]
    input_format: str
    out_format: str | None
    shape: tuple[int, int]
    max_k: int
    long_k: int
    #: False where the family is known to lack this library's order on some CPUs (torch.sum:
    #: the tail summed apart and added to lane 0 before the lanes are combined, and another
    #: kernel when the tail is a whole vector): then an "outside" verdict must be honest
    must_reproduce: bool = True


BOXES = [
    Box("numpy float32 matmul 8x8", lambda: np_matmul, "fp32", None, (8, 8), 36, 1200),
    Box("numpy fp32 matmul 64x64", lambda: np_matmul, "fp32", None, (64, 64), 24, 1337),
    # OpenBLAS's small-matrix kernel serves M * N * K <= 1e6: at 16 x 48 it is a chain up to
    # K = 1302, K-blocks of 448 past it (measured on an Intel Xeon): a switch the probe bisects
    # (measured on one CPU only, and OpenBLAS's small-matrix kernels are per architecture)
    Box("numpy fp32 matmul 16x48", lambda: np_matmul, "fp32", None, (16, 48), 24, 1337, False),
    Box("numpy float64 matmul 8x8", lambda: np_matmul, "fp64", None, (8, 8), 24, 600),
    Box("numpy float32 np.sum", lambda: np_sum, "fp32", None, (8, 8), 24, 1000),
    # OpenBLAS's sdot is a kernel per CPU: on an AMD Zen 3 (Haswell kernel) 32 fp32 FMA lanes
    # and a tail in a C double (reproduced); SkylakeX's (Zen 4) is outside the family
    Box("numpy float32 np.dot 1-D", lambda: np_dot, "fp32", None, (4, 4), 64, 1000, False),
    Box("torch fp32 matmul 8x8", lambda: torch_matmul("float32"), "fp32", None, (8, 8), 24, 600),
    # oneDNN's 16-bit kernels change with the CPU: on an Intel Xeon with AMX-BF16 the bf16
    # kernel past K = 64 is TDPBF16PS tiles in K-blocks that depend on K's divisors (beyond
    # the family: an honest "outside"); the fp16 one switches at K = 64 and 1024 (reproduced)
    Box("torch bf16 mm 8x8", lambda: torch_matmul("bfloat16"), "bf16", "bf16", (8, 8), 24, 1337,
        False),
    Box("torch fp16 matmul 8x8", lambda: torch_matmul("float16"), "fp16", "fp16", (8, 8), 24, 1337,
        False),
    # ATen's float32 sum (measured on an Intel Xeon): 4 lanes below K = 8; from K = 8 four
    # 8-wide accumulators (32 lanes, each in blocks of 16), whole vectors left into the first,
    # the scalar tail's sum into lane 0 before the horizontal sum; 2L = 64 shows the 32 lanes
    Box("torch float32 torch.sum", lambda: torch_sum, "fp32", None, (8, 8), 64, 1000, False),
]  # fmt: skip


def fresh(
    box: Box, fn: Callable[..., Any], acc: pl.Accumulator, ks: tuple[int, ...]
) -> tuple[int, int, list[str]]:
    """(elements reproduced, elements, the misses) on fresh inputs at the probed (M, N)."""
    rng = np.random.default_rng(RNG_SEED)
    fin = pl.get_format(box.input_format)
    fout = box.out_format or ("fp64" if box.input_format == "fp64" else "fp32")
    dtype = np.float64 if box.input_format == "fp64" else np.float32
    m, n = box.shape
    same = total = 0
    misses: list[str] = []
    for i, k in enumerate(ks):
        scale = 2.0 ** rng.integers(-4, 5, size=(m, k)) if i % 2 else 1.0
        a = np.asarray(pl.round_to(rng.standard_normal((m, k)) * scale, fin), dtype=np.float64)
        b = np.asarray(pl.round_to(rng.standard_normal((k, n)), fin), dtype=np.float64)
        want = np.asarray(fn(a.astype(dtype), b.astype(dtype)), dtype=np.float64)
        got = np.asarray(
            pl.gemm(a, b, input_format=fin, accumulator=acc, out_format=fout, backend="numpy"),
            dtype=np.float64,
        )
        ok = (got.view(np.int64) == want.view(np.int64)) | (np.isnan(got) & np.isnan(want))
        same += int(ok.sum())
        total += ok.size
        if not ok.all():
            misses.append(f"K={k}: {int((~ok).sum())}/{ok.size}")
    return same, total, misses


@pytest.mark.parametrize("box", BOXES, ids=lambda b: b.name)
def test_the_recovered_model_reproduces_the_library_on_fresh_shapes(box: Box) -> None:
    fn = box.make()
    res = pl.probe_gemm(
        fn,
        input_format=box.input_format,
        out_format=box.out_format,
        max_k=box.max_k,
        long_k=box.long_k,
        shape=box.shape,
        cases=64,
    )
    where = f"[{box.name} on {machine()}]"
    if res.failed == "places":
        # BLAS kernels whose edge tiles sum in another order (numpy's OpenBLAS float32 on an
        # AMD Zen 3): beyond the family, and the claim is checked here on other inputs
        assert res.outcome == "outside" and res.accumulator is None, f"{where}\n{res}"
        places = places_that_differ(box, fn)
        print(f"{where}: {places} of {box.shape[0] * box.shape[1]} places sum in another order")
        assert places > 0, f"{where}: every place sums alike, yet the probe says 'places'\n{res}"
        return
    if not box.must_reproduce and res.outcome != "reproduced":
        # an honest "no": the property is named, and the closest model does miss fresh cases
        assert res.accumulator is None and res.failed is not None, f"{where}\n{res}"
        assert res.closest is not None, f"{where}\n{res}"
        same, total, _ = fresh(box, fn, res.closest, (5, 12, 20, 33, 40, 100))
        f_same, f_total, _ = fprev_same(box, fn, res.closest, (40, 100, 200))
        print(f"{where}: outside ({res.failed}); closest {res.closest.describe()}: {same}/{total}"
              f" random, {f_same}/{f_total} FPRev cases")  # fmt: skip
        assert same + f_same < total + f_total, f"{where}: the closest model reproduces all\n{res}"
        return
    assert res.outcome == "reproduced", f"{where}\n{res}"
    acc = res.accumulator
    assert acc is not None
    # K up to 4096 where M * N is small; up to 1337 beyond (seconds, not minutes)
    kmax = 4096 if box.shape[0] * box.shape[1] <= 64 else 1337
    ks = tuple(k for k in FRESH_K if k <= kmax)
    same, total, misses = fresh(box, fn, acc, ks)
    print(f"{where}: {acc.describe()}; {len(ks)} fresh shapes, {same}/{total} elements reproduced")
    assert same == total, f"{where} {acc.describe()}: misses {misses}\n{res}"
    # the order itself on fresh K, through pl.gemm (not the probe's trees): random inputs of a
    # narrow output format (fp16, bf16) rarely show a wrong order
    kt = tuple(k for k in (3, 37, 100, 700, 1100, 1337, 2047) if k <= kmax)
    same, total, misses = fprev_same(box, fn, acc, kt)
    print(f"{where}: the order at K = {kt}: {same}/{total} FPRev cases reproduced")
    assert same == total, f"{where} {acc.describe()}: FPRev misses {misses}\n{res}"


def places_that_differ(box: Box, fn: Callable[..., Any]) -> int:
    """Output places whose sum differs from element (0, 0)'s when every row of ``a`` and every
    column of ``b`` holds the same FPRev inputs (+M, -M among units), at random pairs and K."""
    rng = np.random.default_rng(RNG_SEED + 2)
    big, unit = _FPREV[box.input_format]
    dtype = np.float64 if box.input_format == "fp64" else np.float32
    m, n = box.shape
    differ = np.zeros((m, n), dtype=bool)
    for k in (5, 17, 24, 40, 100):
        for _ in range(4):
            p, j = (int(x) for x in rng.choice(k, 2, replace=False))
            v = np.full(k, unit)
            v[p] = v[j] = big
            w = v.copy()
            v[j] = -big
            d = np.asarray(fn(np.tile(v, (m, 1)).astype(dtype), np.tile(w[:, None], (1, n))
                              .astype(dtype)), dtype=np.float64)  # fmt: skip
            differ |= d != d[0, 0]
    return int(differ.sum())


#: (a = b for +M, a = b for a unit) per input format: products 2**2e
_FPREV = {"fp32": (2.0**20, 2.0**-12), "bf16": (2.0**20, 2.0**-12), "fp16": (2.0**15, 2.0**-12),
          "fp64": (2.0**40, 2.0**-20)}  # fmt: skip


def fprev_same(
    box: Box, fn: Callable[..., Any], acc: pl.Accumulator, ks: tuple[int, ...]
) -> tuple[int, int, list[str]]:
    """(cases reproduced, cases, misses) on FPRev inputs at fresh K: +M at product p, -M at
    product j, units at up to 200 other products (zeros elsewhere: the output format counts
    them exactly), for random pairs (p, j) and for p = 0 with every j on a sample; one case
    per diagonal element of the probed (M, N)."""
    rng = np.random.default_rng(RNG_SEED + 1)
    big, unit = _FPREV[box.input_format]
    fout = box.out_format or ("fp64" if box.input_format == "fp64" else "fp32")
    dtype = np.float64 if box.input_format == "fp64" else np.float32
    m, n = box.shape
    per = min(m, n)
    same = total = 0
    misses: list[str] = []
    for k in ks:
        pairs = [(0, int(j)) for j in rng.choice(np.arange(1, k), min(k - 1, 24), replace=False)]
        pairs += [tuple(int(x) for x in rng.choice(k, 2, replace=False)) for _ in range(24)]
        pairs = [p for p in pairs if p[0] != p[1]]
        bad = 0
        for i in range(0, len(pairs), per):
            a = np.zeros((m, k))
            b = np.zeros((k, n))
            for r, (p, j) in enumerate(pairs[i : i + per]):
                units = rng.choice(k, min(k, 200), replace=False)
                a[r, units], b[units, r] = unit, unit
                a[r, p], b[p, r] = big, big
                a[r, j], b[j, r] = -big, big
            want = np.asarray(fn(a.astype(dtype), b.astype(dtype)), dtype=np.float64)
            got = np.asarray(
                pl.gemm(a, b, input_format=box.input_format, accumulator=acc, out_format=fout,
                        backend="numpy"), dtype=np.float64,
            )  # fmt: skip
            idx = np.arange(len(pairs[i : i + per]))
            ok = got[idx, idx].view(np.int64) == want[idx, idx].view(np.int64)
            bad += int((~ok).sum())
            same += int(ok.sum())
            total += ok.size
        if bad:
            misses.append(f"K={k}: {bad}/{len(pairs)}")
    return same, total, misses
