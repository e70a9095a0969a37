"""CPU dot-product and conversion instructions: rows of :func:`~precision_lab.tensor_core`.

CPUs sit in the matrix-core table beside the GPUs: the "GPU" is the machine (``"x86"``, its
aliases ``"zen4"`` and ``"sapphirerapids"``, or ``"arm"``) and the instruction is the vendor's
mnemonic in lower case, with the variant as its kind after a dot (``"bfdot.ebf1"``)::

    pl.tensor_core("x86", "bf16", instruction="vdpbf16ps")       # AVX512-BF16
    pl.tensor_core("x86", "fp16", instruction="tdpfp16ps")       # AMX-FP16 (or "tdpbf16ps")
    pl.tensor_core("x86", "fp16", instruction="vfmadd231ph")     # AVX512-FP16, fp16 output
    pl.tensor_core("x86", "fp16", instruction="vdpphps")         # AVX10.2 (published: Bochs)
    pl.tensor_core("x86", "e4m3", instruction="tdphf8ps")        # AMX-FP8 (published: Bochs)
    pl.tensor_core("arm", "bf16", instruction="bfdot")           # FPCR.EBF = 0
    pl.tensor_core("arm", "bf16", instruction="bfmmla.ebf1")     # FEAT_EBF16, FPCR.EBF = 1
    pl.tensor_core("arm", ("e4m3", "e5m2"), instruction="fdot")  # FP8 4-way dot into fp32

A GEMM on these instructions is a chain of them along K (``d = instr(d, a[k0:k0+n],
b[k0:k0+n])``, ``n`` the products per instruction); the preset is that chain as an
:class:`~precision_lab.Accumulator`, so :func:`~precision_lab.gemm` computes it bit for bit.

x86 (measured). **VDPBF16PS** (AVX512-BF16): per fp32 lane, two fused multiply-adds, the
product of the odd (upper) BF16 element first, ``d = fma(a1, b1, d); d = fma(a0, b0, d)``,
each rounded to nearest even whatever MXCSR says, with subnormal inputs (the BF16 elements and
the fp32 accumulator) read as zeros of their sign and subnormal results flushed to zeros of
their sign, tininess detected after rounding; a NaN result is the first NaN among ``src1``'s
low element, ``src2``'s low element, ``src1``'s high element, ``src2``'s high element and the
accumulator, made quiet; an invalid operation without NaN operands (``inf * 0``, ``inf - inf``)
gives the x86 default NaN ``0xffc00000``. Measured on an AMD EPYC 9004 (Zen 4, Genoa) and on
an Intel Xeon with AMX-BF16 and AVX512-FP16 (CPUID family 6, model 167 as its VM reports) by
``tests/gemm/test_cpu_isa_hardware.py`` (10.4 million lanes each; :data:`MEASURED_ON`): the same
bits on both. Intel's
SDM (vol. 2, VDPBF16PS; felixcloutier.com/x86/vdpbf16ps) says: "'Round to nearest even'
rounding mode is used when doing each accumulation of the FMA. Output denormals are always
flushed to zero and input denormals are always treated as zero. MXCSR is not consulted nor
updated", and gives the NaN priorities above as its Table 5-1 ("lower part has priority over
upper part"); the measurement agrees with all of it and settles what the text leaves open:
two roundings (not one), the odd product first (the even one first differs on 1534 of 20 000
random lanes), the signs of flushed zeros, and tininess after rounding (an exact ``2**-126 -
2**-151`` rounds to ``2**-126`` and stays; ``2**-126 - 2**-150`` flushes). So there is one
row. The preset's Accumulator gives NaN results as the quiet NaN (payloads are beyond the
Accumulator spec); :func:`vdpbf16ps` gives the hardware's bits.

**VCVTNEPS2BF16** and **VCVTNE2PS2BF16** are conversions (:func:`vcvtneps2bf16`,
:func:`vcvtne2ps2bf16`, on :func:`~precision_lab.encode`): round to nearest even whatever MXCSR
says, overflow to inf, subnormal fp32 inputs read as zeros of their sign, NaN made quiet keeping
the sign and the payload's upper seven bits (``(x >> 16) | 0x0040``): the SDM's pseudocode
(``convert_fp32_to_bfloat16``: a zero or denormal gives the signed zero, a NaN is truncated with
bit 6 set, a normal number is ``(x + 0x7fff + x[16]) >> 16`` in integers), measured equal on
10.5 million inputs on both CPUs; ``tests/gemm/test_cpu_isa_presets.py`` holds the functions to that
pseudocode on any CPU.

**AVX512-FP16** (measured on the Intel Xeon by ``tests/gemm/test_cpu_isa_fp16.py``; this is what
a CPU fp16 GEMM with fp16 accumulation runs): **VFMADD231PH** is an fp16 fused multiply-add,
one rounding by MXCSR.RC (every mode measured, 12.6 million FMAs each: the row
``pl.tensor_core("x86", "fp16", instruction="vfmadd231ph")``, ``Accumulator("fp16")``, nearest
even as MXCSR's default, ``.replace(rounding="down")`` ... for the others), with fp16 subnormal
operands and results kept whatever MXCSR.DAZ and FTZ say (the SDM: FP16 instructions handle
denormals and ignore DAZ and FTZ; measured: setting both changes no bit); unlike AMX it sets
MXCSR's exception flags. A NaN result is the first NaN of ``src2``, ``src3`` and the
destination (the addend), by position, made quiet; ``inf * 0`` or ``inf - inf`` gives
``0xfe00`` (:func:`vfmadd231ph`). **VCVTPS2PHX** (fp32 to fp16, :func:`vcvtps2phx`, 11 million
words under each mode) rounds by MXCSR.RC, keeps fp16 subnormal results (FTZ ignored) but reads
fp32 subnormal sources as zeros of their sign when MXCSR.DAZ is set (the SDM's VCVTPS2PH page
says the same of the F16C form: "MXCSR.FTZ is ignored", a denormal source raises DE only "with
MXCSR.DAZ not set"); it shows under round up or down, where a tiny fp32 gives fp16's smallest
subnormal without DAZ and a zero with it. A NaN keeps its sign and the payload's upper nine
bits, made quiet. **VCVTPH2PSX** (fp16 to fp32, :func:`vcvtph2psx`) is exact on all 65 536
codes under every rounding, DAZ and FTZ setting, a NaN made quiet with its payload.

Arm (published: Arm Architecture Reference Manual for A-profile, DDI 0487, the instruction
descriptions of section C8.2 (SVE) and their ASL, e.g. C8.2.49 BFDOT (vectors), C8.2.67
BFMMLA, C8.2.185 FDOT (4-way, indexed); no Arm machine here, so no measurement):

* ``bfdot``, ``bfmmla`` with FPCR.EBF = 0 (kind ``ebf0``, the default; ``BFDotAdd``): each
  pair's products rounded to fp32, their sum rounded, then added to the accumulator, every
  rounding round-to-odd with an overflow to inf, denormal inputs and results flushed to zeros
  of their sign (as FPCR.{FZ, FIZ} = {1, 1}), default NaN. BFMMLA accumulates two such pairs
  per element, in K order: the same chain.
* ``bfdot``, ``bfmmla`` with FEAT_EBF16 and FPCR.EBF = 1 (kind ``ebf1``): each pair's exact
  products summed and rounded once, then added to the accumulator, both as FPCR says (the
  presets: round to nearest even, subnormals kept, FPCR.FZ = 0).
* ``bfmlal`` (BFMLALB then BFMLALT: even then odd elements): a chain of fp32 fused
  multiply-adds (FPCR: nearest even, subnormals kept).
* FP8 (FEAT_FP8DOT4, FP8DOT2, FP8FMA; ``FP8DotAddFP``, ``FP8MulAddFP``; operand formats by
  FPMR.F8S1 / F8S2, OCP E5M2 or E4M3, so ``input_format`` may be a pair): ``fdot`` into fp32
  (4-way) or fp16 (2-way): the exact sum of 4 (2) products and the accumulator rounded once;
  ``fmlal`` (FMLALB/FMLALT, FP8 to fp16) and ``fmlall`` (FMLALLBB..TT, FP8 to fp32): one fused
  multiply-add per product. The product sums are scaled by ``2**-FPMR.LSCALE`` before the one
  rounding; the presets model LSCALE = 0. Rounding to nearest even with subnormals kept is
  inferred (FPCR defaults; the descriptions say only "without intermediate rounding").

x86 AMX. **TDPBF16PS** (AMX-BF16; measured on the Intel Xeon above by
``tests/gemm/test_cpu_isa_amx.py``: 10.1 million output elements, one instruction at every even
K from 2 to 32 and chains of up to 8 instructions, bit for bit; :func:`tdpbf16ps`). Per output
element one instruction keeps two fp32 sums from +0, one of the even and one of the odd BF16
elements' products, each a chain of FMAs in K order, then ``tmpf32 := even + odd`` and ``dest :=
dest + tmpf32``, every step rounded to nearest even, DAZ (BF16 inputs and the fp32 destination,
read as zeros of their sign) and FTZ (zeros of their sign, tininess after rounding: ``2**-126 -
2**-151 (1 + f)``, ``f > 0``, formed in a lane's FMA is flushed; it would round to ``2**-126`` on
the subnormal grid), whatever MXCSR says (round toward zero with FTZ and DAZ gives the same bits)
and without setting its flags. That is the Operation section of Intel's SDM vol. 2 / ISA
Extensions Programming Reference ("FP32 FMA with DAZ=FTZ=1, RNE rounding. MXCSR is neither
consulted nor updated"); the measurement agrees with it on every element and settles what the
text leaves open: tininess after rounding, the signs of DAZ and FTZ zeros, and the NaN, which is
x86's rule applied step by step (an FMA gives the first NaN of the A element, the B element and
the running sum; ``even + odd`` the even sum's NaN over the odd one's; ``dest + tmpf32`` the
destination's over the instruction's; each made quiet, signalling or not, by position only;
``inf * 0`` or ``inf - inf`` without a NaN operand gives ``0xffc00000``). So there is one row,
and it is measured. The preset is that as an :class:`~precision_lab.Accumulator`: ``lanes=2``
(product ``k`` in lane ``k mod 2``, each lane from 0), ``lane_combine="sequential"``, and
``split_k=32`` with a sequential combine (one instruction per 32 elements of K, added to C in
turn), ``input_subnormals="flush_signed"``, ``subnormals="flush"``,
``tininess="after_rounding"``; the preset gives a NaN as the quiet NaN, :func:`tdpbf16ps` the
hardware's bits. ``pl.probe_gemm`` on the hardware (16 x 16 tiles, K up to 32, ``with_c``,
``long_k=200``) recovers the same lanes, combine and 32-element K-blocks on its own. Not a
property of the instruction: the 32 K elements per instruction (the tile shape is the
program's; 16 rows of 64 bytes, palette 1's largest, is what AMX GEMM kernels such as oneDNN's
configure: ``AMX_K``; rows of ``colsb`` bytes: ``acc.replace(split_k=colsb // 2)``, measured
for every even K up to 32). An A tile whose rows are not a multiple of 4 bytes (an odd K)
raises #UD here: software pads K to even with zeros; the preset leaves a missing product out,
which may differ only in the sign of a zero.

**TDPFP16PS** (AMX-FP16; published, not measured: the Intel Xeon here has no AMX-FP16): the same
Operation with FP16 elements, which are "not treated as zero" (they are normal fp32 numbers
after the exact conversion) while the fp32 destination is still read with DAZ
(``input_subnormals="flush_signed_c"``). Inferred from the TDPBF16PS measurement: tininess
after rounding, signed zeros and the NaN rule.

AVX10.2 and AMX-FP8 (published, not measured: no CPU here has them, the Xeon above lacks
AVX10.2, AMX-FP8 and AMX-FP16). Intel's Operation sections could not be read in this work; the
evidence is the Bochs x86 emulator (bochs-emu/Bochs at :data:`BOCHS_COMMIT`, maintained by an
Intel engineer; cpu/avx/avx10_2_misc.cc, avx10_2_cvt.cc, avx10_2_cvt_fp8.cc, bf8.h, hf8.h,
amx.cc and its softfloat3e, whose FTZ detects tininess after rounding and flushes to zeros of
their sign, and whose DAZ reads subnormal operands as zeros of their sign).
``tests/gemm/test_cpu_isa_avx10.py`` holds the functions and the row to exact oracles of those
rules on any CPU.

* **VDPPHPS** (FP16 pairs into fp32; the row ``pl.tensor_core("x86", "fp16",
  instruction="vdpphps")``): VDPBF16PS's rule, ``d = fma(a1, b1, d); d = fma(a0, b0, d)`` (the
  odd, upper element first), nearest even whatever MXCSR says, FTZ after rounding; the fp16
  elements are widened exactly (subnormals kept) and DAZ applies to the fp32 accumulator only
  (``input_subnormals="flush_signed_c"``; it cannot change a bit here, as the first FMA's FTZ
  flushes a subnormal sum too). GCC's AVX10.2 test model adds the odd product first as well.
* FP8 formats: BF8 is OCP E5M2 (``"e5m2"``: inf and NaNs), HF8 is OCP E4M3 (``"e4m3"``: no inf,
  ``S.1111.111`` the NaN, largest 448): :data:`FP8_FORMATS`.
* **VCVTPH2BF8[S]**, **VCVTPH2HF8[S]**, **VCVT2PH2BF8[S]**, **VCVT2PH2HF8[S]**
  (:func:`vcvtph2bf8`, :func:`vcvtph2hf8`, :func:`vcvt2ph2bf8`, :func:`vcvt2ph2hf8`): fp16 to
  FP8, nearest even whatever MXCSR says, DAZ and FTZ ignored (fp16 subnormals are values);
  overflow gives inf (BF8) or the NaN (HF8: beyond 464, and from an infinity), the S forms
  ``±max`` instead (infinities included); a NaN stays NaN (BF8: sign, exponent and the upper
  payload bits, quiet; HF8: the NaN of its sign). Bochs's two-source handlers saturate on the
  opcode without S, the opposite of its one-source ones and of the mnemonics: the functions
  follow the mnemonics (``saturate=True`` for the S forms).
* **VCVTBIASPH2BF8[S]**, **VCVTBIASPH2HF8[S]** (:func:`vcvtbiasph2bf8`,
  :func:`vcvtbiasph2hf8`): the low byte ``r`` of each 16-bit word of the first source is added
  below the result's last bit and the sum truncated: ``trunc(|x| / q + r / 256)`` quanta ``q``,
  which is the core's ``stochastic`` rounding with ``random_bits=8`` and ``r`` as the random
  field (Bochs adds ``r`` to the fp16 code for BF8, ``r >> 1`` for a normal HF8 result and
  ``r`` at ``2**-8`` quanta for a subnormal one; the tests show all of them equal to that rule
  on every fp16 code and every ``r``). Overflow, saturation and NaN as above.
* **VCVTHF82PH** (:func:`vcvthf82ph`): exact; the NaN ``S.1111.111`` gives ``S | 0x7f80``.
* Open (special values): GCC's test model (gcc.target/i386/fp8-helper.h) differs from Bochs
  there: an infinite input gives the HF8 NaN in the S forms too and stays a BF8 infinity in
  them, and the HF8 NaN widens to ``S | 0x7e00``; the functions follow Bochs. On finite
  inputs that helper is cruder (an HF8 subnormal result is a zero, its HF8 path without bias
  truncates), so it is not taken as evidence.
* **VCVT2PS2PHX** (:func:`vcvt2ps2phx`): two sources of :func:`vcvtps2phx` (measured here for
  VCVTPS2PHX): MXCSR.RC, DAZ on the fp32 sources, fp16 subnormals kept; Bochs says the same.
* **AMX-FP8** TDPBF8PS, TDPBHF8PS, TDPHBF8PS, TDPHF8PS (A's format then B's: BF8 or HF8;
  :func:`tdpfp8ps`). Per output element and instruction, for each group of four K elements: the
  four products (exact in fp32), ``p0 + p1`` and ``p2 + p3`` each rounded, added into two fp32
  sums from +0 (``even += p0 + p1``, ``odd += p2 + p3``); then ``even + odd`` and ``dest +
  that``; nearest even, FTZ after rounding, DAZ on the fp32 destination, MXCSR ignored. Bochs
  widens each FP8 element to fp16 and then to fp32 under DAZ, so a BF8 subnormal (an fp16
  subnormal) is read as a zero of its sign while an HF8 subnormal (a normal fp16) is kept;
  whether the hardware does that is open. The rows ``pl.tensor_core("x86", ("e5m2",
  "e4m3"), instruction="tdpbhf8ps")`` (and ``tdpbf8ps``, ``tdphbf8ps``, ``tdphf8ps``) say it
  as an Accumulator: ``lanes=2`` fed by runs of two products (``lane_run=2``: product ``k``
  in lane ``(k // 2) mod 2``, each pair summed first), ``lane_combine="sequential"``,
  ``split_k=64`` (16 x 64-byte tiles) added into ``c`` in turn, ``input_subnormals=
  "flush_signed_fp16"`` (the inputs through fp16 under DAZ: one rule for all four input
  pairs), RNE, FTZ after rounding; ``tests/gemm/test_cpu_isa_avx10.py`` holds them to
  :func:`tdpfp8ps` bit for bit.

>>> import precision_lab as pl
>>> acc = pl.tensor_core("x86", "bf16", instruction="vdpbf16ps")
>>> acc.pair_order, acc.tininess, acc.input_subnormals
('odd_first', 'after_rounding', 'flush_signed')
>>> import numpy as np
>>> float(vdpbf16ps(np.float32(1.0), [2.0**-30, 2.0**-24], [1.0, 1.0]))   # two roundings
1.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.codec import encode
from .accumulator import Accumulator
from .reference import gemm

__all__ = [
    "AMX_FP8_INPUTS",
    "AMX_FP8_K",
    "BOCHS_COMMIT",
    "CPU_INSTRUCTIONS",
    "CPU_MACHINES",
    "FP8_FORMATS",
    "MEASURED_ON",
    "cpu_instruction_name",
    "cpu_rows",
    "tdpbf16ps",
    "tdpfp8ps",
    "vcvt2ph2bf8",
    "vcvt2ph2hf8",
    "vcvt2ps2phx",
    "vcvtbiasph2bf8",
    "vcvtbiasph2hf8",
    "vcvthf82ph",
    "vcvtne2ps2bf16",
    "vcvtneps2bf16",
    "vcvtph2bf8",
    "vcvtph2hf8",
    "vcvtph2psx",
    "vcvtps2phx",
    "vdpbf16ps",
    "vfmadd231ph",
]

#: machine name -> architecture (the table's "GPU" column for CPUs)
CPU_MACHINES: dict[str, str] = {
    "x86": "x86",
    "zen4": "x86",
    "sapphirerapids": "x86",
    "arm": "arm",
}
#: per architecture, the order in which GEMM libraries prefer them (oneDNN: VDPBF16PS, and
#: AMX's TDPBF16PS / TDPFP16PS on CPUs that have AMX (the x86 default stays the AVX512-BF16
#: instruction that Zen 4 and the AMX Xeons both have); Arm Compute Library / oneDNN on
#: Neoverse: BFMMLA for bf16, FDOT for FP8)
CPU_LIBRARY_CHOICE: dict[str, tuple[str, ...]] = {
    "x86": (
        "vdpbf16ps",
        "tdpbf16ps",
        "tdpfp16ps",
        "vfmadd231ph",
        "vdpphps",
        "tdpbf8ps",
        "tdpbhf8ps",
        "tdphbf8ps",
        "tdphf8ps",
    ),
    "arm": ("bfmmla", "bfdot", "bfmlal", "fdot", "fmlal", "fmlall"),
}
#: the CPU instructions (vendor mnemonics, lower case)
CPU_INSTRUCTIONS = tuple(i for arch in ("x86", "arm") for i in CPU_LIBRARY_CHOICE[arch])
ZEN4 = "AMD EPYC 9004 (Zen 4, Genoa)"
INTEL_XEON = (
    "Intel Xeon with AMX-BF16 and AVX512-FP16 (CPUID family 6, model 167 as this VM reports)"
)
#: the commit of the Bochs source (bochs-emu/Bochs on GitHub) that the AVX10.2 and AMX-FP8
#: models follow (no such CPU here)
BOCHS_COMMIT = "783b58fd6d9bae598a07c59719122322fa0edce6"
#: the FP8 formats of AVX10.2 and AMX-FP8: Intel's BF8 is OCP E5M2 (IEEE-like: inf, NaNs), HF8
#: is OCP E4M3 (no inf; ``S.1111.111`` is NaN; largest 448): Bochs's bf8.h / hf8.h
FP8_FORMATS = {"bf8": "e5m2", "hf8": "e4m3"}
#: CPUs the hardware tests (tests/gemm/test_cpu_isa_hardware.py, test_cpu_isa_amx.py) have run
#: on, per instruction
MEASURED_ON: dict[str, str] = {
    "vdpbf16ps": f"{ZEN4}; {INTEL_XEON}",
    "vcvtneps2bf16": f"{ZEN4}; {INTEL_XEON}",
    "vcvtne2ps2bf16": f"{ZEN4}; {INTEL_XEON}",
    "tdpbf16ps": INTEL_XEON,
    "vfmadd231ph": INTEL_XEON,
    "vcvtps2phx": INTEL_XEON,
    "vcvtph2psx": INTEL_XEON,
}
#: the special-value rules of the CPU rows, with their evidence (the table's special-values note)
CPU_SPECIAL_EVIDENCE: dict[str, str] = {
    "x86": "measured: AMD EPYC 9004 (Zen 4) and Intel Xeon (family 6 model 167): VDPBF16PS "
    "and AMX TDPBF16PS: DAZ (signed zeros), FTZ (tininess after rounding), RNE whatever MXCSR "
    "says; NaN: VDPBF16PS the first of src1 low, src2 low, src1 high, src2 high, accumulator "
    "(the SDM's Table 5-1), TDPBF16PS per step (FMA: A, B, running sum; even over odd; dest "
    "over the instruction's sum), quieted; invalid gives 0xffc00000 (pl.gemm: quiet NaN; exact "
    "bits: precision_lab.gemm.cpu_instructions.vdpbf16ps, tdpbf16ps); TDPFP16PS (published): "
    "DAZ on the fp32 operands only, FTZ, RNE, MXCSR ignored; NaN: quiet NaN (inferred); "
    "AVX512-FP16 VFMADD231PH (measured, Intel Xeon): MXCSR.RC rounds, DAZ and FTZ ignored "
    "(fp16 subnormals kept), NaN: the first of the two factors and the addend, quieted, "
    "invalid gives 0xfe00 (pl.gemm: quiet NaN; exact bits: cpu_instructions.vfmadd231ph); "
    "AVX10.2 VDPPHPS (published: Bochs): RNE, FTZ after rounding, DAZ on the fp32 accumulator "
    "only, MXCSR ignored; NaN: quiet NaN",
    "arm": "published: Arm ARM (DDI 0487) C8.2: BF16 (FPCR.EBF = 0) round to odd, overflow to "
    "inf, FZ and FIZ (signed zeros); EBF = 1 and FP8 as FPCR (nearest even, subnormals kept); "
    "default NaN",
}

_ARM = "published: Arm ARM (DDI 0487)"
_AMX = (
    "published: Intel SDM vol. 2 / ISA Extensions Programming Reference, {} Operation: per "
    "element two fp32 sums from 0 (even and odd elements), each FMAs in K order with DAZ=FTZ=1 "
    "and RNE, MXCSR not consulted; then tmpf32 := even + odd, dest := dest + tmpf32; {}. "
    "inferred: K = 32 per instruction (16 x 64-byte tiles), tininess after rounding (as "
    "measured for VDPBF16PS and TDPBF16PS), NaN as quiet NaN (the page gives no NaN rule)"
)
_AMX_BF16_MEASURED = (
    f"measured: {INTEL_XEON}, 10.1M output elements bit for bit (one instruction at every "
    "even K from 2 to 32, chains along K; tests/gemm/test_cpu_isa_amx.py): per element two "
    "fp32 FMA chains from 0 (even and odd elements), even + odd, then dest + that, RNE, DAZ "
    "and FTZ (signed zeros, tininess after rounding), MXCSR neither consulted nor updated: the "
    "SDM's TDPBF16PS Operation; K = 32 per instruction is the tile shape GEMM kernels choose "
    "(split_k = colsb / 2 for other tiles)"
)
_X86_MEASURED = (
    f"measured: {ZEN4} and {INTEL_XEON}, 10M lanes bit for bit "
    "(tests/gemm/test_cpu_isa_hardware.py); agrees with the SDM's description (RNE for each "
    "FMA, DAZ, FTZ, MXCSR ignored, NaN priorities of its Table 5-1)"
)


def cpu_instruction_name(instruction: str, kind: str) -> str:
    """The row's instruction in words: ``"vdpbf16ps"``, ``"bfdot (FPCR.EBF=0)"``,
    ``"fdot (4-way)"``.

    >>> cpu_instruction_name("bfmmla", "ebf1")
    'bfmmla (FPCR.EBF=1)'
    """
    if kind.startswith("ebf"):
        return f"{instruction} (FPCR.EBF={kind[3:]})"
    if kind in ("4way", "2way"):
        return f"{instruction} ({kind[0]}-way)"
    return instruction


def _vdpbf16ps_acc(out: str) -> Accumulator:
    return Accumulator(
        "fp32",
        "nearest_even",
        subnormals="flush",
        tininess="after_rounding",
        input_subnormals="flush_signed",
        pair_order="odd_first",
    )


def _amx_fp8_acc(out: str) -> Accumulator:
    """AMX-FP8 TDP*8PS (published: Bochs's amx.cc): per instruction (``AMX_FP8_K`` elements
    of K) two fp32 sums from +0 fed by pair sums, ``even += p0 + p1``, ``odd += p2 + p3``
    (``lane_run=2``), then ``even + odd`` added into the destination; RNE, FTZ after rounding,
    DAZ on the destination, the FP8 inputs through fp16 under DAZ (E5M2 subnormals flushed to
    signed zeros, E4M3 subnormals kept)."""
    return Accumulator(
        "fp32",
        "nearest_even",
        subnormals="flush",
        tininess="after_rounding",
        input_subnormals="flush_signed_fp16",
        lanes=2,
        lane_run=2,
        lane_combine="sequential",
        split_k=AMX_FP8_K,
        split_combine="sequential",
    )


_AMX_FP8_BOCHS = (
    "published: Bochs (bochs-emu/Bochs {}, cpu/amx.cc {}): per element and instruction "
    "(64 elements of K: 16 x 64-byte tiles), for each group of four K elements the products "
    "(exact in fp32), p0 + p1 and p2 + p3 each rounded, added into two fp32 sums from +0 (even, "
    "odd); then even + odd, and dest + that; RNE, FTZ after rounding, DAZ on the fp32 "
    "destination, MXCSR ignored; FP8 elements widened to fp16, then to fp32 under DAZ (BF8 "
    "subnormals flushed to signed zeros, HF8 subnormals kept); no hardware here (no AMX-FP8 "
    "CPU)"
)


def _vdpphps_acc(out: str) -> Accumulator:
    """AVX10.2 VDPPHPS (published: Bochs): VDPBF16PS's two FMAs (odd element first, RNE, FTZ
    after rounding) on fp16 pairs, which convert exactly to normal fp32 numbers (DAZ applies
    to the fp32 accumulator only)."""
    return _vdpbf16ps_acc(out).replace(input_subnormals="flush_signed_c")


_VDPPHPS_BOCHS = (
    "published: Bochs (bochs-emu/Bochs {}, cpu/avx/avx10_2_misc.cc VDPPHPS): per fp32 lane "
    "d = fma(a1, b1, d) then d = fma(a0, b0, d) (the odd, upper fp16 element first), each "
    "fp16 element converted exactly to fp32 (subnormals kept), every FMA RNE with DAZ (the "
    "fp32 accumulator, signed zeros) and FTZ (softfloat3e: tininess after rounding, signed "
    "zeros), MXCSR not consulted; no hardware here (no AVX10.2 CPU)"
)


#: K elements per AMX TDP*PS instruction in the presets: a 16-row by 64-byte tile of 16-bit
#: pairs (palette 1's largest, the shape oneDNN's AMX GEMM kernels configure)
AMX_K = 32


def _amx_acc(input_subnormals: str) -> Callable[[str], Accumulator]:
    """AMX TDPBF16PS / TDPFP16PS: per instruction (``AMX_K`` elements of K) two fp32
    accumulators from 0, the even and the odd elements' products, each a chain of FMAs in K
    order (lanes of 2), summed (``even + odd``) and added to the destination (split_k with a
    sequential combine); every step RNE, DAZ, FTZ (tininess after rounding). Measured for
    TDPBF16PS (:data:`MEASURED_ON`), the SDM's Operation for both."""
    return lambda out: Accumulator(
        "fp32",
        "nearest_even",
        subnormals="flush",
        tininess="after_rounding",
        input_subnormals=input_subnormals,
        lanes=2,
        lane_tail="lanes",
        lane_combine="sequential",
        split_k=AMX_K,
        split_combine="sequential",
    )


def _bf16_ebf0(out: str) -> Accumulator:
    """Arm BFDotAdd with FPCR.EBF = 0: products to fp32, pair sum, then the accumulator, all
    round-to-odd, overflow to inf, FZ and FIZ (each pair a promoted segment of two)."""
    return Accumulator(
        "fp32",
        "odd",
        order="pairwise",
        promote_every=2,
        promote_format="fp32",
        promote_rounding="odd",
        product_format="fp32",
        product_rounding="odd",
        overflow="infinity",
        subnormals="flush",
        input_subnormals="flush_signed",
    )


def _bf16_ebf1(out: str) -> Accumulator:
    """FEAT_EBF16, FPCR.EBF = 1: each pair's exact sum rounded once (FPDot), then added."""
    return Accumulator("fp32", order="exact_block", block=2, promote_every=2, promote_format="fp32")


def _exact_blocks(n: int) -> Callable[[str], Accumulator]:
    """FP8DotAddFP: the accumulator and ``n`` exact products, one rounding (nearest even)."""
    return lambda out: Accumulator(out, order="exact_block", block=n)


def _fma_chain(out: str) -> Accumulator:
    return Accumulator(out)


_AVX512_FP16 = (
    f"measured: {INTEL_XEON}, 12.6M FMAs under each MXCSR.RC bit for bit "
    "(tests/gemm/test_cpu_isa_fp16.py): "
    "VFMADD231PH is an fp16 fused multiply-add rounded by MXCSR.RC (nearest even by default; "
    "the four modes measured: acc.replace(rounding=...)), fp16 subnormal inputs and results "
    "kept whatever MXCSR.DAZ and FTZ say (as the SDM says of FP16 instructions); a GEMM on it "
    "is a chain of them along K"
)


_FP8 = ("e4m3", "e5m2")
_FP8_PAIRS = [(a, b) for a in _FP8 for b in _FP8]

Row = tuple[str, str, str, list[Any], tuple[str, ...], Callable[[str], Accumulator], str]


def cpu_rows() -> list[Row]:
    """The CPU rows of the table, as ``(arch, instruction, kind, inputs, outputs, builder,
    evidence)`` for ``precision_lab.gemm.tensor_core._add``.

    >>> [r[1] for r in cpu_rows()][:6]
    ['vdpbf16ps', 'tdpbf16ps', 'tdpfp16ps', 'vfmadd231ph', 'vdpphps', 'tdpbf8ps']
    """
    ebf0 = (
        f"{_ARM} {{}}: BFDotAdd with FPCR.EBF = 0 (unfused: products and pair sum rounded, "
        "round-to-odd, overflow to inf, denormal inputs and results flushed)"
    )
    ebf1 = (
        f"{_ARM} {{}}: BFDotAdd with FEAT_EBF16, FPCR.EBF = 1 (fused pair sum rounded once, "
        "then the accumulator; FPCR: nearest even, FZ = 0)"
    )
    fp8 = f"{_ARM} {{}} (products scaled by 2**-FPMR.LSCALE, LSCALE = 0 here, added {{}}"
    rne = "; nearest even and subnormals kept inferred from the FPCR defaults)"
    return [
        ("x86", "vdpbf16ps", "avx512_bf16", ["bf16"], ("fp32",), _vdpbf16ps_acc, _X86_MEASURED),
        ("x86", "tdpbf16ps", "amx_bf16", ["bf16"], ("fp32",), _amx_acc("flush_signed"),
         _AMX_BF16_MEASURED),
        ("x86", "tdpfp16ps", "amx_fp16", ["fp16"], ("fp32",), _amx_acc("flush_signed_c"),
         _AMX.format("TDPFP16PS (AMX-FP16)", "FP16 input denormals handled (exact in fp32), "
                     "the fp32 destination read with DAZ")),
        ("x86", "vfmadd231ph", "avx512_fp16", ["fp16"], ("fp16",), _fma_chain, _AVX512_FP16),
        ("x86", "vdpphps", "avx10_2", ["fp16"], ("fp32",), _vdpphps_acc,
         _VDPPHPS_BOCHS.format(BOCHS_COMMIT)),
        *[
            ("x86", name, "amx_fp8", [tuple(FP8_FORMATS[f] for f in pair)], ("fp32",),
             _amx_fp8_acc, _AMX_FP8_BOCHS.format(BOCHS_COMMIT, name.upper()))
            for name, pair in AMX_FP8_INPUTS.items()
        ],
        ("arm", "bfmmla", "ebf0", ["bf16"], ("fp32",), _bf16_ebf0,
         ebf0.format("C8.2.67 BFMMLA (2 pairs per element)")),
        ("arm", "bfmmla", "ebf1", ["bf16"], ("fp32",), _bf16_ebf1,
         ebf1.format("C8.2.67 BFMMLA (2 pairs per element)")),
        ("arm", "bfdot", "ebf0", ["bf16"], ("fp32",), _bf16_ebf0,
         ebf0.format("C8.2.49 BFDOT")),
        ("arm", "bfdot", "ebf1", ["bf16"], ("fp32",), _bf16_ebf1,
         ebf1.format("C8.2.49 BFDOT")),
        ("arm", "bfmlal", "bfmlalb_t", ["bf16"], ("fp32",), _fma_chain,
         f"{_ARM} BFMLALB, BFMLALT: fp32 fused multiply-add of the even then the odd "
         "elements (FPCR: nearest even, FZ = 0)"),
        ("arm", "fdot", "4way", _FP8_PAIRS, ("fp32",), _exact_blocks(4),
         fp8.format("C8.2.185 FDOT (4-way, FEAT_FP8DOT4): FP8DotAddFP, 4 products",
                    "to the fp32 accumulator without intermediate rounding") + rne),
        ("arm", "fdot", "2way", _FP8_PAIRS, ("fp16",), _exact_blocks(2),
         fp8.format("FDOT (2-way, FEAT_FP8DOT2): FP8DotAddFP, 2 products",
                    "to the fp16 accumulator without intermediate rounding") + rne),
        ("arm", "fmlal", "fmlalb_t", _FP8_PAIRS, ("fp16",), _fma_chain,
         fp8.format("FMLALB, FMLALT (FEAT_FP8FMA): FP8MulAddFP, one product",
                    "to the fp16 accumulator without intermediate rounding") + rne),
        ("arm", "fmlall", "fmlallbb_tt", _FP8_PAIRS, ("fp32",), _fma_chain,
         fp8.format("FMLALLBB..FMLALLTT (FEAT_FP8FMA): FP8MulAddFP, one product",
                    "to the fp32 accumulator without intermediate rounding") + rne),
    ]  # fmt: skip


# ----- x86 instructions, bit for bit (NaN payloads included) -------------------------------------
_QUIET32 = np.uint32(0x00400000)
_X86_DEFAULT_NAN = np.uint32(0xFFC00000)


def _f32_bits(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real array, got dtype {arr.dtype}")
    return np.array(arr, dtype=np.float32, order="C").view(np.uint32)  # (0-d stays 0-d)


def _bf16_words(x: Any, name: str) -> np.ndarray:
    """fp32 bit patterns of BF16 operands given as values (which must be on the BF16 grid)."""
    u = _f32_bits(x, name)
    if (u & np.uint32(0xFFFF)).any():
        raise ValueError(f"{name} must hold BF16 values (fp32 words with zero low halves)")
    return u


def _is_nan(u: np.ndarray) -> np.ndarray:
    return (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)


def vdpbf16ps(src: Any, a: Any, b: Any) -> np.ndarray:
    """VDPBF16PS on lanes: ``src`` (fp32, shape ``S``) plus the two products of the BF16 pairs
    ``a`` and ``b`` (shape ``S + (2,)``, element 0 the even, low one), as this CPU computes it:
    two FMAs (odd element first) rounded to nearest even, DAZ and FTZ (signed zeros, tininess
    after rounding), NaN as the hardware's (see the module docstring). float32 result.

    Lanes whose result is not NaN are the preset ``pl.tensor_core("x86", "bf16",
    instruction="vdpbf16ps")`` through :func:`~precision_lab.gemm` (K = 2); on NaN lanes the
    two steps are replayed (each the preset on one product) to pick the NaN by the measured
    rule.

    >>> float(vdpbf16ps(np.float32(2.0**-126), [-(2.0**-75), 0.0], [2.0**-75, 0.0]))
    0.0
    """
    c = _f32_bits(src, "src")
    aw, bw = _bf16_words(a, "a"), _bf16_words(b, "b")
    if aw.shape != (*c.shape, 2) or bw.shape != aw.shape:
        raise ValueError(
            f"a and b must have the shape of src plus a last axis of 2 (a BF16 pair), got "
            f"src {c.shape}, a {aw.shape}, b {bw.shape}"
        )
    acc = _vdpbf16ps_acc("fp32")

    def run(x: np.ndarray, y: np.ndarray, r: np.ndarray) -> np.ndarray:
        k = x.shape[-1]
        with np.errstate(all="ignore"):
            v = gemm(
                x.view(np.float32).reshape(-1, 1, k),
                y.view(np.float32).reshape(-1, k, 1),
                r.view(np.float32).reshape(-1, 1, 1),
                input_format="bf16",
                accumulator=acc,
                input_rounding="exact",
            )
        return np.asarray(v, dtype=np.float32).reshape(r.shape).view(np.uint32)

    d = run(aw, bw, c)  # the preset on one instruction (K = 2, the odd product first)
    nan = _is_nan(d)
    if nan.any():  # the NaN's bits: the measured rule, step by step on those lanes
        xa, xb, r = aw[nan], bw[nan], c[nan]
        for j in (1, 0):
            x, y = xa[..., j], xb[..., j]
            v = run(x[..., None], y[..., None], r)
            pick = np.where(
                _is_nan(x),
                x | _QUIET32,
                np.where(
                    _is_nan(y), y | _QUIET32, np.where(_is_nan(r), r | _QUIET32, _X86_DEFAULT_NAN)
                ),
            )
            r = np.where(_is_nan(v), pick, v).astype(np.uint32)
        d = d.copy()
        d[nan] = r
    return d.view(np.float32)


def vcvtneps2bf16(x: Any) -> np.ndarray:
    """VCVTNEPS2BF16 on each element: fp32 ``x`` to BF16 codes (uint16), as this CPU does:
    subnormal inputs read as zeros of their sign, round to nearest even whatever MXCSR says,
    overflow to inf, NaN made quiet with its sign and the upper payload bits.

    >>> [hex(int(c)) for c in vcvtneps2bf16(np.array([1 + 2.0**-8, 1e-40, np.inf], np.float32))]
    ['0x3f80', '0x0', '0x7f80']
    """
    u = _f32_bits(x, "x")
    f = u.view(np.float32)
    daz = np.where(np.abs(f) < np.float32(2.0**-126), np.copysign(np.float32(0), f), f)
    with np.errstate(invalid="ignore"):
        codes = np.asarray(encode(daz, "bf16"), dtype=np.uint16)
    quiet = ((u >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return np.where(_is_nan(u), quiet, codes)


def vcvtne2ps2bf16(a: Any, b: Any) -> np.ndarray:
    """VCVTNE2PS2BF16: the destination register of two fp32 sources: the conversions of ``b``
    (the second source) in the low half of the last axis, those of ``a`` in the high half;
    each element as :func:`vcvtneps2bf16`.

    >>> vcvtne2ps2bf16(np.float32([1.0]), np.float32([2.0])).tolist()
    [16384, 16256]
    """
    ca, cb = vcvtneps2bf16(a), vcvtneps2bf16(b)
    if ca.shape != cb.shape:
        raise ValueError(f"a and b must have one shape, got {ca.shape} and {cb.shape}")
    return np.concatenate([cb, ca], axis=-1)


def _pick_nan(v: np.ndarray, *operands: np.ndarray) -> np.ndarray:
    """x86's NaN rule for one operation whose result words are ``v``: where ``v`` is NaN, the
    first NaN among ``operands`` (in the given order) made quiet, else (an invalid operation
    without NaN operands) the default NaN ``0xffc00000``."""
    pick = np.full(v.shape, _X86_DEFAULT_NAN, dtype=np.uint32)
    for x in reversed(operands):
        pick = np.where(_is_nan(x), x | _QUIET32, pick)
    return np.where(_is_nan(v), pick, v).astype(np.uint32)


def _x86_step(
    acc: Accumulator, s: np.ndarray, x: np.ndarray, y: np.ndarray, fmt: str
) -> np.ndarray:
    """One fp32 step of ``acc`` on words: ``s + x * y`` rounded once (an FMA; ``x`` and ``y``
    of ``fmt``); a NaN result as the model gives it (pick its bits with :func:`_pick_nan`)."""
    with np.errstate(all="ignore"):
        v = gemm(
            x.view(np.float32).reshape(-1, 1, 1),
            y.view(np.float32).reshape(-1, 1, 1),
            s.view(np.float32).reshape(-1, 1, 1),
            input_format=fmt,
            accumulator=acc,
            input_rounding="exact",
        )
    return np.asarray(v, dtype=np.float32).reshape(s.shape).view(np.uint32)


_ONE32 = np.uint32(0x3F800000)


def tdpbf16ps(c: Any, a: Any, b: Any, k: int | None = None) -> np.ndarray:
    """A GEMM on AMX-BF16 TDPBF16PS as this CPU computes it: ``c`` (fp32, ``(..., M, N)``)
    plus ``a @ b`` (BF16 values, ``(..., M, K)`` and ``(..., K, N)``), one instruction per
    ``k`` elements of K (default :data:`AMX_K`; the A tile's rows of ``2k`` bytes), the
    destination kept between them. float32 result, every bit (NaN payloads included).

    Each instruction, per output element: two fp32 sums from +0, the even and the odd
    elements' products, each a chain of FMAs in K order, then ``even + odd``, then ``dest +
    that``; every step rounded to nearest even whatever MXCSR says, DAZ and FTZ (signed
    zeros, tininess after rounding). A NaN result is the first NaN operand of the step that
    made it (an FMA: the A element, the B element, the running sum; an addition: the even sum
    over the odd one, the destination over the instruction's sum), made quiet, or the default
    NaN ``0xffc00000`` from an invalid operation (``inf * 0``, ``inf - inf``). Measured: see
    the module docstring and :data:`MEASURED_ON`.

    Elements whose result is not NaN are the preset ``pl.tensor_core("x86", "bf16",
    instruction="tdpbf16ps")`` (with ``split_k=k``) through :func:`~precision_lab.gemm`; on
    NaN elements the steps are replayed to pick the NaN.

    >>> d = tdpbf16ps(np.float32([[1.0]]), [[2.0**-24, 2.0**-24]], [[1.0], [1.0]])
    >>> float(d[0, 0]) == 1 + 2.0**-23                   # even + odd first, then c
    True
    """
    k = AMX_K if k is None else int(k)
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    cw = _f32_bits(c, "c")
    aw, bw = _bf16_words(a, "a"), _bf16_words(b, "b")
    if aw.ndim < 2 or bw.ndim < 2 or aw.shape[-1] != bw.shape[-2]:
        raise ValueError(f"a (..., M, K) and b (..., K, N) must agree on K: {aw.shape}, {bw.shape}")
    acc = _amx_acc("flush_signed")("fp32").replace(split_k=k)
    with np.errstate(all="ignore"):
        d = gemm(
            aw.view(np.float32),
            bw.view(np.float32),
            cw.view(np.float32),
            input_format="bf16",
            accumulator=acc,
            input_rounding="exact",
        )
    d = np.array(d, dtype=np.float32).view(np.uint32)
    nan = _is_nan(d)
    if nan.any():  # the NaN's bits: the measured rule, step by step on those elements
        shape = d.shape
        idx = np.nonzero(nan)
        batch, i, j = idx[:-2], idx[-2], idx[-1]
        ab = np.broadcast_to(aw, (*shape[:-2], *aw.shape[-2:]))
        bb = np.broadcast_to(bw, (*shape[:-2], *bw.shape[-2:]))
        rows, cols = (*batch, i), (*batch, j)
        xa = ab[rows]  # (n, K)
        xb = np.moveaxis(bb, -1, -2)[cols]
        dest = np.broadcast_to(cw, shape)[idx].astype(np.uint32)
        step = _vdpbf16ps_acc("fp32")
        one = np.full(dest.shape, _ONE32, dtype=np.uint32)
        K = xa.shape[-1]
        for k0 in range(0, K, k):
            lanes = [np.zeros_like(dest), np.zeros_like(dest)]
            for kk in range(k0, min(k0 + k, K)):
                lane = (kk - k0) % 2
                x, y, s = xa[:, kk], xb[:, kk], lanes[lane]
                lanes[lane] = _pick_nan(_x86_step(step, s, x, y, "bf16"), x, y, s)
            # even + odd, then dest + that (an addition x + y: fp32 y times 1 added to x)
            even, odd = lanes
            tmp = _pick_nan(_x86_step(step, even, one, odd, "fp32"), even, odd)
            dest = _pick_nan(_x86_step(step, dest, one, tmp, "fp32"), dest, tmp)
        d = d.copy()
        d[idx] = dest
    return d.view(np.float32)


# ----- AVX512-FP16 -------------------------------------------------------------------------------
_QUIET16 = np.uint16(0x0200)
_X86_DEFAULT_NAN16 = np.uint16(0xFE00)
#: MXCSR.RC (bits 13-14) -> the library's rounding mode
MXCSR_ROUNDING = {0: "nearest_even", 1: "down", 2: "up", 3: "toward_zero"}


def _f16_codes(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == np.float16:
        return np.array(arr, order="C").view(np.uint16)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real array, got dtype {arr.dtype}")
    h = arr.astype(np.float16)
    with np.errstate(invalid="ignore"):
        ok = (h.astype(np.float64) == arr.astype(np.float64)) | np.isnan(arr.astype(np.float64))
    if not ok.all():
        raise ValueError(f"{name} must hold fp16 values")
    return np.array(h, order="C").view(np.uint16)


def _is_nan16(u: np.ndarray) -> np.ndarray:
    return (u & np.uint16(0x7FFF)) > np.uint16(0x7C00)


def vfmadd231ph(c: Any, a: Any, b: Any, rounding: str = "nearest_even") -> np.ndarray:
    """VFMADD231PH (AVX512-FP16) on each element: ``a * b + c`` in fp16 with one rounding,
    as this CPU computes it: ``rounding`` is MXCSR.RC's mode (:data:`MXCSR_ROUNDING`), fp16
    subnormal operands and results are kept whatever MXCSR.DAZ and FTZ say, a NaN result is
    the first NaN of ``a`` (the instruction's second source), ``b`` (the third) and ``c`` (the
    destination, the addend), made quiet, and an invalid operation without NaN operands
    (``inf * 0``, ``inf - inf``) gives ``0xfe00``. float16 result, every bit.

    Non-NaN results are ``pl.gemm`` with ``pl.tensor_core("x86", "fp16",
    instruction="vfmadd231ph").replace(rounding=rounding)`` on K = 1; a GEMM on the
    instruction is that preset along K (a chain of them).

    >>> float(vfmadd231ph(np.float16(1.0), np.float16(2.0**-11), np.float16(1.0)))  # a tie
    1.0
    >>> hex(int(vfmadd231ph(np.float16(0), np.float16(np.inf), np.float16(0)).view(np.uint16)))
    '0xfe00'
    """
    cw, aw, bw = _f16_codes(c, "c"), _f16_codes(a, "a"), _f16_codes(b, "b")
    cw, aw, bw = np.broadcast_arrays(cw, aw, bw)
    acc = Accumulator("fp16", rounding)
    with np.errstate(all="ignore"):
        d = gemm(
            aw.view(np.float16).reshape(-1, 1, 1),
            bw.view(np.float16).reshape(-1, 1, 1),
            cw.view(np.float16).reshape(-1, 1, 1),
            input_format="fp16",
            accumulator=acc,
            out_format="fp16",
            input_rounding="exact",
        )
    v = np.asarray(d).astype(np.float16).reshape(cw.shape).view(np.uint16)
    pick = np.full(v.shape, _X86_DEFAULT_NAN16, dtype=np.uint16)
    for x in (cw, bw, aw):  # the first NaN of a, b, c wins: apply in reverse
        pick = np.where(_is_nan16(x), x | _QUIET16, pick)
    return np.where(_is_nan16(v), pick, v).astype(np.uint16).view(np.float16)


def vcvtps2phx(x: Any, rounding: str = "nearest_even", daz: bool = False) -> np.ndarray:
    """VCVTPS2PHX (AVX512-FP16) on each element: fp32 ``x`` to fp16 codes (uint16), as this
    CPU does: rounded by MXCSR.RC (``rounding``), overflow by IEEE's rule for that mode (inf, or
    the largest finite value when the mode points inward), fp16 subnormal results kept
    (MXCSR.FTZ ignored), fp32 subnormal inputs read as zeros of their sign when MXCSR.DAZ is set
    (``daz``: it matters under ``"up"`` and ``"down"``, where a tiny non-zero input gives the
    smallest subnormal), NaN made quiet keeping its sign and the payload's upper nine bits
    (``sign | 0x7e00 | (x >> 13) & 0x3ff``). Measured: :data:`MEASURED_ON`.

    >>> [hex(int(c)) for c in vcvtps2phx(np.float32([1 + 2.0**-11, 1e-40]), rounding="up")]
    ['0x3c01', '0x1']
    >>> [hex(int(c)) for c in vcvtps2phx(np.float32([1e-40]), rounding="up", daz=True)]
    ['0x0']
    """
    u = _f32_bits(x, "x")
    f = u.view(np.float32)
    if daz:
        f = np.where(np.abs(f) < np.float32(2.0**-126), np.copysign(np.float32(0), f), f)
    with np.errstate(invalid="ignore", over="ignore"):
        codes = np.asarray(encode(f, "fp16", rounding=rounding), dtype=np.uint16)
    quiet = (
        ((u >> np.uint32(16)) & np.uint32(0x8000))
        | np.uint32(0x7E00)
        | ((u >> np.uint32(13)) & np.uint32(0x3FF))
    ).astype(np.uint16)
    return np.where(_is_nan(u), quiet, codes)


def vcvtph2psx(codes: Any) -> np.ndarray:
    """VCVTPH2PSX (AVX512-FP16) on each element: fp16 codes to fp32, exact (fp16 subnormals
    become normal fp32 numbers whatever MXCSR.DAZ says), NaN made quiet keeping its sign and
    payload (``(h & 0x8000) << 16 | 0x7fc00000 | (h & 0x3ff) << 13``). Measured on every code
    under every MXCSR rounding, DAZ and FTZ setting: :data:`MEASURED_ON`.

    >>> hex(int(vcvtph2psx(np.uint16([0x7c01])).view(np.uint32)[0]))
    '0x7fc02000'
    """
    h = np.asarray(codes)
    if h.dtype != np.uint16:
        raise TypeError(f"codes must be fp16 codes (uint16), got dtype {h.dtype}")
    v = h.view(np.float16).astype(np.float32).view(np.uint32)
    return np.where(_is_nan16(h), v | _QUIET32, v).astype(np.uint32).view(np.float32)


# ----- AVX10.2 (published: the Bochs emulator; no AVX10.2 CPU here) ------------------------------


def _fp16_in(x: Any, name: str) -> np.ndarray:
    """fp16 operands as codes: uint16 codes, or float16 values."""
    arr = np.asarray(x)
    if arr.dtype == np.float16:
        return np.array(arr, order="C").view(np.uint16)
    if arr.dtype != np.uint16:
        raise TypeError(f"{name} must be fp16 codes (uint16) or float16, got dtype {arr.dtype}")
    return np.array(arr, order="C")


def _fp16_to_fp8(h: np.ndarray, fp8: str, saturate: bool, bias: np.ndarray | None) -> np.ndarray:
    """The AVX10.2 conversion of fp16 codes ``h`` to ``fp8`` ("bf8" or "hf8") codes (uint8):
    nearest even (``bias`` None) or the BIAS forms' add-and-truncate, which is the core's
    ``stochastic`` rounding with the 8-bit random field ``bias`` (see :func:`vcvtbiasph2bf8`)."""
    from ..core.formats import FloatFormat, get_format
    from ..core.rounding import _plan, _round_float_chunk

    fmt = get_format(FP8_FORMATS[fp8])
    assert isinstance(fmt, FloatFormat)
    nan = _is_nan16(h)
    f = np.where(nan, np.uint16(0), h).view(np.float16).astype(np.float32)
    overflow = "saturate" if saturate else "ieee"
    with np.errstate(all="ignore"):
        if bias is None:
            codes = np.asarray(encode(f, fmt, overflow=overflow))
        else:
            words = (bias.astype(np.uint64) & np.uint64(0xFF)) << np.uint64(56)
            src = np.ascontiguousarray(f).reshape(-1)
            out = np.empty(src.size, dtype=np.float32)
            p = _plan(fmt, "float32", "stochastic", overflow, False)
            _round_float_chunk(p, src, out, np.ascontiguousarray(words).reshape(-1))
            vals = out.reshape(f.shape)
            codes = np.asarray(encode(vals, fmt, rounding="toward_zero", overflow=overflow))
    sign = ((h >> np.uint16(8)) & np.uint16(0x80)).astype(np.uint8)
    if fp8 == "bf8":  # NaN: sign, exponent and the upper two payload bits, made quiet
        q = ((h >> np.uint16(8)) | np.uint16(0x02)).astype(np.uint8)
    else:  # HF8 has one NaN per sign
        q = sign | np.uint8(0x7F)
    return np.where(nan, q, codes.astype(np.uint8)).astype(np.uint8)


def vcvtph2bf8(x: Any, saturate: bool = False) -> np.ndarray:
    """VCVTPH2BF8 (``saturate=False``) and VCVTPH2BF8S (AVX10.2) on each element: fp16 (codes
    or float16) to BF8 (OCP E5M2) codes, uint8. Round to nearest even whatever MXCSR says,
    fp16 subnormals kept (DAZ and FTZ ignored: BF8 has fp16's exponent, so a subnormal fp16
    rounds onto BF8's subnormal grid); overflow to inf, or with saturation to ``±57344``
    (``0x7b``), infinite inputs included; a NaN keeps its sign, exponent and upper two payload
    bits, made quiet (``(h >> 8) | 0x02``). Published, not measured: Bochs's bf8.h
    (:data:`BOCHS_COMMIT`), an integer add of ``0x7f + (bit 8 of h)`` to the fp16 code and a
    shift by 8.

    >>> [hex(int(c)) for c in vcvtph2bf8(np.float16([1 + 2.0**-3, 61440.0]))]
    ['0x3c', '0x7c']
    >>> [hex(int(c)) for c in vcvtph2bf8(np.float16([61440.0, -np.inf]), saturate=True)]
    ['0x7b', '0xfb']
    """
    return _fp16_to_fp8(_fp16_in(x, "x"), "bf8", saturate, None)


def vcvtph2hf8(x: Any, saturate: bool = False) -> np.ndarray:
    """VCVTPH2HF8 and VCVTPH2HF8S (AVX10.2): fp16 to HF8 (OCP E4M3: no inf, NaN
    ``S.1111.111``, largest 448) codes, uint8. Round to nearest even whatever MXCSR says, DAZ
    and FTZ ignored; a value beyond 464 (the tie between 448 and 480 rounds to 448) and an
    infinity give the NaN of their sign, or with saturation ``±448`` (``0x7e``); a NaN gives
    the NaN of its sign. Published: Bochs's hf8.h (:data:`BOCHS_COMMIT`).

    >>> [hex(int(c)) for c in vcvtph2hf8(np.float16([464.0, 464.5, -np.inf]))]
    ['0x7e', '0x7f', '0xff']
    >>> [hex(int(c)) for c in vcvtph2hf8(np.float16([464.5, -np.inf]), saturate=True)]
    ['0x7e', '0xfe']
    """
    return _fp16_to_fp8(_fp16_in(x, "x"), "hf8", saturate, None)


def _bias_in(bias: Any, shape: tuple[int, ...]) -> np.ndarray:
    b = np.asarray(bias)
    if b.dtype.kind not in "ui" or (b.size and (b.min() < 0 or b.max() > 0xFFFF)):
        raise TypeError("bias must hold the 16-bit words of src1 (unsigned integers < 2**16)")
    return np.broadcast_to(b.astype(np.uint64), shape)


def vcvtbiasph2bf8(x: Any, bias: Any, saturate: bool = False) -> np.ndarray:
    """VCVTBIASPH2BF8 and VCVTBIASPH2BF8S (AVX10.2): fp16 ``x`` (src2) to BF8 codes, each
    element rounded with the low byte ``r`` of the matching 16-bit word of ``bias`` (src1): ``r``
    is added to the eight fp16 bits below BF8's last bit and the sum truncated, which on the
    magnitude is ``trunc(|x| / q + r / 256) * q`` (``q`` the BF8 quantum at ``|x|``; carries
    into the exponent included): the core's ``stochastic`` rounding (away from zero iff the
    discarded fraction plus ``r / 256`` reaches 1) with ``random_bits=8`` and ``r`` as the
    random field. Subnormals as normals (fp16 and BF8 share the exponent), overflow, saturation
    and NaN as :func:`vcvtph2bf8`. Published: Bochs's bf8.h (:data:`BOCHS_COMMIT`,
    ``convert_truncate_fp16_to_bf8_bias``).

    >>> x = np.float16([1 + 2.0**-3, 1 + 2.0**-3])              # half a BF8 quantum above 1
    >>> [hex(int(c)) for c in vcvtbiasph2bf8(x, np.uint16([0x7f, 0x80]))]
    ['0x3c', '0x3d']
    """
    h = _fp16_in(x, "x")
    return _fp16_to_fp8(h, "bf8", saturate, _bias_in(bias, h.shape))


def vcvtbiasph2hf8(x: Any, bias: Any, saturate: bool = False) -> np.ndarray:
    """VCVTBIASPH2HF8 and VCVTBIASPH2HF8S (AVX10.2): fp16 ``x`` to HF8 (E4M3) codes, rounded
    with the low byte ``r`` of ``bias``'s words: ``trunc(|x| / q + r / 256) * q``, ``q`` the
    HF8 quantum at ``|x|`` (``2**-9`` below ``2**-6``), the core's ``stochastic`` rounding with
    ``random_bits=8``. Bochs adds ``r >> 1`` to the seven dropped fp16 bits of a normal result
    and ``r`` shifted to the quantum's ``2**-8`` for a subnormal one: both are that rule (the
    fp16 fraction there is a multiple of ``q / 128``, so the dropped low bit of ``r`` never
    carries). A result that truncates to 480 or beyond, and an infinity, give the NaN of its
    sign, or with saturation ``±448``; NaN as :func:`vcvtph2hf8`. Published: Bochs's hf8.h
    (:data:`BOCHS_COMMIT`, ``convert_truncate_fp16_to_hf8_bias``).

    >>> x = np.float16([1 + 2.0**-4, 1 + 2.0**-4])               # half an HF8 quantum above 1
    >>> [hex(int(c)) for c in vcvtbiasph2hf8(x, np.uint16([0x7f, 0x80]))]
    ['0x38', '0x39']
    """
    h = _fp16_in(x, "x")
    return _fp16_to_fp8(h, "hf8", saturate, _bias_in(bias, h.shape))


def _two_sources(fn: Callable[..., np.ndarray], a: Any, b: Any, **kw: Any) -> np.ndarray:
    ca, cb = fn(a, **kw), fn(b, **kw)
    if ca.shape != cb.shape:
        raise ValueError(f"a and b must have one shape, got {ca.shape} and {cb.shape}")
    return np.concatenate([cb, ca], axis=-1)


def vcvt2ph2bf8(a: Any, b: Any, saturate: bool = False) -> np.ndarray:
    """VCVT2PH2BF8 / VCVT2PH2BF8S: the destination of two fp16 sources, ``b`` (src2)
    converted into the low half of the last axis and ``a`` (src1) into the high half, each
    element as :func:`vcvtph2bf8`. (Bochs, :data:`BOCHS_COMMIT`, saturates for the opcode
    without S in its two-source handlers, the opposite of its one-source ones and of the
    mnemonic; this follows the mnemonic.)

    >>> vcvt2ph2bf8(np.float16([1.0]), np.float16([2.0])).tolist()
    [64, 60]
    """
    return _two_sources(vcvtph2bf8, a, b, saturate=saturate)


def vcvt2ph2hf8(a: Any, b: Any, saturate: bool = False) -> np.ndarray:
    """VCVT2PH2HF8 / VCVT2PH2HF8S: as :func:`vcvt2ph2bf8` with :func:`vcvtph2hf8`.

    >>> vcvt2ph2hf8(np.float16([1.0]), np.float16([2.0])).tolist()
    [64, 56]
    """
    return _two_sources(vcvtph2hf8, a, b, saturate=saturate)


def vcvthf82ph(codes: Any) -> np.ndarray:
    """VCVTHF82PH (AVX10.2): HF8 (E4M3) codes (uint8) to fp16 codes (uint16), exact (HF8's
    subnormals become normal fp16 numbers whatever MXCSR says); the NaN ``S.1111.111`` gives
    ``S | 0x7f80`` (a quiet NaN). Published: Bochs's hf8.h (:data:`BOCHS_COMMIT`,
    ``convert_hf8_to_fp16``).

    >>> [hex(int(h)) for h in vcvthf82ph(np.uint8([0x01, 0x7e, 0xff]))]
    ['0x1800', '0x5f00', '0xff80']
    """
    from ..core.codec import decode

    c = np.asarray(codes)
    if c.dtype != np.uint8:
        raise TypeError(f"codes must be HF8 codes (uint8), got dtype {c.dtype}")
    v = np.asarray(decode(c, FP8_FORMATS["hf8"]), dtype=np.float64)
    h = np.where(np.isnan(v), 0.0, v).astype(np.float16).view(np.uint16)
    nan = (c & np.uint8(0x7F)) == np.uint8(0x7F)
    q = ((c.astype(np.uint16) & np.uint16(0x80)) << np.uint16(8)) | np.uint16(0x7F80)
    return np.where(nan, q, h).astype(np.uint16)


def vcvt2ps2phx(a: Any, b: Any, rounding: str = "nearest_even", daz: bool = False) -> np.ndarray:
    """VCVT2PS2PHX (AVX10.2): the destination of two fp32 sources, ``b`` (src2) converted into
    the low half of the last axis and ``a`` (src1) into the high half, each element as
    :func:`vcvtps2phx` (measured for that instruction): MXCSR.RC (or the embedded rounding)
    rounds, fp32 subnormal inputs read as zeros under MXCSR.DAZ, fp16 subnormal results kept
    (FTZ ignored). Published: Bochs's avx10_2_cvt.cc (:data:`BOCHS_COMMIT`) says exactly that
    ("Input FP32 denormals are affected by MXCSR.DAZ but output FP16 denormals are not ...").

    >>> [hex(int(c)) for c in vcvt2ps2phx(np.float32([1.0]), np.float32([2.0**-25]), "up")]
    ['0x1', '0x3c00']
    """
    return _two_sources(vcvtps2phx, a, b, rounding=rounding, daz=daz)


# ----- AMX-FP8 (published: Bochs; the rows' independent model) ----------------------------------
#: the AMX-FP8 instructions: (A tile's format, B tile's format), Intel's names
AMX_FP8_INPUTS: dict[str, tuple[str, str]] = {
    "tdpbf8ps": ("bf8", "bf8"),
    "tdpbhf8ps": ("bf8", "hf8"),
    "tdphbf8ps": ("hf8", "bf8"),
    "tdphf8ps": ("hf8", "hf8"),
}
#: K elements per AMX-FP8 instruction here: 16 rows of 64 bytes, 4 FP8 elements per dword
AMX_FP8_K = 64


def _fp8_values(x: Any, fp8: str, name: str) -> np.ndarray:
    """FP8 operands given as values on the grid of ``fp8``, as float32, with BF8 subnormals
    read as zeros of their sign (Bochs widens each element to fp16 and then to fp32 with
    ``f16_to_f32`` under DAZ: a BF8 subnormal is an fp16 subnormal, an HF8 subnormal becomes a
    normal fp16 number first)."""
    from ..core.rounding import round_to

    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real array, got dtype {arr.dtype}")
    v = arr.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        on = round_to(v, FP8_FORMATS[fp8])
    if not ((on == v) | np.isnan(v) | (np.isinf(v) & (fp8 == "bf8"))).all():
        raise ValueError(f"{name} must hold {fp8.upper()} ({FP8_FORMATS[fp8]}) values")
    v32 = v.astype(np.float32)
    if fp8 == "bf8":
        v32 = np.where(np.abs(v32) < np.float32(2.0**-14), np.copysign(np.float32(0), v32), v32)
    return v32


def _ftz32(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < np.float32(2.0**-126), np.copysign(np.float32(0), x), x)


def tdpfp8ps(
    c: Any, a: Any, b: Any, instruction: str = "tdpbf8ps", k: int | None = None
) -> np.ndarray:
    """A GEMM on AMX-FP8 (TDPBF8PS, TDPBHF8PS, TDPHBF8PS, TDPHF8PS: :data:`AMX_FP8_INPUTS`)
    as Bochs computes it: ``c`` (fp32, ``(..., M, N)``) plus ``a @ b`` (FP8 values, ``(..., M,
    K)`` and ``(..., K, N)``), one instruction per ``k`` elements of K (default
    :data:`AMX_FP8_K`), the destination kept between them. float32 result; a NaN result is
    numpy's NaN (its bits are not modelled).

    Per output element and instruction, for each group of four K elements ``4j .. 4j+3``: the
    four products rounded to fp32 (exact: FP8 products have at most 8 significant bits and
    stay in fp32's normal range), ``s0 = p0 + p1`` and ``s1 = p2 + p3`` each rounded, and two
    fp32 sums from +0 take ``even = even + s0``, ``odd = odd + s1``; after the last group,
    ``tmp = even + odd`` and ``dest = dest + tmp``. Every step rounded to nearest even whatever
    MXCSR says, DAZ (the fp32 destination and BF8 subnormal elements read as zeros of their
    sign; HF8 subnormals kept) and FTZ (signed zeros, tininess after rounding). Published:
    Bochs's amx.cc (:data:`BOCHS_COMMIT`); no AMX-FP8 CPU here. A K not a multiple of 4 is
    padded with zeros (they change no bit: both sums start from +0).

    >>> d = tdpfp8ps(np.float32([[0.0]]), [[2.0**15, 1.0, 2.0**15, 1.0]], [[1.0]] * 4)
    >>> float(d[0, 0]) == 2.0**16 + 2                     # (p0 + p1) + (p2 + p3), each exact
    True
    """
    if instruction not in AMX_FP8_INPUTS:
        raise ValueError(f"instruction must be one of {', '.join(AMX_FP8_INPUTS)}")
    k = AMX_FP8_K if k is None else int(k)
    if k < 1 or k % 4:
        raise ValueError(f"k must be a positive multiple of 4, got {k}")
    fa, fb = AMX_FP8_INPUTS[instruction]
    av, bv = _fp8_values(a, fa, "a"), _fp8_values(b, fb, "b")
    cv = np.asarray(_f32_bits(c, "c").view(np.float32))
    if av.ndim < 2 or bv.ndim < 2 or av.shape[-1] != bv.shape[-2]:
        raise ValueError(f"a (..., M, K) and b (..., K, N) must agree on K: {av.shape}, {bv.shape}")
    K = av.shape[-1]
    pad = (-K) % 4
    if pad:
        av = np.concatenate([av, np.zeros((*av.shape[:-1], pad), np.float32)], axis=-1)
        bv = np.concatenate([bv, np.zeros((*bv.shape[:-2], pad, bv.shape[-1]), np.float32)], -2)
    batch = np.broadcast_shapes(av.shape[:-2], bv.shape[:-2])
    shape = np.broadcast_shapes(cv.shape, (*batch, av.shape[-2], bv.shape[-1]))
    dest = np.array(np.broadcast_to(_ftz32(cv), shape), dtype=np.float32)
    with np.errstate(all="ignore"):
        for k0 in range(0, av.shape[-1], k):
            even = np.zeros(shape, np.float32)
            odd = np.zeros(shape, np.float32)
            for j in range(k0, min(k0 + k, av.shape[-1]), 4):
                p = [av[..., :, j + i, None] * bv[..., j + i, None, :] for i in range(4)]
                even = even + (p[0] + p[1])  # float32 arithmetic: IEEE, nearest even
                odd = odd + (p[2] + p[3])  # (no subnormal can arise before dest + tmp)
            dest = _ftz32(dest + (even + odd))
    return dest
