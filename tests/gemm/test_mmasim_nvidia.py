"""NVIDIA matrix-core presets against MMA-Sim 2.1.1 itself (``import mmasim``), bit for bit.

MMA-Sim (Xie et al., arXiv 2511.10909, github.com/microsoft/MMA-Sim, PyPI ``mmasim``) is the
hardware-validated model the NVIDIA presets cite. Every preset of ``pl.tensor_core.list()`` that
MMA-Sim also models (``mma``, ``wgmma``, ``tcgen05``, and the block-scaled kinds through
``pl.gemm`` with scales, as :func:`~precision_lab.gemm_blocks` runs them) is run by both on six
input classes: uniform, random bit patterns, a wide exponent spread, near-cancellation,
subnormals, and special values and zeros beside huge operands. Results compare as bit patterns
(any NaN equals any NaN). Where the measured GPU data of ``tests/gemm/data/tensor_core`` decided
a rule against MMA-Sim the data would win and the case would be listed here: there is none (the
30 measured sets agree with MMA-Sim 2.1.1's rules, benchmarks/verify_tensor_cores.py), so no
case is excluded. Not in MMA-Sim, so not run here: the FP8 ``mma.sync`` emulation of Hopper and
Blackwell (measured) and sm_120's UE4M3 scales on blocks of 32. MMA-Sim compiles a small C++
extension at its first import (fp64 FMA chains).
"""

from __future__ import annotations

import collections
import zlib
from typing import Any

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.gemm.tensor_core import PRESETS, Preset

torch = pytest.importorskip("torch", reason="MMA-Sim runs on torch")
mmasim = pytest.importorskip("mmasim", reason="MMA-Sim 2.1.1 (pip install mmasim) is the oracle")
nv_ptx = pytest.importorskip("mmasim.nv_ptx", reason="MMA-Sim's NVIDIA PTX models")

ARCH = {
    "volta": "Volta",
    "turing": "Turing",
    "ampere": "Ampere",
    "ada": "Ada Lovelace",
    "hopper": "Hopper",
    "blackwell": "Blackwell",
    "rtx_blackwell": "RTX Blackwell",
}
GPU = {
    "volta": "v100",
    "turing": "t4",
    "ampere": "a100",
    "ada": "l40s",
    "hopper": "h100",
    "blackwell": "b200",
    "rtx_blackwell": "rtx5090",
}
PTX = {
    "fp16": "f16",
    "bf16": "bf16",
    "tf32": "tf32",
    "fp32": "f32",
    "fp64": "f64",
    "e4m3": "e4m3",
    "e5m2": "e5m2",
    "e3m2": "e3m2",
    "e2m3": "e2m3",
    "e2m1": "e2m1",
}
TORCH = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "tf32": torch.float32,
    "fp32": torch.float32,
    "fp64": torch.float64,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}
#: block format of a block-scaled preset -> (element format, scale block, scale format)
BLOCKS = {
    "mxfp8_e4m3": ("e4m3", 32, "e8m0"),
    "mxfp8_e5m2": ("e5m2", 32, "e8m0"),
    "mxfp6_e3m2": ("e3m2", 32, "e8m0"),
    "mxfp6_e2m3": ("e2m3", 32, "e8m0"),
    "mxfp4_e2m1": ("e2m1", 32, "e8m0"),
    "mxfp4_e2m1_b16": ("e2m1", 16, "e8m0"),
    "nvfp4": ("e2m1", 16, "e4m3"),
    "nvfp4_b32": ("e2m1", 32, "e4m3"),
}
CLASSES = ("uniform", "bits", "spread", "cancel", "subnormal", "special")


# ----- the MMA-Sim instruction of a preset ---------------------------------------------------
def mmasim_op(p: Preset) -> tuple[Any, bool] | None:
    """(MMA-Sim operation, block-scaled?) of a preset, or None where MMA-Sim has no model."""
    arch, ins, kind = ARCH[p.arch], p.instruction, p.kind
    fa, fb = p.input_format
    out = PTX[p.out_format]
    try:
        if p.block_scaled:
            ea, kb, sf = BLOCKS[fa]
            eb = BLOCKS[fb][0]
            s = "ue8m0" if sf == "e8m0" else "ue4m3"
            if kind == "kind::mxf4nvf4":
                k_name = "mxf4" if (fa == "mxfp4_e2m1" and ins == "tcgen05") else "mxf4nvf4"
                if fa == "mxfp4_e2m1" and ins == "mma":
                    k_name = "mxf4"
                if ins == "tcgen05":
                    st = f"m128n8k64.kind::{k_name}.block{kb}.f32.e2m1.e2m1.{s}"
                    return nv_ptx.TCGen05MMABlockScale(arch, st), True
                st = f"m16n8k64.kind::{k_name}.block{kb}.f32.e2m1.e2m1.f32.{s}"
                return nv_ptx.MMABlockScale(arch, st), True
            if ins == "tcgen05":
                st = f"m128n8k32.kind::mxf8f6f4.block32.f32.{ea}.{eb}.{s}"
                return nv_ptx.TCGen05MMABlockScale(arch, st), True
            st = f"m16n8k32.kind::mxf8f6f4.block32.f32.{ea}.{eb}.f32.{s}"
            return nv_ptx.MMABlockScale(arch, st), True
        a, b = PTX[fa], PTX[fb]
        if ins == "mma":
            shape = kind.split(".")[0]
            if kind.startswith("kind::"):
                st = f"m16n8k32.{kind}.{out}.{a}.{b}.{out}"
            elif kind.count(".") == 4:  # the full PTX shape and types (an f16 C, an f32 D)
                st = kind
            else:
                st = f"{shape}.{out}.{a}.{b}.{out}"
            return nv_ptx.MMA(arch, st), False
        if ins == "wgmma":
            k = kind.split("k")[-1]
            return nv_ptx.WGMMA(arch, f"m64n8k{k}.{out}.{a}.{b}"), False
        if ins == "tcgen05":
            k = {"kind::tf32": 8, "kind::f16": 16, "kind::f8f6f4": 32}[kind]
            return nv_ptx.TCGen05MMA(arch, f"m64n8k{k}.{kind}.{out}.{a}.{b}"), False
    except AssertionError:  # MMA-Sim does not list this instruction
        return None
    return None


def nvidia_presets() -> list[Preset]:
    return [p for p in PRESETS.values() if p.vendor == "nvidia"]


def c_type(p: Preset) -> str:
    """The type of C: the output's, or the preset's ``c_format`` (Volta's f16 C, f32 D)."""
    cf = getattr(p.accumulator, "c_format", None)
    return p.out_format if cf is None else str(cf)


def family(p: Preset) -> str:
    fa, fb = p.input_format
    return (
        f"{p.arch} {p.instruction}.{p.kind} {fa if fa == fb else fa + 'x' + fb} -> {p.out_format}"
    )


# ----- inputs ----------------------------------------------------------------------------------
def _fmt(name: str) -> Any:
    return pl.get_format(name)


def _values(rng: np.random.Generator, fmt_name: str, shape: tuple[int, ...], cls: str) -> Any:
    """Values on ``fmt_name``'s grid (float64) for one input class."""
    f = _fmt(fmt_name)
    n = int(np.prod(shape))
    sign = rng.choice([-1.0, 1.0], n)
    if cls == "uniform":
        x = rng.uniform(-1, 1, n)
    elif cls == "bits":
        if f.bits > 32:
            x = rng.integers(0, 2**64, n, dtype=np.uint64).view(np.float64)
        else:
            x = np.asarray(pl.decode(rng.integers(0, 2**f.bits, n), f), dtype=np.float64)
    elif cls == "spread":
        e = rng.integers(f.emin - f.mantissa_bits, f.emax + 1, n)
        x = sign * np.ldexp(1 + rng.random(n), e)
    elif cls == "subnormal":
        x = sign * rng.integers(0, 2**f.mantissa_bits, n) * float(f.smallest_subnormal)
        x = np.where(rng.random(n) < 0.3, sign * rng.uniform(0, 4, n) * f.smallest_normal, x)
    elif cls == "special":  # small values with low bits, zeros, a few huge and special ones
        x = sign * np.ldexp(1 + rng.random(n), rng.integers(max(f.emin, -40), 1, n))
        big = sign * float(f.max) * rng.uniform(0.5, 1, n)
        x = np.where(rng.random(n) < 0.15, big, x)
        x = np.where(rng.random(n) < 0.35, rng.choice([0.0, -0.0], n), x)
        pool = [np.inf, -np.inf] if f.has_inf else []
        pool += [np.nan] if f.has_nan else []
        if pool:
            x = np.where(rng.random(n) < 0.02, rng.choice(pool, n), x)
    else:  # cancel: filled by the caller from uniform values
        x = rng.uniform(-1, 1, n)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.asarray(pl.round_to(x, f, overflow="saturate"), dtype=np.float64)
    return out.reshape(shape)


def _c_values(rng: np.random.Generator, out: str, shape: tuple[int, int], cls: str) -> Any:
    if cls == "bits":
        f = _fmt(out)
        if f.bits > 32:
            return rng.integers(0, 2**64, shape, dtype=np.uint64).view(np.float64)
        return np.asarray(pl.decode(rng.integers(0, 2**f.bits, shape), f), dtype=np.float64)
    if cls == "uniform":
        return np.where(rng.random(shape) < 0.3, 0.0, _values(rng, out, shape, "uniform"))
    return _values(rng, out, shape, cls)


def make_case(p: Preset, cls: str, seed: int, k: int, m: int = 3, n: int = 3) -> dict[str, Any]:
    """Operands (float64 on the grids), c, and scales for block-scaled presets."""
    rng = np.random.default_rng(seed)
    fa, fb = p.input_format
    if p.block_scaled:
        fa, fb = BLOCKS[fa][0], BLOCKS[fb][0]
    a = _values(rng, fa, (m, k), cls)
    b = _values(rng, fb, (k, n), cls)
    if cls == "cancel":  # products of the second half cancel the first half's, nearly
        h = k // 2
        a[:, h : 2 * h] = -a[:, :h]
        b[h : 2 * h, :] = b[:h, :]
        flip = rng.random((m, h)) < 0.5
        a[:, h : 2 * h] = np.where(flip, a[:, h : 2 * h], _values(rng, fa, (m, h), "uniform"))
    if cls == "special":  # zeros beside huge partners: rows of b at max, a zero there
        huge = rng.random(k) < 0.4
        b[huge, :] = float(_fmt(fb).max) * rng.choice([-1.0, 1.0], (int(huge.sum()), n))
        a[:-1, huge] = 0.0  # the last row keeps huge products (overflow)
    c = _c_values(rng, c_type(p), (m, n), cls)
    if cls == "cancel":
        with np.errstate(all="ignore"):
            c = np.asarray(pl.round_to(-(a @ b) * 1.0000001, _fmt(c_type(p))), np.float64)
    case = {"a": a, "b": b, "c": c}
    if p.block_scaled:
        kb, sf = BLOCKS[p.input_format[0]][1], BLOCKS[p.input_format[0]][2]
        if sf == "e8m0":
            lo, hi = (-20, 20) if cls != "spread" else (-127, 127)
            sa = np.ldexp(1.0, rng.integers(lo, hi, (m, k // kb)))
            sb = np.ldexp(1.0, rng.integers(lo, hi, (k // kb, n)))
        else:  # UE4M3: positive e4m3 values
            sa = np.abs(
                _values(rng, "e4m3", (m, k // kb), "spread" if cls == "spread" else "uniform")
            )
            sb = np.abs(
                _values(rng, "e4m3", (k // kb, n), "spread" if cls == "spread" else "uniform")
            )
            sa = np.where(sa == 0, 1.0, sa)
            sb = np.where(sb == 0, 1.0, sb)
        case |= {"sa": sa, "sb": sb, "kb": kb}
    return case


# ----- running both ----------------------------------------------------------------------------
def _to_torch(x: Any, fmt_name: str, *, packed: bool = False, low_bits: bool = False) -> Any:
    if fmt_name in TORCH:
        return torch.tensor(np.ascontiguousarray(x), dtype=torch.float64).to(TORCH[fmt_name])
    codes = np.asarray(pl.encode(x, _fmt(fmt_name)), dtype=np.uint8)
    if fmt_name == "e2m1" and packed:  # two per byte, the first in the high nibble
        codes = (codes[..., 0::2] << 4) | codes[..., 1::2]
    elif fmt_name == "e2m1" and not low_bits:  # one per byte, in bits 5:2
        codes = codes << 2
    return torch.from_numpy(np.ascontiguousarray(codes))


def run_mmasim(p: Preset, op: Any, case: dict[str, Any]) -> Any:
    fa, fb = p.input_format
    c = torch.tensor(case["c"], dtype=torch.float64).to(TORCH[c_type(p)])
    if p.block_scaled:
        ea, eb = BLOCKS[fa][0], BLOCKS[fb][0]
        packed = p.kind == "kind::mxf4nvf4"
        A = _to_torch(case["a"], ea, packed=packed)
        B = _to_torch(case["b"].T.copy(), eb, packed=packed).T
        sdt = torch.float8_e8m0fnu if BLOCKS[fa][2] == "e8m0" else torch.float8_e4m3fn
        sa = torch.tensor(case["sa"], dtype=torch.float32).to(sdt)
        sb = torch.tensor(case["sb"], dtype=torch.float32).to(sdt)
        if packed:
            d = op(A, B, c, sa, sb)
        else:  # ST-FDPA takes one scale per call: chain the 32-wide blocks as the GPU does
            for j in range(sa.shape[1]):
                blk = slice(32 * j, 32 * (j + 1))
                c = op(A[:, blk], B[blk, :], c, sa[:, j : j + 1], sb[j : j + 1, :])
            d = c
    else:
        A = _to_torch(case["a"], fa)
        B = _to_torch(case["b"], fb)
        d = op(A, B, c)
    return d.numpy()


def run_pl(p: Preset, case: dict[str, Any], backend: str = "auto") -> Any:
    fa, fb = p.input_format
    acc = pl.tensor_core(GPU[p.arch], (fa, fb), out_format=p.out_format,
                         instruction=f"{p.instruction}.{p.kind}")  # fmt: skip
    if p.block_scaled:
        d = pl.gemm(
            case["a"],
            case["b"],
            case["c"],
            input_format=(BLOCKS[fa][0], BLOCKS[fb][0]),
            accumulator=acc,
            out_format=p.out_format,
            input_rounding="exact",
            scale_a=case["sa"],
            scale_b=case["sb"],
            scale_block=case["kb"],
            backend=backend,
        )
    else:
        d = pl.gemm(case["a"], case["b"], case["c"], input_format=(fa, fb), accumulator=acc,
                    out_format=p.out_format, backend=backend)  # fmt: skip
    return np.asarray(d)


def _bits(x: Any, out: str) -> Any:
    dt = {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64}[out]
    x = np.asarray(x).astype(dt)
    u = {"fp16": np.uint16, "fp32": np.uint32, "fp64": np.uint64}[out]
    bits = x.view(u).astype(np.uint64)
    return np.where(np.isnan(x), np.uint64(1), bits)  # any NaN equals any NaN


def differences(p: Preset, op: Any, case: dict[str, Any], backend: str = "auto") -> Any:
    """Boolean mask of the output elements where pl.gemm and MMA-Sim differ."""
    want = _bits(run_mmasim(p, op, case), p.out_format)
    got = _bits(run_pl(p, case, backend), p.out_format)
    return want != got


def k_of(p: Preset) -> int:
    """Two blocks and a ragged tail (whole scale blocks for block-scaled kinds)."""
    block = p.accumulator.block or 4
    if p.block_scaled:
        return 2 * block
    if p.accumulator.order != "block_fma":
        return 6
    return 2 * block + block // 2 + 1


def seed_of(*parts: Any) -> int:
    return zlib.crc32(" ".join(map(str, parts)).encode())


def count(cases_per_class: int = 4) -> dict[str, tuple[int, int]]:
    """family -> (differing elements, elements compared) over every preset MMA-Sim models."""
    table: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for p in nvidia_presets():
        found = mmasim_op(p)
        if found is None:
            continue
        op, _ = found
        for cls in CLASSES:
            for i in range(cases_per_class):
                case = make_case(p, cls, seed_of(family(p), cls, i), k_of(p))
                diff = differences(p, op, case)
                table[family(p)][0] += int(diff.sum())
                table[family(p)][1] += diff.size
    return {k: (v[0], v[1]) for k, v in table.items()}


# ----- the tests -------------------------------------------------------------------------------
def _sampled() -> list[Preset]:
    """Every preset MMA-Sim models, the mixed-format pairs sampled (one per instruction and
    output besides the same-format ones)."""
    chosen, seen = [], set()
    for p in nvidia_presets():
        fa, fb = p.input_format
        key = (p.arch, p.instruction, p.kind, p.out_format)
        if fa != fb and key in seen:
            continue
        if fa != fb:
            seen.add(key)
        chosen.append(p)
    return chosen


SAMPLED = [p for p in _sampled() if mmasim_op(p) is not None]


def test_mmasim_models_the_nvidia_table() -> None:
    """MMA-Sim models every NVIDIA preset but the FP8 ``mma.sync`` emulation of Hopper and
    Blackwell (measured, not in MMA-Sim) and UE4M3 scales on blocks of 32 on sm_120 (MMA-Sim
    marks the instruction invalid)."""
    missing = {family(p) for p in nvidia_presets() if mmasim_op(p) is None}
    assert all(
        (" mma.m16n8k32 " in f and f.split()[0] in ("hopper", "blackwell")) or "nvfp4_b32" in f
        for f in missing
    ), sorted(missing)


@pytest.mark.parametrize("p", SAMPLED, ids=family)
def test_preset_equals_mmasim(p: Preset) -> None:
    op, _ = mmasim_op(p)  # type: ignore[misc]
    k = k_of(p)
    bad = []
    for cls in CLASSES:
        case = make_case(p, cls, seed_of(family(p), cls, 0), k)
        diff = differences(p, op, case)
        if diff.any():
            bad.append(f"{cls}: {int(diff.sum())}/{diff.size}")
    assert not bad, f"{family(p)} differs from MMA-Sim: {bad}"


if __name__ == "__main__":  # the per-family difference table
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    total = [0, 0]
    for fam, (d, t) in sorted(count(n).items()):
        total[0] += d
        total[1] += t
        print(f"{d:6d} / {t:6d}  {fam}")
    print(f"{total[0]:6d} / {total[1]:6d}  all")


# ----- regression tests of the rules MMA-Sim 2.1.1 exposed (each failed before the fix) ------
def _one(fa: str, out: str, a: list[float], b: list[float], c: float) -> dict[str, Any]:
    return {"a": np.array([a]), "b": np.array([b]).T, "c": np.array([[c]])}


def _preset(gpu_arch: str, ins: str, kind: str, f: str, out: str) -> Preset:
    return PRESETS[(gpu_arch, ins, kind, f, f, out)]


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_a_zero_product_beside_a_huge_operand_keeps_the_anchor(backend: str) -> None:
    """Hopper bf16: a zero times 2**127 aligns at e_zero (-133), not at 127 - 126 = 1, so the
    small product keeps its low bits (the old rule cut them: 0x3580 0000 vs MMA-Sim's)."""
    p = _preset("hopper", "mma", "m16n8k16", "bf16", "fp32")
    op, _ = mmasim_op(p)  # type: ignore[misc]
    a = [2.0**-20 * (1 + 2**-7) + 2.0**-27, 0.0] + [0.0] * 14
    b = [1 + 2.0**-7, 2.0**127] + [0.0] * 14
    case = _one("bf16", "fp32", a, b, 0.0)
    want = _bits(run_mmasim(p, op, case), "fp32")
    assert int(want[0, 0]) == 897778688  # MMA-Sim 2.1.1
    assert (_bits(run_pl(p, case, backend), "fp32") == want).all()


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_a_zero_c_aligns_at_e_zero(backend: str) -> None:
    """Hopper bf16, c = 0: the anchor is at least e_zero = -133 (25 bits: a grain of 2**-158),
    not -126 (2**-151): two products near 2**-145 keep bits the old rule cut (0x37 against
    the old 0x38, MMA-Sim 2.1.1 0x37)."""
    p = _preset("hopper", "mma", "m16n8k16", "bf16", "fp32")
    op, _ = mmasim_op(p)  # type: ignore[misc]
    a = [1.5021599923962983e-21, 2.2540671692070004e-23] + [0.0] * 14
    b = [5.459392042849983e-23, -1.5881867761018131e-22] + [0.0] * 14
    case = _one("bf16", "fp32", a, b, 0.0)
    want = _bits(run_mmasim(p, op, case), "fp32")
    assert int(want[0, 0]) == 0x37
    assert (_bits(run_pl(p, case, backend), "fp32") == want).all()


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_a_cancelled_fp4_group_keeps_its_scales_exponent(backend: str) -> None:
    """NVFP4 (GST-FDPA): a group of 16 products that cancels still aligns at its scales'
    exponent (448 * 448: 2**16 here), which cuts c's low bits; a group of zero products
    takes e_zero."""
    p = PRESETS[("blackwell", "tcgen05", "kind::mxf4nvf4", "nvfp4", "nvfp4", "fp32")]
    op, _ = mmasim_op(p)  # type: ignore[misc]
    a = np.zeros((1, 64))
    b = np.zeros((64, 1))
    a[0, 0], a[0, 1], b[0, 0], b[1, 0] = 1.0, -1.0, 1.0, 1.0  # cancels
    case = {
        "a": a,
        "b": b,
        "c": np.array([[1.0 + 2.0**-20]]),
        "sa": np.array([[448.0, 1.0, 1.0, 1.0]]),
        "sb": np.array([[448.0], [1.0], [1.0], [1.0]]),
        "kb": 16,
    }
    want = _bits(run_mmasim(p, op, case), "fp32")
    assert float(np.asarray(want, np.uint32).view(np.float32)[0, 0]) == 1.0
    assert (_bits(run_pl(p, case, backend), "fp32") == want).all()


def test_the_rows_mmasim_lists_are_in_the_table() -> None:
    """Turing's mma.m8n8k4 (Volta's datapath, Volta's e_zero) and mma.m8n8k4.f64 on Hopper,
    Blackwell and RTX Blackwell (sm_80's DMMA, a chain of fp64 FMAs)."""
    t = pl.tensor_core("t4", "fp16", instruction="mma.m8n8k4")
    assert (t.block, t.align_bits, t.zero_exponent) == (4, 23, -131)
    assert (
        pl.tensor_core("t4", "fp16", instruction="mma.m8n8k4", out_format="fp16").zero_exponent
        == -19
    )
    for gpu in ("h100", "b200", "rtx5090"):
        acc = pl.tensor_core(gpu, "fp64", out_format="fp64", instruction="mma.m8n8k4.f64")
        assert acc.order == "sequential" and str(acc.format) == "fp64"


def test_volta_f16_c_aligns_a_subnormal_c_at_fp16s_emin() -> None:
    """Volta mma.m8n8k4.f32.f16.f16.f16 (an f16 C, an f32 D): c = 3 * 2**-24 (fp16 subnormal)
    aligns at -14, not at -23, so the product's low bits (below 2**-37) are cut; with an f32
    C (the m8n8k4 preset) they stay. Both against MMA-Sim 2.1.1."""
    x = 1 + 2.0**-10
    a = np.array([[x * 2.0**-10, 0, 0, 0]])
    b = np.array([[x * 2.0**-12], [0], [0], [0]])
    c = np.array([[3 * 2.0**-24]])
    for kind, c_dtype in (("m8n8k4.f32.f16.f16.f16", torch.float16), ("m8n8k4", torch.float32)):
        p = PRESETS[("volta", "mma", kind, "fp16", "fp16", "fp32")]
        op, _ = mmasim_op(p)  # type: ignore[misc]
        want = op(_to_torch(a, "fp16"), _to_torch(b, "fp16"), torch.tensor(c).to(c_dtype))
        got = run_pl(p, {"a": a, "b": b, "c": c})
        assert (_bits(got, "fp32") == _bits(want.numpy(), "fp32")).all(), kind
    assert p.accumulator.c_format is None
    with pytest.raises(ValueError, match="c_format needs order='block_fma'"):
        pl.Accumulator(c_format="fp16")
