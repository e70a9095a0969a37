"""AMX-BF16 TDPBF16PS of this CPU against its preset, bit for bit (issue 33).

``cpu_isa/x86_amx.cpp`` is compiled by the system C++ compiler into a temporary directory (no
``-m`` flags: only its kernel carries target attributes) and loaded through ctypes; its check
(CPUID AMX-TILE and AMX-BF16, XCR0 bits 17 and 18, the XTILEDATA permission from
``arch_prctl``) skips these tests, saying why, elsewhere. Where it runs, tiles ``C (16 x 16
fp32) += A (16 x K bf16) . B (K x 16 bf16)`` go through one instruction for every even K from 2
to 32 (A's rows of ``2K`` bytes, B in the VNNI pair layout) and through chains of instructions
along longer K (the destination kept in its tile), at least 10 million output elements in
named input classes (random words, every exponent pair, wide exponent spreads, subnormal
inputs and results, ties, cancellation, inf/NaN/zeros, the smallest normal's edge, chains),
under the default MXCSR and (a quarter of them again) under round toward zero with FTZ and
DAZ, which the instruction must ignore. The model must give the same bits:

* :func:`~precision_lab.gemm.cpu_instructions.tdpbf16ps` on every element (NaN payloads
  included);
* the preset ``pl.tensor_core("x86", "bf16", instruction="tdpbf16ps")`` (``split_k`` = the
  instruction's K) through :func:`precision_lab.gemm` on every element whose result is not
  NaN (a NaN there is the quiet NaN: the Accumulator has no payload rule).

Ran on: Intel Xeon with AMX-BF16 and AVX512-FP16 (CPUID family 6, model 167 as this VM
reports) (``cpu_instructions.MEASURED_ON``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from cpu_harness import MXCSR_DEFAULT, MXCSR_ODD, build, cpu_flags
from cpu_harness import ptr as _p

import precision_lab as pl
from precision_lab.gemm import cpu_instructions as ci

SOURCE = Path(__file__).parent / "cpu_isa" / "x86_amx.cpp"
#: at least this many output elements (the issue's bar)
N_MIN = 10_000_000
_WHY = {
    1: "this CPU has no AMX-TILE and AMX-BF16 (CPUID leaf 7 EDX bits 24 and 22)",
    2: "the OS has not enabled XSAVE (CPUID.1:ECX.OSXSAVE)",
    3: "the OS does not enable the AMX tile state (XCR0 bits 17, 18)",
    4: "the OS refused the XTILEDATA permission (arch_prctl ARCH_REQ_XCOMP_PERM)",
}


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return build(tmp_path_factory, SOURCE, "AMX")


@pytest.fixture(scope="module")
def lib(harness: ctypes.CDLL) -> ctypes.CDLL:
    why = harness.pl_amx_status()
    if why:
        pytest.skip(_WHY.get(why, f"AMX unavailable ({why})") + ": TDPBF16PS cannot run here")
    return harness


def test_the_cpuid_check_agrees_with_the_kernel(harness):
    flags = cpu_flags()
    if {"amx_tile", "amx_bf16"} <= flags:
        assert harness.pl_amx_status() in (0, 4)  # (4: a kernel that refuses the permission)
    else:
        assert harness.pl_amx_status() == 1


def hw_amx(h: ctypes.CDLL, c, a, b, k: int, mxcsr: int = MXCSR_DEFAULT) -> np.ndarray:
    """c: (T, 16, 16) fp32 words; a: (T, 16, K) bf16 codes; b: (T, K, 16) bf16 codes; K a
    multiple of the instruction's ``k`` -> (T, 16, 16) fp32 words. Checks that MXCSR came back
    unchanged (no exception flag set: the instruction does not update it)."""
    c = np.ascontiguousarray(c, np.uint32)
    a = np.ascontiguousarray(a, np.uint16)
    b = np.ascontiguousarray(b, np.uint16)
    t, _, kk = a.shape
    assert c.shape == (t, 16, 16) and b.shape == (t, kk, 16) and kk % k == 0
    out = np.zeros_like(c)
    after = ctypes.c_uint32(0)
    n, steps = ctypes.c_int64(t), ctypes.c_int(kk // k)
    rc = h.pl_tdpbf16ps(_p(c), _p(a), _p(b), _p(out), n, ctypes.c_int(k), steps,
                        ctypes.c_uint32(mxcsr), ctypes.byref(after))  # fmt: skip
    assert rc == 0
    assert after.value == mxcsr, f"MXCSR {mxcsr:#x} came back as {after.value:#x}"
    return out


# ----- input classes -------------------------------------------------------------------------
def _bf16(sign, exp, man) -> np.ndarray:
    return ((np.asarray(sign).astype(np.uint32) << 15)
            | (np.clip(exp, 0, 255).astype(np.uint32) << 7)
            | np.asarray(man).astype(np.uint32)).astype(np.uint16)  # fmt: skip


def _fp32(sign, exp, man) -> np.ndarray:
    return ((np.asarray(sign).astype(np.uint32) << 31)
            | (np.clip(exp, 0, 255).astype(np.uint32) << 23)
            | np.asarray(man).astype(np.uint32)).astype(np.uint32)  # fmt: skip


def _v16(codes) -> np.ndarray:
    return (np.asarray(codes).astype(np.uint32) << 16).view(np.float32)


def _v32(words) -> np.ndarray:
    return np.asarray(words, np.uint32).view(np.float32)


def _special16(rng, shape):
    """bf16 codes: zeros, subnormals, inf, NaNs (quiet and signalling payloads), normals."""
    kind = rng.integers(0, 6, shape)
    man = rng.integers(0, 128, shape)
    exp = np.select([kind <= 1, kind <= 3], [0 * man, 0 * man + 255], rng.integers(1, 255, shape))
    man = np.select([kind == 0, kind == 2, kind == 3], [0 * man, 0 * man, np.maximum(man, 1)], man)
    return _bf16(rng.integers(0, 2, shape), exp, man)


def _sgn(rng, shape):
    return rng.integers(0, 2, shape)


#: the instruction's K for each batch of a class: every even K from 2 to 32
KS = tuple(range(2, 33, 2))


def amx_classes(rng: np.random.Generator) -> dict[str, list[tuple]]:
    """Named classes: lists of batches ``(c words (T, 16, 16), a codes (T, 16, K), b codes
    (T, K, 16), k)`` (``k`` the instruction's K; ``K = k`` but for the chains)."""
    out: dict[str, list[tuple]] = {}

    def tiles(t, k, ea, eb, ec, ma=None, mb=None, mc=None):
        ma = rng.integers(0, 128, (t, 16, k)) if ma is None else ma
        mb = rng.integers(0, 128, (t, k, 16)) if mb is None else mb
        mc = rng.integers(0, 2**23, (t, 16, 16)) if mc is None else mc
        return (_fp32(_sgn(rng, (t, 16, 16)), ec, mc), _bf16(_sgn(rng, (t, 16, k)), ea, ma),
                _bf16(_sgn(rng, (t, k, 16)), eb, mb))  # fmt: skip

    # random words: every encoding (inf, NaN, subnormals included), every even K
    out["random words"] = [
        (rng.integers(0, 2**32, (200, 16, 16), dtype=np.uint64).astype(np.uint32),
         rng.integers(0, 2**16, (200, 16, k)).astype(np.uint16),
         rng.integers(0, 2**16, (200, k, 16)).astype(np.uint16), k)
        for k in KS
    ]  # fmt: skip
    # every exponent pair: row i of tile (p, q) gives A's first element the exponent 16p + i,
    # column j gives B's first element 16q + j (every pair of biased exponents 0..255 once per
    # round); the other products lie within 2**+-20 of it, c within 2**+-26
    batches = []
    for rnd in range(10):
        k = KS[(rnd * 5) % len(KS)] if rnd else 2
        p, q = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
        p, q = p.ravel(), q.ravel()
        t = p.size
        ea0 = (16 * p[:, None] + np.arange(16)[None, :])[:, :, None]  # (t, 16, 1)
        eb0 = (16 * q[:, None] + np.arange(16)[None, :])[:, None, :]  # (t, 1, 16)
        ea = np.clip(ea0 + rng.integers(-10, 11, (t, 16, k)), 1, 254)
        eb = np.clip(eb0 + rng.integers(-10, 11, (t, k, 16)), 1, 254)
        ea[:, :, 0], eb[:, 0, :] = ea0[:, :, 0], eb0[:, 0, :]
        ec = np.clip(ea0 + eb0 - 127 + rng.integers(-26, 27, (t, 16, 16)), 0, 255)
        ec = np.where(ec == 255, 254, ec)
        for _ in range(4):
            batches.append((*tiles(t, k, ea, eb, ec), k))
    out["every exponent pair"] = batches
    # wide exponent spreads: products over 2**+-60 (and c), every even K
    batches = []
    for k in KS:
        t = 250
        batches.append((*tiles(t, k, rng.integers(97, 158, (t, 16, k)),
                               rng.integers(97, 158, (t, k, 16)),
                               rng.integers(67, 188, (t, 16, 16))), k))  # fmt: skip
    out["wide exponent spreads"] = batches
    # subnormal inputs and results: bf16 exponents near the bottom (subnormal codes
    # included), products around 2**-126, c subnormal or tiny
    batches = []
    for k in KS:
        t = 250
        ea = rng.integers(0, 61, (t, 16, k))
        eb = np.clip(98 - rng.integers(0, 61, (t, k, 16)) + rng.integers(0, 61, (t, k, 16)), 0, 254)
        batches.append((*tiles(t, k, ea, eb, rng.integers(0, 6, (t, 16, 16))), k))
    out["subnormals"] = batches
    out["ties"] = _ties(rng)
    out["cancellation"] = _cancellation(rng)
    # inf, NaN (payloads), zeros of both signs, subnormals, mixed with normals
    batches = []
    for k in KS:
        t = 250
        cs = _special16(rng, (t, 16, 16)).astype(np.uint32) << 16
        cs |= rng.integers(0, 2**16, (t, 16, 16)).astype(np.uint32)
        inf_ = ((cs >> 23) & 0xFF) == 0xFF
        cs = np.where(inf_ & ((cs & 0x7FFFFF) == 0x10000), cs & 0xFFFF0000, cs).astype(np.uint32)
        batches.append((cs, _special16(rng, (t, 16, k)), _special16(rng, (t, k, 16)), k))
    out["inf, NaN, zeros"] = batches
    # the smallest normal's edge: lanes whose sums cross 2**-126 (tininess after rounding),
    # c = +-2**-126 (1 + few ulps)
    batches = []
    for k in KS:
        t = 250
        ea = rng.integers(40, 70, (t, 16, k))
        eb = 127 - 70 + 3 + rng.integers(0, 6, (t, k, 16))
        mc = rng.integers(0, 4, (t, 16, 16))
        batches.append((*tiles(t, k, ea, eb, rng.integers(1, 3, (t, 16, 16)), mc=mc), k))
    out["smallest normal's edge"] = batches + _tininess(rng)
    # chains: instructions of k elements along K = 64 .. 256, C kept in the tile
    batches = []
    for k, kk in ((32, 64), (32, 96), (32, 256), (16, 64), (8, 40), (2, 16), (30, 90)):
        t = 200
        e = rng.integers(110, 145, (t, 16, kk))
        eb = rng.integers(115, 140, (t, kk, 16))
        batches.append((*tiles(t, kk, e, eb, rng.integers(120, 150, (t, 16, 16))), k))
    out["chains"] = batches
    return out


def _ties(rng) -> list[tuple]:
    """Exact ties in each rounding step. B's column j is the power of two ``2**s_j`` (signs
    random) down K, so output (i, j) is ``c_ij + 2**s_j * sum_k A[i, k]`` in the instruction's
    order. (1) the final ``dest + (even + odd)``: A's row holds one product X_i (then zeros or
    tiny ones), c_ij is chosen so that X_i 2**s_j is an odd multiple of half c's ulp; (2) ``even
    + odd``: the even lane fills 24 bits (three products 2**-8 apart), the odd lane is half its
    ulp times an odd number (or a quarter); (3) inside a lane: the same with the tie in the
    lane's FMA chain."""
    batches = []
    for k in KS:
        t = 250
        s = rng.integers(-3, 4, (t, 1, 16))
        b = np.broadcast_to(_bf16(_sgn(rng, (t, 1, 16)), 127 + s, np.zeros((t, 1, 16), int)),
                            (t, k, 16)).copy()  # fmt: skip
        mode = rng.integers(0, 3, (t, 16, 1))
        e = rng.integers(90, 160, (t, 16, 1))
        m = rng.integers(0, 128, (t, 16, k))
        a = np.zeros((t, 16, k), np.uint16)
        # (1) A[i, 0] = X_i; c's exponent so that X 2**s is half an ulp (times odd) of c
        x = _bf16(_sgn(rng, (t, 16, 1)), e, m[:, :, :1])
        sig = 128 + m[:, :, 0:1].astype(np.int64)  # X = sig * 2**(e - 127 - 7)
        tz = np.zeros_like(sig)
        for bit in range(7):
            tz += ((sig >> bit) & 1 == 0) & (tz == bit)
        ec1 = e - 7 + 23 + 1 + tz + s  # c's biased exponent: X 2**s / ulp(c) = odd / 2
        # (2) / (3): the even lane (or the first lane) fills 24 bits: X, X 2**-8, X 2**-16
        # (its ulp then 2**(e-127-23)); the next product is half of that (times odd, or a
        # quarter of it: no tie), in the odd lane (2) or the same lane (3, K >= 4)
        if k >= 2:
            fill = [(0, 0), (2, -8), (4, -16)] if k >= 6 else [(0, 0)]
            half_e = e - 24 if k >= 6 else e - 8
            for pos, de in fill:
                a = np.where(
                    mode >= 1, _put(a, pos, _bf16(0, e + de, rng.integers(1, 128, (t, 16, 1)))), a
                )
            tie_pos = np.where(mode == 2, 6 if k >= 8 else 1, 1)
            half = _bf16(_sgn(rng, (t, 16, 1)), half_e - rng.integers(0, 2, (t, 16, 1)),
                         rng.choice([0, 64, 32, 96], (t, 16, 1)))  # fmt: skip
            for pos in np.unique(tie_pos):
                sel = (mode >= 1) & (tie_pos == pos)
                a = np.where(sel, _put(a, int(pos), half), a)
        a = np.where(mode == 0, _put(a, 0, x), a)
        # tiny products after the tie in some rows (sticky bits: no longer a tie)
        tiny = rng.random((t, 16, 1)) < 0.2
        if k >= 2:
            a = np.where(
                tiny, _put(a, k - 1, _bf16(_sgn(rng, (t, 16, 1)), e - 60, m[:, :, -1:])), a
            )
        ec = np.where(mode == 0, ec1, e + rng.integers(-30, 30, (t, 16, 1)) + s)
        ec = np.clip(np.broadcast_to(ec, (t, 16, 16)), 1, 254)
        c = _fp32(_sgn(rng, (t, 16, 16)), ec, rng.integers(0, 2**23, (t, 16, 16)))
        batches.append((c, a, b, k))
    return batches


def _tininess(rng) -> list[tuple]:
    """Tininess inside a lane's FMA chain: the lane holds +-2**-126 (A = +-2**-63 times B's
    2**-63), then a product of the opposite sign of about 2**-150, 2**-151 or 2**-152 (times 1 +
    f): ``2**-126 - 2**-151 (1 + f)``, f > 0, rounds to ``2**-126 - 2**-150`` with an unbounded
    exponent (tiny: flushed) but to ``2**-126`` on the subnormal grid (kept); c zero or a few
    ulps around the smallest normal. Elsewhere in A's row: zeros, or products of either lane."""
    batches = []
    for k in (4, 6, 8, 16, 32):
        t = 160
        b = np.full((t, k, 16), _bf16(0, 127 - 63, 0), np.uint16)
        sgn = _sgn(rng, (t, 16))
        a = np.where(rng.random((t, 16, k)) < 0.3,
                     _bf16(_sgn(rng, (t, 16, k)), rng.integers(30, 70, (t, 16, k)),
                           rng.integers(0, 128, (t, 16, k))), 0).astype(np.uint16)  # fmt: skip
        pos = 2 * rng.integers(0, k // 2 - 1, (t, 16))  # the even lane's product 2**-126
        for tt in range(t):
            rows = np.arange(16)
            a[tt, rows, pos[tt]] = _bf16(sgn[tt], np.full(16, 127 - 63), np.zeros(16, int))
            off = 2 * rng.integers(1, (k - pos[tt]) // 2)  # a later product of the same lane
            a[tt, rows, pos[tt] + off] = _bf16(1 - sgn[tt], 127 - 87 - rng.integers(0, 3, 16),
                                               rng.integers(0, 128, 16))  # fmt: skip
        ec = rng.integers(0, 3, (t, 16, 16))
        c = _fp32(_sgn(rng, (t, 16, 16)), ec, rng.integers(0, 4, (t, 16, 16)))
        c = np.where(rng.random((t, 16, 16)) < 0.5, 0, c).astype(np.uint32)
        batches.append((c, a, b, k))
    return batches


def _put(a, pos, v):
    a = a.copy()
    if pos < a.shape[-1]:
        a[:, :, pos] = np.broadcast_to(v, (*a.shape[:2], 1))[:, :, 0]
    return a


def _cancellation(rng) -> list[tuple]:
    """The odd lane nearly cancels the even one: A[i, 2m + 1] = -A[i, 2m] (give or take a
    code), B[2m + 1, :] = B[2m, :]; c of the size of the residue (2**-8 .. 2**-30 of the
    products) or zero."""
    batches = []
    for k in KS:
        t = 250
        ea = rng.integers(100, 155, (t, 16, k // 2))
        eb = rng.integers(110, 145, (t, k // 2, 16))
        a0 = _bf16(_sgn(rng, ea.shape), ea, rng.integers(0, 128, ea.shape))
        a1 = (a0 ^ np.uint16(0x8000)).astype(np.int64) + rng.integers(-1, 2, ea.shape)
        a1 = np.where((a1 & 0x7F80) == (a0 & 0x7F80), a1, a0 ^ 0x8000).astype(np.uint16)
        a = np.stack([a0, a1], -1).reshape(t, 16, k)
        b0 = _bf16(_sgn(rng, eb.shape), eb, rng.integers(0, 128, eb.shape))
        b = np.repeat(b0, 2, axis=1)
        ec = ea.mean(-1, keepdims=True).astype(int) + eb.mean(1, keepdims=True).astype(int)
        ec = np.clip(ec - 127 - rng.integers(8, 31, (t, 16, 16)), 1, 254)
        c = _fp32(_sgn(rng, (t, 16, 16)), ec, rng.integers(0, 2**23, (t, 16, 16)))
        c = np.where(rng.random((t, 16, 16)) < 0.1, 0, c).astype(np.uint32)
        batches.append((c, a, b, k))
    return batches


def _preset(k: int) -> pl.Accumulator:
    return pl.tensor_core("x86", "bf16", instruction="tdpbf16ps").replace(split_k=k)


def _mismatch(what, got, want, c, a, b) -> str:
    bad = np.argwhere(got != want)
    rows = [f"c {c[t, i, j]:#x} a {[hex(x) for x in a[t, i]]} b {[hex(x) for x in b[t, :, j]]}"
            f" -> hw {want[t, i, j]:#x}, model {got[t, i, j]:#x}"
            for t, i, j in bad[:3]]  # fmt: skip
    return f"{what}: {len(bad)} elements differ; first: " + "; ".join(rows)


@pytest.fixture(scope="module")
def amx_inputs(lib: ctypes.CDLL) -> dict[str, list[tuple]]:
    """(Built only where the harness runs.)"""
    return amx_classes(np.random.default_rng(37))


CLASSES = ["random words", "every exponent pair", "wide exponent spreads", "subnormals", "ties",
           "cancellation", "inf, NaN, zeros", "smallest normal's edge", "chains"]  # fmt: skip


def test_the_classes_reach_ten_million_outputs(amx_inputs):
    assert set(amx_inputs) == set(CLASSES)
    sizes = {name: sum(c.size for c, *_ in v) for name, v in amx_inputs.items()}
    assert sum(sizes.values()) >= N_MIN, sizes
    ks = {k for v in amx_inputs.values() for c, a, b, k in v if a.shape[-1] == k}
    assert ks == set(KS)  # one instruction at every even K from 2 to 32


@pytest.mark.parametrize("cls", CLASSES)
def test_tdpbf16ps_model_equals_the_hardware_bit_for_bit(lib, amx_inputs, cls):
    nan_seen = 0
    for c, a, b, k in amx_inputs[cls]:
        hw = hw_amx(lib, c, a, b, k)
        # MXCSR is ignored: round toward zero with FTZ and DAZ gives the same bits (a quarter)
        q = slice(0, max(1, c.shape[0] // 4))
        assert np.array_equal(hw_amx(lib, c[q], a[q], b[q], k, MXCSR_ODD), hw[q]), cls
        got = ci.tdpbf16ps(_v32(c), _v16(a), _v16(b), k).view(np.uint32)
        assert np.array_equal(got, hw), _mismatch(cls, got, hw, c, a, b)
        # the preset itself through pl.gemm: the same bits wherever the result is not NaN
        with np.errstate(all="ignore"):
            d = pl.gemm(_v16(a), _v16(b), _v32(c), input_format="bf16",
                        accumulator=_preset(k), input_rounding="exact")  # fmt: skip
        d = np.asarray(d, np.float32).view(np.uint32)
        nan = np.isnan(hw.view(np.float32))
        assert np.array_equal(np.isnan(d.view(np.float32)), nan)
        assert np.array_equal(d[~nan], hw[~nan]), _mismatch(cls, d, hw, c, a, b)
        nan_seen += int(nan.sum())
    if cls in ("random words", "inf, NaN, zeros"):
        assert nan_seen > 10_000  # the NaN rule is exercised


#: other models, each of which the hardware refutes on these inputs: (the change to the preset,
#: the class that shows it, the least number of non-NaN elements where it must differ)
ALTERNATIVES = [
    ({"lanes": None}, "cancellation", 10_000),  # one FMA chain (VDPBF16PS-like)
    ({"rounding": "toward_zero"}, "wide exponent spreads", 10_000),  # MXCSR.RC = RZ
    ({"tininess": "subnormal_grid"}, "smallest normal's edge", 10_000),
    ({"input_subnormals": "keep"}, "subnormals", 1_000),
    ({"input_subnormals": "flush"}, "every exponent pair", 1_000),  # DAZ to +0, not signed
    ({"subnormals": "keep", "tininess": "subnormal_grid"}, "smallest normal's edge", 10_000),
    ({"split_k": None}, "chains", 10_000),  # the chain's instructions as one
    ({"rounding": "nearest_away"}, "ties", 100_000),  # the ties are ties, broken to even
]


@pytest.mark.parametrize("change,cls,least", ALTERNATIVES)
def test_other_models_differ_from_the_hardware(lib, amx_inputs, change, cls, least):
    """The classes tell the preset from its neighbours: each alternative misses the hardware
    on many elements (so the bit-for-bit agreement above is not for want of cases)."""
    differ = 0
    for c, a, b, k in amx_inputs[cls]:
        hw = hw_amx(lib, c, a, b, k)
        acc = _preset(k).replace(**change)
        with np.errstate(all="ignore"):
            d = pl.gemm(_v16(a), _v16(b), _v32(c), input_format="bf16", accumulator=acc,
                        input_rounding="exact")  # fmt: skip
        d = np.asarray(d, np.float32).view(np.uint32)
        ok = ~np.isnan(hw.view(np.float32))
        differ += int((d[ok] != hw[ok]).sum())
        if differ >= least:
            break
    assert differ >= least, (change, cls, differ)


def test_tdpbf16ps_nan_rule_as_measured():
    """Runs on any CPU: single elements whose bits the Intel Xeon gave (one instruction, the
    rest of the tile ones), held to :func:`~precision_lab.gemm.cpu_instructions.tdpbf16ps`.
    Priority by position only (signalling or quiet alike): an FMA takes the A element's NaN,
    then B's, then the running sum's (so a later product's NaN wins within a lane); ``even +
    odd`` the even sum's; ``dest + tmp`` the destination's; invalid gives 0xffc00000."""
    one = 0x3F80

    def run(cw, a, b):
        d = ci.tdpbf16ps(_v32(np.uint32([[cw]])), _v16(np.uint16([a])), _v16(np.uint16(b)[:, None]))
        return int(d.view(np.uint32)[0, 0])

    cases = [  # (c, A's row, B's column, the hardware's result)
        (0x7FA00001, [0x7F81, one], [one, one], 0x7FE00001),  # c over a0
        (0, [0x7F81, 0x7F82], [one, one], 0x7FC10000),  # even over odd
        (0, [0x7F81, one], [0x7F83, one], 0x7FC10000),  # A over B
        (0, [one, 0x7F82], [0x7F83, one], 0x7FC30000),  # b0 (even) over a1 (odd)
        (0, [0x7F81, one, 0x7F84, one], [one] * 4, 0x7FC40000),  # a2 over the lane's a0
        (0, [one, 0x7F81, one, 0x7F84], [one] * 4, 0x7FC40000),  # a3 over a1
        (0, [0x7F81, one, one, 0x7F84], [one] * 4, 0x7FC10000),  # a0 (even) over a3
        (0, [0x7F81, one, one, one], [one, one, 0x7F85, one], 0x7FC50000),  # b2 over the sum
        (0, [0x7FC1, one, 0x7F84, one], [one] * 4, 0x7FC40000),  # no sNaN priority
        (0, [0x7F81, one, 0x7FC4, one], [one] * 4, 0x7FC40000),
        (0, [0xFF81, one], [one, one], 0xFFC10000),  # the sign kept
        (0x7F800001, [one, one], [one, one], 0x7FC00001),  # c quieted
        (0x7FA00001, [0x7F80, one], [0, one], 0x7FE00001),  # c over inf * 0
        (0, [0x7F80, 0x7F82], [0, one], 0xFFC00000),  # even's default NaN over odd's a1
        (0, [0x7F82, 0x7F80], [one, 0], 0x7FC20000),  # even's a0 over odd's default NaN
        (0, [0x7F80, 0xFF80], [one, one], 0xFFC00000),  # inf - inf
        (0xFF800000, [0x7F80, one], [one, one], 0xFFC00000),
        (0, [0x7F80, one, 0x7F84, one], [0, one, one, one], 0x7FC40000),  # a2 over inf * 0's
        (0, [0x7F84, one, 0x7F80, one], [one, one, 0, one], 0x7FC40000),  # the sum over inf*0
    ]
    got = [run(*x[:3]) for x in cases]
    assert got == [x[3] for x in cases], [hex(g) for g in got]
    # the destination's NaN across instructions (K = 64, two of 32): the first one's stays
    a = np.full((1, 64), one, np.uint16)
    a[0, 0], a[0, 33] = 0x7F81, 0x7F82
    b = np.full((64, 1), one, np.uint16)
    d = ci.tdpbf16ps(np.zeros((1, 1), np.float32), _v16(a), _v16(b), 32)
    assert int(d.view(np.uint32)[0, 0]) == 0x7FC10000


def test_probe_gemm_recovers_the_preset_from_the_hardware(lib):
    """FPRev-style targeted inputs (``+M``, ``-M`` among small units) on the hardware itself:
    ``pl.probe_gemm`` finds two interleaved lanes combined in turn and 32-element K-blocks
    added to C, with no hint from the preset; the found model is then the preset's order."""

    def fn(a, b, c):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        m, k = a.shape
        n = b.shape[1]
        kp = -(-k // 32) * 32  # whole instructions of 32 (zeros at the end)
        aa = np.zeros((1, 16, kp), np.uint16)
        bb = np.zeros((1, kp, 16), np.uint16)
        aa[0, :m, :k] = a.view(np.uint32) >> 16
        bb[0, :k, :n] = b.view(np.uint32) >> 16
        cc = np.zeros((1, 16, 16), np.uint32)
        cc[0, :m, :n] = np.asarray(c, np.float32).view(np.uint32)
        return hw_amx(lib, cc, aa, bb, 32)[0, :m, :n].view(np.float32)

    res = pl.probe_gemm(fn, input_format="bf16", shape=(16, 16), max_k=32, with_c=True,
                        long_k=200)  # fmt: skip
    acc = res.accumulator
    assert acc is not None, res.verdict
    want = _preset(32)
    fields = ("lanes", "lane_combine", "lane_tail", "split_k", "split_combine", "rounding",
              "product_format", "subnormals")  # fmt: skip
    assert {f: getattr(acc, f) for f in fields} == {f: getattr(want, f) for f in fields}
