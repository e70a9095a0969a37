"""The x86 AMX rows of ``pl.tensor_core`` (TDPBF16PS, TDPFP16PS) against an exact-rational
oracle of Intel's published pseudocode (issue 33), on any CPU. (TDPBF16PS is also measured
against AMX hardware where there is some: ``test_cpu_isa_amx.py``; it equals this oracle.)
Per output element and per instruction (32 K elements): two fp32 sums from +0, the even and
the odd elements' products, each a chain of FMAs in K order; then ``even + odd``; then ``dest +
that``; every step RNE with DAZ and FTZ (tininess after rounding).
"""

from __future__ import annotations

import math
from fractions import Fraction as F

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.gemm import cpu_instructions as ci
from precision_lab.gemm.accumulator import reference_only

TINY = 2.0**-126


def rne32(x: F) -> float:
    """``x`` rounded to 24 significant bits, nearest even, unbounded exponent (tininess after
    rounding), overflow to inf."""
    if x == 0:
        return 0.0
    s = -1 if x < 0 else 1
    m = abs(x)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if F(2) ** e > m:
        e -= 1
    q = F(2) ** (e - 23)
    n, r = divmod(m, q)
    if r * 2 > q or (r * 2 == q and n % 2):
        n += 1
    v = n * q
    return s * math.inf if v >= F(2) ** 128 else s * float(v)


def step(a: float, b: float) -> float:
    """``a + b`` (``b`` an exact product or a sum) rounded RNE into fp32 with FTZ after
    rounding; IEEE zero signs and special values."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a + b
    s = F(a) + F(b)
    if s == 0:
        return -0.0 if (math.copysign(1, a) < 0 and math.copysign(1, b) < 0) else 0.0
    v = rne32(s)
    return math.copysign(0.0, v) if abs(v) < TINY else v


def daz(v: float) -> float:
    return math.copysign(0.0, v) if abs(v) < TINY else v


def amx_oracle(c: float, a: list[float], b: list[float], daz_inputs: bool) -> float:
    """TDPBF16PS (``daz_inputs``) / TDPFP16PS as Intel's Operation section writes it, chained
    along K in instructions of 32 elements (16 pairs)."""
    if daz_inputs:
        a, b = [daz(x) for x in a], [daz(x) for x in b]
    dest = daz(c)  # the final add's DAZ=1 reads a subnormal destination as zero
    for k0 in range(0, len(a), ci.AMX_K):
        temp = [0.0, 0.0]
        for k in range(k0, min(k0 + ci.AMX_K, len(a))):
            temp[k % 2] = step(temp[k % 2], a[k] * b[k])  # exact product in float64
        dest = step(dest, step(temp[0], temp[1]))
    return dest


def same(x: float, y: float) -> bool:
    return (x == y and math.copysign(1, x) == math.copysign(1, y)) or (x != x and y != y)


def values(rng, fmt, shape, lo, hi, sub):
    """Values of ``fmt`` (bf16 or fp16) with exponents in [lo, hi), a fraction ``sub`` of
    them subnormal, random signs (-0 included)."""
    bits = {"bf16": 7, "fp16": 10}[fmt]
    e = rng.integers(lo, hi, shape)
    v = np.where(rng.random(shape) < 0.5, -1.0, 1.0) * (
        1 + rng.integers(0, 2**bits, shape) / 2**bits
    )
    v = np.ldexp(v, e)
    emin = {"bf16": -126, "fp16": -14}[fmt]
    tiny = rng.integers(-(2**bits) + 1, 2**bits, shape) * 2.0 ** (emin - bits)
    v = np.where(rng.random(shape) < sub, tiny, v)
    return np.where(rng.random(shape) < 0.02, -0.0, v)


def run(fmt, instruction, a, b, c):
    acc = pl.tensor_core("x86", fmt, instruction=instruction)
    with np.errstate(all="ignore"):
        d = pl.gemm(a[:, None, :], b[:, :, None], c[:, None, None], input_format=fmt,
                    accumulator=acc, input_rounding="exact")  # fmt: skip
    return np.asarray(d, dtype=np.float64)[:, 0, 0]


CASES = [
    # (format, instruction, exponent range of a and b, whether inputs are DAZ'd)
    ("bf16", "tdpbf16ps", (-66, -58), True),  # products near fp32's smallest normal: FTZ, DAZ
    ("bf16", "tdpbf16ps", (-4, 4), True),  # cancellation and rounding
    ("fp16", "tdpfp16ps", (-14, -8), False),  # fp16 subnormals kept, products tiny
    ("fp16", "tdpfp16ps", (-4, 4), False),
]


@pytest.mark.parametrize("k", [2, 6, 32, 34, 70])
@pytest.mark.parametrize("fmt,instruction,erange,daz_inputs", CASES)
def test_amx_preset_is_the_published_pseudocode(fmt, instruction, erange, daz_inputs, k):
    rng = np.random.default_rng(k * 1000 + erange[0] + 100)
    n = 200 if k < 64 else 80
    a = values(rng, fmt, (n, k), *erange, sub=0.15)
    b = values(rng, fmt, (n, k), *erange, sub=0.15)
    scale = 2.0 ** (2 * erange[0]) if erange[0] < -10 else 1.0
    c = np.where(rng.random(n) < 0.5, -1, 1) * rng.integers(0, 2**24, n) * 2.0**-24 * scale
    c = np.where(rng.random(n) < 0.1, c * 2.0**-30, c)  # some subnormal destinations
    c = np.asarray(pl.round_to(c, "fp32"), dtype=np.float64)
    d = run(fmt, instruction, a, b, c)
    for i in range(n):
        want = amx_oracle(float(c[i]), a[i].tolist(), b[i].tolist(), daz_inputs)
        assert same(float(d[i]), want), (c[i], a[i], b[i], d[i], want)


def test_amx_is_not_the_vdpbf16ps_chain():
    # the oracle tells the two lanes from one FMA chain: c = 1, a*b = [2**-24, 2**-24]: one
    # chain ties twice back to 1; two lanes sum to 2**-23 first, then 1 + 2**-23
    a, b, c = [2.0**-24, 2.0**-24], [1.0, 1.0], 1.0
    assert amx_oracle(c, a, b, True) == 1 + 2.0**-23
    d = run("bf16", "tdpbf16ps", np.array([a]), np.array([b]), np.array([c]))
    assert d[0] == 1 + 2.0**-23
    assert run("bf16", "vdpbf16ps", np.array([a]), np.array([b]), np.array([c]))[0] == 1.0
    # one instruction per 32 elements: at K = 34 the 33rd product starts a new pair of sums
    a34 = np.zeros((1, 34))
    a34[0, [0, 32]] = 2.0**-24
    b34 = np.ones((1, 34))
    d = run("bf16", "tdpbf16ps", a34, b34, np.ones(1))
    assert d[0] == 1.0 == amx_oracle(1.0, a34[0].tolist(), b34[0].tolist(), True)
    whole = pl.tensor_core("x86", "bf16", instruction="tdpbf16ps").replace(split_k=64)
    d = pl.gemm(a34[:, None, :], b34[:, :, None], np.ones((1, 1, 1)), input_format="bf16",
                accumulator=whole)[:, 0, 0]  # fmt: skip
    assert d[0] == 1 + 2.0**-23  # the same 34 products in one instruction's two lanes


def test_amx_fp16_keeps_fp16_subnormals_and_reads_a_subnormal_c_as_zero():
    # an fp16 subnormal input times 2**10 is an fp32 normal product: kept (no DAZ on fp16)
    a = np.array([[2.0**-24, 0.0]])
    b = np.array([[2.0**10, 0.0]])
    assert run("fp16", "tdpfp16ps", a, b, np.zeros(1))[0] == 2.0**-14
    assert run("bf16", "tdpbf16ps", a, b, np.zeros(1))[0] == 2.0**-14  # bf16: 2**-24 is normal
    # a subnormal destination is read as a zero of its sign (DAZ on the fp32 add): with fp16
    # inputs every non-zero sum is a multiple of 2**-48, which absorbs a subnormal c, so the
    # rule shows in the sign of a zero: -0 + (+0) = +0; without it -2**-130 + 0 flushes to -0
    c = np.array([-(2.0**-130)])
    zeros = np.zeros((1, 2))
    d = run("fp16", "tdpfp16ps", zeros, zeros, c)
    assert d[0] == 0 and math.copysign(1, d[0]) > 0
    assert same(amx_oracle(float(c[0]), [0.0, 0.0], [0.0, 0.0], False), 0.0)
    kept = pl.tensor_core("x86", "fp16", instruction="tdpfp16ps").replace(input_subnormals="keep")
    d = pl.gemm(zeros[:, None, :], zeros[:, :, None], c[:, None, None], input_format="fp16",
                accumulator=kept)[:, 0, 0]  # fmt: skip
    assert d[0] == 0 and math.copysign(1, d[0]) < 0


def test_amx_rows_and_evidence():
    rows = {r["instruction"]: r for r in pl.tensor_core.list("x86")}
    assert set(rows) == {"vdpbf16ps", "tdpbf16ps", "tdpfp16ps", "vfmadd231ph", "vdpphps",
                         *ci.AMX_FP8_INPUTS}  # fmt: skip
    ev = rows["tdpfp16ps"]["evidence"]
    assert ev.startswith("published: Intel") and "inferred: K = 32" in ev
    # TDPBF16PS: measured on an AMX Xeon (tests/gemm/test_cpu_isa_amx.py), equal to this oracle
    ev = rows["tdpbf16ps"]["evidence"]
    assert ev.startswith("measured: Intel Xeon") and "tininess after rounding" in ev
    assert ci.MEASURED_ON["tdpbf16ps"] == ci.INTEL_XEON
    assert pl.tensor_core("x86", "fp16").name == "x86 fp16 -> fp32 (tdpfp16ps)"
    assert pl.tensor_core("sapphirerapids", "bf16", instruction="tdpbf16ps").split_k == 32
    acc = pl.tensor_core("x86", "fp16")
    assert reference_only(acc) == "input_subnormals='flush_signed_c'"
