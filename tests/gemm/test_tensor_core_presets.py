"""The matrix-core presets of issue 20 against their published descriptions.

Each model is re-derived here with exact ``fractions.Fraction`` arithmetic from the description
it cites (MMA-Sim, Xie et al., arXiv 2511.10909: T-FDPA, ST-FDPA, GST-FDPA for NVIDIA; FMA
chains, E-FDPA, FTZ mul-add, TR-FDPA and GTR-FDPA for AMD) and compared bit for bit with
``pl.gemm`` / ``pl.gemm_blocks`` under the preset, on random operands over several blocks (so
that chaining is checked too) and on hand-made cases. The oracles avoid exact zero products
and overflow, whose rules are the special-value fields of the accumulator (tested with them).
"""

from __future__ import annotations

import math
from fractions import Fraction as Fr

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.backends.native import kernels as native_kernels
from precision_lab.gemm import native_backend
from precision_lab.gemm.tensor_core import GPUS, INSTRUCTIONS, PRESETS, tensor_core_list

F32, F16, F64 = pl.get_format("fp32"), pl.get_format("fp16"), pl.get_format("fp64")


# ----- exact helpers --------------------------------------------------------------------------
def _flog2(x: Fr) -> int:
    """floor(log2 |x|) of a non-zero rational."""
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fr(2) ** e > x:
        e -= 1
    return e


def _e(x: Fr, emin: int) -> int:
    return max(_flog2(x), emin)


def _cut(x: Fr, q: Fr, mode: str) -> Fr:
    v = x / q
    n = math.floor(v) if mode == "floor" else math.trunc(v)
    return n * q


def _round(x: Fr, fmt, mode: str) -> Fr:
    """x onto fmt's grid: 'rz' (toward zero) or 'rne'; no overflow in these tests."""
    if x == 0:
        return Fr(0)
    q = Fr(2) ** (_e(x, fmt.emin) - fmt.mantissa_bits)
    v = abs(x) / q
    if mode == "rz":
        n = math.floor(v)
    else:
        n = math.floor(v)
        rest = v - n
        if rest > Fr(1, 2) or (rest == Fr(1, 2) and n % 2):
            n += 1
    out = n * q
    assert out <= Fr(fmt.max), "the oracle does not model overflow"
    return out if x > 0 else -out


def _grid_values(fmt, rng, shape, lo=-6, hi=6):
    """Random non-zero values of fmt (exponents in [lo, hi] where the format has them)."""
    x = rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(lo, hi, shape))
    v = pl.round_to(x, fmt).astype(np.float64)
    v[v == 0] = fmt.smallest_subnormal
    return v


def _tfdpa_chain(a, b, c, fa, fb, block, F, acc_fmt, mode):
    """NVIDIA T-FDPA chained over blocks: products and the running value aligned to the largest
    exponent, truncated to F fraction bits, summed exactly, rounded into acc_fmt."""
    r = Fr(c)
    for j0 in range(0, len(a), block):
        terms = []
        for x, y in zip(a[j0 : j0 + block], b[j0 : j0 + block], strict=True):
            p = Fr(x) * Fr(y)
            if p != 0:
                terms.append((p, _e(Fr(x), fa.emin) + _e(Fr(y), fb.emin)))
        if r != 0:
            terms.append((r, _e(r, acc_fmt.emin)))
        if not terms:
            r = Fr(0)
            continue
        q = Fr(2) ** (max(e for _, e in terms) - F)
        r = _round(sum(_cut(t, q, "trunc") for t, _ in terms), acc_fmt, mode)
    return r


def _row_gemm(a, b, c, fmt, acc, out="fp32", backend="auto"):
    """pl.gemm on rows: a (n, K), b (n, K) -> n results."""
    fa = fmt if isinstance(fmt, tuple) else (fmt, fmt)
    d = pl.gemm(a[:, None, :], b[:, :, None], np.asarray(c, np.float64)[:, None, None],
                input_format=fa, accumulator=acc, out_format=out, input_rounding="exact",
                backend=backend)  # fmt: skip
    return d[:, 0, 0].astype(np.float64)


# ----- NVIDIA T-FDPA presets ------------------------------------------------------------------
NV_CASES = [
    # gpu, input formats, instruction, out, block, fraction bits, accumulator format, rounding
    ("b200", ("e4m3", "e4m3"), "tcgen05", "fp32", 32, 25, F32, "rz"),
    ("b200", ("e5m2", "e2m1"), "tcgen05", "fp32", 32, 25, F32, "rz"),
    ("b200", ("e2m3", "e3m2"), "tcgen05", "fp16", 32, 25, F16, "rne"),
    ("b200", ("fp16", "fp16"), "tcgen05", "fp32", 16, 25, F32, "rz"),
    ("b200", ("bf16", "bf16"), "tcgen05", "fp32", 16, 25, F32, "rz"),
    ("b200", ("tf32", "tf32"), "tcgen05", "fp32", 8, 25, F32, "rz"),
    ("t4", ("fp16", "fp16"), "mma", "fp32", 8, 24, F32, "rz"),
    ("rtx2080", ("fp16", "fp16"), "mma", "fp16", 8, 24, F16, "rne"),
    ("rtx5090", ("e2m1", "e4m3"), "mma", "fp32", 32, 25, F32, "rz"),
    ("rtxpro6000", ("e4m3", "e5m2"), "mma", "fp16", 32, 25, F16, "rne"),
    ("rtx5090", ("fp16", "fp16"), "mma", "fp32", 16, 25, F32, "rz"),
    ("h100", ("e4m3", "e4m3"), "wgmma", "fp16", 32, 13, F16, "rne"),
    ("h200", ("e5m2", "e4m3"), "wgmma", "fp16", 32, 13, F16, "rne"),
]


@pytest.mark.parametrize("case", NV_CASES, ids=lambda c: f"{c[0]}-{c[2]}-{'x'.join(c[1])}-{c[3]}")
def test_nvidia_block_fma_matches_the_fraction_model(case):
    gpu, (fa_n, fb_n), ins, out, block, bits, acc_fmt, mode = case
    fa, fb = pl.get_format(fa_n), pl.get_format(fb_n)
    acc = pl.tensor_core(gpu, (fa_n, fb_n), out_format=out, instruction=ins)
    assert (acc.block, acc.align_bits, acc.format) == (block, bits, acc_fmt)
    rng = np.random.default_rng(block * bits)
    k = 3 * block
    a = _grid_values(fa, rng, (40, k))
    b = _grid_values(fb, rng, (40, k))
    c = pl.round_to(rng.uniform(-4, 4, 40), out).astype(np.float64)
    got = _row_gemm(a, b, c, (fa_n, fb_n), acc, out)
    want = [float(_tfdpa_chain(a[i], b[i], c[i], fa, fb, block, bits, acc_fmt, mode))
            for i in range(40)]  # fmt: skip
    assert got.tolist() == want


def test_tcgen05_f8f6f4_is_one_32_product_block_with_25_bits():
    # 1 + 2**-18 (k=0, k=31) survives one block of 32 with 25 fraction bits; 13 bits (Hopper
    # wgmma) lose it. b200's default for FP8 is tcgen05.
    acc = pl.tensor_core("b200", "e4m3")
    assert acc == pl.tensor_core("b200", "e4m3", instruction="tcgen05.kind::f8f6f4")
    assert "tcgen05.mma kind::f8f6f4" in acc.describe()
    a = np.zeros((1, 32))
    b = np.zeros((1, 32))
    a[0, 0], b[0, 0] = 1.0, 1.0
    a[0, 31], b[0, 31] = 2.0**-9, 2.0**-9
    assert _row_gemm(a, b, [0.0], "e4m3", acc)[0] == 1 + 2.0**-18
    assert _row_gemm(a, b, [0.0], "e4m3", pl.tensor_core("h100", "e4m3"))[0] == 1.0
    # 256 - 2**-18 - 2**-18: bits below 2**(8 - 25) are truncated (toward zero) term by term,
    # so the block is 256; the exact 256 - 2**-17 would round toward zero to 256 - 2**-16
    a[0, 0], b[0, 0] = 16.0, 16.0
    a[0, 30], b[0, 30] = -(2.0**-9), 2.0**-9
    a[0, 31], b[0, 31] = -(2.0**-9), 2.0**-9
    assert _row_gemm(a, b, [0.0], "e4m3", acc)[0] == 256.0
    emu = pl.tensor_core("b200", "e4m3", instruction="mma")
    assert emu.inner_block == 16 and "mma.m16n8k32" in emu.describe()


def test_turing_keeps_24_bits_in_blocks_of_8():
    acc = pl.tensor_core("t4", "fp16")
    assert pl.tensor_core("rtx2080", "fp16") == acc
    tiny = [2.0**-10, 2.0**-14]  # a product of 2**-24: 24 bits below the anchor 1

    def dot(sign, *tail):
        a = np.array([[1.0, sign * tiny[0], sign * tiny[0], *tail] + [0.0] * (5 - len(tail))])
        b = np.array([[1.0, tiny[1], tiny[1] / (2 if sign < 0 else 1)] + [0.0] * 5])
        if sign < 0:
            b[0, 1] /= 2
        return _row_gemm(a, b, [0.0], "fp16", acc)[0]

    # 1 + 2**-24 + 2**-24: 24 bits keep both (23 would give 1)
    assert dot(1) == 1 + 2.0**-23
    # 1 - 2**-25 - 2**-25: 24 bits truncate both toward zero (25 would give 1 - 2**-24)
    assert dot(-1) == 1.0
    # a ninth product starts the next block: 1 + 2**-23 (block 1) then + 1 (block 2) = 2
    a = np.array([[1.0] + [0.0] * 7 + [1.0]])
    b = np.array([[1.0] + [0.0] * 7 + [1.0]])
    assert _row_gemm(a, b, [2.0**-23], "fp16", acc)[0] == 2.0


def test_hopper_wgmma_fp8_with_an_fp16_accumulator_keeps_13_bits_and_rounds_to_nearest():
    acc = pl.tensor_core("h100", "e4m3", out_format="fp16")  # what libraries issue: wgmma
    assert acc.format == F16 and acc.align_bits == 13 and acc.block == 32
    assert "wgmma" in acc.describe()
    # 1 + 2**-11 + 2**-13: 13 bits keep both, fp16 rounds to nearest: 1 + 2**-10
    a = np.array([[1.0, 2.0**-5, 2.0**-6] + [0.0] * 29])
    b = np.array([[1.0, 2.0**-6, 2.0**-7] + [0.0] * 29])
    assert _row_gemm(a, b, [0.0], "e4m3", acc, "fp16")[0] == 1 + 2.0**-10
    # the measured mma.sync emulation rounds the first fp16 MMA (1 + 2**-11 -> 1) first
    emu = pl.tensor_core("h100", "e4m3", out_format="fp16", instruction="mma")
    assert _row_gemm(a, b, [0.0], "e4m3", emu, "fp16")[0] == 1.0


# ----- block-scaled MMA (ST-FDPA, GST-FDPA) ---------------------------------------------------
def _operands(fmt, m, k, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-8, 8, (m, 1)))
    x[1] *= 2.0**-17  # NVFP4: subnormal UE4M3 block scales
    w = rng.standard_normal((k, n)) * np.exp2(rng.integers(-8, 8, (1, n)))
    return pl.quantize_blocks(x, fmt), pl.quantize_blocks(w, fmt, axis=0)


def _per_element(q, axis):
    s = np.asarray(q.scales, np.float64)
    return np.repeat(s, q.block_format.block_shape[0], axis=axis)[
        tuple(slice(0, d) for d in q.shape)
    ]


def _st_oracle(qa, qb, c):
    """ST-FDPA (kind::mxf8f6f4): per 32 products, e(p) = e(a) + e(b) + log2(sa) + log2(sb);
    c in the block; 25 bits; toward zero into fp32."""
    va, vb = qa.element_values().astype(np.float64), qb.element_values().astype(np.float64)
    sa, sb = _per_element(qa, 1), _per_element(qb, 0)
    ea, eb = qa.block_format.element, qb.block_format.element
    m, k = va.shape
    n = vb.shape[1]
    out = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            r = Fr(c)
            for j0 in range(0, k, 32):
                terms = []
                for t in range(j0, min(j0 + 32, k)):
                    p = Fr(va[i, t]) * Fr(vb[t, j])
                    if p != 0:
                        e = _e(Fr(va[i, t]), ea.emin) + _e(Fr(vb[t, j]), eb.emin)
                        e += _flog2(Fr(sa[i, t])) + _flog2(Fr(sb[t, j]))
                        terms.append((p * Fr(sa[i, t]) * Fr(sb[t, j]), e))
                if r != 0:
                    terms.append((r, _e(r, F32.emin)))
                if not terms:
                    r = Fr(0)
                    continue
                q = Fr(2) ** (max(e for _, e in terms) - 25)
                r = _round(sum(_cut(v, q, "trunc") for v, _ in terms), F32, "rz")
            out[i, j] = float(r)
    return out


def _gst_oracle(qa, qb, c, scale_emin):
    """GST-FDPA (kind::mxf4nvf4): per 64 products, groups of 16 summed exactly, times the
    scales, aligned at e(sa) + e(sb) with c; 35 bits; toward zero into fp32."""
    va, vb = qa.element_values().astype(np.float64), qb.element_values().astype(np.float64)
    sa, sb = _per_element(qa, 1), _per_element(qb, 0)
    m, k = va.shape
    n = vb.shape[1]
    out = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            r = Fr(c)
            for j0 in range(0, k, 64):
                terms = []
                for g0 in range(j0, min(j0 + 64, k), 16):
                    val = sum(Fr(va[i, t]) * Fr(vb[t, j]) for t in range(g0, g0 + 16))
                    if val != 0:
                        s_a, s_b = Fr(sa[i, g0]), Fr(sb[g0, j])
                        e = _e(s_a, scale_emin) + _e(s_b, scale_emin)
                        terms.append((val * s_a * s_b, e))
                if r != 0:
                    terms.append((r, _e(r, F32.emin)))
                if not terms:
                    r = Fr(0)
                    continue
                q = Fr(2) ** (max(e for _, e in terms) - 35)
                r = _round(sum(_cut(v, q, "trunc") for v, _ in terms), F32, "rz")
            out[i, j] = float(r)
    return out


@pytest.mark.parametrize("backend", ["numpy", "native"])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp4_e2m1"])
@pytest.mark.parametrize("gpu", ["b200", "rtx5090"])
def test_mxf8f6f4_scales_enter_the_block_fma(fmt, gpu, backend):
    if backend == "native" and not native_kernels.available():
        pytest.skip("precision_lab.backends._native_kernels is not built")
    ins = "tcgen05" if gpu == "b200" else "mma"
    acc = pl.tensor_core(gpu, fmt, instruction=f"{ins}.kind::mxf8f6f4")
    assert acc.scales == "in_block" and acc.block == 32 and acc.align_bits == 25
    qa, qb = _operands(fmt, 4, 96, 3, seed=len(fmt))
    c = np.full((4, 3), 0.375)
    got = pl.gemm_blocks(qa, qb, c, accumulator=acc, backend=backend).astype(np.float64)
    np.testing.assert_array_equal(got, _st_oracle(qa, qb, 0.375))


@pytest.mark.parametrize(
    ("gpu", "fmt", "scale_emin"),
    [
        ("b200", "nvfp4", -6),
        ("b200", "mxfp4_e2m1", -127),
        ("b200", "mxfp4_e2m1_b16", -127),
        ("rtx5090", "nvfp4", -6),
        ("rtx5090", "nvfp4_b32", -6),  # sm_120 only: UE4M3 scales on blocks of 32
    ],
)
@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_mxf4nvf4_groups_of_16_and_35_bits(gpu, fmt, scale_emin, backend):
    if backend == "native" and not native_kernels.available():
        pytest.skip("precision_lab.backends._native_kernels is not built")
    acc = pl.tensor_core(gpu, fmt, instruction="tcgen05" if gpu == "b200" else "mma")
    assert (acc.block, acc.group, acc.align_bits) == (64, 16, 35)
    qa, qb = _operands(fmt, 3, 128, 2, seed=7)
    c = np.array([[0.0, -1.5], [2.0**-20, 3.0], [-7.25, 0.0]])
    kw: dict = {"backend": backend}
    if qa.tensor_scale != 1 or qb.tensor_scale != 1:  # NVFP4's per-tensor scales: no c
        got = pl.gemm_blocks(qa, qb, accumulator=acc, **kw).astype(np.float64)
        alpha = np.float32(qa.tensor_scale) * np.float32(qb.tensor_scale)
        want = pl.round_to(_gst_oracle(qa, qb, 0.0, scale_emin) * float(alpha), "fp32")
    else:
        got = pl.gemm_blocks(qa, qb, c, accumulator=acc, **kw).astype(np.float64)
        want = np.array([[float(_gst_oracle(qa, qb, c[i, j], scale_emin)[i, j])
                          for j in range(2)] for i in range(3)])  # fmt: skip
    np.testing.assert_array_equal(got, want)


def test_nvfp4_operands_have_subnormal_ue4m3_scales():
    # the GST oracle test above clamps their exponents at -6 (UE4M3's emin): make sure the
    # operands it draws have such scales, so that the clamp is exercised
    qa, qb = _operands("nvfp4", 3, 128, 2, seed=7)
    scales = np.concatenate([np.ravel(qa.scales), np.ravel(qb.scales)]).astype(np.float64)
    assert ((scales > 0) & (scales < 2.0**-6)).any()


def test_every_block_format_of_the_table_is_a_named_block_format():
    # the table's input_format names are what users pass to quantize_blocks and tensor_core
    rows = [r for r in pl.tensor_core.list() if r["kind"].startswith("kind::mx")]
    names = {name for r in rows for name in r["input_format"].split(" x ")}  # (mixed: "a x b")
    assert {"mxfp4_e2m1_b16", "nvfp4_b32"} <= names
    for name in names:
        bf = pl.get_block_format(name)
        assert bf.name == name
        gpu = next(r["gpus"].split()[0] for r in rows if r["input_format"] == name)
        assert pl.tensor_core(gpu, bf) == pl.tensor_core(gpu, name)
    assert pl.get_block_format("nvfp4_b32").block_shape == (32,)
    assert str(pl.get_block_format("mxfp4_e2m1_b16").scale) == "e8m0"


def test_gemm_blocks_checks_the_presets_scale_format():
    qa, qb = _operands("mxfp4_e2m1", 2, 64, 2, seed=1)
    with pytest.raises(ValueError, match=r"accumulator: .*takes e4m3 scales.*e8m0"):
        pl.gemm_blocks(qa, qb, accumulator=pl.tensor_core("b200", "nvfp4"))


# ----- FP64 DMMA and FMA chains -----------------------------------------------------------------
def test_fp64_dmma_is_an_exactly_rounded_fma_chain():
    rng = np.random.default_rng(5)
    k = 12
    a = rng.standard_normal((60, k)) * np.exp2(rng.integers(-40, 40, (60, k)))
    b = rng.standard_normal((60, k)) * np.exp2(rng.integers(-40, 40, (60, k)))
    c = rng.standard_normal(60)
    # hard cases: the low half of a*b decides the rounding
    a[:2], b[:2] = 0.0, 0.0
    a[0, :2], b[0, :2], c[0] = [1 + 2.0**-52, 0.0], [1 - 2.0**-52, 0.0], -1.0
    a[1, :2], b[1, :2], c[1] = [1 + 2.0**-30, 1.0], [1 + 2.0**-30, -(2.0**-60)], -1.0
    for gpu in ("a100", "h100", "mi250", "mi300x"):
        acc = pl.tensor_core(gpu, "fp64", out_format="fp64")
        got = _row_gemm(a, b, c, "fp64", acc, "fp64")
        for i in range(60):
            r = Fr(c[i])
            for x, y in zip(a[i], b[i], strict=True):
                r = _round(r + Fr(x) * Fr(y), F64, "rne")
            assert got[i] == float(r), (gpu, i)
    assert got[0] == -(2.0**-104)  # a plain float64 multiply-add gives 0
    assert got[1] == 2.0**-29  # RN(-1 + (1 + 2**-30)**2) = 2**-29 + 2**-60 exactly, then - 2**-60


def test_fp64_inputs_need_an_fp64_fma_chain():
    with pytest.raises(
        ValueError, match="input_format fp64 x fp64: at most 26 significant bits are supported"
    ):
        pl.gemm(np.ones((1, 2)), np.ones((2, 1)), input_format="fp64", accumulator="fp32")
    with pytest.raises(ValueError, match=r"out_format: a100 .*fp64 inputs output fp64"):
        pl.tensor_core("a100", "fp64")


def test_amd_f32_mfma_is_an_fp32_fma_chain():
    rng = np.random.default_rng(3)
    a = pl.round_to(rng.standard_normal((30, 8)), "fp32").astype(np.float64)
    b = pl.round_to(rng.standard_normal((30, 8)), "fp32").astype(np.float64)
    c = rng.standard_normal(30)
    for gpu in ("mi100", "mi210", "mi300a"):
        got = _row_gemm(a, b, pl.round_to(c, "fp32"), "fp32", pl.tensor_core(gpu, "fp32"))
        for i in range(30):
            r = Fr(float(np.float32(c[i])))
            for x, y in zip(a[i], b[i], strict=True):
                r = _round(r + Fr(x) * Fr(y), F32, "rne")
            assert got[i] == float(r)


# ----- AMD CDNA1 (E-FDPA), CDNA2 (FTZ mul-add), CDNA3 (TR-FDPA, GTR-FDPA) ----------------------
@pytest.mark.parametrize("backend", ["numpy", "native"])
@pytest.mark.parametrize(("fmt", "block"), [("fp16", 4), ("bf16", 2)])
def test_cdna1_sums_each_block_exactly_and_rounds_once(fmt, block, backend):
    if backend == "native" and not native_kernels.available():
        pytest.skip("precision_lab.backends._native_kernels is not built")
    acc = pl.tensor_core("mi100", fmt)
    assert acc.order == "exact_block" and acc.block == block
    rng = np.random.default_rng(block)
    f = pl.get_format(fmt)
    span = 12 if fmt == "fp16" else 40
    a = _grid_values(f, rng, (40, 8), -span, span)
    b = _grid_values(f, rng, (40, 8), -span, span)
    c = pl.round_to(rng.standard_normal(40) * 1e3, "fp32").astype(np.float64)
    got = _row_gemm(a, b, c, fmt, acc, backend=backend)
    for i in range(40):
        r = Fr(c[i])
        for j0 in range(0, 8, block):
            r = _round(r + sum(Fr(x) * Fr(y) for x, y in zip(a[i, j0:j0 + block],
                                                          b[i, j0:j0 + block], strict=True)),
                       F32, "rne")  # fmt: skip
        assert got[i] == float(r), i
    # 2**20 + 2**-48 - 2**20 + 2**-24 + c (= 1): the exact sum 1 + 2**-24 + 2**-48 is just
    # above a tie and rounds up; float64 left to right loses 2**-48 and ties to even: 1
    if block == 4:
        a1 = np.array([[2.0**10, 2.0**-24, -(2.0**10), 2.0**-12]])
        b1 = np.array([[2.0**10, 2.0**-24, 2.0**10, 2.0**-12]])
        assert _row_gemm(a1, b1, [1.0], fmt, acc, backend=backend)[0] == 1 + 2.0**-23


def _ftz(x: Fr, fmt) -> Fr:
    return Fr(0) if abs(x) < Fr(fmt.smallest_normal) else x


@pytest.mark.parametrize(
    ("fmt", "instruction", "pairs"),
    [("fp16", None, 4), ("bf16", None, 4), ("bf16", "mfma.bf16", 2), ("bf16", "mfma.bf16_1k", 4)],
)
@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_cdna2_ftz_mul_add(fmt, instruction, pairs, backend):
    if backend == "native" and not native_kernels.available():
        pytest.skip("precision_lab.backends._native_kernels is not built")
    acc = pl.tensor_core("mi250", fmt, instruction=instruction)
    f = pl.get_format(fmt)
    rng = np.random.default_rng(pairs)
    a = _grid_values(f, rng, (40, 8), -30, 10)
    b = _grid_values(f, rng, (40, 8), -30, 10)
    a[0, 0] = f.smallest_subnormal  # a subnormal input is flushed
    c = pl.round_to(rng.standard_normal(40), "fp32").astype(np.float64)
    c[1] = 2.0**-130  # a subnormal c is flushed
    got = _row_gemm(a, b, c, fmt, acc, backend=backend)

    def rnd(x: Fr) -> Fr:
        return _ftz(_round(x, F32, "rne"), F32)

    for i in range(40):
        r = _ftz(Fr(c[i]), F32)
        p = [rnd(_ftz(Fr(x), f) * _ftz(Fr(y), f)) for x, y in zip(a[i], b[i], strict=True)]
        for j0 in range(0, 8, pairs):
            s = rnd(p[j0] + p[j0 + 1])
            if pairs == 4:
                s = rnd(s + rnd(p[j0 + 2] + p[j0 + 3]))
            r = rnd(r + s)
        assert got[i] == float(r), i


def _tr_oracle(a, b, c, fa, fb, block, fp8):
    """MMA-Sim 2.1.1's TR-FDPA (fp8: GTR-FDPA, even and odd products as two inner blocks),
    F = 24, F2 = 31, every cut a floor (products aligned among themselves: truncated)."""
    r = Fr(c)
    for j0 in range(0, len(a), block):
        idx = list(range(j0, j0 + block))
        parts = [idx[0::2], idx[1::2]] if fp8 else [idx]
        sums = []
        for part in parts:
            terms = [(Fr(a[t]) * Fr(b[t]), _e(Fr(a[t]), fa.emin) + _e(Fr(b[t]), fb.emin))
                     for t in part if a[t] * b[t] != 0]  # fmt: skip
            if terms:
                ep = max(e for _, e in terms)
                sums.append((sum(_cut(v, Fr(2) ** (ep - 24), "trunc") for v, _ in terms), ep))
        er = _e(r, F32.emin) if r != 0 else F32.emin  # (a zero c: -126)
        E = max([er] + [e for _, e in sums])
        X = Fr(0)
        if sums:
            ep = max(e for _, e in sums)
            X = sum(_cut(v, Fr(2) ** (ep - 24), "floor") for v, _ in sums)
        rc = _cut(r, Fr(2) ** (E - 24), "floor")
        if fp8 and er < E - 25:  # GTR-FDPA drops c below e_max - F - 1
            rc = Fr(0)
        S = _cut(X, Fr(2) ** (E - 32), "floor") + rc
        es = _e(S, F32.emin) if S != 0 else F32.emin
        r = _round(_cut(S, Fr(2) ** (es - 31), "floor"), F32, "rne")
    return r


@pytest.mark.parametrize("backend", ["numpy", "native"])
@pytest.mark.parametrize(
    ("fmt", "block", "fp8"),
    [("fp16", 8, False), ("bf16", 8, False), ("tf32", 4, False),
     (("e4m3fnuz", "e4m3fnuz"), 16, True), (("e5m2fnuz", "e4m3fnuz"), 16, True)],
)  # fmt: skip
def test_cdna3_aligns_products_then_the_accumulator(fmt, block, fp8, backend):
    if backend == "native" and not native_kernels.available():
        pytest.skip("precision_lab.backends._native_kernels is not built")
    gpu = "mi300x"
    acc = pl.tensor_core(gpu, fmt)
    assert acc.addend == "separate" and acc.block == block and acc.sum_bits == 31
    assert acc.align_rounding == "down" and acc.drop_bits == (25 if fp8 else None)
    fa_n, fb_n = fmt if isinstance(fmt, tuple) else (fmt, fmt)
    fa, fb = pl.get_format(fa_n), pl.get_format(fb_n)
    rng = np.random.default_rng(block)
    span = 5 if fp8 else 8  # FNUZ e4m3 tops at 240
    a = _grid_values(fa, rng, (60, 3 * block), -span, span)
    b = _grid_values(fb, rng, (60, 3 * block), -span, span)
    c = pl.round_to(rng.standard_normal(60) * np.exp2(rng.integers(-30, 30, 60)), "fp32")
    got = _row_gemm(a, b, c.astype(np.float64), (fa_n, fb_n), acc, backend=backend)
    want = [float(_tr_oracle(a[i], b[i], Fr(float(c[i])), fa, fb, block, fp8))
            for i in range(60)]  # fmt: skip
    assert got.tolist() == want


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_cdna3_floor_moves_a_tiny_negative_accumulator_down(backend):
    # c = -2**-40 below a block sum of 1: floor at 24 bits below the anchor gives -2**-24,
    # so 1 + (-2**-24) = 1 - 2**-24 (a truncation toward zero would give 1)
    if backend == "native" and not native_kernels.available():
        pytest.skip("precision_lab.backends._native_kernels is not built")
    acc = pl.tensor_core("mi300x", "fp16")
    a = np.array([[1.0] + [0.0] * 7])
    b = np.array([[1.0] + [0.0] * 7])
    assert _row_gemm(a, b, [-(2.0**-40)], "fp16", acc, backend=backend)[0] == 1 - 2.0**-24


def _pad(v: list[float], n: int) -> list[float]:
    return v + [0.0] * (n - len(v))


#: the rules of MMA-Sim 2.1.1's CDNA3 models that the presets had wrong (issue 31, item 9), one
#: hand-made block each: (label, input format, a, b, c, d); test_mmasim_amd.py checks MMA-Sim
#: itself gives d
CDNA3_RULE_CASES = [
    # GTR-FDPA: the even/odd partial sums are floored at the common anchor: 2**30 (even) and
    # -1 (odd, k = 1) -> -1 floored at 2**6 is -2**6 (truncation: 0, d = 2**30)
    ("fp8 inner sums floored", "e5m2fnuz", _pad([2.0**15, 1.0], 16), _pad([2.0**15, -1.0], 16),
     0.0, 2.0**30 - 64),
    # GTR-FDPA: c is dropped below e_max - F - 1 = -25: 1 + (-2**-40) = 1 (floored: 1 - 2**-24)
    ("fp8 c dropped", "e4m3fnuz", _pad([1.0], 16), _pad([1.0], 16), -(2.0**-40), 1.0),
    # ... but not at e_max - 25: -2**-25 floored at 2**-24: 1 - 2**-24
    ("fp8 c kept", "e4m3fnuz", _pad([1.0], 16), _pad([1.0], 16), -(2.0**-25), 1 - 2.0**-24),
    # fp8 c floored at the anchor (E = 9): 1280 + floor(-1 + 2**-14 + 2**-16 at 2**-15) is the
    # tie 1279 + 2**-14 (even: 1279); truncated, 1279 + 2**-14 + 2**-15 rounds up
    ("fp8 c floored", "e4m3fnuz", _pad([32.0, 48.0], 16), _pad([16.0, 16.0], 16),
     -1 + 2.0**-14 + 2.0**-16, 1279.0),
    # TR-FDPA: a product of 2**128 or more is inf before the sum: 2**128 - 2**127 = +inf, and
    # 2**130 - 2**130 = NaN (the exact sums: 2**127 and c)
    ("bf16 product overflow", "bf16", _pad([2.0**127, 2.0**127], 8), _pad([2.0, -1.0], 8),
     0.0, math.inf),
    ("bf16 products inf - inf", "bf16", _pad([2.0**100, 2.0**100], 8),
     _pad([2.0**30, -(2.0**30)], 8), 1.0, math.nan),
    ("xf32 product overflow", "tf32", _pad([2.0**127, 2.0**127], 4), _pad([2.0, -1.0], 4),
     0.0, math.inf),
    # a zero c enters the anchor at -126: 2**-150 + 2**-170 is floored at 2**-158 to the tie
    # 2**-150, which rounds to +0 (the exact sum rounds to 2**-149)
    ("bf16 zero c at -126", "bf16", _pad([2.0**-75, 2.0**-85], 8), _pad([2.0**-75, 2.0**-85], 8),
     0.0, 0.0),
    # the sum S = X' + c' is cut to 31 bits below its own exponent: 2 - 2**-23 + 2**-22 +
    # 2**-31 = 2 + 2**-23 + 2**-31 -> 2 + 2**-23 (a tie: 2); uncut it rounds to 2 + 2**-22
    ("fp16 sum renormalised (carry)", "fp16", _pad([2.0**-11, 2.0**-16], 8),
     _pad([2.0**-11, 2.0**-15], 8), 2 - 2.0**-23, 2.0),
    # ... and X cut at 32 bits below the anchor, not 31: 1 - 2**-8 + 2**-25 + 2**-32 (c = 1,
    # E = 0) keeps 2**-32 and rounds up to 1 - 2**-8 + 2**-24 (cut at 2**-31: a tie, down)
    ("fp16 block sum 32 bits", "fp16", _pad([-(2.0**-4), 2.0**-12, 2.0**-16], 8),
     _pad([2.0**-4, 2.0**-13, 2.0**-16], 8), 1.0, 1 - 2.0**-8 + 2.0**-24),
]  # fmt: skip


@pytest.mark.parametrize("backend", ["numpy", "native"])
@pytest.mark.parametrize("case", CDNA3_RULE_CASES, ids=lambda c: c[0])
def test_cdna3_rules_of_mmasim(case, backend):
    if backend == "native" and not native_kernels.available():
        pytest.skip("precision_lab.backends._native_kernels is not built")
    _, fmt, a, b, c, want = case
    acc = pl.tensor_core("mi300x", fmt)
    got = _row_gemm(np.array([a]), np.array([b]), [c], fmt, acc, backend=backend)[0]
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert np.float64(got).view(np.uint64) == np.float64(want).view(np.uint64), (got, want)


# ----- instruction choice, describe, errors ---------------------------------------------------
def test_default_instruction_is_what_gemm_libraries_issue():
    assert "wgmma" in pl.tensor_core("h100", "bf16").describe()
    assert "tcgen05.mma kind::f16" in pl.tensor_core("b200", "bf16").describe()
    assert "mma.m16n8k16" in pl.tensor_core("b200", "bf16", instruction="mma").describe()
    assert "mma.m16n8k16.f64" in pl.tensor_core("h100", "fp64", out_format="fp64").describe()
    assert "kind::mxf4nvf4" in pl.tensor_core("b200", "mxfp4_e2m1").describe()
    assert "bf16_1k" in pl.tensor_core("mi210", "bf16").describe()
    assert "mma.block_scale kind::mxf4nvf4" in pl.tensor_core("rtx5090", "nvfp4").describe()
    # models equal where the hardware is the same; names say which instruction
    assert pl.tensor_core("h100", "fp16") == pl.tensor_core("h100", "fp16", instruction="mma")
    assert pl.tensor_core("mi300a", "tf32") == pl.tensor_core("mi325x", "tf32")
    assert pl.tensor_core("mi210", "bf16") == pl.tensor_core("mi250", "bf16", instruction="mfma")


@pytest.mark.parametrize(
    ("args", "kw", "match"),
    [
        (
            ("h100", "fp16"),
            {"instruction": "tcgen05"},
            r"instruction: h100 \(hopper\) has mma, wgmma, got 'tcgen05'",
        ),
        (
            ("b200", "fp16"),
            {"instruction": "mfma"},
            r"instruction: b200 \(blackwell\) has mma, tcgen05",
        ),
        (
            ("a100", "fp16"),
            {"instruction": "dmma"},
            r"instruction must be one of mma, wgmma, tcgen05, mfma",
        ),
        (("b200", "e4m3"), {"instruction": "tcgen05.kind::nope"}, r"has the kinds .*kind::f8f6f4"),
        (
            ("b200", "e2m1"),
            {"instruction": "mma"},
            r"input_format: b200 \(blackwell\) mma takes .*fp16.*e4m3",
        ),
        (("mi100", "e4m3fnuz"), {}, r"input_format: mi100 \(cdna1\) mfma takes .*fp16"),
        (("mi300x", "e4m3"), {}, r"input_format: mi300x .*e4m3fnuz.*got 'e4m3'"),
        (("h100", "mxfp8_e4m3"), {}, r"input_format: h100 .*takes"),
        (
            ("b200", "nvfp4"),
            {"out_format": "fp16"},
            r"out_format: b200 matrix cores with nvfp4 inputs output fp32",
        ),
        (("b200", ("e4m3", "nope")), {}, r"input_format\[1\]: unknown format"),
        (
            ("b200", pl.BlockFormat("x", "e4m3", "e8m0", (16,), "floor")),
            {},
            r"input_format: no matrix core takes the block format",
        ),
        (("v200", "fp16"), {}, r"gpu must be one of .*mi300x"),
    ],
)
def test_errors_name_the_argument_and_what_is_allowed(args, kw, match):
    with pytest.raises(ValueError, match=match):
        pl.tensor_core(*args, **kw)


# ----- the table --------------------------------------------------------------------------------
def test_list_has_every_preset_with_evidence():
    rows = pl.tensor_core.list()
    assert rows == tensor_core_list()
    assert len(rows) == len(PRESETS)
    keys = {(r["arch"], r["instruction"], r["kind"], r["input_format"], r["out_format"])
            for r in rows}  # fmt: skip
    for arch, ins, kind, fa, fb, out in PRESETS:
        shown = fa if fa == fb else f"{fa} x {fb}"
        assert (arch, ins, kind, shown, out) in keys
    for r in rows:
        assert r["evidence"].split(":")[0] in ("measured", "published", "inferred"), r
        assert r["instruction"] in INSTRUCTIONS
        assert r["special_values"] and r["rounding"] and r["model"]
    assert {g for r in rows for g in r["gpus"].split()} == set(GPUS)
    # the 30 measured (set, output) pairs are all there, as measured rows
    measured = {
        r["evidence"].split()[1] + r["out_format"]
        for r in rows
        if r["evidence"].startswith("measured") and r["arch"] not in ("x86", "arm")
    }  # (the CPU rows are measured on CPUs, not in these data sets)
    assert len(measured) == 30
    # every (architecture, operands, output) has exactly one default
    seen: dict[tuple, int] = {}
    for r in rows:
        key = (r["arch"], r["input_format"], r["out_format"])
        seen[key] = seen.get(key, 0) + r["default"]
    assert set(seen.values()) == {1}


def test_every_row_builds_with_its_instruction_and_kind():
    for r in pl.tensor_core.list():
        gpus = r["gpus"].split()
        fmts = r["input_format"].split(" x ")
        fmt = fmts[0] if len(fmts) == 1 else tuple(fmts)
        acc = pl.tensor_core(gpus[-1], fmt, out_format=r["out_format"],
                             instruction=f"{r['instruction']}.{r['kind']}")  # fmt: skip
        assert acc.describe() == r["model"].replace("/".join(gpus), gpus[-1])
        assert (acc.block or acc.promote_every or 1) == r["products_per_block"]
    assert len(pl.tensor_core.list("mi300x")) == len(pl.tensor_core.list("mi325x")) == 9


def test_cli_prints_the_table(capsys):
    from precision_lab.cli import main

    assert main(["tensor-cores", "--gpu", "b200", "--instruction", "tcgen05"]) == 0
    out = capsys.readouterr().out
    assert "kind::mxf4nvf4" in out and "published: MMA-Sim" in out
    assert " mma " not in out and "wgmma" not in out
    assert main(["tensor-cores", "--json"]) == 0
    assert '"evidence": "measured: V100_fp16' in capsys.readouterr().out


# ----- backends ---------------------------------------------------------------------------------
NATIVE_PRESETS = [
    ("b200", "e4m3", "fp32", None),
    ("b200", ("e2m1", "e3m2"), "fp16", None),
    ("b200", "bf16", "fp32", "tcgen05"),
    ("t4", "fp16", "fp16", None),
    ("rtx5090", ("e2m3", "e4m3"), "fp32", None),
    ("h100", "e5m2", "fp16", None),
    ("mi300x", "fp32", "fp32", None),
]


@pytest.mark.parametrize("case", NATIVE_PRESETS, ids=str)
def test_numpy_and_native_agree_on_the_new_presets(case):
    gpu, fmt, out, ins = case
    acc = pl.tensor_core(gpu, fmt, out_format=out, instruction=ins)
    if not native_backend.available():
        pytest.skip("the native extension is not built")
    if not native_backend.covers(acc):  # NVIDIA's special-value rules: numpy only for now
        acc = acc.replace(
            overflow="ieee", zeros_in_anchor=False, zero_sign="ieee", nan_encoding="quiet"
        )
    assert native_backend.covers(acc)
    rng = np.random.default_rng(11)
    a = rng.standard_normal((2, 7, 96)) * np.exp2(rng.integers(-6, 6, (2, 7, 96)))
    b = rng.standard_normal((96, 5))
    c = rng.standard_normal((7, 5))
    kw = {"input_format": fmt, "accumulator": acc, "out_format": out}
    d_np = pl.gemm(a, b, c, backend="numpy", **kw)
    d_nat = pl.gemm(a, b, c, backend="native", **kw)
    assert d_np.view(np.uint32 if d_np.dtype == np.float32 else np.uint64).tolist() == \
        d_nat.view(np.uint32 if d_nat.dtype == np.float32 else np.uint64).tolist()  # fmt: skip


def test_every_preset_has_general_kernels_and_compensated_falls_back():
    # every row of the table runs on the CUDA header's kernels (and the native per-element
    # ones): reference_only says why not, None for all
    from precision_lab.gemm.accumulator import reference_only

    for row in pl.tensor_core.list():
        fa, _, fb = row["input_format"].partition(" x ")
        gpu = row["gpus"].split()[0]
        acc = pl.tensor_core(gpu, (fa, fb) if fb else fa, out_format=row["out_format"],
                             instruction=row["instruction"])  # fmt: skip
        why = reference_only(acc)
        if row["arch"] in ("x86", "arm"):  # the CPU rules of spec 3c/3d: the numpy reference's
            assert why is None or why.split("=")[0] in ("input_subnormals", "pair_order")
            continue
        assert why is None, acc.name
    # Kahan summation is the numpy reference's alone: the native backend hands it back
    acc = pl.Accumulator("fp16", order="compensated")
    assert reference_only(acc) == "order='compensated'"
    if not native_backend.available():
        pytest.skip("the native extension is not built")
    assert not native_backend.covers(acc)
    a = np.random.default_rng(2).standard_normal((3, 40))
    d = pl.gemm(a, a.T, input_format="bf16", accumulator=acc, backend="native")
    want = pl.gemm(a, a.T, input_format="bf16", accumulator=acc, backend="numpy")
    np.testing.assert_array_equal(d, want)


# ----- special-value rules of the presets (issue 20, item 1's cases through the presets) ------
def _bits(x: float, dtype=np.float32) -> int:
    return int(np.array([x], dtype).view(np.uint32 if dtype == np.float32 else np.uint16)[0])


def _from_bits(h: int, kind: str) -> float:
    if kind == "bf16":
        return float(np.array([h << 16], np.uint32).view(np.float32)[0])
    if kind == "fp16":
        return float(np.array([h], np.uint16).view(np.float16)[0])
    return float(np.array([h], np.uint32).view(np.float32)[0])


def _one(gpu, fmt, pairs, c=0.0, out="fp32", k=16, instruction=None):
    a, b = np.zeros((1, k)), np.zeros((1, k))
    for i, (x, y) in pairs.items():
        a[0, i], b[0, i] = x, y
    acc = pl.tensor_core(gpu, fmt, out_format=out, instruction=instruction)
    return float(_row_gemm(a, b, [c], fmt, acc, out)[0])


def test_nvidia_presets_carry_the_hardware_special_value_rules():
    for gpu, fmt, out in (
        ("h100", "bf16", "fp32"),
        ("b200", "e4m3", "fp32"),
        ("t4", "fp16", "fp32"),
    ):
        acc = pl.tensor_core(gpu, fmt, out_format=out)
        assert (acc.overflow, acc.zero_sign) == ("infinity", "positive")
        assert acc.zeros_in_anchor and acc.nan_encoding == "nvidia"
    fp16 = pl.tensor_core("a100", "fp16", out_format="fp16")  # rounds to nearest: no inf rule
    assert fp16.zeros_in_anchor and fp16.zero_sign == "positive" and fp16.overflow == "ieee"
    amd = pl.tensor_core("mi300x", "bf16")
    assert not amd.zeros_in_anchor and amd.nan_encoding == "quiet" and amd.overflow == "ieee"
    rows = {r["special_evidence"].split(":")[0] for r in pl.tensor_core.list()}
    assert rows <= {"published", "measured"}  # (measured: the x86 CPU rows)


def test_truncating_overflow_gives_inf():
    big, two = _from_bits(0x7F00, "bf16"), _from_bits(0x4000, "bf16")
    assert _one("h100", "bf16", {0: (big, two)}) == np.inf  # wgmma bf16: 0x7f800000
    # Ampere: the later block's -2**129 cannot pull the overflowed sum back
    four = _from_bits(0x4080, "bf16")
    assert _one("a100", "bf16", {0: (big, two), 8: (-big, four)}) == np.inf


def test_zeros_take_part_in_the_anchor():
    """MMA-Sim 2.1.1: a zero product aligns at e_zero (-133 on Hopper, -131 on Volta), not at
    its partner's exponent - 126 (the earlier snapshot gave 0x3E800000 and 0x80000736): c is
    kept (tests/gemm/test_mmasim_nvidia.py runs mmasim itself)."""
    big = _from_bits(0x7F00, "bf16")
    c = _from_bits(0x3E800001, "fp32")
    assert _bits(_one("h100", "bf16", {0: (big, 0.0)}, c=c)) == 0x3E800001
    c = _from_bits(0x80000737, "fp32")
    assert _bits(_one("v100", "fp16", {0: (2.0, -0.0)}, c=c, k=4)) == 0x80000737
    # a zero c aligns at e_zero: Hopper bf16, two products near 2**-145 (MMA-Sim 0x37; -126: 0x38)
    a0, a1 = 1.5021599923962983e-21, 2.2540671692070004e-23
    b0, b1 = 5.459392042849983e-23, -1.5881867761018131e-22
    assert _bits(_one("h100", "bf16", {0: (a0, b0), 1: (a1, b1)}, c=0.0)) == 0x37


def test_infinity_after_an_overflow_is_nan_and_nvidia_nan_encoding():
    m, t = _from_bits(0x7BFF, "fp16"), _from_bits(0xC000, "fp16")
    d = _one("a100", "fp16", {0: (m, t), 8: (np.inf, 1.0)}, out="fp16")
    assert _bits(d, np.float16) == 0x7FFF
    d = _one("b200", "fp16", {0: (np.inf, 1.0), 1: (-np.inf, 1.0)})
    assert _bits(d) == 0x7FFFFFFF
