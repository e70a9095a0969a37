"""Tensor-core presets: bit-exact agreement with real GPU measurements and Fasi et al. vectors.

The measurements (first 500 cases of every set of Khattak & Mikaitis's model_validation data,
BSD 2-Clause, see tests/data/tensor_core/LICENCE) ship with the tests;
benchmarks/verify_tensor_cores.py checks all 5000 cases when ../shared is present.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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
    arch = GPUS[s.gpu.lower()]
    result = check_set(s, out)
    if (arch, s.fmt.lower(), out) in APPROXIMATE:
        # FP8 -> fp16 on Hopper/Blackwell: an open question; the best model found matches ~80%
        assert 0.7 * result.cases <= result.matches < result.cases
        assert "approximate" in str(pl.tensor_core(s.gpu.lower(), s.fmt, out_format=out).name)
    else:
        assert result.matches == result.cases, f"{result}; first mismatches {result.mismatches[:5]}"


def test_published_in_block_model_does_not_fit_b200_fp8():
    # what the published model says for B200 FP8 (c aligned with the products, truncation)
    s = next(s for s in SETS if s.name == "B200_E4M3")
    tc = pl.tensor_core("b200", "e4m3")
    published = tc.replace(addend="in_block", rounding="toward_zero")
    d = pl.gemm(s.a[:, None, :], s.b[:, :, None], s.c[:, None, None], input_format="e4m3",
                accumulator=published)[:, 0, 0]  # fmt: skip
    match = int((d.view(np.uint32) == s.d["fp32"].view(np.uint32)).sum())
    assert 250 < match < 400  # about 64%, as reported (3207/5000 on the full set)


def _dot(gpu, fmt, a, b, c=0.0, out="fp32"):
    a = np.asarray(a, dtype=np.float64)[None, :]
    b = np.asarray(b, dtype=np.float64)[:, None]
    acc = pl.tensor_core(gpu, fmt, out_format=out)
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


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_every_gpu_has_presets(gpu):
    formats = tensor_core_formats(gpu)
    assert "fp16" in formats
    assert ("e4m3" in formats) == (GPUS[gpu] in ("ada", "hopper", "blackwell"))
    assert ("bf16" in formats) == (GPUS[gpu] != "volta")
    for fmt in formats:
        acc = pl.tensor_core(gpu, fmt)
        assert acc.order == "block_fma" and acc.block in (4, 8, 16, 32)
        assert acc.name.startswith(gpu)


def test_same_architecture_same_model():
    assert pl.tensor_core("h200", "bf16") == pl.tensor_core("h100", "bf16")
    assert pl.tensor_core("l40s", "e4m3") == pl.tensor_core("rtx4090", "e4m3")
    assert pl.tensor_core("A30", "tf32") == pl.tensor_core("a100", "tf32")


@pytest.mark.parametrize(
    ("args", "kw", "match"),
    [
        (("t4", "fp16"), {}, "gpu must be one of"),
        (("v100", "bf16"), {}, "input_format: v100 .volta. tensor cores take fp16"),
        (("a100", "e4m3"), {}, "input_format: a100"),
        (("h100", "fp32"), {}, "input_format"),
        (("h100", "bf16"), {"out_format": "fp16"}, "out_format: h100 tensor cores with bf16"),
        (("h100", "nope"), {}, "input_format: unknown format"),
    ],
)
def test_unknown_gpu_or_unsupported_pair(args, kw, match):
    with pytest.raises(ValueError, match=match):
        pl.tensor_core(*args, **kw)
