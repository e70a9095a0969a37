"""The compiled CPU backend: round_to, encode and decode in C++
(``precision_lab.backends._native``).

The extension is built by ``setup.py`` from ``native/core.cpp`` and the CUDA kernels' own header
``cuda/pl_round.cuh`` (one rounding core for CPU and GPU), and gives the numpy reference's bits.
:mod:`precision_lab.backends.dispatch` sends calls here; users call :func:`precision_lab.round_to`
etc.

Loading. The extension is optional: when it is missing (no compiler when the package was
installed) or stale (its sources were edited after the build: the hash compiled into it differs
from the hash of the files in the package, see :mod:`precision_lab.backends.native.sources`), the
numpy backend serves everything and one RuntimeWarning at import says why and how to rebuild. With
the environment variable ``PRECISION_LAB_REQUIRE_NATIVE=1`` (``make test`` sets it) that warning is
an ImportError instead, so a machine that should have the extension cannot silently lose it.

Dtype rules are the numpy backend's. Inputs of any strides and byte order are first made
contiguous and native-endian; large arrays are cut into chunks of :data:`CHUNK` elements spread
over the thread pool of :func:`precision_lab.core.pool.for_chunks` (the extension releases the GIL).

>>> mod, why = load("precision_lab._no_such_extension")
>>> mod is None and why.startswith("extension not built")
True
"""

from __future__ import annotations

import importlib
import os
import warnings
from contextvars import ContextVar
from types import ModuleType
from typing import Any

import numpy as np

from ...core.codec import _table
from ...core.formats import FloatFormat, IntFormat, get_format
from ...core.pool import current_workers
from ...core.rounding import (
    ROUNDING_MODES,
    RoundingOptions,
    as_float_array,
    check_choice,
    for_chunks,
    word_bits,
    working_dtype,
)
from ..kernel_sources import format_args
from .sources import EXTENSIONS, REBUILD, source_hash

__all__ = [
    "CHUNK",
    "REQUIRE_ENV",
    "WHY",
    "decode",
    "encode",
    "ext",
    "load",
    "load_or_warn",
    "round_to",
]

#: CPU backends one can select ("auto": native where built, else numpy)
BACKENDS = ("auto", "native", "numpy")
#: the environment variable that selects the CPU backend
BACKEND_ENV = "PRECISION_LAB_BACKEND"
#: the backend selected by :func:`precision_lab.use_backend` (per thread and async task)
SELECTED: ContextVar[str | None] = ContextVar("precision_lab_backend", default=None)


def choice() -> tuple[str, str]:
    """(selected CPU backend, where the choice comes from): ``use_backend``, else the
    environment variable ``PRECISION_LAB_BACKEND``, else ``"auto"``."""
    chosen = SELECTED.get()
    if chosen is not None:
        return chosen, "use_backend"
    env = os.environ.get(BACKEND_ENV)
    if env is None or not env.strip():
        return "auto", "default"
    return check_choice(BACKEND_ENV, env.strip().lower(), BACKENDS), BACKEND_ENV


#: set to 1 to turn a missing or stale extension into an ImportError (``make test`` does)
REQUIRE_ENV = "PRECISION_LAB_REQUIRE_NATIVE"
#: most elements per call into the extension. Each call releases the GIL, but entering it takes
#: the GIL (a few microseconds of Python per chunk): with chunks of 2**16 elements two threads ran
#: a 16M encode 1.24x faster than one, with 2**20 1.9x. The kernels stream (their own buffers are
#: per block of 1024), so a chunk need not fit a cache.
CHUNK = 1 << 20
#: fewest elements per call (smaller arrays are one call)
MIN_CHUNK = 1 << 16


def _chunk(n: int) -> int:
    """Elements per call for an array of n: about four calls per worker, within the bounds.

    >>> _chunk(1 << 24) == CHUNK, _chunk(1000) == MIN_CHUNK
    (True, True)
    """
    return min(CHUNK, max(MIN_CHUNK, -(-n // (4 * current_workers()))))


_M64 = (1 << 64) - 1


def load(name: str) -> tuple[ModuleType | None, str]:
    """``(module, "")``, or ``(None, why)`` when the extension is not built or is stale."""
    try:
        mod = importlib.import_module(name)
    except ImportError as exc:
        return None, f"extension not built ({exc}); rebuild with: {REBUILD}"
    try:
        want = source_hash(EXTENSIONS[name])
    except (KeyError, OSError):  # sources not shipped with this install: nothing to compare
        return mod, ""
    have = getattr(mod, "SOURCE_HASH", "unknown")
    if have != want:
        return None, (
            f"extension {name} is stale (built from sources {have}, the package's sources hash to "
            f"{want}); rebuild with: {REBUILD}"
        )
    return mod, ""


def load_or_warn(name: str) -> tuple[ModuleType | None, str]:
    """:func:`load`, warning once (or raising ImportError under ``REQUIRE_ENV=1``) on failure.

    Every compiled extension of the package is loaded this way (list it in
    :data:`precision_lab.backends.native.sources.EXTENSIONS` so that setup.py builds and hashes it).
    """
    mod, why = load(name)
    if mod is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            raise ImportError(f"precision_lab: {why} ({REQUIRE_ENV}=1 requires it)")
        if os.environ.get("PRECISION_LAB_BACKEND", "").strip().lower() != "numpy":
            warnings.warn(
                f"precision_lab: {why}. The numpy reference serves instead "
                "(precision_lab.backend_info() says which backend serves each operation).",
                RuntimeWarning,
                stacklevel=2,
            )
    return mod, why


#: the extension module, or None; WHY says why it is None
ext, WHY = load_or_warn("precision_lab.backends._native")


def _sr(o: RoundingOptions) -> tuple[int, int, int]:
    return o.seed & _M64, (o.seed >> 64) & _M64, word_bits(o.mode, o.random_bits)


def _source(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """(the input as an array, its flat contiguous native-endian float16/32/64 data)."""
    a = as_float_array(x)
    return a, np.ascontiguousarray(a).reshape(-1)


def _rounded(
    x: Any, fmt: FloatFormat | IntFormat, o: RoundingOptions, out_dtype: np.dtype | None
) -> np.ndarray:
    """round_to (out_dtype None: the working dtype) or encode (out_dtype: the code dtype)."""
    assert ext is not None
    a, src = _source(x)
    encode = out_dtype is not None
    out = np.empty(a.shape, dtype=out_dtype if encode else working_dtype(a.dtype, fmt))
    flat = out.reshape(-1)
    if src.size == 0:
        return out
    mode = ROUNDING_MODES.index(o.mode)
    isz, osz = src.dtype.itemsize, out.dtype.itemsize
    if isinstance(fmt, IntFormat):
        fn = ext.encode_int if encode else ext.round_int
        args: tuple[Any, ...] = (fmt.bits, int(fmt.signed), mode, *_sr(o))
    else:
        fn = ext.encode_float if encode else ext.round_float
        sat, flush = int(o.overflow == "saturate"), int(o.subnormals == "flush")
        args = (format_args(fmt), mode, sat, flush, *_sr(o))
    errors: list[int] = []

    def work(lo: int, hi: int) -> None:
        if fn(src, isz, flat, osz, *args, lo, hi):
            errors.append(1)

    for_chunks(src.size, work, chunk=_chunk(src.size))
    if errors:
        extra = "" if isinstance(fmt, IntFormat) else " (it has no NaN code)"
        raise ValueError(f"x contains NaN, which {fmt} cannot represent{extra}")
    return out


def round_to(x: Any, fmt: FloatFormat | IntFormat, o: RoundingOptions) -> np.ndarray:
    """:func:`precision_lab.round_to` on the extension (options already checked)."""
    return _rounded(x, fmt, o, None)


def encode(x: Any, fmt: FloatFormat | IntFormat, o: RoundingOptions) -> np.ndarray:
    """:func:`precision_lab.encode` on the extension (options already checked)."""
    return _rounded(x, fmt, o, np.dtype(fmt.code_dtype))


def decode(codes: Any, fmt: FloatFormat | IntFormat, o: None = None) -> np.ndarray | None:
    """:func:`precision_lab.decode` on the extension; None leaves the call to numpy.

    Formats of at most 16 bits decode by lookup in the numpy reference's own table. None is
    returned for what numpy does as well or must report: non-integer or out-of-range codes (numpy
    raises the error) and fp32/fp64 (a bit view).
    """
    assert ext is not None
    c = np.asarray(codes)
    if c.dtype.kind not in "ui" or fmt in (get_format("fp32"), get_format("fp64")):
        return None
    if not c.dtype.isnative:
        c = c.astype(c.dtype.newbyteorder("="))
    src = np.ascontiguousarray(c).reshape(-1)
    out = np.empty(c.shape, dtype=working_dtype(np.dtype(np.float32), fmt))
    flat = out.reshape(-1)
    if src.size == 0:
        return out
    csz, signed, osz = src.dtype.itemsize, src.dtype.kind == "i", out.dtype.itemsize
    if fmt.bits <= 16:
        table = _table(fmt)

        def call(lo: int, hi: int) -> int:
            return int(ext.decode_table(src, csz, signed, table, flat, osz, lo, hi))

    elif isinstance(fmt, IntFormat):

        def call(lo: int, hi: int) -> int:
            return int(ext.decode_int(src, csz, signed, flat, osz, fmt.bits, fmt.signed, lo, hi))

    else:
        fa = format_args(fmt)

        def call(lo: int, hi: int) -> int:
            return int(ext.decode_float(src, csz, signed, flat, osz, fa, lo, hi))

    bad: list[int] = []

    def work(lo: int, hi: int) -> None:
        if call(lo, hi):
            bad.append(1)

    for_chunks(src.size, work, chunk=_chunk(src.size))
    return None if bad else out


#: operations of :func:`elementwise` (their numbers in the extension)
ELEMENTWISE_OPS = ("add", "sub", "mul", "fma", "div", "sqrt")
_KINDS = {np.dtype(np.float32): 4, np.dtype(np.float16): 2}


def _operand_kind(a: np.ndarray) -> tuple[np.ndarray, int]:
    """(flat contiguous native data, kind 4/2/3 for float32/float16/bfloat16) of an operand
    whose values are float32 values (other ml_dtypes floats are widened to float32 first)."""
    import ml_dtypes

    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return np.ascontiguousarray(a).reshape(-1).view(np.uint16), 3
    if a.dtype not in _KINDS:
        a = a.astype(np.float32)
    elif not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return np.ascontiguousarray(a).reshape(-1), _KINDS[a.dtype]


def elementwise(
    op: str, operands: list[np.ndarray], fmt: FloatFormat, o: RoundingOptions, on_grid: bool
) -> np.ndarray | None:
    """``op`` (one of :data:`ELEMENTWISE_OPS`) of float32-valued operands, correctly rounded to
    ``fmt`` (whose values fit in float32) on the extension: a float32 array of the broadcast
    shape, or None when the numpy path must serve (a stochastic sum whose discarded fraction
    reaches beyond 53 bits: operands more than 29 binades apart, an fma, or an inexact quotient
    or square root).

    ``on_grid``: the operands are known to be values of ``fmt`` already (no rounding of them).
    Options already checked; precision_lab.ops states the semantics and calls this.
    """
    assert ext is not None
    shape = np.broadcast_shapes(*(a.shape for a in operands))
    flat = [_operand_kind(np.broadcast_to(a, shape)) for a in operands]
    while len(flat) < 3:
        flat.append(flat[0])
    (x, xk), (y, yk), (z, zk) = flat
    out = np.empty(shape, dtype=np.float32)
    dst = out.reshape(-1)
    if dst.size == 0:
        return out
    sat, flush = int(o.overflow == "saturate"), int(o.subnormals == "flush")
    args = (ELEMENTWISE_OPS.index(op), format_args(fmt), ROUNDING_MODES.index(o.mode), sat, flush)
    deferred: list[int] = []

    def work(lo: int, hi: int) -> None:
        if ext.elementwise(x, xk, y, yk, z, zk, dst, *args, on_grid, *_sr(o), lo, hi):
            deferred.append(lo)

    for_chunks(dst.size, work, chunk=_chunk(dst.size))
    return None if deferred else out
