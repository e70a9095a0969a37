"""Models of real matrix cores (NVIDIA tensor cores, AMD matrix cores): :func:`tensor_core`.

Every preset is a record of ``PRESETS``: the GPU architecture, the instruction
(``"mma"``, ``"wgmma"``, ``"tcgen05"`` or ``"mfma"``, with its kind or shape), the operand
formats, the output format, the :class:`~precision_lab.gemm.accumulator.Accumulator` that
computes it, and the evidence: ``measured`` (reproduces a data set of
``shared/data/tensor-core-validation`` bit for bit, ``benchmarks/verify_tensor_cores.py``),
``published`` (the bit-accurate, hardware-validated models of MMA-Sim, Xie et al., arXiv
2511.10909, github.com/microsoft/MMA-Sim) or ``inferred`` (with the reason).
:func:`tensor_core_list` (also ``pl.tensor_core.list()`` and ``precision-lab tensor-cores``) is
the table.

NVIDIA (MMA-Sim's T-FDPA; Fasi et al. 2021; Khattak & Mikaitis 2025): a block of ``n`` exact
products and the running accumulator are aligned to the largest exponent, bits below
``align_bits`` fraction bits are truncated, the block is summed exactly, normalised once and
rounded (toward zero into fp32, to nearest even into fp16), and blocks chain. ``mma`` on Ampere
and Ada splits its K in two blocks (m16n8k16: 2 x 8); Volta keeps 23 fraction bits, Turing,
Ampere and Ada 24, Hopper and both Blackwells 25; FP8 on Ada and in Hopper's ``wgmma`` keeps 13
into a 14-bit accumulator (``FloatFormat(8, 13)``). Block-scaled MMA (tcgen05
``kind::mxf8f6f4``, ``kind::mxf4nvf4`` and sm_120 ``mma.block_scale``; MMA-Sim's ST-FDPA and
GST-FDPA) takes the block format as ``input_format`` and runs through
:func:`~precision_lab.gemm_blocks`: the E8M0 scales add to the products' exponents inside the
32-product block FMA (25 bits); FP4 kinds (k = 64) first sum each 16 products exactly, multiply
by the two scales (E8M0, or UE4M3 for NVFP4) and align those terms at the scales' exponents with
35 fraction bits. FP64 (``mma.m8n8k4.f64`` from Ampere on, Hopper's DMMA, AMD's f64 MFMA) is a
chain of fused multiply-adds in fp64. Turing keeps Volta's ``mma.m8n8k4`` (4 products, 23 bits).
A zero product and a zero c take part in the alignment anchor at MMA-Sim 2.1.1's ``e_zero``, a
constant per architecture and output type (:data:`NV_ZERO_EXPONENT`; the accumulator's
``zero_exponent``), not at -126 plus the partner's exponent (MMA-Sim's earlier snapshot): no
measured data set separates the two rules (they agree on all 30 sets), so MMA-Sim 2.1.1 decides
(``tests/gemm/test_mmasim_nvidia.py`` runs it against every preset it models).

AMD (MMA-Sim 2.1.1, CDNA1-3): f32 and f64 MFMA are chains of FMAs; CDNA1 fp16/bf16 sum blocks
of 4/2 products and the accumulator exactly with one round to nearest (E-FDPA); CDNA2 fp16/bf16
round products to fp32, add them in pairs (``_1k`` and fp16: pairs of pairs) in fp32 with
subnormals flushed (inputs and results) and add that to the accumulator; CDNA3 fp16/bf16 (8
products), xf32 (4) and fp8/bf8 FNUZ (16: even and odd products as two blocks) align the
products among themselves (24 fraction bits, truncated), then the block sum (32 bits) and the
accumulator (24 bits) at their common exponent, floored, normalise that sum to 31 bits
(floored) and round to nearest (TR-FDPA, GTR-FDPA; ``addend="separate"`` in the accumulator
spec). The rules MMA-Sim 2.1.1 fixed, each now the preset's (issue 31): fp8/bf8 floor the
even/odd partial sums and c at the common anchor (not toward zero) and drop c below ``e_max -
F - 1`` (``drop_bits=25``); bf16/xf32 products of ``2**128`` or more are inf before the sum
(``inf - inf`` is NaN); a zero c enters the anchor at -126. No measured AMD data set exists (the
library's 30 measured sets are NVIDIA's), so MMA-Sim 2.1.1 is the evidence of every CDNA1-3 rule;
``tests/gemm/test_mmasim_amd.py`` runs it on six input classes and requires the same bits (NaN
payloads aside), with one documented departure: an inf or NaN accumulator stays inf or NaN on
CDNA3 fp8/bf8, where MMA-Sim's GTR-FDPA drops it once the next block's products reach ``2**25``
(an artifact of its float emulation: ``torch.frexp`` gives inf and NaN the exponent 0, and its
code assumes a finite c, ``-126 <= e_c <= 127``).

CPUs (issue 33; :mod:`precision_lab.gemm.cpu_instructions`): x86 ``vdpbf16ps`` (measured on
an AMD EPYC 9004, Zen 4, and an Intel Xeon), ``tdpbf16ps`` (AMX-BF16) and ``vfmadd231ph``
(AVX512-FP16; measured on the Xeon), ``tdpfp16ps`` (the SDM's Operation) and Arm ``bfmmla``,
``bfdot``, ``bfmlal``, ``fdot``, ``fmlal``, ``fmlall`` (the Arm ARM's pseudocode) are rows of
the same table, machine ``"x86"`` or ``"arm"``.

AMD CDNA4 (``mi350x``, ``mi355x``; ``_cdna4_rows``): no bit-accurate public model and no
measurement exist, so every row is ``inferred``: CDNA3's published datapaths carried over to the
instructions LLVM's gfx950 definitions keep or add. f64/f32 are FMA chains, f16/bf16 (now also
16x16x32 and 32x32x16) CDNA3's TR-FDPA, ``f8f6f4`` (``v_mfma_f32_16x16x128_f8f6f4`` /
``32x32x64``, a format per operand: OCP E4M3/E5M2, E2M3, E3M2, E2M1, selected by ``cbsz``/
``blgp``, :data:`CDNA4_F8F6F4_CODES`) CDNA3's fp8 GTR-FDPA on the exact operand values, and
``scale_f8f6f4`` (``v_mfma_scale_f32_*_f8f6f4``, MX operands through
:func:`~precision_lab.gemm_blocks`) the same with each product times its two E8M0 scales
(``scales="in_block"`` with ``addend="separate"``). xf32 is gone; FNUZ operands are refused.
``tests/gemm/test_cdna4.py`` holds the rows to MMA-Sim's own GTR-FDPA on those values; only an
MI355X can say whether the inference holds (``pl.probe_gemm``; docs/gemm.md, "AMD CDNA4").

Operands are taken on their format's grid: tf32 (NVIDIA) and xf32 (AMD) matrix cores truncate
fp32 data to tf32 (MMA-Sim), so pass ``input_rounding="toward_zero"`` to
:func:`~precision_lab.gemm` for fp32 data that is not on the tf32 grid yet.

FP8 ``mma.sync`` on Hopper and Blackwell (every measured FP8 set with fp16 output, and B200
FP8 with fp32 output) is not native: the GPUs have no FP8 ``mma.sync`` unit, and the compiler
converts the FP8 operands to fp16 (exact) and issues two fp16 tensor-core MMAs of k = 16
(NVIDIA's answer in CUTLASS issue #1986; the data confirms it bit for bit). The measured model
(:data:`FP8_MMA_SYNC_EMULATION`, ``inner_block`` in the accumulator spec): the 32 products of
an instruction are split by register byte pairs (the first fp16 MMA takes the products k with
``k % 4`` in {0, 1}, the second those with ``k % 4`` in {2, 3}); the two MMAs chain from a zero
accumulator with the GPU's fp16-input model (16 products, 25 fraction bits), each rounded into
the output type (fp16 to nearest even, fp32 toward zero); only then is c added, with one
round-to-nearest-even in the output type (``addend="after_block"``). This reproduces all four
FP8 -> fp16 sets of H100 and B200 5000/5000 (previously 3931, 4212, 3929 and 4241 with a single
32-product block rounded to fp16; contiguous halves 3477-3850, the byte-pair halves in the
other order 3443-3771, c aligned inside the first MMA 3033-3154). The B200 FP8 -> fp32 sets do
not tell the split apart (fp32 hides it); the emulation model is used there too. It is the
``instruction="mma"`` preset; what GEMM libraries run on B200 (cuBLAS, CUTLASS, DeepGEMM) is
``tcgen05.mma kind::f8f6f4``: one 32-product block, 25 fraction bits, the default.

How the running accumulator enters a native block is measured only where the data has a
non-zero c: it is aligned in the block for Ada FP8 (``addend="in_block"``: 5000/5000, against
about 2800 with ``"after_block"``) and for every fp16, bf16 and tf32 set of every GPU. The Hopper
FP8 fp32 data (``wgmma``) ran with c = 0, so its chaining across the 32-product blocks of a long
K is inferred, not measured. Decision: the running sum is aligned in each block
(``addend="in_block"``), the published model. Evidence: (1) every native data set with a non-zero
c aligns it in the block (Ada FP8, and the fp16, bf16 and tf32 sets of every GPU); the one
apparent exception, B200 FP8, is the ``mma.sync`` emulation above, so no native instruction is
known to add c after its block. (2) DeepSeek-V3 (section 3.3.2) reports that FP8 GEMM on H800
"is limited to retaining around 14 bits", that the problem grows with K, and "a maximum relative
error of nearly 2%" for "two random matrices with K = 4096", fixed by copying partial sums to
FP32 every N_C = 128 products (4 ``wgmma``): that fix only helps if ``wgmma`` carries its
accumulator across instructions at about 14 bits. A block sum added to a full fp32 accumulator
after each instruction would give 1.3e-6 on E4M3 inputs uniform on [0, 1) at K = 4096 (2.6e-5
normwise for Gaussian inputs), far from 2%. Their input distribution and error measure are not
published, so "nearly 2%" does not separate in-block alignment (6.9e-2 on the uniform inputs,
7.4e-2 on ``|N(0, 1)|``, 1.7e-3 normwise on N(0, 1)) from a 14-bit accumulator that takes the
block sum after the block (3.1e-3, 3.6e-3, 3.2e-3): both err by the right order and grow with
K; (1) decides.

fp16 output (``out_format="fp16"``) exists for fp16 and FP8/FP6/FP4 inputs: the accumulator is
then fp16, rounded to nearest even. The measured fp16-output FP8 sets of Hopper and Blackwell
are ``mma.sync`` (``instruction="mma"``); Hopper's default, ``wgmma`` with an f16 accumulator
(32 products, 13 bits, then fp16 to nearest), is MMA-Sim's published model, not measured.
:data:`APPROXIMATE` lists presets that do not reproduce their data: none.

>>> import precision_lab as pl
>>> acc = pl.tensor_core("h100", "e4m3")
>>> acc.block, acc.align_bits, acc.format, acc.rounding
(32, 13, FloatFormat(exponent_bits=8, mantissa_bits=13, ...), 'toward_zero')
>>> pl.tensor_core("b200", "e4m3").name
'b200 e4m3 -> fp32 (tcgen05.mma kind::f8f6f4)'
>>> pl.tensor_core("v100", "bf16")
Traceback (most recent call last):
...
ValueError: input_format: v100 (volta) mma takes fp16, got 'bf16'
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.formats import FloatFormat, get_format
from ..quant.block_formats import BlockFormat, get_block_format
from .accumulator import Accumulator, reference_only
from .cpu_instructions import (
    CPU_INSTRUCTIONS,
    CPU_LIBRARY_CHOICE,
    CPU_MACHINES,
    CPU_SPECIAL_EVIDENCE,
    cpu_instruction_name,
    cpu_rows,
)

__all__ = [
    "APPROXIMATE",
    "ARCHITECTURES",
    "CDNA4_F8F6F4_CODES",
    "CDNA4_F8F6F4_VGPRS",
    "GPUS",
    "INSTRUCTIONS",
    "PRESETS",
    "TCGEN05_F8F6F4_CODES",
    "Preset",
    "measured_preset",
    "tensor_core",
    "tensor_core_formats",
    "tensor_core_list",
]

#: GPU name -> architecture
GPUS: dict[str, str] = {
    "v100": "volta",
    "t4": "turing",
    "rtx2080": "turing",
    "a100": "ampere",
    "a2": "ampere",
    "a30": "ampere",
    "ada": "ada",
    "l40s": "ada",
    "rtx4090": "ada",
    "h100": "hopper",
    "h200": "hopper",
    "b200": "blackwell",
    "rtx5090": "rtx_blackwell",
    "rtxpro6000": "rtx_blackwell",
    "mi100": "cdna1",
    "mi210": "cdna2",
    "mi250": "cdna2",
    "mi300a": "cdna3",
    "mi300x": "cdna3",
    "mi325x": "cdna3",
    **CPU_MACHINES,  # CPUs: "x86" (aliases "zen4", "sapphirerapids"), "arm" (cpu_instructions)
    "mi350x": "cdna4",
    "mi355x": "cdna4",
}

#: the instructions, and per architecture the order in which GEMM libraries prefer them
#: (cuBLAS/CUTLASS: wgmma on Hopper, tcgen05 on datacenter Blackwell; rocBLAS/hipBLASLt: mfma)
INSTRUCTIONS = ("mma", "wgmma", "tcgen05", "mfma", *CPU_INSTRUCTIONS)
_LIBRARY_CHOICE: dict[str, tuple[str, ...]] = {
    "volta": ("mma",),
    "turing": ("mma",),
    "ampere": ("mma",),
    "ada": ("mma",),
    "hopper": ("wgmma", "mma"),
    "blackwell": ("tcgen05", "mma"),
    "rtx_blackwell": ("mma",),
    "cdna1": ("mfma",),
    "cdna2": ("mfma",),
    "cdna3": ("mfma",),
    **CPU_LIBRARY_CHOICE,
    "cdna4": ("mfma",),
}

#: (architecture, input format, output format) whose preset does not reproduce measurements
#: (empty: every measured set is reproduced bit for bit)
APPROXIMATE: dict[tuple[str, str, str], str] = {}

#: FP8 ``mma.sync`` (m16n8k32) on Hopper and Blackwell, which have no native FP8 mma.sync: the
#: compiler converts the FP8 operands to fp16 (exactly) and issues two fp16 tensor-core MMAs
#: (k = 16 each) chained from a zero accumulator, then adds c. The fp8x4 registers are split
#: into low and high byte pairs: the first MMA takes the products k with k % 4 in {0, 1}, the
#: second those with k % 4 in {2, 3}.
FP8_MMA_SYNC_EMULATION: dict[str, int] = {"block": 32, "inner_block": 16, "inner_interleave": 2}

#: the 14-bit accumulator of FP8 tensor cores (Ada mma, Hopper wgmma): 13 fraction bits
FP8_ACCUMULATOR = FloatFormat(8, 13, name="e8m13")

_FP8 = ("e4m3", "e5m2")
_F8F6F4 = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
_MMASIM = "published: MMA-Sim (Xie et al., arXiv 2511.10909)"

#: measured data sets (shared/data/tensor-core-validation): (arch, input, output) -> (set name,
#: instruction the set was recorded with)
MEASURED: dict[tuple[str, str, str], tuple[str, str]] = {
    ("volta", "fp16", "fp32"): ("V100_fp16", "mma"),
    ("volta", "fp16", "fp16"): ("V100_fp16", "mma"),
    ("ampere", "fp16", "fp32"): ("A100_fp16", "mma"),
    ("ampere", "fp16", "fp16"): ("A100_fp16", "mma"),
    ("ampere", "bf16", "fp32"): ("A100_bf16", "mma"),
    ("ampere", "tf32", "fp32"): ("A100_tf32", "mma"),
    ("ada", "fp16", "fp32"): ("Ada_fp16", "mma"),
    ("ada", "fp16", "fp16"): ("Ada_fp16", "mma"),
    ("ada", "bf16", "fp32"): ("Ada_bf16", "mma"),
    ("ada", "tf32", "fp32"): ("Ada_tf32", "mma"),
    ("ada", "e4m3", "fp32"): ("Ada_E4M3", "mma"),
    ("ada", "e4m3", "fp16"): ("Ada_E4M3", "mma"),
    ("ada", "e5m2", "fp32"): ("Ada_E5M2", "mma"),
    ("ada", "e5m2", "fp16"): ("Ada_E5M2", "mma"),
    ("hopper", "fp16", "fp32"): ("H100_fp16", "mma"),
    ("hopper", "fp16", "fp16"): ("H100_fp16", "mma"),
    ("hopper", "bf16", "fp32"): ("H100_bf16", "mma"),
    ("hopper", "tf32", "fp32"): ("H100_tf32", "mma"),
    ("hopper", "e4m3", "fp32"): ("H100_E4M3", "wgmma"),
    ("hopper", "e4m3", "fp16"): ("H100_E4M3", "mma"),
    ("hopper", "e5m2", "fp32"): ("H100_E5M2", "wgmma"),
    ("hopper", "e5m2", "fp16"): ("H100_E5M2", "mma"),
    ("blackwell", "fp16", "fp32"): ("B200_fp16", "mma"),
    ("blackwell", "fp16", "fp16"): ("B200_fp16", "mma"),
    ("blackwell", "bf16", "fp32"): ("B200_bf16", "mma"),
    ("blackwell", "tf32", "fp32"): ("B200_tf32", "mma"),
    ("blackwell", "e4m3", "fp32"): ("B200_E4M3", "mma"),
    ("blackwell", "e4m3", "fp16"): ("B200_E4M3", "mma"),
    ("blackwell", "e5m2", "fp32"): ("B200_E5M2", "mma"),
    ("blackwell", "e5m2", "fp16"): ("B200_E5M2", "mma"),
}

#: special-value rules (fields of the Accumulator spec) of NVIDIA's block-FMA datapaths, with
#: their evidence. A zero product and a zero c take MMA-Sim 2.1.1's fixed exponent ``e_zero``
#: in the alignment anchor (``zeros_in_anchor``, ``zero_exponent``: :data:`NV_ZERO_EXPONENT`);
#: NaN results are 0x7fffffff / 0x7fff (``nan_encoding="nvidia"``);
#: a zero result is +0 (``zero_sign="positive"``): the aligned terms are summed as a
#: fixed-point integer from +0, so even a sum of -0 terms is +0, into fp32 or fp16 alike
#: (MMA-Sim's fused sum; no measured set has the case); where the datapath truncates (fp32
#: output), a sum whose exponent passes ``emax`` is inf (``overflow="infinity"``; with
#: round-to-nearest outputs IEEE already gives inf).
NVIDIA_SPECIALS = {"zeros_in_anchor": True, "nan_encoding": "nvidia", "zero_sign": "positive"}
NVIDIA_TRUNCATING = {"overflow": "infinity"}
_SPECIAL_EVIDENCE = {
    "nvidia": f"{_MMASIM} 2.1.1: zeros (a zero product, a zero c) align at e_zero (a constant per "
    "architecture and output type), NaN 0x7fffffff/0x7fff, truncated significand "
    "times 2**e (inf past emax), the aligned sum a fixed-point integer (no -0)",
    "fma": f"{_MMASIM}: libm fma, IEEE 754 results",
    "amd": f"{_MMASIM.replace('MMA-Sim', 'MMA-Sim 2.1.1')} MFMA: IEEE results of the fp64 "
    "sum for inf/NaN (CDNA3 bf16/xf32: products of 2**128 or more are inf), round to nearest",
    "cdna2": f"{_MMASIM} MFMA CDNA2: subnormal inputs flushed to +0, results to signed zero",
}


@dataclass(frozen=True)
class Preset:
    """One row of the table: a GPU architecture's instruction on given operand formats."""

    arch: str
    instruction: str  # mma | wgmma | tcgen05 | mfma
    kind: str  # the instruction's kind or shape, e.g. "kind::f8f6f4", "m16n8k16", "bf16_1k"
    input_format: tuple[str, str]  # operand formats (block formats for block-scaled kinds)
    out_format: str
    accumulator: Accumulator
    evidence: str
    block_scaled: bool = False

    @property
    def vendor(self) -> str:
        return _vendor(self.arch)

    @property
    def gpus(self) -> list[str]:
        return [g for g, a in GPUS.items() if a == self.arch]

    @property
    def default(self) -> bool:
        """Whether ``instruction=None`` picks this preset (what GEMM libraries issue)."""
        return _default_of(self.arch, self.input_format, self.out_format) is self

    def row(self) -> dict[str, Any]:
        """The table row (see :func:`tensor_core_list`)."""
        acc = self.accumulator
        fa, fb = self.input_format
        return {
            "gpus": " ".join(self.gpus),
            "arch": self.arch,
            "instruction": self.instruction,
            "kind": self.kind,
            "input_format": fa if fa == fb else f"{fa} x {fb}",
            "out_format": self.out_format,
            "default": self.default,
            "products_per_block": acc.block or acc.promote_every or 1,
            "fraction_bits": acc.align_bits if acc.order == "block_fma" else None,
            "rounding": _rounding_text(acc),
            "special_values": _special_text(acc),
            "special_evidence": _special_evidence(self),
            "evidence": self.evidence,
            "model": acc.describe().replace("{gpu}", "/".join(self.gpus)),
        }


def _rounding_text(acc: Accumulator) -> str:
    fmt = acc.format
    if acc.order == "block_fma" and acc.addend == "after_block":
        return f"{acc.block_rounding} per MMA, then {acc.rounding} into {fmt}"
    return f"{acc.rounding} into {fmt}"


def _special_text(acc: Accumulator) -> str:
    parts = [
        f"overflow={acc.overflow}",
        f"zero_sign={acc.zero_sign}",
        f"nan_encoding={acc.nan_encoding}",
    ]
    if acc.order == "block_fma":
        parts.append(f"zeros_in_anchor={acc.zeros_in_anchor}")
        if acc.zeros_in_anchor:
            parts.append(f"zero_exponent={acc.zero_exponent}")
    if acc.subnormals == "flush":
        parts.append("subnormals=flush")
    if acc.input_subnormals != "keep":
        parts.append(f"input_subnormals={acc.input_subnormals}")
    if acc.tininess != "subnormal_grid":
        parts.append(f"tininess={acc.tininess}")
    if acc.pair_order != "natural":
        parts.append(f"pair_order={acc.pair_order}")
    return ", ".join(parts)


def _with_specials(acc: Accumulator, vendor: str) -> Accumulator:
    """NVIDIA's special-value rules on a block-FMA preset (:data:`NVIDIA_SPECIALS`; with
    :data:`NVIDIA_TRUNCATING` where a rounding truncates); AMD's models and FMA chains keep
    IEEE rules."""
    if vendor != "nvidia" or acc.order != "block_fma":
        return acc
    changes: dict[str, Any] = dict(NVIDIA_SPECIALS)
    if acc.rounding == "toward_zero" or (
        acc.addend == "after_block" and acc.block_rounding == "toward_zero"
    ):
        changes.update(NVIDIA_TRUNCATING)
    return dataclasses.replace(acc, **changes)


def _vendor(arch: str) -> str:
    if arch in CPU_SPECIAL_EVIDENCE:  # the CPUs: "x86", "arm"
        return arch
    return "amd" if arch.startswith("cdna") else "nvidia"


def _special_evidence(p: Preset) -> str:
    acc = p.accumulator
    if p.vendor in CPU_SPECIAL_EVIDENCE:
        return CPU_SPECIAL_EVIDENCE[p.vendor]
    if acc.input_subnormals == "flush":
        return _SPECIAL_EVIDENCE["cdna2"]
    if acc.order == "sequential":
        return _SPECIAL_EVIDENCE["fma"]
    return _SPECIAL_EVIDENCE[p.vendor]


#: MMA-Sim 2.1.1's ``e_zero`` (the alignment exponent of a zero product and of a zero c) of
#: NVIDIA's T-FDPA per architecture: (fp32 output, fp16 output) (``nv_ptx/sim.py``); Turing's
#: ``mma.m8n8k4`` runs Volta's datapath and takes Volta's; block-scaled kinds: ST-FDPA
#: (``kind::mxf8f6f4``) -133, GST-FDPA (``kind::mxf4nvf4``) -139
NV_ZERO_EXPONENT: dict[str, tuple[int, int]] = {
    "volta": (-131, -19),
    "turing": (-132, -20),
    "ampere": (-132, -20),
    "ada": (-132, -20),
    "hopper": (-133, -21),
    "blackwell": (-133, -21),
    "rtx_blackwell": (-133, -21),
}


def _zero_exponent(arch: str, kind: str, out: str, acc: Accumulator) -> int:
    """MMA-Sim 2.1.1's ``e_zero`` of a preset (:data:`NV_ZERO_EXPONENT`)."""
    if acc.scales == "in_block":
        return -139 if acc.group is not None else -133
    fp32, fp16 = NV_ZERO_EXPONENT["volta" if kind.startswith("m8n8k4") else arch]
    return fp16 if out == "fp16" else fp32


# ----- the builders -----------------------------------------------------------------------
def _nv_block(out: str, block: int, bits: int, *, fp8_acc: bool = False) -> Accumulator:
    """NVIDIA T-FDPA: fp32 output truncated (or the 14-bit FP8 accumulator), fp16 to nearest."""
    if out == "fp16":
        return Accumulator("fp16", "nearest_even", order="block_fma", block=block, align_bits=bits)
    fmt = FP8_ACCUMULATOR if fp8_acc else "fp32"
    return Accumulator(fmt, "toward_zero", order="block_fma", block=block, align_bits=bits)


def _fp8_emulation(out: str) -> Accumulator:
    emu = FP8_MMA_SYNC_EMULATION
    acc_fmt, inner = ("fp16", "nearest_even") if out == "fp16" else ("fp32", "toward_zero")
    return Accumulator(
        acc_fmt,
        "nearest_even",
        order="block_fma",
        block=emu["block"],
        align_bits=25,
        addend="after_block",
        block_rounding=inner,
        inner_block=emu["inner_block"],
        inner_interleave=emu["inner_interleave"],
    )


def _fma_chain(fmt: str) -> Accumulator:
    """A chain of fused multiply-adds (products exact, one rounding to nearest per step)."""
    return Accumulator(fmt, "nearest_even")


def _block_scaled(group: int | None, bits: int, scale: str) -> Accumulator:
    return Accumulator(
        "fp32",
        "toward_zero",
        order="block_fma",
        block=64 if group else 32,
        align_bits=bits,
        scales="in_block",
        group=group,
        scale_format=scale,
    )


def _fp4_kind(out: str, *, scale: str) -> Accumulator:
    return _block_scaled(16, 35, scale)


def _cdna3(block: int, fp8: bool) -> Accumulator:
    return Accumulator(
        "fp32",
        "nearest_even",
        order="block_fma",
        block=block,
        align_bits=24,
        addend="separate",
        sum_bits=31,
        align_rounding="down",
        drop_bits=25 if fp8 else None,
        inner_block=block // 2 if fp8 else None,
        inner_interleave=1 if fp8 else None,
    )


def _cdna4_scaled() -> Accumulator:
    """CDNA4 ``v_mfma_scale_f32_*_f8f6f4`` (inferred): CDNA3's GTR-FDPA on the products times
    their E8M0 scales (exact powers of two), scale blocks of 32 along K."""
    return dataclasses.replace(_cdna3(16, True), scales="in_block", scale_format="e8m0")


def _cdna2(pairs_of_pairs: bool) -> Accumulator:
    return Accumulator(
        "fp32",
        "nearest_even",
        order="pairwise",
        promote_every=4 if pairs_of_pairs else 2,
        promote_format="fp32",
        promote_rounding="nearest_even",
        product_format="fp32",
        subnormals="flush",
        input_subnormals="flush",
    )


PRESETS: dict[tuple[str, str, str, str, str, str], Preset] = {}


def _add(
    arch: str,
    instruction: str,
    kind: str,
    inputs: list[tuple[str, str]] | list[str],
    outs: tuple[str, ...],
    build: Callable[[str], Accumulator],
    evidence: Callable[[tuple[str, str], str], str] | str,
    *,
    block_scaled: bool = False,
) -> None:
    vendor = _vendor(arch)
    for pair in inputs:
        fa, fb = (pair, pair) if isinstance(pair, str) else pair
        for out in outs:
            ev = evidence((fa, fb), out) if callable(evidence) else evidence
            acc = _with_specials(build(out), vendor)
            if acc.zeros_in_anchor:
                acc = dataclasses.replace(acc, zero_exponent=_zero_exponent(arch, kind, out, acc))
            label = f"{fa if fa == fb else fa + ' x ' + fb} -> {out}"
            name = f"({instruction_name(instruction, kind)})"
            p = Preset(
                arch,
                instruction,
                kind,
                (fa, fb),
                out,
                dataclasses.replace(acc, name=f"{{gpu}} {label} {name}"),
                ev,
                block_scaled,
            )
            PRESETS[(arch, instruction, kind, fa, fb, out)] = p


def instruction_name(instruction: str, kind: str) -> str:
    """``"tcgen05.mma kind::f8f6f4"``, ``"mma.m16n8k16"``, ``"wgmma.m64nNk32"``,
    ``"mfma bf16_1k"``, ``"bfdot (FPCR.EBF=0)"``."""
    if instruction in CPU_INSTRUCTIONS:
        return cpu_instruction_name(instruction, kind)
    base = {"mma": "mma", "wgmma": "wgmma", "tcgen05": "tcgen05.mma", "mfma": "v_mfma"}
    if instruction == "mma" and kind.startswith("kind::mx"):
        return f"mma.block_scale {kind}"
    sep = " " if kind.startswith("kind") or instruction == "mfma" else "."
    return f"{base[instruction]}{sep}{kind}"


def _measured_or(arch: str, fallback: str) -> Callable[[tuple[str, str], str], str]:
    def ev(pair: tuple[str, str], out: str) -> str:
        m = MEASURED.get((arch, pair[0], out))
        if m is not None and pair[0] == pair[1]:
            return f"measured: {m[0]} ({out} output, 5000/5000)"
        if pair[0] != pair[1] and m is not None:
            return f"inferred: the {pair[0]} and {pair[1]} sets ({m[0]}) share the datapath"
        return fallback

    return ev


def _pairs(fmts: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(a, b) for a in fmts for b in fmts]


def _build_table() -> None:
    nv = _MMASIM
    # Volta: mma.m8n8k4 f16, 4 products, 23 bits
    _add("volta", "mma", "m8n8k4", ["fp16"], ("fp32", "fp16"),
         lambda o: _nv_block(o, 4, 23), _measured_or("volta", nv + " Volta"))  # fmt: skip
    # Turing: mma.m16n8k8 f16, one block of 8, 24 bits
    _add("turing", "mma", "m16n8k8", ["fp16"], ("fp32", "fp16"),
         lambda o: _nv_block(o, 8, 24),
         nv + " Turing m16n8k8 (one block of 8, 24 bits)")  # fmt: skip
    # Turing keeps Volta's mma.m8n8k4 (MMA-Sim: Volta's settings, 4 products, 23 bits)
    _add("turing", "mma", "m8n8k4", ["fp16"], ("fp32", "fp16"),
         lambda o: _nv_block(o, 4, 23),
         nv + " Turing mma.m8n8k4 (Volta's datapath: one block of 4, 23 bits)")  # fmt: skip
    # ... and both have the f32 D with an f16 C: a subnormal C aligns at fp16's emin (-14)
    for arch, name in (("volta", "Volta"), ("turing", "Turing")):
        _add(arch, "mma", "m8n8k4.f32.f16.f16.f16", ["fp16"], ("fp32",),
             lambda o: _nv_block(o, 4, 23).replace(c_format="fp16"),
             f"{nv} {name} mma.m8n8k4.f32.f16.f16.f16 (C in fp16, D in fp32: c aligns "
             "with fp16's emin in the first block; numpy reference only)")  # fmt: skip
    # Ampere and Ada: m16n8k16 as two blocks of 8 (24 bits), tf32 m16n8k8 as 2 x 4
    for arch in ("ampere", "ada"):
        name = "Ampere" if arch == "ampere" else "Ada Lovelace"
        _add(arch, "mma", "m16n8k16", ["fp16"], ("fp32", "fp16"),
             lambda o: _nv_block(o, 8, 24), _measured_or(arch, nv))  # fmt: skip
        _add(arch, "mma", "m16n8k16", ["bf16"], ("fp32",),
             lambda o: _nv_block(o, 8, 24), _measured_or(arch, nv))  # fmt: skip
        _add(arch, "mma", "m16n8k8", ["tf32"], ("fp32",),
             lambda o: _nv_block(o, 4, 24), _measured_or(arch, nv))  # fmt: skip
        _add(arch, "mma", "m8n8k4.f64", ["fp64"], ("fp64",), lambda o: _fma_chain("fp64"),
             f"{nv} {name} mma.m8n8k4.f64 (a chain of fp64 FMAs)")  # fmt: skip
    _add("ada", "mma", "m16n8k32", _pairs(_FP8), ("fp32", "fp16"),
         lambda o: _nv_block(o, 16, 13, fp8_acc=True),
         _measured_or("ada", nv + " Ada Lovelace FP8 (2 x 16 products, 13 bits)"))  # fmt: skip
    # Hopper: mma and wgmma, 16 products (tf32 8), 25 bits; FP8 wgmma 32/13
    for ins, kind16, kind8 in (("mma", "m16n8k16", "m16n8k8"), ("wgmma", "m64nNk16", "m64nNk8")):
        for fmt, outs in (("fp16", ("fp32", "fp16")), ("bf16", ("fp32",))):
            _add("hopper", ins, kind16, [fmt], outs, lambda o: _nv_block(o, 16, 25),
                 _measured_or("hopper", nv) if ins == "mma"
                 else _same_as_mma("hopper"))  # fmt: skip
        _add("hopper", ins, kind8, ["tf32"], ("fp32",), lambda o: _nv_block(o, 8, 25),
             _measured_or("hopper", nv) if ins == "mma" else _same_as_mma("hopper"))  # fmt: skip
    _add("hopper", "wgmma", "m64nNk32", _pairs(_FP8), ("fp32", "fp16"),
         lambda o: _nv_block(o, 32, 13, fp8_acc=True), _hopper_wgmma_fp8)  # fmt: skip
    _add("hopper", "mma", "m16n8k32", _pairs(_FP8), ("fp32", "fp16"), _fp8_emulation,
         _fp8_emulation_evidence("hopper"))  # fmt: skip
    _add("hopper", "mma", "m16n8k16.f64", ["fp64"], ("fp64",), lambda o: _fma_chain("fp64"),
         f"{nv} Hopper mma.m16n8k16.f64 (DMMA: a chain of fp64 FMAs)")  # fmt: skip
    for arch, name in (("hopper", "Hopper"), ("blackwell", "Blackwell"),
                       ("rtx_blackwell", "RTX Blackwell")):  # fmt: skip
        _add(arch, "mma", "m8n8k4.f64", ["fp64"], ("fp64",), lambda o: _fma_chain("fp64"),
             f"{nv} {name} mma.m8n8k4.f64 (sm_80's, a chain of fp64 FMAs)")  # fmt: skip
    # Blackwell (sm_100): mma as Hopper, FP8 mma emulated; tcgen05 kinds
    _add("blackwell", "mma", "m16n8k16", ["fp16"], ("fp32", "fp16"),
         lambda o: _nv_block(o, 16, 25), _measured_or("blackwell", nv))  # fmt: skip
    _add("blackwell", "mma", "m16n8k16", ["bf16"], ("fp32",),
         lambda o: _nv_block(o, 16, 25), _measured_or("blackwell", nv))  # fmt: skip
    _add("blackwell", "mma", "m16n8k8", ["tf32"], ("fp32",),
         lambda o: _nv_block(o, 8, 25), _measured_or("blackwell", nv))  # fmt: skip
    _add("blackwell", "mma", "m16n8k32", _pairs(_FP8), ("fp32", "fp16"), _fp8_emulation,
         _fp8_emulation_evidence("blackwell"))  # fmt: skip
    tc = nv + " tcgen05.mma"
    _add("blackwell", "tcgen05", "kind::f16", ["fp16"], ("fp32", "fp16"),
         lambda o: _nv_block(o, 16, 25), f"{tc} kind::f16 (16 products, 25 bits)")  # fmt: skip
    _add("blackwell", "tcgen05", "kind::f16", ["bf16"], ("fp32",),
         lambda o: _nv_block(o, 16, 25), f"{tc} kind::f16 (16 products, 25 bits)")  # fmt: skip
    _add("blackwell", "tcgen05", "kind::tf32", ["tf32"], ("fp32",),
         lambda o: _nv_block(o, 8, 25), f"{tc} kind::tf32 (8 products, 25 bits)")  # fmt: skip
    _add("blackwell", "tcgen05", "kind::f8f6f4", _pairs(_F8F6F4), ("fp32", "fp16"),
         lambda o: _nv_block(o, 32, 25),
         _fp8_only(f"{tc} kind::f8f6f4 (one block of 32, 25 bits)",
                   "MMA-Sim models the e4m3/e5m2 operands of kind::f8f6f4; FP6/FP4 operands "
                   "enter the same datapath (exactly converted); the PTX ISA allows .e2m3/.e3m2/"
                   ".e2m1 there (instruction-descriptor codes 3/4/5, K-major, one per byte in "
                   "shared memory: TCGEN05_F8F6F4_CODES)"))  # fmt: skip
    _block_scaled_rows("blackwell", "tcgen05", tc, tcgen05=True)
    # RTX Blackwell (sm_120): mma without the Ampere/Ada K split, 25 bits; FP8 and f8f6f4 32/25
    rb = nv + " RTX Blackwell mma"
    _add("rtx_blackwell", "mma", "m16n8k16", ["fp16"], ("fp32", "fp16"),
         lambda o: _nv_block(o, 16, 25), f"{rb}.m16n8k16 (one block of 16, 25 bits)")  # fmt: skip
    _add("rtx_blackwell", "mma", "m16n8k16", ["bf16"], ("fp32",),
         lambda o: _nv_block(o, 16, 25), f"{rb}.m16n8k16 (one block of 16, 25 bits)")  # fmt: skip
    _add("rtx_blackwell", "mma", "m16n8k8", ["tf32"], ("fp32",),
         lambda o: _nv_block(o, 8, 25), f"{rb}.m16n8k8 (one block of 8, 25 bits)")  # fmt: skip
    _add("rtx_blackwell", "mma", "kind::f8f6f4", _pairs(_F8F6F4), ("fp32", "fp16"),
         lambda o: _nv_block(o, 32, 25),
         _fp8_only(f"{rb} kind::f8f6f4 m16n8k32 (one block of 32, 25 bits)",
                   "MMA-Sim lists e4m3, e5m2 and e2m1 operands (e3m2, e2m3 marked TODO); "
                   "FP6 enters the same datapath; the PTX ISA allows .e3m2/.e2m3 in "
                   "mma.kind::f8f6f4.m16n8k32, one element per byte of the .b32 fragment "
                   "registers", fp4_published=True))  # fmt: skip
    _block_scaled_rows("rtx_blackwell", "mma", rb + ".block_scale", tcgen05=False)
    # AMD CDNA1 (MI100)
    amd = _MMASIM.replace("MMA-Sim", "MMA-Sim 2.1.1 MFMA")  # (tests/gemm/test_mmasim_amd.py)
    _add("cdna1", "mfma", "f32", ["fp32"], ("fp32",), lambda o: _fma_chain("fp32"),
         f"{amd} CDNA1 f32 (a chain of fp32 FMAs)")  # fmt: skip
    _add("cdna1", "mfma", "f16", ["fp16"], ("fp32",),
         lambda o: Accumulator("fp32", order="exact_block", block=4),
         f"{amd} CDNA1 f16 (E-FDPA: 4 products and c summed exactly, one rounding)")  # fmt: skip
    _add("cdna1", "mfma", "bf16", ["bf16"], ("fp32",),
         lambda o: Accumulator("fp32", order="exact_block", block=2),
         f"{amd} CDNA1 bf16 (E-FDPA: 2 products and c summed exactly, one rounding)")  # fmt: skip
    # CDNA2 (MI210, MI250)
    _add("cdna2", "mfma", "f64", ["fp64"], ("fp64",), lambda o: _fma_chain("fp64"),
         f"{amd} CDNA2 f64 (a chain of fp64 FMAs)")  # fmt: skip
    _add("cdna2", "mfma", "f32", ["fp32"], ("fp32",), lambda o: _fma_chain("fp32"),
         f"{amd} CDNA2 f32 (a chain of fp32 FMAs)")  # fmt: skip
    ftz = "products in fp32, summed in fp32 with subnormal inputs and results flushed"
    _add("cdna2", "mfma", "f16", ["fp16"], ("fp32",), lambda o: _cdna2(True),
         f"{amd} CDNA2 f16 (FTZ mul-add, P = 4: {ftz})")  # fmt: skip
    _add("cdna2", "mfma", "bf16_1k", ["bf16"], ("fp32",), lambda o: _cdna2(True),
         f"{amd} CDNA2 bf16_1k (FTZ mul-add, P = 4: {ftz})")  # fmt: skip
    _add("cdna2", "mfma", "bf16", ["bf16"], ("fp32",), lambda o: _cdna2(False),
         f"{amd} CDNA2 bf16 (FTZ mul-add, P = 2: {ftz})")  # fmt: skip
    # CDNA3 (MI300A, MI300X, MI325X)
    tr = ("TR-FDPA: products aligned among themselves (24 bits), then with c (32/24 bits, "
          "floor; a zero c at -126), the sum normalised to 31 bits (floor); products of 2**128 "
          "or more are inf")  # fmt: skip
    _add("cdna3", "mfma", "f64", ["fp64"], ("fp64",), lambda o: _fma_chain("fp64"),
         f"{amd} CDNA3 f64 (a chain of fp64 FMAs)")  # fmt: skip
    _add("cdna3", "mfma", "f32", ["fp32"], ("fp32",), lambda o: _fma_chain("fp32"),
         f"{amd} CDNA3 f32 (a chain of fp32 FMAs)")  # fmt: skip
    _add("cdna3", "mfma", "xf32", ["tf32"], ("fp32",), lambda o: _cdna3(4, False),
         f"{amd} CDNA3 xf32 ({tr}, 4 products; no measured AMD data)")  # fmt: skip
    for f, kind in (("fp16", "f16"), ("bf16", "bf16")):
        _add("cdna3", "mfma", kind, [f], ("fp32",), lambda o: _cdna3(8, False),
             f"{amd} CDNA3 {kind} ({tr}, 8 products; no measured AMD data)")  # fmt: skip
    _add("cdna3", "mfma", "fp8", _pairs(("e4m3fnuz", "e5m2fnuz")), ("fp32",),
         lambda o: _cdna3(16, True),
         f"{amd} CDNA3 fp8/bf8 (GTR-FDPA: even and odd products as two blocks of 8, "
         "their sums and c floored at the common anchor, c dropped below it - 25; an inf/NaN "
         "c stays, which MMA-Sim drops: an artifact of its emulation; no measured AMD "
         "data)")  # fmt: skip
    # CPUs (x86 AVX512-BF16, AMX-BF16, AVX512-FP16 measured, Arm from the Arm ARM):
    # precision_lab.gemm.cpu_instructions
    for row in cpu_rows():
        _add(*row)
    _cdna4_rows()


#: CDNA4's f8f6f4 operand formats, with the 3-bit code of the ``cbsz`` (A) and ``blgp`` (B)
#: modifiers that select them (LLVM AMDGPU, gfx950 ``v_mfma_*_f8f6f4``; hipBLASLt and
#: rocRoller emit the same): OCP E4M3 and E5M2 (not CDNA3's FNUZ), E2M3, E3M2, E2M1. Each lane's
#: operand registers hold its 32 K-consecutive values packed densely: 8 VGPRs of FP8, 6 of
#: FP6, 4 of FP4 (the instruction's register count follows the format).
CDNA4_F8F6F4_CODES: dict[str, int] = {"e4m3": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}
#: VGPRs per lane of one f8f6f4 operand (32 values: 256, 192 or 128 bits)
CDNA4_F8F6F4_VGPRS: dict[str, int] = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4}
#: tcgen05 ``kind::f8f6f4`` / ``kind::mxf8f6f4``: the 3-bit operand-format codes of the
#: instruction descriptor (bits 7-9 for A, 10-12 for B; CUTLASS ``UMMA::MXF8F6F4Format``).
#: FP6 and FP4 operands are K-major only and sit one per byte in shared memory (CUTLASS's
#: ``float_e2m3_unpacksmem_t`` ...: TMA's 16-byte-padded unpacked copy); sm_120 ``mma
#: .kind::f8f6f4.m16n8k32`` holds them one per byte too (PTX ISA 9.2, "Matrix Fragments for
#: mma.m16n8k32": four .b32 registers of four .e4m3/.e5m2/.e3m2/.e2m3/.e2m1 elements for A).
TCGEN05_F8F6F4_CODES: dict[str, int] = {"e4m3": 0, "e5m2": 1, "e2m3": 3, "e3m2": 4, "e2m1": 5}


def _cdna4_rows() -> None:
    """AMD CDNA4 (MI350X, MI355X). No bit-accurate public model exists (MMA-Sim 2.1.1 stops at
    CDNA3) and no measured data: every row is inferred from AMD's CDNA4 ISA guide and LLVM's
    gfx950 instruction definitions, with the nearest published datapath (MMA-Sim's CDNA3)."""
    amd = _MMASIM.replace("MMA-Sim", "MMA-Sim 2.1.1 MFMA")
    why = (
        "inferred: no public bit-accurate model or measurement of CDNA4; LLVM's gfx950 "
        "definitions keep CDNA3's {old} and add {new}, so CDNA3's datapath ({amd} CDNA3 {what}) "
        "is assumed; check it on an MI355X with probe_gemm"
    )
    _add("cdna4", "mfma", "f64", ["fp64"], ("fp64",), lambda o: _fma_chain("fp64"),
         why.format(old="v_mfma_f64_16x16x4_f64", new="nothing for fp64", amd=amd,
                    what="f64: a chain of fp64 FMAs"))  # fmt: skip
    _add("cdna4", "mfma", "f32", ["fp32"], ("fp32",), lambda o: _fma_chain("fp32"),
         why.format(old="v_mfma_f32_*_f32", new="nothing for fp32 (xf32 is removed)", amd=amd,
                    what="f32: a chain of fp32 FMAs"))  # fmt: skip
    for f, kind in (("fp16", "f16"), ("bf16", "bf16")):
        _add("cdna4", "mfma", kind, [f], ("fp32",), lambda o: _cdna3(8, False),
             why.format(old=f"v_mfma_f32_16x16x16_{kind}",
                        new=f"v_mfma_f32_16x16x32_{kind} and 32x32x16 (twice the K)", amd=amd,
                        what=f"{kind}: TR-FDPA, 8 products, 24/31 bits"))  # fmt: skip
    gtr = "fp8/bf8: GTR-FDPA, 16 products as even/odd blocks of 8, 24/31 bits, floored"
    _add("cdna4", "mfma", "f8f6f4", _pairs(_F8F6F4), ("fp32",), lambda o: _cdna3(16, True),
         why.format(old="the fp8/bf8 MFMAs (in OCP E4M3/E5M2 on gfx950)",
                    new="v_mfma_f32_16x16x128_f8f6f4 and 32x32x64 with a format per operand "
                    "(cbsz/blgp: 0 E4M3, 1 E5M2, 2 E2M3, 3 E3M2, 4 E2M1); FP6/FP4 values are "
                    "exact in the FP8 datapath's products", amd=amd, what=gtr))  # fmt: skip
    mx = {
        "e4m3": "mxfp8_e4m3",
        "e5m2": "mxfp8_e5m2",
        "e3m2": "mxfp6_e3m2",
        "e2m3": "mxfp6_e2m3",
        "e2m1": "mxfp4_e2m1",
    }
    for a, b in _pairs(_F8F6F4):
        _add("cdna4", "mfma", "scale_f8f6f4", [(mx[a], mx[b])], ("fp32",),
             lambda o: _cdna4_scaled(),
             why.format(old="the f8f6f4 MFMA", new="v_mfma_scale_f32_16x16x128_f8f6f4 and "
                        "32x32x64: the same MFMA after v_mfma_ld_scale_b32, an E8M0 scale per "
                        "32 K-values of each operand, D = C + (A * 2**(sa - 127)) (B * 2**(sb - "
                        "127)); the scales multiply the products exactly (powers of two), "
                        "inside the f8f6f4 datapath, so unit scales give the f8f6f4 row", amd=amd,
                        what=gtr), block_scaled=True)  # fmt: skip


def _same_as_mma(arch: str) -> Callable[[tuple[str, str], str], str]:
    def ev(pair: tuple[str, str], out: str) -> str:
        m = MEASURED.get((arch, pair[0], out))
        base = f"{_MMASIM} wgmma (the same block FMA as mma"
        return f"{base}, measured: {m[0]})" if m else base + ")"

    return ev


def _hopper_wgmma_fp8(pair: tuple[str, str], out: str) -> str:
    m = MEASURED.get(("hopper", pair[0], out))
    if out == "fp32" and pair[0] == pair[1] and m is not None:
        return f"measured: {m[0]} (wgmma, c = 0, 5000/5000); chaining: {_MMASIM}"
    if out == "fp16":
        return f"{_MMASIM} wgmma FP8 with an f16 accumulator (32 products, 13 bits, RNE)"
    return f"inferred: mixed FP8 operands share the {pair[0]} and {pair[1]} wgmma datapath"


def _fp8_emulation_evidence(arch: str) -> Callable[[tuple[str, str], str], str]:
    def ev(pair: tuple[str, str], out: str) -> str:
        m = MEASURED.get((arch, pair[0], out))
        if m is not None and m[1] == "mma" and pair[0] == pair[1]:
            return f"measured: {m[0]} ({out} output, 5000/5000; fp16-emulated mma.sync)"
        return (
            "inferred: FP8 mma.sync is emulated on the fp16 tensor cores (CUTLASS #1986), "
            "as measured on H100/B200 FP8 -> fp16 and B200 FP8 -> fp32"
        )

    return ev


def _fp8_only(
    published: str, why: str, *, fp4_published: bool = False
) -> Callable[[tuple[str, str], str], str]:
    ok = {"e4m3", "e5m2"} | ({"e2m1"} if fp4_published else set())

    def ev(pair: tuple[str, str], out: str) -> str:
        if set(pair) <= ok:
            return published
        return f"inferred: {why}"

    return ev


#: block-scaled kinds: (element formats, scale format, scale block) -> kind
def _block_scaled_rows(arch: str, instruction: str, evidence: str, *, tcgen05: bool) -> None:
    mx = {
        "e4m3": "mxfp8_e4m3",
        "e5m2": "mxfp8_e5m2",
        "e3m2": "mxfp6_e3m2",
        "e2m3": "mxfp6_e2m3",
        "e2m1": "mxfp4_e2m1",
    }
    gst = (
        f"{evidence} kind::mxf4nvf4 (GST-FDPA: groups of 16 FP4 products summed exactly, "
        "scaled, aligned at the scales' exponents with c, 35 bits)"
    )
    for name, scale in (
        ("mxfp4_e2m1", "e8m0"),
        ("mxfp4_e2m1_b16", "e8m0"),
        ("nvfp4", "e4m3"),
    ):
        _add(arch, instruction, "kind::mxf4nvf4", [name], ("fp32",),
             functools.partial(_fp4_kind, scale=scale), gst, block_scaled=True)  # fmt: skip
    if not tcgen05:  # sm_120 takes UE4M3 scales on blocks of 32 too (MMA-Sim)
        _add(arch, instruction, "kind::mxf4nvf4", ["nvfp4_b32"], ("fp32",),
             lambda o: _block_scaled(16, 35, "e4m3"), gst, block_scaled=True)  # fmt: skip
    # FP8/FP6/FP4 elements with E8M0 scales on blocks of 32 (MXFP4 also here; the FP4 kind
    # above comes first, as libraries pick it)
    fp4_ok = not tcgen05  # sm_120: MMA-Sim lists e2m1 in mxf8f6f4
    for a, b in _pairs(_F8F6F4):
        pub = {a, b} <= ({"e4m3", "e5m2", "e2m1"} if fp4_ok else {"e4m3", "e5m2"})
        ev = (
            f"{evidence} kind::mxf8f6f4 (ST-FDPA: E8M0 scales added to the products' "
            "exponents, one block of 32, 25 bits)"
            if pub
            else "inferred: MMA-Sim models the e4m3/e5m2 operands of kind::mxf8f6f4; "
            "FP6/FP4 operands enter the same datapath"
        )
        _add(arch, instruction, "kind::mxf8f6f4", [(mx[a], mx[b])], ("fp32",),
             lambda o: _block_scaled(None, 25, "e8m0"), ev, block_scaled=True)  # fmt: skip


_build_table()


def _default_of(arch: str, pair: tuple[str, str], out: str) -> Preset | None:
    for ins in _LIBRARY_CHOICE[arch]:
        rows = [
            p
            for (a, i, _k, fa, fb, o), p in PRESETS.items()
            if a == arch and i == ins and (fa, fb) == pair and o == out
        ]
        if rows:
            return rows[0]
    return None


#: architecture -> input format -> (products per block FMA, fraction bits kept) of the default
#: instruction's fp32-output block-FMA preset that every backend computes (the old table)
ARCHITECTURES: dict[str, dict[str, tuple[int, int]]] = {}
for _p in PRESETS.values():
    _fa, _fb = _p.input_format
    _acc = _p.accumulator
    if _fa == _fb and _p.out_format == "fp32" and not _p.block_scaled:
        if _p.default and _acc.order == "block_fma" and reference_only(_acc) is None:
            ARCHITECTURES.setdefault(_p.arch, {})[_fa] = (_acc.block or 1, _acc.align_bits or 0)


# ----- the public functions ---------------------------------------------------------------
def _gpu_arch(gpu: str) -> tuple[str, str]:
    key = (
        gpu.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
        if isinstance(gpu, str)
        else gpu
    )
    if not isinstance(key, str) or key not in GPUS:
        raise ValueError(f"gpu must be one of {', '.join(GPUS)}, got {gpu!r}")
    return key, GPUS[key]


def _block_name(bf: BlockFormat) -> str | None:
    """The table's name of a block format: ``mxfp8_e4m3``, ``nvfp4``, ``mxfp4_e2m1_b16`` ..."""
    if len(bf.block_shape) != 1 or not isinstance(bf.element, FloatFormat):
        return None
    elem, scale, n = str(bf.element), str(bf.scale), bf.block_shape[0]
    if scale == "e8m0":
        base = {
            "e4m3": "mxfp8_e4m3",
            "e5m2": "mxfp8_e5m2",
            "e3m2": "mxfp6_e3m2",
            "e2m3": "mxfp6_e2m3",
            "e2m1": "mxfp4_e2m1",
        }.get(elem)
        if base is None:
            return None
        if n == 32:
            return base
        return f"{base}_b16" if n == 16 and elem == "e2m1" else None
    if scale == "e4m3" and elem == "e2m1":
        return {16: "nvfp4", 32: "nvfp4_b32"}.get(n)
    return None


def _operand_name(fmt: Any, which: str) -> str:
    """The table's name of one operand format (a float format or a block format)."""
    if isinstance(fmt, BlockFormat):
        name = _block_name(fmt)
        if name is None:
            raise ValueError(
                f"{which}: no matrix core takes the block format {fmt} "
                f"(element {fmt.element}, scale {fmt.scale}, blocks {fmt.block_shape})"
            )
        return name
    if isinstance(fmt, str):
        if fmt.strip().lower() in _block_names():
            return fmt.strip().lower()
        try:
            return _operand_name(get_block_format(fmt), which)
        except (TypeError, ValueError) as exc:
            if fmt.strip().lower() in _block_names():
                raise ValueError(f"{which}: {exc}") from None
    try:
        f = get_format(fmt)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{which}: {exc}") from None
    name = str(f)
    try:
        same = get_format(name) == f
    except (TypeError, ValueError):
        same = False
    return name if same else repr(f)


def _block_names() -> set[str]:
    return {p.input_format[0] for p in PRESETS.values() if p.block_scaled}


def _parse_instruction(instruction: str | None) -> tuple[str | None, str | None]:
    if instruction is None:
        return None, None
    if not isinstance(instruction, str):
        raise ValueError(
            f"instruction must be one of {', '.join(INSTRUCTIONS)} or None, got {instruction!r}"
        )
    base, _, kind = instruction.strip().lower().partition(".")
    if base not in INSTRUCTIONS:
        raise ValueError(
            f"instruction must be one of {', '.join(INSTRUCTIONS)} (optionally with a kind, "
            f"e.g. 'tcgen05.kind::mxf8f6f4', 'mfma.bf16'), or None, got {instruction!r}"
        )
    return base, kind or None


def _tensor_core(
    gpu: str,
    input_format: Any,
    *,
    out_format: str | FloatFormat | None = None,
    instruction: str | None = None,
) -> Accumulator:
    """The accumulator model of ``gpu``'s matrix cores for ``input_format`` operands.

    :func:`tensor_core_list` (``pl.tensor_core.list()``) is the table of every preset with its
    evidence.

    Parameters
    ----------
    gpu:
        ``"v100"``, ``"t4"``/``"rtx2080"``, ``"a100"``/``"a2"``/``"a30"``,
        ``"ada"``/``"l40s"``/``"rtx4090"``, ``"h100"``/``"h200"``, ``"b200"``,
        ``"rtx5090"``/``"rtxpro6000"``, ``"mi100"``, ``"mi210"``/``"mi250"``,
        ``"mi300a"``/``"mi300x"``/``"mi325x"``; CPUs: ``"x86"`` (``"zen4"``,
        ``"sapphirerapids"``) and ``"arm"`` (:mod:`precision_lab.gemm.cpu_instructions`).
        ``"mi300a"``/``"mi300x"``/``"mi325x"``, ``"mi350x"``/``"mi355x"`` (CDNA4, inferred).
    input_format:
        The operands' format (``"fp16"``, ``"bf16"``, ``"tf32"``, ``"fp32"``, ``"fp64"``,
        ``"e4m3"``, ``"e5m2"``, ``"e3m2"``, ``"e2m3"``, ``"e2m1"``, ``"e4m3fnuz"``,
        ``"e5m2fnuz"`` where the instruction takes it), a pair ``(format_a, format_b)`` for
        mixed operands, or for block-scaled kinds the block format (``"mxfp8_e4m3"``,
        ``"mxfp8_e5m2"``, ``"mxfp6_e2m3"``, ``"mxfp6_e3m2"``, ``"mxfp4_e2m1"``, ``"nvfp4"`` or
        a :class:`~precision_lab.BlockFormat`, e.g. MXFP4 with blocks of 16); run those through
        :func:`~precision_lab.gemm_blocks`.
    out_format:
        ``"fp32"``, ``"fp16"`` (where the instruction has an f16 accumulator) or
        ``"fp64"`` (fp64 operands): the type of C and D; pass the same ``out_format`` to
        :func:`~precision_lab.gemm`. ``None`` (default): ``"fp32"``, or the one output of a
        named ``instruction`` that has no fp32 output (x86 ``"vfmadd231ph"``: fp16).
    instruction:
        ``"mma"``, ``"wgmma"``, ``"tcgen05"`` or ``"mfma"``, optionally with the kind after a
        dot (``"tcgen05.kind::mxf8f6f4"``, ``"mfma.bf16"`` for CDNA2's pre-``_1k`` bf16); on
        CPUs the mnemonic (``"vdpbf16ps"``, ``"bfmmla"``, ``"bfdot.ebf1"``, ``"fdot"`` ...);
        ``None``: what GEMM libraries issue on that GPU (wgmma on Hopper, tcgen05 on B200).

    Examples
    --------
    >>> print(tensor_core("a100", "fp16", out_format="fp16").describe())
    block FMA of 8 products, 24 fraction bits kept after alignment, normalised into fp16
    (nearest_even); zeros align with exponent -20, zero results are +0, NaN is 0x7fffffff
    [a100 fp16 -> fp16 (mma.m16n8k16)]
    >>> tensor_core("b200", "nvfp4", instruction="tcgen05").group
    16
    """
    key, arch = _gpu_arch(gpu)
    if isinstance(input_format, tuple | list):
        if len(input_format) != 2:
            raise ValueError(
                f"input_format must be one format or a pair (format_a, format_b), got "
                f"{len(input_format)} items"
            )
        pair = (
            _operand_name(input_format[0], "input_format[0]"),
            _operand_name(input_format[1], "input_format[1]"),
        )
    else:
        one = _operand_name(input_format, "input_format")
        pair = (one, one)
    base, kind = _parse_instruction(instruction)
    if out_format is None:
        row_outs = {
            p.out_format for p in PRESETS.values() if p.arch == arch and p.instruction == base
        }
        out_format = row_outs.pop() if base is not None and len(row_outs) == 1 else "fp32"
    try:
        out_name = str(get_format(out_format))
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"out_format: {exc}") from None
    arch_rows = [p for p in PRESETS.values() if p.arch == arch]
    if base is not None:
        rows = [p for p in arch_rows if p.instruction == base]
        if not rows:
            have = sorted({p.instruction for p in arch_rows}, key=INSTRUCTIONS.index)
            raise ValueError(
                f"instruction: {key} ({arch}) has {', '.join(have)}, got {instruction!r}"
            )
        if kind is not None:
            krows = [p for p in rows if p.kind.lower() == kind]
            if not krows:
                kinds = sorted({p.kind for p in rows})
                raise ValueError(
                    f"instruction: {key} ({arch}) {base} has the kinds {', '.join(kinds)}, "
                    f"got {instruction!r}"
                )
            rows = krows
    else:
        rows = arch_rows
    shown = pair[0] if pair[0] == pair[1] else f"{pair[0]} x {pair[1]}"
    fmt_rows = [p for p in rows if p.input_format == pair]
    if not fmt_rows:
        what = (
            instruction_name(base, kind)
            if base and kind
            else base
            if base
            else " / ".join(sorted({p.instruction for p in rows}, key=INSTRUCTIONS.index))
        )
        takes = sorted({p.row()["input_format"] for p in rows}, key=lambda s: (len(s.split()), s))
        raise ValueError(
            f"input_format: {key} ({arch}) {what} takes {', '.join(takes)}, got {input_format!r}"
        )
    out_rows = [p for p in fmt_rows if p.out_format == out_name]
    if not out_rows:
        outs = sorted({p.out_format for p in fmt_rows})
        raise ValueError(
            f"out_format: {key} {base or 'matrix cores'} with {shown} inputs output "
            f"{' or '.join(outs)}, got {out_format!r}"
        )
    if base is None:
        chosen = _default_of(arch, pair, out_name)
        assert chosen is not None
    elif kind is None:
        chosen = _kind_default(out_rows)
    else:
        chosen = out_rows[0]
    acc = chosen.accumulator
    assert acc.name is not None
    return dataclasses.replace(acc, name=acc.name.replace("{gpu}", key))


def _kind_default(rows: list[Preset]) -> Preset:
    """Among the kinds of one instruction: the one libraries use (``bf16_1k`` on CDNA2)."""
    for p in rows:
        if p.kind.endswith("_1k"):
            return p
    return rows[0]


def measured_preset(gpu: str, fmt: str, out_format: str) -> Accumulator:
    """The preset of the instruction a measured data set was recorded with.

    >>> measured_preset("b200", "e4m3", "fp32").inner_block
    16
    """
    _, arch = _gpu_arch(gpu)
    m = MEASURED.get((arch, fmt, out_format))
    return _tensor_core(gpu, fmt, out_format=out_format, instruction=m[1] if m else None)


def tensor_core_formats(
    gpu: str, *, instruction: str | None = None, block_formats: bool = False
) -> list[str]:
    """Operand formats the matrix cores of ``gpu`` take (same-format operands; every
    instruction, or one; with ``block_formats``, the block formats of block-scaled kinds
    instead).

    >>> tensor_core_formats("a100")
    ['fp16', 'bf16', 'tf32', 'fp64']
    """
    _, arch = _gpu_arch(gpu)
    base, _ = _parse_instruction(instruction)
    out: list[str] = []
    for p in PRESETS.values():
        fa, fb = p.input_format
        if (
            p.arch == arch
            and fa == fb
            and p.block_scaled == block_formats
            and (base is None or p.instruction == base)
        ):
            if fa not in out:
                out.append(fa)
    return out


def tensor_core_list(gpu: str | None = None) -> list[dict[str, Any]]:
    """The table of every preset: one dict per GPU architecture x instruction x kind x
    input/output format, with ``gpus``, ``arch``, ``instruction``, ``kind``,
    ``input_format``, ``out_format``, ``default`` (what ``instruction=None`` picks),
    ``products_per_block``, ``fraction_bits``, ``rounding``, ``special_values``, ``evidence``
    and ``model`` (the accumulator's one-line description). ``gpu`` restricts it to one GPU.

    >>> rows = tensor_core_list("h100")
    >>> [r["evidence"].split(":")[0] for r in rows][:2]
    ['measured', 'measured']
    """
    arch = None if gpu is None else _gpu_arch(gpu)[1]
    return [p.row() for p in PRESETS.values() if arch is None or p.arch == arch]


def format_table(rows: list[dict[str, Any]]) -> str:
    """The table as fixed-width text (what ``precision-lab tensor-cores`` prints)."""
    cols = [
        ("gpus", "GPUs"),
        ("instruction", "instruction"),
        ("kind", "kind"),
        ("input_format", "inputs"),
        ("out_format", "out"),
        ("products_per_block", "block"),
        ("fraction_bits", "bits"),
        ("rounding", "rounding"),
        ("special_values", "special values"),
        ("evidence", "evidence"),
    ]
    cells = [[h for _, h in cols]]
    for r in rows:
        line = []
        for k, _ in cols:
            v = r[k]
            txt = "-" if v is None else str(v)
            if k == "instruction" and r["default"]:
                txt += "*"
            line.append(txt)
        cells.append(line)
    widths = [max(len(c[i]) for c in cells[:]) for i in range(len(cols) - 1)]
    out = []
    for c in cells:
        out.append(
            "  ".join(x.ljust(w) for x, w in zip(c[:-1], widths, strict=True)) + "  " + c[-1]
        )
    out.append("* the default instruction (what GEMM libraries issue on that GPU)")
    notes = sorted({r["special_evidence"] for r in rows})
    out += [f"special values: {n}" for n in notes]
    return "\n".join(out)


class TensorCore:
    """``pl.tensor_core``: call it for a preset (see ``_tensor_core``'s parameters, which
    it has); ``pl.tensor_core.list()`` is the table (:func:`tensor_core_list`)."""

    def __init__(self) -> None:
        functools.update_wrapper(self, _tensor_core)
        self.__name__ = "tensor_core"
        self.__qualname__ = "tensor_core"

    def __call__(
        self,
        gpu: str,
        input_format: Any,
        *,
        out_format: str | FloatFormat | None = None,
        instruction: str | None = None,
    ) -> Accumulator:
        return _tensor_core(gpu, input_format, out_format=out_format, instruction=instruction)

    @staticmethod
    def list(gpu: str | None = None) -> list[dict[str, Any]]:
        """The table of every preset (:func:`tensor_core_list`).

        >>> len(tensor_core.list("b200")) > 40
        True
        """
        return tensor_core_list(gpu)

    def __repr__(self) -> str:
        return "<precision_lab.tensor_core: call for a preset, .list() for the table>"


#: the accumulator model of a GPU's matrix cores; ``tensor_core.list()`` is the table
tensor_core = TensorCore()
