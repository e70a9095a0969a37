"""Accumulator models of real NVIDIA tensor cores: :func:`tensor_core`.

Each preset is an :class:`~precision_lab.gemm.accumulator.Accumulator` with
``order="block_fma"``: a block of ``n`` exact products (and the running accumulator) is aligned to
the largest exponent, bits below ``align_bits`` fraction bits are truncated, the block is summed
exactly, normalised once and rounded (toward zero into fp32, to nearest for fp16 output), and
blocks chain (Fasi et al. 2021; Khattak & Mikaitis 2025). The parameters were fitted to, and are
checked bit for bit against, the measured data of ``shared/data/tensor-core-validation``
(``benchmarks/verify_tensor_cores.py``):

========== ================= ====================================================================
GPU        architecture      fp16 / bf16 / tf32 / FP8 (products per block, fraction bits kept)
========== ================= ====================================================================
v100       Volta             fp16 4/23
a100 a2    Ampere            fp16 and bf16 8/24, tf32 4/24
a30
ada l40s   Ada Lovelace      fp16 and bf16 8/24, tf32 4/24, e4m3 and e5m2 16/13 into a
rtx4090                      14-bit accumulator (``FloatFormat(8, 13)``) rounded toward zero
h100 h200  Hopper            fp16 and bf16 16/25, tf32 8/25, e4m3 and e5m2 (wgmma) 32/13 into
                             ``FloatFormat(8, 13)`` toward zero
b200       Blackwell         fp16 and bf16 16/25, tf32 8/25
========== ================= ====================================================================

FP8 ``mma.sync`` on Hopper and Blackwell (every FP8 set with fp16 output, and B200 FP8 with fp32
output) is not native: the GPUs have no FP8 ``mma.sync`` unit, and the compiler converts the FP8
operands to fp16 (exact) and issues two fp16 tensor-core MMAs of k = 16 (NVIDIA's answer in
CUTLASS issue #1986; the data below confirms it bit for bit). The measured model
(:data:`FP8_MMA_SYNC_EMULATION`, ``inner_block`` in the accumulator spec):

* the 32 products of an instruction are split by register byte pairs: the first fp16 MMA takes
  the products k with ``k % 4`` in {0, 1}, the second those with ``k % 4`` in {2, 3};
* the two MMAs chain from a zero accumulator with the GPU's fp16-input model (16 products and
  the running value aligned, 25 fraction bits, normalised once), each rounded into the output
  type: fp16 to nearest even, fp32 toward zero;
* only then is c added, with one round-to-nearest-even in the output type
  (``addend="after_block"``).

This reproduces all four FP8 -> fp16 sets of H100 and B200 5000/5000 (previously 3931, 4212,
3929 and 4241 with a single 32-product block rounded to fp16; contiguous halves instead of byte
pairs give 3477-3850, the two byte-pair halves in the other order 3443-3771, and c aligned inside
the first MMA 3033-3154). The B200 FP8 -> fp32 sets
do not tell the split apart (any split, or one 32-product block, matches: fp32 hides it); the
emulation model is used there too. What the published in-block model misses on B200 FP8 (it
matches about 3200/5000) is just this: c is added after the products, not aligned with them.

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

fp16 output (``out_format="fp16"``) exists for fp16 and FP8 inputs: the accumulator is then
fp16, rounded to nearest even. The fp16-output FP8 presets of Hopper and Blackwell model
``mma.sync`` (the measured instruction); Hopper's ``wgmma`` with an f16 accumulator is not
measured. :data:`APPROXIMATE` lists presets that do not reproduce their data: none.

>>> import precision_lab as pl
>>> acc = pl.tensor_core("h100", "e4m3")
>>> acc.block, acc.align_bits, acc.format, acc.rounding
(32, 13, FloatFormat(exponent_bits=8, mantissa_bits=13, ...), 'toward_zero')
>>> pl.tensor_core("v100", "bf16")
Traceback (most recent call last):
...
ValueError: input_format: v100 (volta) tensor cores take fp16, got 'bf16'
"""

from __future__ import annotations

from ..core.formats import FloatFormat, get_format
from .accumulator import Accumulator

__all__ = ["APPROXIMATE", "ARCHITECTURES", "GPUS", "tensor_core", "tensor_core_formats"]

#: GPU name -> architecture
GPUS: dict[str, str] = {
    "v100": "volta",
    "a100": "ampere",
    "a2": "ampere",
    "a30": "ampere",
    "ada": "ada",
    "l40s": "ada",
    "rtx4090": "ada",
    "h100": "hopper",
    "h200": "hopper",
    "b200": "blackwell",
}

#: architecture -> input format -> (products per block FMA, fraction bits kept after alignment)
ARCHITECTURES: dict[str, dict[str, tuple[int, int]]] = {
    "volta": {"fp16": (4, 23)},
    "ampere": {"fp16": (8, 24), "bf16": (8, 24), "tf32": (4, 24)},
    "ada": {"fp16": (8, 24), "bf16": (8, 24), "tf32": (4, 24), "e4m3": (16, 13), "e5m2": (16, 13)},
    "hopper": {
        "fp16": (16, 25),
        "bf16": (16, 25),
        "tf32": (8, 25),
        "e4m3": (32, 13),
        "e5m2": (32, 13),
    },
    "blackwell": {
        "fp16": (16, 25),
        "bf16": (16, 25),
        "tf32": (8, 25),
        "e4m3": (32, 25),
        "e5m2": (32, 25),
    },
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

#: the 14-bit accumulator of FP8 tensor cores (Ada, Hopper): 13 fraction bits, fp32 exponents
FP8_ACCUMULATOR = FloatFormat(8, 13, name="e8m13")


def _gpu_arch(gpu: str) -> tuple[str, str]:
    key = (
        gpu.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
        if isinstance(gpu, str)
        else gpu
    )
    if not isinstance(key, str) or key not in GPUS:
        raise ValueError(f"gpu must be one of {', '.join(GPUS)}, got {gpu!r}")
    return key, GPUS[key]


def tensor_core_formats(gpu: str) -> list[str]:
    """Input formats the tensor cores of ``gpu`` take.

    >>> tensor_core_formats("a100")
    ['fp16', 'bf16', 'tf32']
    """
    return list(ARCHITECTURES[_gpu_arch(gpu)[1]])


def tensor_core(
    gpu: str, input_format: str | FloatFormat, *, out_format: str | FloatFormat = "fp32"
) -> Accumulator:
    """The accumulator model of ``gpu``'s tensor cores for ``input_format`` inputs.

    Parameters
    ----------
    gpu:
        ``"v100"``, ``"a100"``, ``"a2"``, ``"a30"``, ``"ada"``, ``"l40s"``, ``"rtx4090"``,
        ``"h100"``, ``"h200"`` or ``"b200"``.
    input_format:
        ``"fp16"``, ``"bf16"``, ``"tf32"``, ``"e4m3"`` or ``"e5m2"`` where the GPU has it.
    out_format:
        ``"fp32"`` (default) or ``"fp16"`` (fp16 and FP8 inputs): the type of C and D; pass the
        same ``out_format`` to :func:`~precision_lab.gemm`.

    Examples
    --------
    >>> print(tensor_core("a100", "fp16", out_format="fp16").describe())
    block FMA of 8 products, 24 fraction bits kept after alignment, normalised into fp16
    (nearest_even)
    """
    key, arch = _gpu_arch(gpu)
    try:
        fin = get_format(input_format)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"input_format: {exc}") from None
    table = ARCHITECTURES[arch]
    fname = str(fin)
    if fname not in table or fin != get_format(fname):
        raise ValueError(
            f"input_format: {key} ({arch}) tensor cores take {', '.join(table)}, "
            f"got {input_format!r}"
        )
    try:
        fout = get_format(out_format)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"out_format: {exc}") from None
    out_name = str(fout)
    fp8 = fname in ("e4m3", "e5m2")
    allowed = ("fp32", "fp16") if fname == "fp16" or fp8 else ("fp32",)
    if out_name not in allowed or fout != get_format(out_name):
        raise ValueError(
            f"out_format: {key} tensor cores with {fname} inputs output "
            f"{' or '.join(allowed)}, got {out_format!r}"
        )
    n, bits = table[fname]
    label = f"{key} {fname} -> {out_name}"
    if fp8 and arch in ("hopper", "blackwell") and (out_name == "fp16" or arch == "blackwell"):
        # mma.sync FP8 emulated on the fp16 tensor cores: two chained fp16-input block FMAs
        # (the fp16 model of the GPU: 16 products, 25 fraction bits) from 0, then c added
        emu = FP8_MMA_SYNC_EMULATION
        acc_fmt, inner_rounding = (
            ("fp16", "nearest_even") if out_name == "fp16" else ("fp32", "toward_zero")
        )
        return Accumulator(
            acc_fmt,
            "nearest_even",
            order="block_fma",
            block=emu["block"],
            align_bits=table["fp16"][1],
            addend="after_block",
            block_rounding=inner_rounding,
            inner_block=emu["inner_block"],
            inner_interleave=emu["inner_interleave"],
            name=label + " (mma.sync, emulated on fp16 tensor cores)",
        )
    if out_name == "fp16":
        return Accumulator(
            "fp16", "nearest_even", order="block_fma", block=n, align_bits=bits, name=label
        )
    fmt = FP8_ACCUMULATOR if fp8 else "fp32"
    return Accumulator(fmt, "toward_zero", order="block_fma", block=n, align_bits=bits, name=label)
