"""The AVX512-FP16 instructions of a CPU fp16 GEMM against their models, bit for bit (issue 33).

``cpu_isa/x86_fp16.cpp`` is compiled by the system C++ compiler into a temporary directory (no
``-m`` flags: only its kernels carry target attributes) and loaded through ctypes; its CPUID
check skips these tests, saying why, on a CPU without AVX512-FP16. Where it runs:

* VFMADD231PH (``dest = src2 * src3 + dest``, the form pinned by inline assembly): more than
  10 million fp16 FMAs of named classes (random words, every exponent pair, subnormal
  operands and results, ties, cancellation, inf/NaN/zeros, near the largest value, chains of
  16 along K), each under all four MXCSR.RC modes, and a quarter of them again with MXCSR.DAZ
  and FTZ set (the same bits: FP16 arithmetic ignores them), against
  :func:`~precision_lab.gemm.cpu_instructions.vfmadd231ph` (every bit, NaN payloads included)
  and the preset ``pl.tensor_core("x86", "fp16", instruction="vfmadd231ph")`` with that
  rounding through :func:`precision_lab.gemm` (the chains: one GEMM along K);
* VCVTPS2PHX (fp32 to fp16): more than 10 million fp32 words under all four modes, with and
  without DAZ and FTZ, against :func:`~precision_lab.gemm.cpu_instructions.vcvtps2phx`
  (:func:`~precision_lab.encode` with the mode; DAZ, which the fp32 source obeys, as a flag);
* VCVTPH2PSX (fp16 to fp32): every one of the 65536 codes under all 16 MXCSR settings of
  rounding, DAZ and FTZ, against :func:`~precision_lab.gemm.cpu_instructions.vcvtph2psx`.

Ran on: Intel Xeon with AMX-BF16 and AVX512-FP16 (CPUID family 6, model 167 as its VM reports)
(``cpu_instructions.MEASURED_ON``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from cpu_harness import build, cpu_flags
from cpu_harness import ptr as _p

import precision_lab as pl
from precision_lab.gemm import cpu_instructions as ci

SOURCE = Path(__file__).parent / "cpu_isa" / "x86_fp16.cpp"
N_MIN = 10_000_000
MODES = {"nearest_even": 0, "down": 1, "up": 2, "toward_zero": 3}
FTZ, DAZ = 1 << 15, 1 << 6


def mxcsr(mode: str, ftz: bool = False, daz: bool = False) -> int:
    return 0x1F80 | (MODES[mode] << 13) | (FTZ if ftz else 0) | (DAZ if daz else 0)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return build(tmp_path_factory, SOURCE, "AVX512-FP16")


@pytest.fixture(scope="module")
def lib(harness: ctypes.CDLL) -> ctypes.CDLL:
    if not harness.pl_has_avx512fp16():
        pytest.skip(
            "this CPU (or OS) has no AVX512-FP16 with AVX512F/BW/VL and ZMM state: "
            "VFMADD231PH, VCVTPS2PHX and VCVTPH2PSX cannot run here"
        )
    return harness


def test_the_cpuid_check_agrees_with_the_kernel(harness):
    flags = cpu_flags()
    want = {"avx512f", "avx512bw", "avx512vl", "avx512_fp16"} <= flags
    assert bool(harness.pl_has_avx512fp16()) == want


def _pad(x: np.ndarray, m: int) -> np.ndarray:
    n = x.shape[0]
    out = np.zeros((-(-n // m) * m, *x.shape[1:]), x.dtype)
    out[:n] = x
    return out


def hw_fma(h, c, a, b, csr: int) -> tuple[np.ndarray, int]:
    """c: (n,) fp16 codes; a, b: (n, k): the chain s = c; s = a[:, j] * b[:, j] + s."""
    n = c.size
    c, a, b = _pad(c, 32), np.ascontiguousarray(_pad(a, 32)), np.ascontiguousarray(_pad(b, 32))
    out = np.zeros(c.size, np.uint16)
    after = ctypes.c_uint32(0)
    h.pl_vfmadd231ph(_p(c), _p(a), _p(b), _p(out), ctypes.c_int64(c.size), ctypes.c_int(a.shape[1]),
                     ctypes.c_uint32(csr), ctypes.byref(after))  # fmt: skip
    return out[:n], after.value


def hw_cvt(h, x, csr: int) -> tuple[np.ndarray, int]:
    n = x.size
    x = _pad(x.astype(np.uint32), 16)
    out = np.zeros(x.size, np.uint16)
    after = ctypes.c_uint32(0)
    h.pl_vcvtps2phx(_p(x), _p(out), ctypes.c_int64(x.size), ctypes.c_uint32(csr),
                    ctypes.byref(after))  # fmt: skip
    return out[:n], after.value


def hw_cvt_back(h, x, csr: int) -> np.ndarray:
    n = x.size
    x = _pad(x.astype(np.uint16), 16)
    out = np.zeros(x.size, np.uint32)
    after = ctypes.c_uint32(0)
    h.pl_vcvtph2psx(_p(x), _p(out), ctypes.c_int64(x.size), ctypes.c_uint32(csr),
                    ctypes.byref(after))  # fmt: skip
    return out[:n]


# ----- input classes -------------------------------------------------------------------------
def _h(sign, exp, man) -> np.ndarray:
    return ((np.asarray(sign).astype(np.uint32) << 15)
            | (np.clip(exp, 0, 31).astype(np.uint32) << 10)
            | np.asarray(man).astype(np.uint32)).astype(np.uint16)  # fmt: skip


def _fp32(sign, exp, man) -> np.ndarray:
    return ((np.asarray(sign).astype(np.uint32) << 31)
            | (np.clip(exp, 0, 255).astype(np.uint32) << 23)
            | np.asarray(man).astype(np.uint32)).astype(np.uint32)  # fmt: skip


def _sgn(rng, shape):
    return rng.integers(0, 2, shape)


def fma_classes(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, ...]]:
    """Named classes of (c codes (n,), a codes (n, k), b codes (n, k))."""
    out = {}
    n = 3_000_000
    out["random words"] = (rng.integers(0, 2**16, n).astype(np.uint16),
                           rng.integers(0, 2**16, (n, 1)).astype(np.uint16),
                           rng.integers(0, 2**16, (n, 1)).astype(np.uint16))  # fmt: skip
    # every pair of exponent fields of a and b (0 .. 31: subnormals, inf/NaN included), 2000
    # each, c within 2**+-13 of the product
    ea, eb = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    ea, eb = np.repeat(ea.ravel(), 2000), np.repeat(eb.ravel(), 2000)
    n = ea.size
    ec = np.clip(ea + eb - 15 + rng.integers(-13, 14, n), 0, 30)
    out["every exponent pair"] = (
        _h(_sgn(rng, n), ec, rng.integers(0, 1024, n)),
        _h(_sgn(rng, n), ea, rng.integers(0, 1024, n))[:, None],
        _h(_sgn(rng, n), eb, rng.integers(0, 1024, n))[:, None],
    )
    # subnormal operands and results: products from 2**-40 to 2**-10, c subnormal or tiny
    n = 1_500_000
    out["subnormals"] = (
        _h(_sgn(rng, n), rng.integers(0, 4, n), rng.integers(0, 1024, n)),
        _h(_sgn(rng, n), rng.integers(0, 10, n), rng.integers(0, 1024, n))[:, None],
        _h(_sgn(rng, n), rng.integers(0, 21, n), rng.integers(0, 1024, n))[:, None],
    )
    # ties: a * b an odd multiple of half c's ulp (1, 3 or 5 halves), b = +-1 (or 1 + 2**-10:
    # no tie); c normal or subnormal
    n = 1_500_000
    ecf = rng.integers(0, 31, n)  # c's exponent field (0: subnormal, ulp 2**-24)
    ulp_e = np.maximum(ecf, 1) - 25  # log2 of c's ulp
    pick = rng.integers(0, 4, n)
    de = np.array([0, 1, 2, 2])[pick]
    man = np.array([0, 512, 256, 768])[pick]
    ae = ulp_e - 1 + de + 15  # a's biased exponent: half an ulp times 1, 1.5, 1.25, 1.75 ...
    sub = ae < 1  # below fp16's normals: a as a subnormal code of the same value
    a_code = np.where(sub, _h(_sgn(rng, n), 0, (1024 + man) >> np.clip(1 - ae, 0, 11)),
                      _h(_sgn(rng, n), ae, man))  # fmt: skip
    b_code = _h(_sgn(rng, n), np.full(n, 15), np.where(rng.random(n) < 0.1, 1, 0))
    out["ties"] = (_h(_sgn(rng, n), ecf, rng.integers(0, 1024, n)), a_code[:, None],
                   b_code[:, None])  # fmt: skip
    # cancellation: c = -(a * b) rounded to fp16, give or take a few codes
    n = 1_500_000
    a = _h(_sgn(rng, n), rng.integers(5, 25, n), rng.integers(0, 1024, n))
    b = _h(_sgn(rng, n), rng.integers(5, 25, n), rng.integers(0, 1024, n))
    with np.errstate(all="ignore"):
        p = a.view(np.float16).astype(np.float32) * b.view(np.float16).astype(np.float32)
        c = (-p).astype(np.float16).view(np.uint16).astype(np.int64) + rng.integers(-3, 4, n)
    c = np.where(np.isfinite(p), c & 0xFFFF, 0).astype(np.uint16)
    out["cancellation"] = (c, a[:, None], b[:, None])
    # inf, NaN (payloads), zeros, subnormals, normals
    n = 1_000_000

    def special(shape):
        kind = rng.integers(0, 6, shape)
        man = rng.integers(0, 1024, shape)
        exp = np.select([kind <= 1, kind <= 3], [0 * man, 0 * man + 31], rng.integers(1, 31, shape))
        man = np.select([kind == 0, kind == 2, kind == 3], [0 * man, 0 * man, np.maximum(man, 1)],
                        man)  # fmt: skip
        return _h(_sgn(rng, shape), exp, man)

    out["inf, NaN, zeros"] = (special(n), special((n, 1)), special((n, 1)))
    # near the largest value: products and c near 65504 (overflow by mode)
    n = 500_000
    out["near the largest value"] = (
        _h(_sgn(rng, n), rng.integers(28, 31, n), 1023 - rng.integers(0, 64, n)),
        _h(_sgn(rng, n), rng.integers(14, 17, n), rng.integers(0, 1024, n))[:, None],
        _h(_sgn(rng, n), rng.integers(28, 31, n), 1023 - rng.integers(0, 64, n))[:, None],
    )
    # chains of 16 (a GEMM's dot products along K): 100 000 lanes, 1.6 million FMAs
    n, k = 100_000, 16
    e = rng.integers(8, 22, (n, k))
    out["chains of 16"] = (
        _h(_sgn(rng, n), rng.integers(10, 22, n), rng.integers(0, 1024, n)),
        _h(_sgn(rng, (n, k)), e, rng.integers(0, 1024, (n, k))),
        _h(_sgn(rng, (n, k)), 30 - e + rng.integers(-4, 2, (n, k)), rng.integers(0, 1024, (n, k))),
    )
    return out


@pytest.fixture(scope="module")
def fma_inputs(lib) -> dict[str, tuple[np.ndarray, ...]]:
    return fma_classes(np.random.default_rng(38))


FMA_CLASSES = ["random words", "every exponent pair", "subnormals", "ties", "cancellation",
               "inf, NaN, zeros", "near the largest value", "chains of 16"]  # fmt: skip


def test_the_fma_classes_reach_ten_million(fma_inputs):
    assert list(fma_inputs) == FMA_CLASSES
    assert sum(a.size for c, a, b in fma_inputs.values()) >= N_MIN  # FMAs (chains: n * k)


def _f16(codes) -> np.ndarray:
    return np.asarray(codes, np.uint16).view(np.float16)


def _mismatch(what, got, want, *inputs) -> str:
    bad = np.nonzero(got != want)[0]
    rows = [" ".join(f"{x[j].tolist()!r}" for x in inputs) + f" -> hw {want[j]:#x}, model "
            f"{got[j]:#x}" for j in bad[:4]]  # fmt: skip
    return f"{what}: {bad.size} differ; first: " + "; ".join(rows)


@pytest.mark.parametrize("cls", FMA_CLASSES)
def test_vfmadd231ph_equals_the_hardware_bit_for_bit(lib, fma_inputs, cls):
    c, a, b = fma_inputs[cls]
    q = slice(0, c.size // 4)
    for mode in MODES:
        hw, after = hw_fma(lib, c, a, b, mxcsr(mode))
        # DAZ and FTZ are ignored by FP16 arithmetic: the same bits with both set
        hw_dz, _ = hw_fma(lib, c[q], a[q], b[q], mxcsr(mode, ftz=True, daz=True))
        assert np.array_equal(hw_dz, hw[q]), f"{cls} {mode}: DAZ/FTZ changed the result"
        acc = pl.tensor_core("x86", "fp16", instruction="vfmadd231ph").replace(rounding=mode)
        with np.errstate(all="ignore"):
            d = pl.gemm(_f16(a)[:, None, :], _f16(b)[:, :, None], _f16(c)[:, None, None],
                        input_format="fp16", accumulator=acc, out_format="fp16",
                        input_rounding="exact")  # fmt: skip
        d = np.asarray(d)[:, 0, 0].astype(np.float16).view(np.uint16)
        nan = np.isnan(_f16(hw))
        assert np.array_equal(np.isnan(_f16(d)), nan), cls
        assert np.array_equal(d[~nan], hw[~nan]), _mismatch(f"{cls} {mode}", d, hw, c, a, b)
        if a.shape[1] == 1:  # every bit, NaN payloads included
            got = ci.vfmadd231ph(_f16(c), _f16(a[:, 0]), _f16(b[:, 0]), mode).view(np.uint16)
            assert np.array_equal(got, hw), _mismatch(f"{cls} {mode}", got, hw, c, a, b)
        if cls == "random words":  # unlike AMX, FP16 arithmetic sets MXCSR's flags
            assert after & 0x3F == 0x3F & ~0x04  # IE DE OE UE PE (no divide by zero)


def test_subnormals_and_modes_are_seen(lib, fma_inputs):
    """The classes tell the model from its neighbours: flushing fp16 subnormals (as DAZ and
    FTZ would) and another rounding mode each miss the hardware on many FMAs."""
    c, a, b = fma_inputs["subnormals"]
    hw, _ = hw_fma(lib, c, a, b, mxcsr("nearest_even", ftz=True, daz=True))
    flush = pl.Accumulator("fp16", subnormals="flush", input_subnormals="flush_signed")
    with np.errstate(all="ignore"):
        d = pl.gemm(_f16(a)[:, None, :], _f16(b)[:, :, None], _f16(c)[:, None, None],
                    input_format="fp16", accumulator=flush, out_format="fp16",
                    input_rounding="exact")  # fmt: skip
    d = np.asarray(d)[:, 0, 0].astype(np.float16).view(np.uint16)
    assert (d != hw).sum() > 100_000
    c, a, b = fma_inputs["ties"]
    hw, _ = hw_fma(lib, c, a, b, mxcsr("nearest_even"))
    away = ci.vfmadd231ph(_f16(c), _f16(a[:, 0]), _f16(b[:, 0]), "nearest_away")
    assert (away.view(np.uint16) != hw).sum() > 100_000  # ties, broken to even


def test_vfmadd231ph_nan_rule_as_measured():
    """Runs on any CPU: the Intel Xeon's bits for NaN operands of ``a * b + c``."""
    one = 0x3C00

    def run(c, a, b):
        return int(ci.vfmadd231ph(_f16([c]), _f16([a]), _f16([b])).view(np.uint16)[0])

    assert run(0, 0x7C01, 0x7C02) == 0x7E01  # a over b
    assert run(0x7C03, one, 0x7C02) == 0x7E02  # b over c
    assert run(0x7C03, 0x7C01, one) == 0x7E01  # a over c
    assert run(0, 0x7C01, 0x7E02) == 0x7E01  # by position, not signalling first
    assert run(0x7E03, 0x7C01, one) == 0x7E01
    assert run(0, 0x7C00, 0) == 0xFE00  # inf * 0: the default NaN
    assert run(0x7C03, 0x7C00, 0) == 0x7E03  # a NaN operand over the invalid operation
    assert run(0xFC00, 0x7C00, one) == 0xFE00  # inf - inf
    assert run(0, 0xFC05, one) == 0xFE05  # the sign kept


# ----- conversions ---------------------------------------------------------------------------
def cvt_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """fp32 words, 11 million of them in named classes."""
    out = {}
    out["random words"] = rng.integers(0, 2**32, 4_000_000, dtype=np.uint64).astype(np.uint32)
    n = 2_500_000  # every exponent of fp16's range and around it, the low 13 bits near the tie
    low = np.concatenate([0x1000 + rng.integers(-3, 4, n // 2), rng.integers(0, 2**13, n - n // 2)])
    out["ties and every exponent"] = (
        _fp32(_sgn(rng, n), rng.integers(85, 150, n), rng.integers(0, 1024, n) << 13)
        | low.astype(np.uint32)
    ).astype(np.uint32)
    n = 1_500_000
    out["fp32 subnormals"] = _fp32(_sgn(rng, n), rng.integers(0, 2, n), rng.integers(0, 2**23, n))
    n = 1_500_000  # fp16 subnormal results: 2**-25 .. 2**-14, and below
    out["fp16 subnormal results"] = _fp32(
        _sgn(rng, n), rng.integers(95, 114, n), rng.integers(0, 2**23, n)
    )
    n = 1_000_000
    out["near the largest value"] = _fp32(
        _sgn(rng, n), rng.integers(141, 145, n), (2**23 - 1) - rng.integers(0, 2**15, n)
    )
    n = 500_000
    out["inf and NaN payloads"] = _fp32(_sgn(rng, n), np.full(n, 255), rng.integers(0, 2**23, n))
    return out


@pytest.fixture(scope="module")
def cvt_words(lib) -> dict[str, np.ndarray]:
    return cvt_inputs(np.random.default_rng(39))


def test_conversion_classes_reach_ten_million(cvt_words):
    assert sum(v.size for v in cvt_words.values()) >= N_MIN


def test_vcvtps2phx_equals_the_hardware_bit_for_bit(lib, cvt_words):
    differ_daz = 0
    for cls, x in cvt_words.items():
        q = slice(0, x.size // 4)
        for mode in MODES:
            hw, _ = hw_cvt(lib, x, mxcsr(mode))
            got = ci.vcvtps2phx(x.view(np.float32), mode)
            assert np.array_equal(got, hw), _mismatch(f"{cls} {mode}", got, hw, x)
            # FTZ is ignored (fp16 subnormal results kept); DAZ reads fp32 subnormals as zeros
            hw_f, _ = hw_cvt(lib, x[q], mxcsr(mode, ftz=True))
            assert np.array_equal(hw_f, hw[q]), f"{cls} {mode}: FTZ changed the result"
            hw_d, _ = hw_cvt(lib, x[q], mxcsr(mode, ftz=True, daz=True))
            got = ci.vcvtps2phx(x[q].view(np.float32), mode, daz=True)
            assert np.array_equal(got, hw_d), _mismatch(f"{cls} {mode} DAZ", got, hw_d, x[q])
            differ_daz += int((hw_d != hw[q]).sum())
    assert differ_daz > 100_000  # (DAZ shows: fp32 subnormals rounded up or down)


def test_vcvtph2psx_every_code_under_every_mxcsr(lib):
    codes = np.arange(2**16, dtype=np.uint16)
    want = ci.vcvtph2psx(codes).view(np.uint32)
    for mode in MODES:
        for ftz in (False, True):
            for daz in (False, True):
                hw = hw_cvt_back(lib, codes, mxcsr(mode, ftz, daz))
                assert np.array_equal(want, hw), _mismatch(f"{mode} {ftz} {daz}", want, hw, codes)
