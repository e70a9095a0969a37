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
h100 h200  Hopper            fp16 and bf16 16/25, tf32 8/25, e4m3 and e5m2 32/13 into
                             ``FloatFormat(8, 13)`` toward zero
b200       Blackwell         fp16 and bf16 16/25, tf32 8/25; e4m3 and e5m2: 32 products aligned
                             with 25 fraction bits, their sum truncated to fp32, *then* added
                             to the fp32 accumulator with round-to-nearest-even
                             (``addend="after_block"``; this reproduces 5000/5000 measured cases,
                             the published in-block model about 3200)
========== ================= ====================================================================

How the running accumulator enters a block is measured only where the data has a non-zero c:
for Ada FP8 it is aligned in the block (``addend="in_block"``: 5000/5000, against about 2800 with
``"after_block"``); the Hopper FP8 fp32 data ran with c = 0, so its chaining follows Ada's.

fp16 output (``out_format="fp16"``) exists for fp16 and FP8 inputs: the accumulator is then
fp16, rounded to nearest even. For FP8 inputs with fp16 output on Hopper and Blackwell no model
reproduces the measurements yet (the best one found, used here, matches about 4 cases in 5): see
:data:`APPROXIMATE`.

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

from ..formats import FloatFormat, get_format
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
APPROXIMATE: dict[tuple[str, str, str], str] = {
    ("hopper", "e4m3", "fp16"): "about 3900/5000 H100 cases",
    ("hopper", "e5m2", "fp16"): "about 4200/5000 H100 cases",
    ("blackwell", "e4m3", "fp16"): "about 3900/5000 B200 cases",
    ("blackwell", "e5m2", "fp16"): "about 4200/5000 B200 cases",
}

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
    if out_name == "fp16":
        if fp8 and arch in ("hopper", "blackwell"):
            return Accumulator(
                "fp16",
                "nearest_even",
                order="block_fma",
                block=32,
                align_bits=25,
                addend="after_block",
                block_rounding="nearest_even",
                name=label + " (approximate)",
            )
        return Accumulator(
            "fp16", "nearest_even", order="block_fma", block=n, align_bits=bits, name=label
        )
    if fp8 and arch == "blackwell":
        return Accumulator(
            "fp32",
            "nearest_even",
            order="block_fma",
            block=n,
            align_bits=bits,
            addend="after_block",
            block_rounding="toward_zero",
            name=label,
        )
    fmt = FP8_ACCUMULATOR if fp8 else "fp32"
    return Accumulator(fmt, "toward_zero", order="block_fma", block=n, align_bits=bits, name=label)
