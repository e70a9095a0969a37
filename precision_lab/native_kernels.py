"""The compiled kernels ``precision_lab._native_kernels`` (GEMM models, INT quantize/dequantize).

Built by ``setup.py`` from ``precision_lab/native/`` and the CUDA headers in
``precision_lab/cuda/``; optional: where it is not built, :data:`ext` is None and every caller
runs its numpy reference. ``PRECISION_LAB_NATIVE_ISA=baseline`` forces the kernels built for the
baseline instruction set (otherwise AVX2+FMA ones where the CPU has them).

>>> available() == (ext is not None)
True
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["available", "ext", "isa"]

try:
    ext: Any = importlib.import_module("precision_lab._native_kernels")
except ImportError:  # pragma: no cover - depends on the build
    ext = None


def available() -> bool:
    """Whether the compiled kernels were built and load."""
    return ext is not None


def isa() -> str | None:
    """Instruction set of the kernels in use (``"avx2+fma"``, ``"baseline"``), None if not built."""
    return None if ext is None else str(ext.isa())
