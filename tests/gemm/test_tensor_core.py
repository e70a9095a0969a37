"""Tensor-core presets: bit-exact agreement with real GPU measurements and Fasi et al. vectors.

The measurements (first 500 cases of every set of Khattak & Mikaitis's model_validation data,
BSD 2-Clause, see tests/gemm/data/tensor_core/LICENCE) ship with the tests;
benchmarks/verify_tensor_cores.py checks all 5000 cases when ../shared is present.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cpu_backends import cpu_backend  # noqa: F401  (every test runs on numpy and native)

import precision_lab as pl
from precision_lab.gemm.tensor_core import APPROXIMATE, GPUS, tensor_core_formats
from precision_lab.gemm.validation import check_set, load_subset

DATA = Path(__file__).parent / "data" / "tensor_core" / "measurements_500.npz"
SETS = load_subset(DATA)
CASES = [(s, o) for s in SETS for o in sorted(s.d)]


def test_the_shipped_subset_is_complete():
    assert len(SETS) == 19 and len(CASES) == 30
    assert all(len(s.c) >= 500 for s in SETS)
    assert (DATA.parent / "LICENCE").read_text().startswith("BSD 2-Clause License")


@pytest.mark.parametrize(("s", "out"), CASES, ids=[f"{s.name}->{o}" for s, o in CASES])
def test_preset_reproduces_the_gpu_bit_for_bit(s, out):
    assert (GPUS[s.gpu.lower()], s.fmt.lower(), out) not in APPROXIMATE
    result = check_set(s, out)
    assert result.matches == result.cases, f"{result}; first mismatches {result.mismatches[:5]}"


def test_no_preset_is_approximate():
    assert APPROXIMATE == {}


def test_published_in_block_model_does_not_fit_b200_fp8():
    # what the published model says for B200 FP8 (c aligned with the products, truncation)
    s = next(s for s in SETS if s.name == "B200_E4M3")
    tc = pl.tensor_core("b200", "e4m3", instruction="mma")
    published = tc.replace(addend="in_block", rounding="toward_zero", inner_block=None,
                           inner_interleave=None)  # fmt: skip
    d = pl.gemm(s.a[:, None, :], s.b[:, :, None], s.c[:, None, None], input_format="e4m3",
                accumulator=published)[:, 0, 0]  # fmt: skip
    match = int((d.view(np.uint32) == s.d["fp32"].view(np.uint32)).sum())
    assert 250 < match < 400  # about 64%, as reported (3207/5000 on the full set)


def _dot(gpu, fmt, a, b, c=0.0, out="fp32", instruction=None):
    a = np.asarray(a, dtype=np.float64)[None, :]
    b = np.asarray(b, dtype=np.float64)[:, None]
    acc = pl.tensor_core(gpu, fmt, out_format=out, instruction=instruction)
    d = pl.gemm(a, b, np.array([[c]]), input_format=fmt, accumulator=acc, out_format=out,
                input_rounding="exact")  # fmt: skip
    return float(d[0, 0])


# ----- Fasi, Higham, Mikaitis & Pranesh (2021), "Numerical behavior of NVIDIA tensor cores" -----
@pytest.mark.parametrize("gpu", ["v100", "a100", "h100", "b200"])
def test_fasi_truncation_not_round_to_nearest(gpu):
    # 2 + 3 * 2**-24: round to nearest in fp32 gives 2 + 2**-22; tensor cores give 2
    a, b = [1.0, 1.0, 1.0, 1.0], [2.0, 3 * 2.0**-24, 0.0, 0.0]
    assert _dot(gpu, "fp16", a, b) == 2.0
    assert float(np.float32(2.0) + np.float32(3 * 2.0**-24)) == 2.0 + 2.0**-22


@pytest.mark.parametrize(("gpu", "want"), [("v100", 2.0**-23), ("a100", 2.0**-24),
                                           ("h100", 2.0**-24)])  # fmt: skip
def test_fasi_extra_alignment_bits(gpu, want):
    # c = -(1 - 2**-24): V100 keeps no bit below c's last one, A100 and later keep it
    assert _dot(gpu, "fp16", [1.0], [1.0], c=-(1 - 2.0**-24)) == want


def test_fasi_products_are_exact():
    x = 1 + 2.0**-10
    assert _dot("v100", "fp16", [x], [x]) == x * x  # 1 + 2**-9 + 2**-20: 21 bits, exact


def test_fasi_one_normalisation_per_block():
    # V100 block of 4: 1 + 2**-24 + 2**-24 (both below the first's last bit) is 1 exactly,
    # even though their sum 2**-23 alone would be one fp32 ulp
    a = [1.0, 1.0, 1.0, 0.0]
    b = [1.0, 2.0**-24, 2.0**-24, 0.0]
    assert _dot("v100", "fp16", a, b) == 1.0
    assert _dot("a100", "fp16", a + [0] * 4, b + [0] * 4) == 1.0 + 2.0**-23


def test_fasi_blocks_chain_on_a100():
    # 8 products per block, each block normalised before the next is added
    small = (2.0**-13, 2.0**-12)  # product 2**-25, below the 24 bits kept next to 1
    a = [small[0]] * 8 + [1.0] + [0.0] * 7
    b = [small[1]] * 8 + [1.0] + [0.0] * 7
    # block 1 sums the small products exactly (2**-22), block 2 adds 1: both bits survive
    assert _dot("a100", "fp16", a, b) == 1.0 + 2.0**-22
    # the other way round, 1 comes first and every small product is truncated against it
    assert _dot("a100", "fp16", a[8::-1] + [0.0] * 7, b[8::-1] + [0.0] * 7) == 1.0


def test_fp16_output_rounds_to_nearest():
    # 1 + 2**-11 + 2**-12 is above the fp16 tie 1 + 2**-11: nearest gives 1 + 2**-10
    assert _dot("a100", "fp16", [1.0, 1.0, 1.0], [1.0, 2.0**-11, 2.0**-12], out="fp16") == (
        1 + 2.0**-10
    )
    assert _dot("a100", "fp16", [1.0, 1.0, 1.0], [1.0, 2.0**-11, 2.0**-12]) == (
        1 + 2.0**-11 + 2.0**-12
    )


def test_h100_fp8_keeps_13_fraction_bits():
    # a 14-bit accumulator: 1 + 2**-14 is lost, 1 + 2**-13 kept; fp32 sequential keeps both
    ones = [1.0] * 32
    b = [1.0, 2.0**-7] + [0.0] * 30
    a = [1.0, 2.0**-7] + [0.0] * 30
    assert _dot("h100", "e4m3", a, b) == 1.0  # 2**-14 truncated
    a2 = [1.0, 2.0**-6] + [0.0] * 30
    assert _dot("h100", "e4m3", a2, b) == 1.0 + 2.0**-13
    assert _dot("ada", "e4m3", ones[:16] + [0.0] * 16, [2.0**-9] * 32) == 2.0**-5


MEASURED_GPUS = ["v100", "a100", "a2", "a30", "ada", "l40s", "rtx4090", "h100", "h200", "b200"]


@pytest.mark.parametrize("gpu", MEASURED_GPUS)
def test_every_gpu_has_presets(gpu):
    formats = tensor_core_formats(gpu)
    assert "fp16" in formats
    assert ("e4m3" in formats) == (GPUS[gpu] in ("ada", "hopper", "blackwell"))
    assert ("bf16" in formats) == (GPUS[gpu] != "volta")
    # mma.m8n8k4.f64 from sm_80 on (MMA-Sim 2.1.1 lists it on Blackwell and RTX Blackwell too)
    assert ("fp64" in formats) == (GPUS[gpu] not in ("volta", "turing"))
    for fmt in formats:
        acc = pl.tensor_core(gpu, fmt, out_format="fp64" if fmt == "fp64" else "fp32")
        if fmt == "fp64":  # DMMA: a chain of fp64 FMAs
            assert acc.order == "sequential" and acc.format == pl.get_format("fp64")
        else:
            assert acc.order == "block_fma" and acc.block in (4, 8, 16, 32)
        assert acc.name.startswith(gpu)


def test_same_architecture_same_model():
    assert pl.tensor_core("h200", "bf16") == pl.tensor_core("h100", "bf16")
    assert pl.tensor_core("l40s", "e4m3") == pl.tensor_core("rtx4090", "e4m3")
    assert pl.tensor_core("A30", "tf32") == pl.tensor_core("a100", "tf32")


@pytest.mark.parametrize(
    ("args", "kw", "match"),
    [
        (("p100", "fp16"), {}, "gpu must be one of"),
        (("v100", "bf16"), {}, "input_format: v100 .volta. mma takes fp16"),
        (("a100", "e4m3"), {}, "input_format: a100"),
        (("h100", "fp32"), {}, "input_format"),
        (("h100", "bf16"), {"out_format": "fp16"}, "out_format: h100 matrix cores with bf16"),
        (("h100", "nope"), {}, "input_format: unknown format"),
    ],
)
def test_unknown_gpu_or_unsupported_pair(args, kw, match):
    with pytest.raises(ValueError, match=match):
        pl.tensor_core(*args, **kw)


# ----- FP8 mma.sync on Hopper/Blackwell: emulated on the fp16 tensor cores -------------------
@pytest.mark.parametrize("gpu", ["h100", "b200"])
def test_fp8_fp16_output_deals_register_byte_pairs_to_two_fp16_mmas(gpu):
    # products 1 (k=0), 2**-11 (k=1) and 2**-11 (k=2): the first fp16 MMA takes k % 4 in
    # {0, 1} and rounds 1 + 2**-11 to 1 (tie to even); the second adds k=2 to 1: a tie again
    # -> 1. One block of 32, or contiguous halves, would give the exact 1 + 2**-10.
    s = 2.0**-5  # 2**-11 = 2**-5 * 2**-6, both on the e4m3 grid
    a = [1.0, s, s] + [0.0] * 29
    b = [1.0, 2.0**-6, 2.0**-6] + [0.0] * 29
    assert _dot(gpu, "e4m3", a, b, out="fp16", instruction="mma") == 1.0
    # with the second small product at k=4 (first MMA again) the first MMA sums all exactly
    a4 = [1.0, s, 0.0, 0.0, s] + [0.0] * 27
    b4 = [1.0, 2.0**-6, 0.0, 0.0, 2.0**-6] + [0.0] * 27
    assert _dot(gpu, "e4m3", a4, b4, out="fp16", instruction="mma") == 1.0 + 2.0**-10


def test_fp8_fp16_output_adds_c_after_the_products():
    # c = 1 and products 2**-11 + 2**-11 (k=0 and k=2, one per fp16 MMA): the MMAs sum them
    # exactly to 2**-10 from a zero accumulator, then c + 2**-10 = 1 + 2**-10 is exact.
    # With c inside the first MMA, 1 + 2**-11 would round to 1 twice.
    a = [2.0**-5, 0.0, 2.0**-5] + [0.0] * 29
    b = [2.0**-6, 0.0, 2.0**-6] + [0.0] * 29
    assert _dot("h100", "e4m3", a, b, c=1.0, out="fp16", instruction="mma") == 1.0 + 2.0**-10
    # c aligned inside chained fp16 MMAs (the fp16-input model) loses both: 1 + 2**-11 -> 1
    in_block = pl.tensor_core("h100", "fp16", out_format="fp16")
    a16, b16 = [2.0**-5] + [0.0] * 15 + [2.0**-5] + [0.0] * 15, [2.0**-6] * 32
    assert _dot_with(in_block, a16, b16, c=1.0, fmt="fp16") == 1.0


def _dot_with(acc, a, b, c=0.0, out="fp16", fmt="e4m3"):
    d = pl.gemm(np.asarray(a, dtype=np.float64)[None, :], np.asarray(b, dtype=np.float64)[:, None],
                np.array([[c]]), input_format=fmt, accumulator=acc, out_format=out)  # fmt: skip
    return float(d[0, 0])


def _emulated_oracle(a, b, c, out):
    """Independent Fraction model of emulated FP8 mma.sync (Hopper/Blackwell), any K."""
    from fractions import Fraction as Fr

    from precision_lab.core.formats import get_format

    acc_fmt = get_format(out)

    def rnd(x, mode):
        return Fr(float(pl.round_to(np.array([float(x)]), acc_fmt, rounding=mode)[0]))

    def exp_of(x, emin):
        return max(int(np.floor(np.log2(abs(float(x))))), emin)

    inner = "nearest_even" if out == "fp16" else "toward_zero"
    r = Fr(float(np.float16(c) if out == "fp16" else np.float32(c)))
    for j0 in range(0, len(a), 32):
        t = Fr(0)
        for half in (0, 1):
            ks = [k for k in range(j0, min(j0 + 32, len(a))) if ((k - j0) // 2) % 2 == half]
            terms = [(Fr(a[k]) * Fr(b[k]), exp_of(a[k], -6) + exp_of(b[k], -6))
                     for k in ks if a[k] != 0 and b[k] != 0]  # fmt: skip
            if t != 0:
                terms.append((t, exp_of(t, acc_fmt.emin)))
            if not terms:
                continue
            q = Fr(2) ** (max(e for _, e in terms) - 25)
            x = sum((abs(v) // q) * q * (1 if v > 0 else -1) for v, _ in terms)
            t = rnd(x, inner)  # exact x: float(x) is exact (at most 53 bits here)
        r = rnd(r + t, "nearest_even")  # r + t exact in float64 for these magnitudes
    return float(r)


@pytest.mark.parametrize(("k", "out"), [(32, "fp16"), (64, "fp16"), (40, "fp32"), (96, "fp32")])
def test_fp8_emulation_matches_an_independent_fraction_oracle(k, out):
    rng = np.random.default_rng(k)
    a = pl.round_to(rng.standard_normal((20, k)), "e4m3")
    b = pl.round_to(rng.standard_normal((k, 1)), "e4m3")
    c = rng.uniform(-2, 2, (20, 1))
    gpu = "h100" if out == "fp16" else "b200"
    acc = pl.tensor_core(gpu, "e4m3", out_format=out, instruction="mma")
    d = pl.gemm(a, b, c, input_format="e4m3", accumulator=acc, out_format=out)[:, 0]
    want = [_emulated_oracle(list(a[i]), list(b[:, 0]), c[i, 0], out) for i in range(20)]
    assert d.astype(np.float64).tolist() == want


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"order": "block_fma", "block": 32, "align_bits": 25, "inner_block": 16},
         "inner_block needs order='block_fma' and addend='after_block'"),
        ({"order": "blocked", "block": 32, "inner_block": 16}, "inner_block needs"),
        ({"order": "block_fma", "block": 32, "align_bits": 25, "addend": "after_block",
          "inner_block": 12}, "inner_block must divide block=32, got 12"),
        ({"order": "block_fma", "block": 32, "align_bits": 25, "addend": "after_block",
          "inner_block": 16, "inner_interleave": 3}, "inner_interleave must divide inner_block"),
        ({"order": "block_fma", "block": 32, "align_bits": 25, "addend": "after_block",
          "inner_interleave": 2}, "inner_interleave needs inner_block"),
        ({"order": "block_fma", "block": 32, "align_bits": 25, "addend": "after_block",
          "inner_block": 0}, "inner_block must be a positive int"),
    ],
)  # fmt: skip
def test_inner_block_knobs_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        pl.Accumulator("fp16", **kw)
