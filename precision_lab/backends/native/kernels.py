"""The compiled kernels ``precision_lab.backends._native_kernels`` (GEMM models, INT
quantize/dequantize).

Built by ``setup.py`` from ``precision_lab/backends/native/`` and the CUDA headers in
``precision_lab/backends/cuda/``; optional: where it is not built, :data:`ext` is None and every
caller runs its numpy reference. ``PRECISION_LAB_NATIVE_ISA=baseline`` forces the kernels built for
the baseline instruction set (otherwise AVX2+FMA ones where the CPU has them, and the fp32 FMA GEMM
and the block-FMA fast path for AVX-512 where it has AVX-512F); ``PRECISION_LAB_NATIVE_ISA=avx2``
leaves out AVX-512.

>>> available() == (ext is not None)
True
"""

from __future__ import annotations

from typing import Any

from . import choice, load_or_warn

__all__ = ["WHY", "active", "available", "ext", "isa"]

#: the extension (None when it is not built or is stale: WHY says why; see
#: precision_lab.backends.native)
ext: Any
ext, WHY = load_or_warn("precision_lab.backends._native_kernels")


def available() -> bool:
    """Whether the compiled kernels were built and load."""
    return ext is not None


def active() -> bool:
    """Whether callers should use the kernels now: built, and the numpy backend not selected
    (:func:`precision_lab.use_backend` or ``PRECISION_LAB_BACKEND``)."""
    return ext is not None and choice()[0] != "numpy"


def isa() -> str | None:
    """Instruction set of the kernels in use (``"avx2+fma, avx512f gemm"``: the fp32 FMA GEMM
    and the block-FMA fast path built for AVX-512; ``"avx2+fma"``, ``"baseline"``), None if not
    built."""
    return None if ext is None else str(ext.isa())
