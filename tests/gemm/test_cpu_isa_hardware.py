"""The x86 BF16 instructions of this CPU against their presets, bit for bit (issue 33).

``cpu_isa/x86_bf16.cpp`` is compiled by the system C++ compiler into a temporary directory
(no ``-m`` flags: only its kernels carry target attributes) and loaded through ctypes; its
CPUID check skips these tests, saying why, on a CPU without AVX512-BF16 (or not x86-64, or
without a compiler). Where it runs, each instruction sees at least 10 million inputs of
named classes (random words, every exponent pair, subnormals, ties, inf/NaN, cancellation,
the smallest normal's edge), under the default MXCSR and under one with every switch the
instruction must ignore (round toward zero, FTZ, DAZ), and the model must give the same bits:

* VDPBF16PS: :func:`~precision_lab.gemm.cpu_instructions.vdpbf16ps` (every bit, NaN payloads
  included) on every lane: it is the preset ``pl.tensor_core("x86", "bf16",
  instruction="vdpbf16ps")`` through :func:`precision_lab.gemm` (one instruction, K = 2) on
  every lane whose result is not NaN, and the measured NaN rule on the others; the preset
  also on chains of 16 instructions (K = 32);
* VCVTNEPS2BF16 and VCVTNE2PS2BF16: :func:`~precision_lab.gemm.cpu_instructions.vcvtneps2bf16`
  and ``vcvtne2ps2bf16``.

Ran on: AMD EPYC 9004 (Zen 4, Genoa); Intel Xeon with AMX-BF16 and AVX512-FP16 (CPUID family 6,
model 167 as its VM reports): the same bits (``cpu_instructions.MEASURED_ON``).
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

SOURCE = Path(__file__).parent / "cpu_isa" / "x86_bf16.cpp"
#: at least this many inputs per instruction (the issue's bar)
N_MIN = 10_000_000


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The compiled harness (any x86-64 CPU loads it: only its kernels need AVX512-BF16)."""
    return build(tmp_path_factory, SOURCE, "AVX512-BF16")


@pytest.fixture(scope="module")
def lib(harness: ctypes.CDLL) -> ctypes.CDLL:
    """The harness where this CPU runs its kernels; a skip saying why elsewhere."""
    h = harness
    if not h.pl_has_avx512bf16():
        pytest.skip(
            "this CPU (or OS) has no AVX512-BF16 with AVX512F/VL and ZMM state: "
            "VDPBF16PS and VCVTNE(2)PS2BF16 cannot run here"
        )
    return h


def test_the_cpuid_check_agrees_with_the_kernel(harness):
    flags = cpu_flags()
    want = {"avx512f", "avx512vl", "avx512_bf16"} <= flags
    assert bool(harness.pl_has_avx512bf16()) == want


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


# ----- the hardware --------------------------------------------------------------------------
def hw_vdpbf16ps(h: ctypes.CDLL, c: np.ndarray, a: np.ndarray, b: np.ndarray, mxcsr: int):
    """c: fp32 words (n,), a, b: bf16 codes (n, 2) -> fp32 words."""
    n = c.size
    m = _pad16(n)
    cw = np.zeros(m, np.uint32)
    aw = np.zeros(m, np.uint32)
    bw = np.zeros(m, np.uint32)
    cw[:n] = c
    aw[:n] = a[:, 0].astype(np.uint32) | (a[:, 1].astype(np.uint32) << 16)
    bw[:n] = b[:, 0].astype(np.uint32) | (b[:, 1].astype(np.uint32) << 16)
    out = np.zeros(m, np.uint32)
    h.pl_vdpbf16ps(_p(cw), _p(aw), _p(bw), _p(out), ctypes.c_int64(m), ctypes.c_uint32(mxcsr))
    return out[:n]


def hw_cvt(h: ctypes.CDLL, x: np.ndarray, mxcsr: int) -> np.ndarray:
    n = x.size
    m = _pad16(n)
    xw = np.zeros(m, np.uint32)
    xw[:n] = x
    out = np.zeros(m, np.uint16)
    h.pl_vcvtneps2bf16(_p(xw), _p(out), ctypes.c_int64(m), ctypes.c_uint32(mxcsr))
    return out[:n]


def hw_cvt2(h: ctypes.CDLL, x: np.ndarray, y: np.ndarray, mxcsr: int) -> np.ndarray:
    """x, y: (n,) fp32 words, n a multiple of 16 -> (n // 16, 32) codes (one register each)."""
    n = x.size
    assert n % 16 == 0
    out = np.zeros(2 * n, np.uint16)
    xw, yw = np.ascontiguousarray(x), np.ascontiguousarray(y)
    h.pl_vcvtne2ps2bf16(_p(xw), _p(yw), _p(out), ctypes.c_int64(n), ctypes.c_uint32(mxcsr))
    return out.reshape(-1, 32)


# ----- input classes -------------------------------------------------------------------------
def _bf16(sign, exp, man) -> np.ndarray:
    return ((sign.astype(np.uint32) << 15) | (np.clip(exp, 0, 255).astype(np.uint32) << 7)
            | man.astype(np.uint32)).astype(np.uint16)  # fmt: skip


def _fp32(sign, exp, man) -> np.ndarray:
    return ((sign.astype(np.uint32) << 31) | (np.clip(exp, 0, 255).astype(np.uint32) << 23)
            | man.astype(np.uint32)).astype(np.uint32)  # fmt: skip


def _special16(rng, n):
    """bf16 codes from zeros, subnormals, inf, NaNs (several payloads) and normals, signed."""
    s = rng.integers(0, 2, n)
    kind = rng.integers(0, 6, n)
    man = rng.integers(0, 128, n)
    exp = np.select(
        [kind == 0, kind == 1, kind == 2, kind == 3],
        [np.zeros(n, int), np.zeros(n, int), np.full(n, 255), np.full(n, 255)],
        rng.integers(1, 255, n),
    )
    man = np.select([kind == 0, kind == 2, kind == 3], [0 * man, 0 * man, np.maximum(man, 1)],
                    man)  # fmt: skip
    return _bf16(s, exp, man)


def vdp_classes(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, ...]]:
    """Named classes of (c words, a codes (n, 2), b codes (n, 2)): 10.4 million lanes."""
    out = {}
    # 1. random words (every encoding, inf/NaN and subnormals included)
    n = 2_500_000
    out["random words"] = (
        rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32),
        rng.integers(0, 2**16, (n, 2)).astype(np.uint16),
        rng.integers(0, 2**16, (n, 2)).astype(np.uint16),
    )
    # 2. every exponent pair of the first product (256 x 256, 24 lanes each), the other
    #    product and c near it
    ea, eb = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    ea, eb = np.repeat(ea.ravel(), 24), np.repeat(eb.ravel(), 24)
    n = ea.size
    e_p = np.clip(ea + eb - 127, -30, 290)  # the product's biased exponent
    a = np.stack([_bf16(rng.integers(0, 2, n), rng.integers(1, 255, n), rng.integers(0, 128, n)),
                  _bf16(rng.integers(0, 2, n), ea, rng.integers(0, 128, n))], -1)  # fmt: skip
    b = np.stack([_bf16(rng.integers(0, 2, n), np.full(n, 127), rng.integers(0, 128, n)),
                  _bf16(rng.integers(0, 2, n), eb, rng.integers(0, 128, n))], -1)  # fmt: skip
    a[:, 0] = _bf16(rng.integers(0, 2, n), e_p + rng.integers(-30, 4, n),
                    rng.integers(0, 128, n))  # fmt: skip
    c = _fp32(rng.integers(0, 2, n), e_p + rng.integers(-26, 26, n), rng.integers(0, 2**23, n))
    out["every exponent pair"] = (c, a, b)
    # 3. subnormal inputs and results: exponents around the bottom of the range
    n = 1_500_000
    a = _bf16(rng.integers(0, 2, (n, 2)), rng.integers(0, 70, (n, 2)), rng.integers(0, 128, (n, 2)))
    b = _bf16(rng.integers(0, 2, (n, 2)), rng.integers(0, 70, (n, 2)) + 40,
              rng.integers(0, 128, (n, 2)))  # fmt: skip
    c = _fp32(rng.integers(0, 2, n), rng.integers(0, 6, n), rng.integers(0, 2**23, n))
    out["subnormals"] = (c, a, b)
    # 4. ties: c in [1, 2) * 2**e, the odd product exactly half an ulp of c (or 1.5, 2.5 ...),
    #    the even one zero, tiny or a quarter ulp
    n = 1_500_000
    e = rng.integers(60, 190, n)
    c = _fp32(rng.integers(0, 2, n), e, rng.integers(0, 2**23, n))
    half = _bf16(rng.integers(0, 2, n), e - 24, rng.choice([0, 64, 32, 96], n))  # 1, 1.5 ...
    pick = rng.integers(0, 3, n)
    even = np.select([pick == 0, pick == 1], [np.zeros(n, np.uint16),
                     _bf16(rng.integers(0, 2, n), e - 60, rng.integers(0, 128, n))],
                     _bf16(rng.integers(0, 2, n), e - 25, np.zeros(n, int)))  # fmt: skip
    a = np.stack([even, half], -1)
    one = _bf16(np.zeros(n, int), np.full(n, 127), np.zeros(n, int))
    b = np.stack([one, one], -1)
    out["ties"] = (c, a, b)
    # 5. cancellation: c = -(a1 * b1) (exact in fp32) plus a few ulps, a0 * b0 small
    n = 1_500_000
    a1 = _bf16(rng.integers(0, 2, n), rng.integers(70, 185, n), rng.integers(0, 128, n))
    b1 = _bf16(rng.integers(0, 2, n), rng.integers(70, 185, n), rng.integers(0, 128, n))
    with np.errstate(all="ignore"):
        p1 = (a1.astype(np.uint32) << 16).view(np.float32) * (b1.astype(np.uint32) << 16).view(
            np.float32
        )
    cw = (-p1).view(np.uint32).astype(np.int64) + rng.integers(-3, 4, n)
    c = np.where(np.isfinite(p1) & (p1 != 0), cw, 0).astype(np.uint32)
    e1 = ((a1 >> 7) & 0xFF).astype(int) + ((b1 >> 7) & 0xFF).astype(int) - 127
    a0 = _bf16(rng.integers(0, 2, n), e1 - rng.integers(8, 40, n), rng.integers(0, 128, n))
    b0 = _bf16(rng.integers(0, 2, n), np.full(n, 127), rng.integers(0, 128, n))
    out["cancellation"] = (c, np.stack([a0, a1], -1), np.stack([b0, b1], -1))
    # 6. inf, NaN (payloads), zeros of both signs, mixed with normals
    n = 1_000_000
    cs = _special16(rng, n).astype(np.uint32) << 16 | rng.integers(0, 2**16, n).astype(np.uint32)
    cs = np.where(((cs >> 23) & 0xFF) == 0xFF, cs & 0xFFFF0000 | ((cs & 0x7FFFFF) != 0), cs)
    out["inf, NaN, zeros"] = (
        cs.astype(np.uint32),
        np.stack([_special16(rng, n), _special16(rng, n)], -1),
        np.stack([_special16(rng, n), _special16(rng, n)], -1),
    )
    # 7. the smallest normal's edge (tininess): c = ±2**-126 (1 + k 2**-23), k small, products
    #    of +-2**-150 .. 2**-120
    n = 900_000
    c = _fp32(rng.integers(0, 2, n), rng.integers(1, 3, n), rng.integers(0, 4, n))
    a = _bf16(
        rng.integers(0, 2, (n, 2)), rng.integers(40, 70, (n, 2)), rng.integers(0, 128, (n, 2))
    )
    eb = np.full((n, 2), 127 - 70 + 3) + rng.integers(0, 6, (n, 2))
    b = _bf16(rng.integers(0, 2, (n, 2)), eb, rng.integers(0, 128, (n, 2)))
    out["smallest normal's edge"] = (c, a, b)
    return out


def _values32(words: np.ndarray) -> np.ndarray:
    return words.astype(np.uint32).view(np.float32)


def _values16(codes: np.ndarray) -> np.ndarray:
    return (codes.astype(np.uint32) << 16).view(np.float32)


def _mismatch(what: str, got: np.ndarray, want: np.ndarray, *inputs: np.ndarray) -> str:
    bad = np.nonzero(got != want)[0]
    i = bad[:4]
    rows = [
        " ".join(f"{x[j].tolist()!r}" for x in inputs) + f" -> hw {want[j]:#x}, model {got[j]:#x}"
        for j in i
    ]
    return f"{what}: {bad.size} lanes differ; first: " + "; ".join(rows)


@pytest.fixture(scope="module")
def vdp_inputs(lib: ctypes.CDLL) -> dict[str, tuple[np.ndarray, ...]]:
    """(Built only where the harness runs: no 10-million-lane arrays on other CPUs.)"""
    return vdp_classes(np.random.default_rng(33))


def test_the_classes_reach_ten_million_lanes(vdp_inputs):
    sizes = {k: v[0].size for k, v in vdp_inputs.items()}
    assert sum(sizes.values()) >= N_MIN, sizes
    assert all(v[1].shape == (v[0].size, 2) == v[2].shape for v in vdp_inputs.values())


@pytest.mark.parametrize("cls", [
    "random words", "every exponent pair", "subnormals", "ties", "cancellation",
    "inf, NaN, zeros", "smallest normal's edge",
])  # fmt: skip
def test_vdpbf16ps_model_equals_the_hardware_bit_for_bit(lib, vdp_inputs, cls):
    c, a, b = vdp_inputs[cls]
    hw = hw_vdpbf16ps(lib, c, a, b, MXCSR_DEFAULT)
    # MXCSR is ignored: round toward zero with FTZ and DAZ gives the same bits (a quarter)
    q = slice(0, c.size // 4)
    assert np.array_equal(hw_vdpbf16ps(lib, c[q], a[q], b[q], MXCSR_ODD), hw[q])
    got = ci.vdpbf16ps(_values32(c), _values16(a), _values16(b)).view(np.uint32)
    assert np.array_equal(got, hw), _mismatch(cls, got, hw, c, a, b)
    # (vdpbf16ps is pl.gemm with the preset on every lane whose result is not NaN: the
    # preset equals the hardware there; on NaN lanes pl.gemm gives a NaN, the quiet one)


def test_vdpbf16ps_is_the_preset_and_the_measured_nan_rule():
    rng = np.random.default_rng(36)
    n = 20_000
    c = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    a = rng.integers(0, 2**16, (n, 2)).astype(np.uint16)
    b = rng.integers(0, 2**16, (n, 2)).astype(np.uint16)
    got = ci.vdpbf16ps(_values32(c), _values16(a), _values16(b))
    with np.errstate(all="ignore"):
        d = pl.gemm(
            _values16(a)[:, None, :], _values16(b)[:, :, None], _values32(c)[:, None, None],
            input_format="bf16", accumulator=pl.tensor_core("x86", "bf16"),
            input_rounding="exact", backend="numpy",
        )[:, 0, 0]  # fmt: skip
    nan = np.isnan(d)
    assert np.array_equal(np.isnan(got), nan) and 200 < nan.sum() < n
    assert np.array_equal(got.view(np.uint32)[~nan], d.view(np.uint32)[~nan])
    assert (d.view(np.uint32)[nan] == 0x7FC00000).all()  # pl.gemm: the quiet NaN

    # the rule, lane by lane on a few: the first NaN of a1, b1, c (quieted), then of a0, b0 and
    # that; an invalid step without NaN operands gives 0xffc00000
    def one(x, y, z):
        src = np.uint32(z).view(np.float32)
        return ci.vdpbf16ps(src, _values16(np.uint16(x)), _values16(np.uint16(y))).view(np.uint32)

    nan_a0, nan_a1, nan_b1 = 0x7F81, 0xFFA5, 0x7F99
    assert int(one([nan_a0, nan_a1], [0, nan_b1], 0x7FA00001)) == 0x7FC10000  # a0 last, wins
    assert int(one([0, nan_a1], [0, nan_b1], 0x7FA00001)) == 0xFFE50000  # a1 over b1 and c
    assert int(one([0, 0], [0, nan_b1], 0x7FA00001)) == 0x7FD90000  # b1 over c
    assert int(one([0, 0], [0, 0], 0x7FA00001)) == 0x7FE00001  # c, quieted
    assert int(one([0x7F80, 0], [0, 0], 0)) == 0xFFC00000  # inf * 0: the default NaN


def test_vdpbf16ps_chains_equal_the_preset_on_k_32(lib):
    """A GEMM on VDPBF16PS: 16 instructions along K = 32, the output fed back as the
    accumulator, against pl.gemm with the preset (50 000 dot products)."""
    rng = np.random.default_rng(34)
    n, k = 50_000, 32
    e = rng.integers(100, 150, (n, k))
    a = _bf16(rng.integers(0, 2, (n, k)), e, rng.integers(0, 128, (n, k)))
    b = _bf16(rng.integers(0, 2, (n, k)), 254 - e + rng.integers(-3, 3, (n, k)),
              rng.integers(0, 128, (n, k)))  # fmt: skip
    c = _fp32(rng.integers(0, 2, n), rng.integers(120, 135, n), rng.integers(0, 2**23, n))
    d = c
    for i in range(0, k, 2):
        d = hw_vdpbf16ps(lib, d, a[:, i : i + 2], b[:, i : i + 2], MXCSR_DEFAULT)
    want = pl.gemm(_values16(a)[:, None, :], _values16(b)[:, :, None],
                   _values32(c)[:, None, None], input_format="bf16",
                   accumulator=pl.tensor_core("zen4", "bf16", instruction="vdpbf16ps"),
                   input_rounding="exact")[:, 0, 0].view(np.uint32)  # fmt: skip
    assert np.array_equal(want, d), _mismatch("K = 32 chains", want, d, c)
    # the order matters: the natural pair order gives other bits on some of them
    natural = pl.tensor_core("x86", "bf16").replace(pair_order="natural")
    other = pl.gemm(_values16(a)[:, None, :], _values16(b)[:, :, None],
                    _values32(c)[:, None, None], input_format="bf16", accumulator=natural,
                    input_rounding="exact")[:, 0, 0].view(np.uint32)  # fmt: skip
    assert (other != d).sum() > 100  # (365 of 50 000)


def cvt_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """fp32 words for the conversions, 10.5 million of them in named classes."""
    out = {}
    out["random words"] = rng.integers(0, 2**32, 4_000_000, dtype=np.uint64).astype(np.uint32)
    # every exponent (and sign) with the low half near the tie 0x8000 and near 0 / 0xffff
    n = 2_500_000
    low = np.concatenate([0x8000 + rng.integers(-3, 4, n // 2), rng.integers(0, 2**16, n - n // 2)])
    out["ties and every exponent"] = (
        _fp32(rng.integers(0, 2, n), rng.integers(0, 256, n), rng.integers(0, 128, n) << 16)
        | low.astype(np.uint32)
    ).astype(np.uint32)
    n = 1_500_000
    out["subnormals and the smallest normal"] = _fp32(
        rng.integers(0, 2, n), rng.integers(0, 3, n), rng.integers(0, 2**23, n)
    )
    n = 1_500_000
    out["inf and NaN payloads"] = _fp32(
        rng.integers(0, 2, n), np.full(n, 255), rng.integers(0, 2**23, n)
    )
    n = 1_000_000
    out["near the largest values"] = _fp32(
        rng.integers(0, 2, n), rng.integers(252, 255, n), (2**23 - 1) - rng.integers(0, 2**17, n)
    )
    return out


@pytest.fixture(scope="module")
def cvt_words(lib: ctypes.CDLL) -> dict[str, np.ndarray]:
    return cvt_inputs(np.random.default_rng(35))


def test_conversion_classes_reach_ten_million(cvt_words):
    assert sum(v.size for v in cvt_words.values()) >= N_MIN


def test_vcvtneps2bf16_equals_the_hardware_bit_for_bit(lib, cvt_words):
    for cls, x in cvt_words.items():
        hw = hw_cvt(lib, x, MXCSR_DEFAULT)
        q = slice(0, x.size // 4)
        assert np.array_equal(hw_cvt(lib, x[q], MXCSR_ODD), hw[q]), f"{cls}: MXCSR mattered"
        got = ci.vcvtneps2bf16(_values32(x))
        assert np.array_equal(got, hw), _mismatch(cls, got, hw, x)


def test_vcvtne2ps2bf16_equals_the_hardware_bit_for_bit(lib, cvt_words):
    words = np.concatenate(list(cvt_words.values()))
    words = words[: words.size // 32 * 32].reshape(-1, 2, 16)  # registers of two sources
    x, y = np.ascontiguousarray(words[:, 0]), np.ascontiguousarray(words[:, 1])
    hw = hw_cvt2(lib, x.ravel(), y.ravel(), MXCSR_DEFAULT)
    got = ci.vcvtne2ps2bf16(_values32(x), _values32(y))
    assert got.shape == hw.shape and 2 * x.size >= N_MIN
    assert np.array_equal(got, hw), _mismatch("vcvtne2ps2bf16", got.ravel(), hw.ravel())
