"""How the compiled kernels see a format, and the CUDA sources they are built from.

Shared by both compiled backends: the C++ extension (:mod:`.native`) and the CuPy backend
(:mod:`.gpu`) pass a format to the header's ``pl_make_format`` as :func:`format_args`; the CUDA
sources live in ``backends/cuda/`` and :func:`kernel_source` inlines their local includes for
NVRTC. No CuPy and no compiler needed here.

>>> from precision_lab.core.formats import get_format
>>> format_args(get_format("e4m3"))  # how a format is passed to the kernels
(4, 3, 7, 1, 14)
>>> src = kernel_source("pl_round.cu")  # the header inlined: one self-contained source
>>> "pl_round_bits" in src, '#include "' in src
(True, False)
"""

from __future__ import annotations

import re
from pathlib import Path

from ..core.formats import FloatFormat

__all__ = ["CUDA_DIR", "NVRTC_OPTIONS", "format_args", "kernel_source"]

#: Folder of the CUDA sources shipped with the package.
CUDA_DIR = Path(__file__).resolve().parent / "cuda"

#: NVRTC options of every kernel: no flush-to-zero, no contraction of a*b+c into FMA, IEEE
#: division; the sources call the rounding-exact intrinsics where they want an FMA.
NVRTC_OPTIONS = ("--std=c++17", "-ftz=false", "-fmad=false", "-prec-div=true", "-prec-sqrt=true")

_NAN_STYLES = {"ieee": 0, "fn": 1, "fnuz": 2, "none": 3}
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def format_args(fmt: FloatFormat) -> tuple[int, int, int, int, int]:
    """``(exponent_bits, mantissa_bits, bias, nan_style, flags)`` of a format, for the kernels.

    ``nan_style`` is 0 ieee, 1 fn, 2 fnuz, 3 none; ``flags`` has bit 0 has_inf, bit 1
    has_subnormals, bit 2 has_zero, bit 3 signed (``pl_make_format`` in ``pl_round.cuh``).
    """
    if not isinstance(fmt, FloatFormat):
        raise TypeError(f"fmt must be a FloatFormat, got {type(fmt).__name__}")
    assert fmt.bias is not None
    flags = (
        int(fmt.has_inf)
        | int(fmt.has_subnormals) << 1
        | int(fmt.has_zero) << 2
        | int(fmt.signed) << 3
    )
    return (fmt.exponent_bits, fmt.mantissa_bits, fmt.bias, _NAN_STYLES[fmt.nan], flags)


def kernel_source(name: str) -> str:
    """Text of ``precision_lab/cuda/<name>`` with its local ``#include "..."`` files inlined.

    Inlining makes the text self-contained, so CuPy's kernel cache (keyed by the source text)
    notices a change in a header too.
    """
    seen: set[str] = set()

    def expand(fname: str) -> str:
        path = CUDA_DIR / fname
        if not path.is_file():
            raise FileNotFoundError(f"CUDA source {fname!r} not found in {CUDA_DIR}")
        if fname in seen:
            return ""
        seen.add(fname)
        text = path.read_text()
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(name)
