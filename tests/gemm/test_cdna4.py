"""AMD CDNA4 (MI350X, MI355X) matrix-core rows (issue 35).

No bit-accurate public model of CDNA4 exists (MMA-Sim 2.1.1 stops at CDNA3) and no measured data:
the rows are inferred from AMD's CDNA4 ISA guide and LLVM's gfx950 MFMA definitions, with
CDNA3's published datapath (MMA-Sim's GTR-FDPA / TR-FDPA / FMA chains) carried over. What the
tests can check is that the rows compute exactly what the inference says:

* every CDNA4 row's evidence is ``inferred`` with its reasoning; xf32 is gone, FNUZ operands are
  refused, the OCP/FP6/FP4 operands of ``f8f6f4`` are taken in every pairing;
* ``f8f6f4`` equals MMA-Sim 2.1.1's own GTR-FDPA (CDNA3's fp8 datapath, run on the OCP, FP6 and
  FP4 operand values) bit for bit, on the numpy reference and the native backend;
* ``scale_f8f6f4`` (``gemm_blocks`` with MX operands) equals MMA-Sim's GTR-FDPA on the operands
  multiplied by their E8M0 scales (the ISA's ``A * 2**(sa - 127)``), and with unit scales the
  ``f8f6f4`` row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.gemm.accumulator import Accumulator
from precision_lab.gemm.tensor_core import (
    CDNA4_F8F6F4_CODES,
    CDNA4_F8F6F4_VGPRS,
    TCGEN05_F8F6F4_CODES,
)

F8F6F4 = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
MX = {
    "e4m3": "mxfp8_e4m3",
    "e5m2": "mxfp8_e5m2",
    "e3m2": "mxfp6_e3m2",
    "e2m3": "mxfp6_e2m3",
    "e2m1": "mxfp4_e2m1",
}


def _gtr_fdpa() -> Any:
    torch = pytest.importorskip("torch", reason="mmasim runs on torch (the [test] extra has it)")
    fdpa = pytest.importorskip("mmasim.arithmetic.fdpa", reason="mmasim==2.1.1 is not installed")
    # MMA-Sim 2.1.1's CDNA3 fp8/bf8 MFMA: MMA_GTR_FDPA(F=24, F2=31, rho="RNE-FP32", L_max=16)
    return torch, fdpa.MMA_GTR_FDPA(F=24, F2=31, rho="RNE-FP32", L_max=16)


def _mmasim(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    torch, op = _gtr_fdpa()
    t = [torch.tensor(x.astype(np.float32)) for x in (a, b, c)]
    return op(*t).numpy().astype(np.float32)


def _values(rng: np.random.Generator, fmt: str, shape: tuple[int, ...]) -> np.ndarray:
    """Finite values of every code of ``fmt`` (random codes, NaN codes skipped)."""
    f = pl.get_format(fmt)
    v = np.asarray(pl.decode(rng.integers(0, 2**f.bits, shape).astype(np.uint8), f), np.float64)
    return np.where(np.isfinite(v), v, 1.0)


def test_rows_are_inferred_and_name_their_reasoning() -> None:
    rows = pl.tensor_core.list("mi355x")
    assert rows and rows == pl.tensor_core.list("mi350x")
    kinds = {r["kind"] for r in rows}
    assert kinds == {"f64", "f32", "f16", "bf16", "f8f6f4", "scale_f8f6f4"}
    for r in rows:
        assert r["evidence"].startswith("inferred:"), r
        assert "CDNA3" in r["evidence"] and "probe_gemm" in r["evidence"]
    pairs = {r["input_format"] for r in rows if r["kind"] == "f8f6f4"}
    assert len(pairs) == 25 and "e2m3 x e3m2" in pairs and "e2m1" in pairs


def test_xf32_removed_fnuz_refused_ocp_taken() -> None:
    with pytest.raises(ValueError, match="cdna4"):
        pl.tensor_core("mi355x", "tf32")
    for fnuz in ("e4m3fnuz", "e5m2fnuz"):
        with pytest.raises(ValueError, match="cdna4"):
            pl.tensor_core("mi355x", fnuz)
    acc = pl.tensor_core("mi355x", ("e2m3", "e4m3"))
    assert acc.name == "mi355x e2m3 x e4m3 -> fp32 (v_mfma f8f6f4)"
    assert pl.tensor_core("mi300x", "e4m3fnuz").block == acc.block == 16  # CDNA3's datapath
    assert pl.tensor_core("mi355x", "mxfp6_e3m2").scales == "in_block"


def test_operand_codes_and_register_counts() -> None:
    """cbsz/blgp codes (LLVM gfx950) and VGPRs per lane: 32 values of 8, 6 or 4 bits."""
    assert CDNA4_F8F6F4_CODES == {"e4m3": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}
    for fmt, vgprs in CDNA4_F8F6F4_VGPRS.items():
        assert vgprs * 32 == 32 * pl.get_format(fmt).bits
    # tcgen05's instruction-descriptor codes (CUTLASS UMMA::MXF8F6F4Format; 2 is unused)
    assert TCGEN05_F8F6F4_CODES == {"e4m3": 0, "e5m2": 1, "e2m3": 3, "e3m2": 4, "e2m1": 5}
    for gpu, ins in (("b200", "tcgen05"), ("rtx5090", "mma")):
        row = [r for r in pl.tensor_core.list(gpu) if r["input_format"] == "e2m3 x e3m2"]
        assert row and "PTX ISA" in row[0]["evidence"], gpu
        assert pl.tensor_core(gpu, ("e2m3", "e3m2"), instruction=ins).block == 32


@pytest.mark.parametrize(
    "pair",
    [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e2m3", "e3m2"), ("e2m1", "e5m2"), ("e3m2", "e2m1")],
)
@pytest.mark.parametrize("backend", ["numpy", "auto"])
def test_f8f6f4_equals_mmasim_gtr_fdpa(pair: tuple[str, str], backend: str) -> None:
    rng = np.random.default_rng([35, F8F6F4.index(pair[0]), F8F6F4.index(pair[1])])
    m, k, n = 6, 128, 5
    a = _values(rng, pair[0], (m, k))
    b = _values(rng, pair[1], (k, n))
    c = rng.standard_normal((m, n)).astype(np.float32) * np.float32(4.0)
    want = _mmasim(a, b, c)
    acc = pl.tensor_core("mi355x", pair)
    got = pl.gemm(a, b, c, input_format=pair, accumulator=acc, backend=backend)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("pair", [("e4m3", "e4m3"), ("e2m3", "e2m1"), ("e3m2", "e5m2")])
def test_scale_f8f6f4_equals_mmasim_on_scaled_operands(pair: tuple[str, str]) -> None:
    rng = np.random.default_rng([3535, F8F6F4.index(pair[0]), F8F6F4.index(pair[1])])
    m, k, n = 4, 128, 3
    # magnitudes that differ from block to block, so the E8M0 scales differ too
    xa = rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 20, (m, k // 32))).repeat(32, 1)
    xb = rng.standard_normal((k, n)) * np.exp2(rng.integers(-20, 20, (k // 32, n))).repeat(32, 0)
    qa = pl.quantize_blocks(xa, MX[pair[0]])
    qb = pl.quantize_blocks(xb, MX[pair[1]], axis=0)
    c = rng.standard_normal((m, n)).astype(np.float32)
    acc = pl.tensor_core("mi355x", (MX[pair[0]], MX[pair[1]]))
    got = pl.gemm_blocks(qa, qb, c, accumulator=acc)
    sa = np.repeat(qa.scales, 32, axis=1)
    sb = np.repeat(qb.scales, 32, axis=0)
    assert len(np.unique(sa)) > 1
    want = _mmasim(qa.element_values() * sa, qb.element_values() * sb, c)
    assert np.array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))


def test_unit_scales_give_the_f8f6f4_row() -> None:
    rng = np.random.default_rng(355)
    a = _values(rng, "e2m3", (4, 64))
    b = _values(rng, "e4m3", (64, 3))
    a[:, ::32] = 7.5  # each block holds its format's max: the MX scale is 2**0
    b[::32, :] = 448.0
    qa = pl.quantize_blocks(a, "mxfp6_e2m3")
    qb = pl.quantize_blocks(b, "mxfp8_e4m3", axis=0)
    assert (qa.scales == 1).all() and (qb.scales == 1).all()
    assert np.array_equal(qa.element_values(), a) and np.array_equal(qb.element_values(), b)
    c = rng.standard_normal((4, 3)).astype(np.float32)
    mx = pl.tensor_core("mi355x", ("mxfp6_e2m3", "mxfp8_e4m3"))
    scaled = pl.gemm_blocks(qa, qb, c, accumulator=mx)
    plain = pl.gemm(a, b, c, input_format=("e2m3", "e4m3"),
                    accumulator=pl.tensor_core("mi355x", ("e2m3", "e4m3")))  # fmt: skip
    assert np.array_equal(np.asarray(scaled), np.asarray(plain))


def test_scaled_rows_native_equals_numpy() -> None:
    """The scaled GTR-FDPA runs on the native kernels too (pl_gemm.cuh's separate addend takes
    the scales), bit for bit with the numpy reference: wide scale spreads, an infinite block."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        spread = 60 if seed % 2 else 20
        xa = rng.standard_normal((5, 128)) * np.exp2(rng.integers(-spread, spread, (5, 4))).repeat(
            32, 1
        )
        xb = rng.standard_normal((128, 4)) * np.exp2(rng.integers(-spread, spread, (4, 4))).repeat(
            32, 0
        )
        if seed == 3:
            xa[0, :32] = np.inf
        for pa, pb in (("mxfp8_e4m3", "mxfp8_e5m2"), ("mxfp6_e2m3", "mxfp4_e2m1")):
            qa, qb = pl.quantize_blocks(xa, pa), pl.quantize_blocks(xb, pb, axis=0)
            c = (rng.standard_normal((5, 4)) * 2.0 ** rng.integers(-30, 30, (5, 4))).astype(
                np.float32
            )
            acc = pl.tensor_core("mi355x", (pa, pb))
            r1 = np.asarray(pl.gemm_blocks(qa, qb, c, accumulator=acc, backend="numpy"))
            r2 = np.asarray(pl.gemm_blocks(qa, qb, c, accumulator=acc))
            same = (r1.view(np.uint32) == r2.view(np.uint32)) | (np.isnan(r1) & np.isnan(r2))
            assert same.all(), (seed, pa, pb)


def test_scales_with_separate_addend_take_no_group() -> None:
    base = pl.tensor_core("mi355x", "mxfp8_e4m3")
    assert base.addend == "separate" and base.scales == "in_block" and base.group is None
    with pytest.raises(ValueError, match="takes no group"):
        base.replace(group=16, block=32)
    with pytest.raises(ValueError, match="'in_block' or 'separate'"):
        Accumulator("fp32", order="block_fma", block=32, align_bits=25, addend="after_block",
                    scales="in_block")  # fmt: skip
