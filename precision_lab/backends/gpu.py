"""CuPy backend of the rounding core: :func:`round_to`, :func:`encode`, :func:`decode` on the GPU.

:func:`precision_lab.round_to`, :func:`~precision_lab.encode` and :func:`~precision_lab.decode`
send CuPy arrays here (after checking their options), so users never call this module directly.
The kernels live in ``precision_lab/backends/cuda/pl_round.cu``; their arithmetic is in the header
``pl_round.cuh``, a port of the numpy core that the test suite compiles with the system C++ compiler
and checks bit for bit against it on the CPU. Here they are compiled at first use with NVRTC
(through :class:`cupy.RawModule`) for the visible GPU.

Dtype rules are the CPU's: float16/float32 input gives float32 for formats float32 can hold (every
format of 16 bits or fewer), float64 otherwise; float64 input gives float64; codes are uint8 for
formats of 8 bits or fewer, then uint16, uint32, uint64. Stochastic rounding uses the same
counter-based random words as the CPU, so the same seed gives the same bits on both.

CuPy is optional (``pip install precision_lab[gpu]``): this module imports it only when a kernel
is launched. Without a GPU, :func:`available` is False and the helpers below still work:

>>> available() in (True, False)
True
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from ..core.formats import FloatFormat, IntFormat, get_format
from ..core.rounding import ROUNDING_MODES, working_dtype
from .kernel_sources import CUDA_DIR, NVRTC_OPTIONS, format_args, kernel_source

__all__ = [
    "CUDA_DIR",
    "NVRTC_OPTIONS",
    "available",
    "decode",
    "encode",
    "format_args",
    "kernel_source",
    "require_cupy",
    "round_to",
]

_THREADS = 256


def require_cupy() -> Any:
    """Import and return :mod:`cupy`, or raise an ImportError that says how to get it."""
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError(
            "precision_lab's GPU backend needs CuPy: pip install 'precision_lab[gpu]' "
            f"(or cupy-cuda12x / cupy-cuda13x matching your CUDA driver); import failed: {exc}"
        ) from exc
    return cupy


def available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


@lru_cache(maxsize=8)
def module(name: str) -> Any:
    """The compiled :class:`cupy.RawModule` of ``precision_lab/backends/cuda/<name>`` (cached)."""
    cp = require_cupy()
    return cp.RawModule(code=kernel_source(name), options=NVRTC_OPTIONS)


def _kernel(name: str) -> Any:
    return module("pl_round.cu").get_function(name)


def launch_config(n_items: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) for a grid-stride loop over ``n_items`` work items."""
    blocks = max(1, min(-(-n_items // _THREADS), 1 << 16))
    return (blocks,), (_THREADS,)


def _float_input(cp: Any, x: Any) -> Any:
    dt = np.dtype(x.dtype)
    if dt.kind != "f" or dt.itemsize > 8:
        what = "complex numbers" if dt.kind == "c" else dt.name
        raise TypeError(
            f"x must hold floating-point numbers, got an array of {what} "
            "(expected float16, float32 or float64)"
        )
    return x


def _sr_args(seed: int, random_bits: int) -> tuple[np.uint64, np.uint64, np.int32]:
    m64 = (1 << 64) - 1
    return np.uint64(seed & m64), np.uint64((seed >> 64) & m64), np.int32(random_bits)


_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
_CODE_SUFFIX = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}
_CODE_DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def round_to(
    x: Any,
    fmt: FloatFormat | IntFormat,
    *,
    rounding: str,
    overflow: str,
    subnormals: str,
    seed: int,
    random_bits: int,
) -> Any:
    """GPU :func:`precision_lab.round_to` of a CuPy array (options already checked there)."""
    cp = require_cupy()
    _float_input(cp, x)
    wdt = working_dtype(np.dtype(x.dtype), fmt)
    src = cp.ascontiguousarray(x, dtype=wdt)
    out = cp.empty(x.shape, dtype=wdt)
    n = int(src.size)
    if n == 0:
        return out
    mode = np.int32(ROUNDING_MODES.index(rounding))
    grid, block = launch_config(-(-n // 4))
    sfx = _SUFFIX[wdt]
    if isinstance(fmt, IntFormat):
        args: tuple[Any, ...] = (np.int32(fmt.bits), np.int32(fmt.signed), mode)
        _kernel(f"pl_round_int_{sfx}")(
            grid, block, (src, out, np.uint64(n), *args, *_sr_args(seed, random_bits))
        )
    else:
        fa = tuple(np.int32(v) for v in format_args(fmt))
        opts = (mode, np.int32(overflow == "saturate"), np.int32(subnormals == "flush"))
        _kernel(f"pl_round_{sfx}")(
            grid, block, (src, out, np.uint64(n), *fa, *opts, *_sr_args(seed, random_bits))
        )
    return out


def encode(
    x: Any,
    fmt: FloatFormat | IntFormat,
    *,
    rounding: str,
    overflow: str,
    subnormals: str,
    seed: int,
    random_bits: int,
) -> Any:
    """GPU :func:`precision_lab.encode` of a CuPy array (options already checked there)."""
    cp = require_cupy()
    _float_input(cp, x)
    wdt = working_dtype(np.dtype(x.dtype), fmt)
    src = cp.ascontiguousarray(x, dtype=wdt)
    cdt = np.dtype(fmt.code_dtype)
    out = cp.empty(x.shape, dtype=cdt)
    n = int(src.size)
    if n == 0:
        return out
    mode = np.int32(ROUNDING_MODES.index(rounding))
    err = cp.zeros(1, dtype=cp.int32)
    grid, block = launch_config(-(-n // 4))
    sfx, csfx = _SUFFIX[wdt], _CODE_SUFFIX[cdt.itemsize]
    if isinstance(fmt, IntFormat):
        args: tuple[Any, ...] = (np.int32(fmt.bits), np.int32(fmt.signed), mode)
        _kernel(f"pl_encode_int_{sfx}_{csfx}")(
            grid, block, (src, out, np.uint64(n), *args, *_sr_args(seed, random_bits), err)
        )
        if int(err[0]):
            raise ValueError(f"x contains NaN, which {fmt} cannot represent")
    else:
        fa = tuple(np.int32(v) for v in format_args(fmt))
        opts = (mode, np.int32(overflow == "saturate"), np.int32(subnormals == "flush"))
        _kernel(f"pl_encode_{sfx}_{csfx}")(
            grid, block, (src, out, np.uint64(n), *fa, *opts, *_sr_args(seed, random_bits), err)
        )
        if fmt.nan == "none" and int(err[0]):
            raise ValueError(f"x contains NaN, which {fmt} cannot represent (it has no NaN code)")
    return out


def decode(codes: Any, fmt: FloatFormat | IntFormat) -> Any:
    """GPU :func:`precision_lab.decode` of a CuPy array of codes."""
    cp = require_cupy()
    dt = np.dtype(codes.dtype)
    if dt.kind not in "ui":
        raise TypeError(f"codes must be an integer array, got {dt.name}")
    top = (1 << fmt.bits) - 1
    if codes.size:
        if dt.kind == "i":
            lo = int(codes.min())
            if lo < 0:
                raise ValueError(f"codes must be non-negative, got {lo}")
        if dt.itemsize * 8 > fmt.bits:
            hi = int(codes.max())
            if hi > top:
                raise ValueError(
                    f"codes must be in 0..{top} for {fmt} (a {fmt.bits}-bit format), "
                    f"got values up to {hi}"
                )
    out_dt = working_dtype(np.dtype(np.float32), fmt)
    if fmt == get_format("fp32"):
        return cp.ascontiguousarray(codes, dtype=cp.uint32).view(cp.float32).copy()
    if fmt == get_format("fp64"):
        return cp.ascontiguousarray(codes, dtype=cp.uint64).view(cp.float64).copy()
    cdt = np.dtype(fmt.code_dtype)
    src = cp.ascontiguousarray(codes, dtype=cdt)
    out = cp.empty(codes.shape, dtype=out_dt)
    n = int(src.size)
    if n == 0:
        return out
    grid, block = launch_config(n)
    sfx, csfx = _SUFFIX[out_dt], _CODE_SUFFIX[cdt.itemsize]
    if isinstance(fmt, IntFormat):
        _kernel(f"pl_decode_int_{csfx}_{sfx}")(
            grid, block, (src, out, np.uint64(n), np.int32(fmt.bits), np.int32(fmt.signed))
        )
    else:
        fa = tuple(np.int32(v) for v in format_args(fmt))
        _kernel(f"pl_decode_{csfx}_{sfx}")(grid, block, (src, out, np.uint64(n), *fa))
    return out
