"""``gemm``: matrix products under an :class:`~precision_lab.gemm.accumulator.Accumulator` model.

The numpy backend here is the reference: it is vectorised over the whole output matrix (and the
batch) and loops only over the reduction dimension (or blocks of it); rows are processed in
cache-sized chunks on all CPU cores. The CuPy backend (:mod:`precision_lab.gemm.cupy_backend`)
computes the same numbers bit for bit.

>>> import numpy as np, precision_lab as pl
>>> a = np.array([[1.0, 1.0, 1.0, 1.0]])
>>> b = np.array([[2.0], [3 * 2.0**-24], [0.0], [0.0]])
>>> float(pl.gemm(a, b, input_format="fp16", accumulator=pl.tensor_core("v100", "fp16"))[0, 0])
2.0
>>> float(pl.gemm(a, b, input_format="fp16", accumulator=pl.Accumulator("fp32"))[0, 0])
2.0000002384185791
"""

from __future__ import annotations

import functools
import importlib
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..backends.native import kernels as native_kernels
from ..core.exact import (
    Rounder,
    odd_collapse,
    round_sum,
    stochastic_words,
    two_product_error,
    two_sum,
)
from ..core.formats import FloatFormat, get_format
from ..core.inputs import as_input
from ..core.rounding import (
    _fits_float32,
    as_float_array,
    check_rounding,
    is_device_array,
    is_stochastic,
    round_to,
)
from .accumulator import (
    Accumulator,
    _float_format,
    _format_pair,
    combine_tree,
    halving_cut,
    join_tail,
    prune_tree,
    reference_only,
    split_chunks,
)
from .scales import expand_scales
from .shapes import gemm_shapes

__all__ = ["BACKENDS", "gemm"]

BACKENDS = ("auto", "numpy", "native", "cupy")
_FP32 = get_format("fp32")
_NO_TERM = -(1 << 20)  # alignment exponent of a zero term (below every real exponent)
#: what backend="auto" runs for numpy arrays: "native" where built and covered, else "numpy"
#: (the test suite sets it to run the same tests on both)
_AUTO_CPU = "native"
#: output elements per work item: the model's temporaries stay in the core's cache
_CHUNK_ELEMENTS = 1 << 15

FormatLike = str | FloatFormat


def gemm(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    input_format: FormatLike | tuple[FormatLike, FormatLike],
    accumulator: Accumulator | FormatLike | None = None,
    out_format: FormatLike = "fp32",
    backend: str = "auto",
    input_rounding: str = "nearest_even",
    scale_a: Any = None,
    scale_b: Any = None,
    scale_block: int | None = None,
) -> Any:
    """``d = c + a @ b`` with inputs on a low-precision grid and a modelled accumulator.

    Parameters
    ----------
    a, b:
        Arrays of shape ``(..., M, K)`` and ``(..., K, N)`` (at least 2-D; batch dimensions
        broadcast like :func:`numpy.matmul`). Float16/32/64 or ml_dtypes floats; never modified.
    c:
        Accumulator input, broadcastable to ``(..., M, N)``; ``None`` for zero. It is rounded
        (nearest_even) to ``out_format`` first, as C and D share a type on the GPU.
    input_format:
        Format of A and B (one for both, or a pair ``(format_a, format_b)``), at most 26
        significant bits (so that products are exact).
    accumulator:
        An :class:`Accumulator` (or a format name for a sequential accumulator in it); default
        ``Accumulator()``, fp32 sequential round-to-nearest-even. :func:`tensor_core` gives the
        models of real GPUs.
    out_format:
        Format of the result (and of ``c``).
    backend:
        ``"numpy"`` (CPU reference), ``"native"`` (compiled CPU kernels,
        :mod:`precision_lab.gemm.native_backend`), ``"cupy"`` (GPU kernels) or ``"auto"`` (cupy
        for CuPy arrays, else native where the extension is built and covers the model, else
        numpy). ``"native"`` on a model it does not cover (``order="blas"``) runs numpy.
    input_rounding:
        How a and b are put on the input grid: a rounding mode (default ``nearest_even``;
        ``stochastic`` uses the accumulator's seed), or ``"exact"``: values must already be on
        the grid, else ValueError.
    scale_a, scale_b, scale_block:
        Optional scales (see :mod:`precision_lab.gemm.scales`): per tensor (scalar), per row of
        A / column of B, or per block of ``scale_block`` (default 128) along K and rows/columns.
        ``d = c + sum over K-blocks of (sa * sb) * (partial sum)``, applied at promotion in the
        wide accumulator, like ``torch._scaled_mm`` and DeepSeek-V3's FP8 GEMM.

    Returns
    -------
    Array of shape ``(..., M, N)``: float32 when ``out_format`` fits in float32, else float64
    (a CuPy array from the cupy backend).

    >>> import numpy as np, precision_lab as pl
    >>> x = np.full((1, 4096), 0.75)
    >>> w = np.full((4096, 1), 0.625)
    >>> d = pl.gemm(x, w, input_format="e4m3", accumulator=pl.Accumulator("bf16"))
    >>> float(d[0, 0]), 0.75 * 0.625 * 4096   # bf16 accumulation stagnates
    (128.0, 1920.0)
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    acc = _as_accumulator(accumulator)
    fa, fb = _input_formats(input_format)
    _check_wide_inputs(acc, fa, fb)
    out_fmt = _float_format(out_format, "out_format")
    a, restore = as_input(a, "a")
    b, _ = as_input(b, "b")
    if c is not None:
        c, _ = as_input(c, "c")
    if acc.switch_k is not None and len(a.shape):  # spec 3g: the kernel of this K
        acc = acc.for_k(int(a.shape[-1]))
        _check_wide_inputs(acc, fa, fb)
    on_device = is_device_array(a) or is_device_array(b) or is_device_array(c)
    if backend == "cupy" or (backend == "auto" and on_device):
        why = reference_only(acc)
        if why is not None:
            raise NotImplementedError(
                f"{why} has no CuPy kernel: use backend='numpy' (the reference)"
            )
        try:
            cupy_backend = importlib.import_module(f"{__package__}.cupy_backend")
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise ImportError(f"backend='cupy' needs CuPy and a GPU: {exc}") from exc
        extra: dict[str, Any] = {}
        if input_rounding != "nearest_even":
            extra["input_rounding"] = input_rounding
        if scale_a is not None or scale_b is not None:
            extra.update(scale_a=scale_a, scale_b=scale_b, scale_block=scale_block)
        out = cupy_backend.gemm(
            a,
            b,
            c,
            input_format=(fa, fb) if fa != fb else fa,
            accumulator=acc,
            out_format=out_fmt,
            **extra,
        )
        return restore(_canonical_nan(out, acc.nan_encoding))
    if on_device:
        raise TypeError(f"backend={backend!r} got CuPy arrays: use backend='cupy' or 'auto'")
    auto_native = backend == "auto" and _AUTO_CPU == "native" and native_kernels.active()
    if backend == "native" or auto_native:
        native = _native_backend()
        if backend == "native" and not native.available():
            native.gemm(a, b, c, input_format=fa, accumulator=acc, out_format=out_fmt)  # raises
        if native.available():
            args = (
                _float64_or_float(as_float_array(a, "a")),
                _float64_or_float(as_float_array(b, "b")),
                None if c is None else _float64_or_float(as_float_array(c, "c")),
            )
            kw = {
                "input_format": (fa, fb) if fa != fb else fa,
                "accumulator": acc,
                "out_format": out_fmt,
                "input_rounding": input_rounding,
                "scale_a": scale_a,
                "scale_b": scale_b,
                "scale_block": scale_block,
            }
            if (
                native.covers(acc)
                and reference_only(acc) is None
                and max(fa.precision, fb.precision) <= _EXACT_PRODUCT_BITS
                and not (auto_native and native.numpy_is_faster(acc, fa, fb))
            ):
                return restore(_canonical_nan(native.gemm(*args, **kw), acc.nan_encoding))
            # models the general kernels lack: a kernel of their own, or None
            out = native.gemm_special(*args, **kw)
            if out is not None:
                return restore(_canonical_nan(out, acc.nan_encoding))
    out = _gemm_numpy(a, b, c, fa, fb, acc, out_fmt, input_rounding, scale_a, scale_b, scale_block)
    return restore(_canonical_nan(out, acc.nan_encoding))


def _native_general(acc: Accumulator, fa: FloatFormat, fb: FloatFormat) -> bool:
    """The checks of :func:`gemm` (``backend="auto"``, numpy float arrays, the native kernels
    active) and of ``native_backend.gemm`` before its fp32 FMA paths, which depend on the model
    alone: whether gemm reaches those paths (or raises, False: gemm raises it itself)."""
    native = _native_backend()
    try:
        fa, fb = _input_formats((fa, fb))
        if max(fa.precision, fb.precision) > _EXACT_PRODUCT_BITS:
            return False
        _check_wide_inputs(acc, fa, fb)
    except ValueError:
        return False
    return bool(
        native.available()
        and acc.switch_k is None
        and native.covers(acc)
        and reference_only(acc) is None
        and not native.numpy_is_faster(acc, fa, fb)
        and acc.input_subnormals != "flush"
        and acc.fields_3d_default()
        and not acc.k1_product
        and acc.scales != "in_block"
    )


@functools.lru_cache(maxsize=256)
def _fma32_route(acc: Accumulator, fa: FloatFormat, fb: FloatFormat, out_fmt: FloatFormat) -> bool:
    """Whether :func:`gemm` (``backend="auto"``, ``input_rounding="nearest_even"``, no scales,
    numpy float arrays, the native kernels active) hands this model to the fp32 FMA kernel
    (``native_backend._fma32_gemm``) first: the chain of checks of :func:`gemm` and
    ``native_backend.gemm``, decided once per model (all of them depend on the model alone)."""
    return bool(
        _native_general(acc, fa, fb)
        and acc.order != "exact_block"
        and acc.addend != "separate"
        and _native_backend().fma32_applies(acc, fa, fb, out_fmt)
    )


@functools.lru_cache(maxsize=256)
def _promoted_route(
    acc: Accumulator, fa: FloatFormat, fb: FloatFormat, out_fmt: FloatFormat
) -> bool:
    """Whether :func:`gemm` (``backend="auto"``, scales given, no ``c``, numpy float arrays, the
    native kernels active) hands this model to the fp32 FMA kernel's promoted form
    (``native_backend._promoted_fma32_gemm``) first, decided once per model."""
    return bool(
        _native_general(acc, fa, fb)
        and _native_backend().promoted_fma32_applies(acc, fa, fb, out_fmt)
    )


def gemm_scaled_internal(
    a: np.ndarray,
    b: np.ndarray,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    scale_a: np.ndarray,
    scale_b: np.ndarray,
    scale_block: int,
) -> np.ndarray:
    """``gemm(a, b, input_format=(fa, fb), accumulator=acc, out_format=out_fmt,
    input_rounding="exact", scale_a=scale_a, scale_b=scale_b, scale_block=scale_block)`` for
    callers in this package whose arguments are valid by construction (numpy float32/float64
    arrays of matching shapes, format objects, an :class:`Accumulator`; the operands on their
    grids): where ``_promoted_route`` says gemm would run the promoted fp32 FMA kernel, it runs
    it directly (the scales still checked by ``expand_scales``), skipping the per-call
    resolution and dispatch, else (and wherever that kernel declines) it calls :func:`gemm`.
    The same bits. Saves about 0.1 ms of each block-scaled GEMM of the recipes (39 per step of
    benchmarks/bench_simulate.py; :func:`~precision_lab.gemm_blocks` calls this)."""
    if _AUTO_CPU == "native" and native_kernels.active() and _promoted_route(acc, fa, fb, out_fmt):
        from .scales import expand_scales

        native = _native_backend()
        batch, m, k, n = gemm_shapes(a.shape, b.shape)
        if k and math.prod(batch) * m * n and a.dtype.kind == "f" and b.dtype.kind == "f":
            sa, sb, kblock = expand_scales(a, b, scale_a, scale_b, scale_block)
            out = native._promoted_fma32_expanded(
                a, b, None, fa, fb, acc, out_fmt, "exact", sa, sb, kblock
            )
            if out is not None:
                return _canonical_nan(out, acc.nan_encoding)  # type: ignore[no-any-return]
    opts: dict[str, Any] = {"scale_a": scale_a, "scale_b": scale_b, "scale_block": scale_block}
    return gemm(  # type: ignore[no-any-return]
        a, b, input_format=(fa, fb), accumulator=acc, out_format=out_fmt,
        input_rounding="exact", **opts,
    )  # fmt: skip


def gemm_internal(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    *,
    store: FloatFormat | None = None,
) -> np.ndarray:
    """``gemm(a, b, c, input_format=(fa, fb), accumulator=acc, out_format=out_fmt)`` for callers
    in this package whose arguments are valid by construction: numpy float32/float64 arrays
    (not ml_dtypes, not CuPy, shapes already matched), format objects, an
    :class:`Accumulator`. The same bits as :func:`gemm`: where ``_fma32_route`` says gemm
    would run the fp32 FMA kernel, it runs it directly, skipping the per-call resolution of
    formats and accumulator, the input conversions and the NaN canonicalisation (its results
    are all finite: a non-finite output makes ``_fma32_gemm`` return None, and the call then
    goes through :func:`gemm` as before, which reruns the same kernel and goes on to the
    general path). Saves 30 us (8 x 8 x 8: pl.gemm 52 us, this 23 us) to 0.1 ms per call of
    ``precision_lab.torch.simulate``'s GEMMs (39 per step of benchmarks/bench_simulate.py),
    measured on this project's 2-core Xeon.

    ``store`` (``out_fmt`` fp32 only): returns ``round_to(result, store)`` instead, the
    rounding of a result kept in a lower precision; the fp32 FMA kernel does it as it writes
    the output (a mixed_float16 step of bench_simulate: 2240 separate roundings of GEMM outputs,
    3 ms of its 33 ms, AMD EPYC Zen 4)."""
    if store is not None and out_fmt != _FP32:
        raise ValueError(f"store needs out_fmt fp32, got {out_fmt.name}")
    if store == _FP32:  # (every fp32 result is on fp32's grid)
        store = None
    if _AUTO_CPU == "native" and native_kernels.active() and _fma32_route(acc, fa, fb, out_fmt):
        native = _native_backend()
        out = None
        if c is not None:
            ab = _bias_as_k_term(a, b, c, fa, fb, out_fmt)
            if ab is not None:
                out = native._fma32_gemm(
                    *ab, None, _FP32, _FP32, acc, out_fmt, "nearest_even", store=store
                )
        if out is None:
            out = native._fma32_gemm(a, b, c, fa, fb, acc, out_fmt, "nearest_even", store=store)
        if out is not None:
            return out  # type: ignore[no-any-return]
    fmt: Any = fa if fa == fb else (fa, fb)
    out = gemm(a, b, c, input_format=fmt, accumulator=acc, out_format=out_fmt)
    return out if store is None else round_to(out, store)  # type: ignore[no-any-return]


#: outputs of at least this many elements take a bias as a K term (``_bias_as_k_term``)
_BIAS_TERM_OUTPUTS = 1 << 15


def _bias_as_k_term(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    fa: FloatFormat,
    fb: FloatFormat,
    out_fmt: FloatFormat,
) -> tuple[np.ndarray, np.ndarray] | None:
    """A bias ``c`` of a 2-D float32 GEMM on the fp32 FMA kernel (a row ``(N,)``/``(1, N)`` or
    a column ``(M, 1)``), folded into the operands as one more K step in front:
    ``[1 | a] @ [c ; b]`` (a column: ``[c | a] @ [1 ; b]``), so that the kernel runs without
    ``c``; or None (not such a case: fp32 inputs and output only).

    The same bits: the model's chain starts at ``s = c`` (c rounded to fp32, which a float32
    value is already) and adds ``a[i, k] * b[k, j]`` in k order, each step one float32 FMA; the
    folded GEMM starts at ``+0`` and its first step is ``+0 + 1 * c = c`` exactly, except for
    ``c = -0`` (the sum gives +0): declined when ``c`` holds a -0. A non-finite ``c`` leaves
    the output non-finite and the caller goes to :func:`gemm`, as before. Why: the fp32 FMA
    kernel runs 1.5 to 2x slower with a ``c`` than without on large outputs (512 x 128 x 512:
    1.21 ms with c, 0.62 ms folded, 0.58 ms without c, one worker, this project's Xeon);
    outputs down to 512 x 96 gained (0.19 -> 0.16 ms); smaller ones, below
    ``_BIAS_TERM_OUTPUTS``, were not measured and keep ``c``.
    Other input formats would need the inputs rounded here, in Python: a bench_simulate step
    under mixed_bfloat16 then took 37.1 ms against 35.7 ms without the fold (median of 25
    interleaved), so they keep ``c``; float32: 32.3 against 33.1 ms.
    """
    if a.ndim != 2 or b.ndim != 2 or not (out_fmt == fa == fb == _FP32):
        return None
    if not (a.dtype == b.dtype == c.dtype == np.float32):
        return None
    (m, k), n = a.shape, b.shape[1]
    if k == 0 or b.shape[0] != k or m * n < _BIAS_TERM_OUTPUTS:
        return None
    row = c.shape in ((n,), (1, n))
    if not row and c.shape != (m, 1):
        return None
    cv = c.reshape(-1)
    if bool(np.any(np.signbit(cv) & (cv == 0))):
        return None
    A = np.empty((m, k + 1), np.float32)
    B = np.empty((k + 1, n), np.float32)
    A[:, 1:] = a  # (fp32 inputs: on their grid as they are)
    B[1:] = b
    if row:
        A[:, 0] = 1.0
        B[0] = cv
    else:
        A[:, 0] = cv
        B[0] = 1.0
    return A, B


@functools.cache
def _native_backend() -> Any:
    """precision_lab.gemm.native_backend (imported once, on first use)."""
    return importlib.import_module(f"{__package__}.native_backend")


def _float64_or_float(x: np.ndarray) -> np.ndarray:
    """numpy float arrays as they are; ml_dtypes arrays as float64 (exact)."""
    return x if x.dtype.kind == "f" else x.astype(np.float64)


#: NVIDIA's canonical NaN (all payload bits set, positive) by itemsize of the output array
_NVIDIA_NAN = {2: 0x7FFF, 4: 0x7FFF_FFFF, 8: 0x7FFF_FFFF_FFFF_FFFF}


def _canonical_nan(out: Any, encoding: str = "quiet") -> Any:
    """NaN results become one bit pattern on every backend (:attr:`Accumulator.nan_encoding`):
    the positive quiet NaN (``"quiet"``) or NVIDIA's canonical NaN (``"nvidia"``: 0x7fffffff
    in float32, which ``astype(np.float16)`` keeps as fp16's 0x7fff).

    IEEE 754 leaves the sign of a NaN result unspecified, and numpy's own choice depends on the
    vector length (SIMD versus scalar loops), so a NaN's sign carries no information here.

    >>> x = _canonical_nan(np.array([np.nan, 1.0], np.float32), "nvidia")
    >>> hex(int(x.view(np.uint32)[0])), hex(int(x.astype(np.float16).view(np.uint16)[0]))
    ('0x7fffffff', '0x7fff')
    """
    nan = out != out
    if nan.any():
        if encoding == "nvidia":
            size = out.dtype.itemsize
            out.view(f"u{size}")[nan] = _NVIDIA_NAN[size]
        else:
            out[nan] = float("nan")
    return out


#: the default model (frozen: shared by every call that passes none; building one validates
#: every field, a cost per call on small GEMMs)
_DEFAULT_ACCUMULATOR = Accumulator()


def _as_accumulator(accumulator: Any) -> Accumulator:
    if accumulator is None:
        return _DEFAULT_ACCUMULATOR
    if isinstance(accumulator, Accumulator):
        return accumulator
    if isinstance(accumulator, str | FloatFormat):
        return Accumulator(format=accumulator)
    raise TypeError(
        "accumulator must be an Accumulator (e.g. pl.tensor_core('h100', 'e4m3')) or a format "
        f"name, got {type(accumulator).__name__}"
    )


#: input formats up to this many significant bits have exact float64 products
_EXACT_PRODUCT_BITS = 26


def _check_wide_inputs(acc: Accumulator, fa: FloatFormat, fb: FloatFormat) -> None:
    """Inputs of more than 26 bits (fp64: FP64 DMMA, AMD f64 MFMA) only in a chain of fused
    multiply-adds into fp64: ``order="sequential"``, exact products, fp64 nearest_even."""
    if max(fa.precision, fb.precision) <= _EXACT_PRODUCT_BITS:
        return
    fmt = acc.format
    if not (
        acc.order == "sequential"
        and acc.product_format is None
        and fmt == get_format("fp64")
        and acc.rounding == "nearest_even"
        and acc.promote_every is None
    ):
        raise ValueError(
            f"input_format {fa} x {fb}: at most {_EXACT_PRODUCT_BITS} significant bits are "
            "supported (products exact in float64), except in a chain of fused multiply-adds "
            "in fp64 (FP64 DMMA: accumulator Accumulator('fp64'), order='sequential', "
            f"nearest_even, no product_format or promotion); got {acc.describe()}"
        )


def _input_formats(input_format: Any) -> tuple[FloatFormat, FloatFormat]:
    fa, fb = _format_pair(input_format)
    for f in (fa, fb):
        if f.precision > 53:
            raise ValueError(
                f"input_format {f} has {f.precision} significant bits; at most 53 are supported "
                "(26 for exact float64 products; fp64 in an fp64 FMA chain)"
            )
    if max(fa.precision, fb.precision) > _EXACT_PRODUCT_BITS:
        return fa, fb  # fp64: products held as two float64 numbers (see _fma64)
    # products must be exact in float64: within its range, down to its smallest subnormal
    top = math.frexp(fa.max)[1] + math.frexp(fb.max)[1]  # a * b < 2**top
    low = (math.frexp(fa.smallest_subnormal)[1] - 1) + (math.frexp(fb.smallest_subnormal)[1] - 1)
    if top > 1024 or low < -1074:
        raise ValueError(
            f"input_format {fa} x {fb}: products of input values reach 2**{top} and go down to "
            f"2**{low}, beyond float64's range (2**-1074 .. 2**1024) in which the GEMM models "
            "form products exactly; use formats with at most 10 exponent bits"
        )
    return fa, fb


def _on_grid(x: Any, fmt: FloatFormat, name: str, mode: str, seed: int, xp: Any = np) -> Any:
    """``x`` (float64, numpy or CuPy ``xp``) put on the grid of ``fmt`` (checked for 'exact')."""
    if mode == "exact":
        r = round_to(x, fmt).astype(np.float64)
        bad = ~((r == x) | (xp.isnan(r) & xp.isnan(x)))
        nbad = int(bad.sum())
        if nbad:
            idx = tuple(int(i) for i in xp.argwhere(bad)[0])
            raise ValueError(
                f"{name} has {nbad} value(s) not on the {fmt} grid (first: {name}"
                f"[{', '.join(map(str, idx))}] = {float(x[idx])!r}); round them first or pass "
                "input_rounding='nearest_even'"
            )
        return x
    try:
        mode = check_rounding(mode)
    except ValueError:
        raise ValueError(
            f"input_rounding must be a rounding mode or 'exact', got {mode!r}"
        ) from None
    return round_to(x, fmt, rounding=mode, seed=seed).astype(np.float64)


def _broadcast_c(c: Any, out_shape: tuple[int, ...]) -> np.ndarray:
    """``c`` as a float array broadcast to the output shape (ValueError naming ``c`` if not)."""
    c_arr = as_float_array(c, "c")
    try:
        return np.broadcast_to(c_arr, out_shape)
    except ValueError:
        raise ValueError(
            f"c of shape {c_arr.shape} does not broadcast to the output shape {out_shape}"
        ) from None


def _gemm_numpy(
    a: Any,
    b: Any,
    c: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    input_rounding: str,
    scale_a: Any,
    scale_b: Any,
    scale_block: int | None,
) -> np.ndarray:
    a = as_float_array(a, "a")
    b = as_float_array(b, "b")
    batch, m, k, n = gemm_shapes(tuple(a.shape), tuple(b.shape))
    out_shape = (*batch, m, n)
    seed = 0 if acc.seed is None else acc.seed
    if _blas_fast_path_applies(acc, fa, fb, out_fmt, input_rounding, scale_a, scale_b):
        return _gemm_blas32(a, b, c, fa, fb, acc, out_fmt, input_rounding, seed, out_shape)
    a64 = _on_grid(a.astype(np.float64), fa, "a", input_rounding, seed)
    b64 = _on_grid(b.astype(np.float64), fb, "b", input_rounding, seed + 1)
    if c is None:
        c64 = np.zeros(out_shape)
    else:
        c_fmt = out_fmt if acc.c_format is None else acc.c_format  # (spec 1)
        c64 = round_to(_broadcast_c(c, out_shape).astype(np.float64), c_fmt).astype(np.float64)
    if acc.input_subnormals != "keep":  # spec 3c: subnormal inputs become +0 (or signed 0)
        sig = acc.input_subnormals != "flush"
        if acc.input_subnormals == "flush_signed_fp16":  # (x86 AMX-FP8: via fp16 under DAZ)
            f16 = get_format("fp16")
            assert isinstance(f16, FloatFormat)
            a64, b64 = _flushed(a64, f16, signed=True), _flushed(b64, f16, signed=True)
        elif acc.input_subnormals != "flush_signed_c":  # (x86 AMX-FP16: c alone)
            a64, b64 = _flushed(a64, fa, signed=sig), _flushed(b64, fb, signed=sig)
        c64 = _flushed(c64, out_fmt, signed=sig)
    if acc.pair_order == "odd_first":  # spec 3d: each pair of products odd one first
        if scale_a is not None or scale_b is not None:
            raise ValueError(
                "pair_order='odd_first' takes no scales (scale_a, scale_b): the pairs would "
                "cross their K-blocks"
            )
        perm = _odd_first(a64.shape[-1])
        a64, b64 = a64[..., perm], b64[..., perm, :]
    sa, sb, kblock = expand_scales(a, b, scale_a, scale_b, scale_block)
    if sa is not None and acc.scales == "promote":
        assert isinstance(acc.promote_format, FloatFormat) and isinstance(acc.format, FloatFormat)
        if acc.format.precision + acc.promote_format.precision > 53:
            raise ValueError(
                f"scales need accumulator precision + promote precision <= 53 bits, got "
                f"{acc.format.precision} + {acc.promote_format.precision}"
            )
    nb = math.prod(batch)
    A = np.ascontiguousarray(np.broadcast_to(a64, (*batch, m, k))).reshape(nb, m, k)
    B = np.ascontiguousarray(np.broadcast_to(b64, (*batch, k, n))).reshape(nb, k, n)
    C = np.ascontiguousarray(c64).reshape(nb, m, n)
    model = _Model(acc, fa, fb, out_fmt, k, kblock, nb * m * n, seed, scaled=sa is not None)
    W = np.empty((nb, m, n))
    if nb * m * n > 0:
        model.run_all(A, B, C, sa, sb, W)
    out = model.out_rounder.round(W, model.words(3 * k, W.shape))
    dtype = np.float32 if _fits_float32(out_fmt) else np.float64
    return out.astype(dtype).reshape(out_shape)


def _check_groups(
    acc: Accumulator, fa: FloatFormat, fb: FloatFormat, kblock: int | None = None
) -> None:
    """Block scales with groups (spec 3b) need each group's sum of products exact in float64,
    and groups that divide the scale block ``kblock`` (a group shares its scales).

    >>> _check_groups(Accumulator(order="block_fma", block=64, align_bits=35,
    ...               scales="in_block", group=16), get_format("fp32"), get_format("fp32"))
    Traceback (most recent call last):
    ...
    ValueError: group=16: sums of 16 products of fp32 x fp32 are not exact in float64 (...)
    """
    if acc.group is None:
        return
    if kblock is not None and kblock % acc.group:
        raise ValueError(
            f"group={acc.group} must divide the scale block ({kblock}): a group of products "
            "shares its scales"
        )
    span = math.log2(fa.max * fb.max * acc.group) - math.log2(
        fa.smallest_subnormal * fb.smallest_subnormal
    )
    if span > 52:
        raise ValueError(
            f"group={acc.group}: sums of {acc.group} products of {fa} x {fb} are not "
            "exact in float64 (MMA-Sim's GST-FDPA takes FP4 operands)"
        )


def _check_power_of_two_scales(sa: np.ndarray, sb: np.ndarray) -> None:
    """Spec 3b without groups takes power-of-two (E8M0) scales only.

    >>> _check_power_of_two_scales(np.array([0.5, 4.0]), np.array([3.0]))
    Traceback (most recent call last):
    ...
    ValueError: scale_b: scales='in_block' without group takes power-of-two scales (E8M0), ...
    """
    for s, name in ((sa, "scale_a"), (sb, "scale_b")):
        if not (np.frexp(s)[0] == 0.5).all():
            raise ValueError(
                f"{name}: scales='in_block' without group takes power-of-two scales "
                "(E8M0), got other values"
            )


def _flushed(x: np.ndarray, fmt: FloatFormat, *, signed: bool = False) -> np.ndarray:
    """Spec 3c (``input_subnormals="flush"``, AMD CDNA2): ``x`` (on ``fmt``'s grid) with its
    subnormals replaced by +0 (``signed``: by a zero of their sign, x86 DAZ and Arm FIZ).

    >>> _flushed(np.array([2.0**-15, -(2.0**-14), -0.0]), get_format("fp16")).tolist()
    [0.0, -6.103515625e-05, -0.0]
    >>> _flushed(np.array([-(2.0**-15)]), get_format("fp16"), signed=True).tolist()
    [-0.0]
    """
    return np.where(np.abs(x) < fmt.smallest_normal, np.copysign(0.0, x) if signed else 0.0, x)


def _odd_first(k: int) -> np.ndarray:
    """Spec 3d: the order of ``k`` products with each pair ``(2i, 2i + 1)`` odd one first.

    >>> _odd_first(5).tolist()
    [1, 0, 3, 2, 4]
    """
    perm = np.arange(k)
    even = k - k % 2
    perm[0:even:2] += 1
    perm[1:even:2] -= 1
    return perm


def _blas_fast_path_applies(
    acc: Accumulator,
    fa: FloatFormat,
    fb: FloatFormat,
    out_fmt: FloatFormat,
    input_rounding: str,
    scale_a: Any,
    scale_b: Any,
) -> bool:
    """order='blas' without scales or stochastic rounding runs in float32 end to end."""
    return (
        acc.order == "blas"
        and scale_a is None
        and scale_b is None
        and input_rounding != "exact"
        and not is_stochastic(input_rounding)
        and not is_stochastic(acc.out_rounding)
        and all(_fits_float32(f) for f in (fa, fb, out_fmt))
    )


def _gemm_blas32(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    input_rounding: str,
    seed: int,
    out_shape: tuple[int, ...],
) -> np.ndarray:
    """The 'blas' model without the float64 detour: the same values, rounded the same way.

    Inputs rounded to their formats are exact in float32, so rounding them from float32 gives
    what the general path's float64 rounding gives; the float32 matmul is the model's ``P``; ``c``
    rounded to the output format is exact in float32, and ``P + c`` is the model's float32 add.
    """
    a32 = round_to(a, fa, rounding=input_rounding, seed=seed).astype(np.float32, copy=False)
    b32 = round_to(b, fb, rounding=input_rounding, seed=seed + 1).astype(np.float32, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.matmul(a32, b32)
        if c is not None:
            c32 = round_to(_broadcast_c(c, out_shape), out_fmt).astype(np.float32, copy=False)
            p = p + c32
    out = Rounder(
        out_fmt, acc.out_rounding, acc.overflow, acc.subnormals, zero_sign=acc.zero_sign
    ).round(p.astype(np.float64))
    return np.ascontiguousarray(out.astype(np.float32, copy=False)).reshape(out_shape)


@dataclass
class _Chunk:
    """One work item: batch slice and row range, with its scales."""

    A: np.ndarray  # (b, m, K)
    B: np.ndarray  # (b, K, N)
    C: np.ndarray  # (b, m, N)
    sa: np.ndarray | None  # (b, m or 1, nk)
    sb: np.ndarray | None  # (b, nk, N or 1)
    #: the raw A and B with their infinities and NaNs (A and B hold zeros there), or None
    Araw: np.ndarray | None = None
    Braw: np.ndarray | None = None


def _acc_rounder(acc: Accumulator, fmt: FloatFormat | str, mode: str, seed: int) -> Rounder:
    """The rounder of ``acc``'s model into ``fmt`` with ``mode``: the accumulator's overflow,
    subnormals, random bits and zero sign (the model's accumulation, promotion, scale and
    output rounders)."""
    return Rounder(
        fmt,
        mode,
        overflow=acc.overflow,
        subnormals=acc.subnormals,
        seed=seed,
        random_bits=acc.random_bits,
        zero_sign=acc.zero_sign,
    )


class _Model:
    """Evaluates one Accumulator model over chunks of the output (numpy reference)."""

    def __init__(
        self,
        acc: Accumulator,
        fa: FloatFormat,
        fb: FloatFormat,
        out_fmt: FloatFormat,
        k: int,
        kblock: int | None,
        total: int,
        seed: int,
        scaled: bool = False,
    ) -> None:
        self.acc = acc
        self.fa, self.fb = fa, fb
        self.K = k
        self.total = total
        self.seed = seed
        fmt = acc.format
        assert isinstance(fmt, FloatFormat) and isinstance(acc.promote_format, FloatFormat)

        def rounder(f: FloatFormat | str, mode: str) -> Rounder:
            return _acc_rounder(acc, f, mode, seed)

        self.r_acc = rounder(fmt, acc.rounding)
        #: spec 3d, tininess after rounding: each accumulation step rounds to the format's
        #: precision with an unbounded exponent (r_acc), then _tiny_flush flushes the results
        #: below the smallest normal and applies the format's overflow
        self.tiny_fmt: FloatFormat | None = None
        if acc.tininess == "after_rounding":
            unbounded = FloatFormat(fmt.exponent_bits + 2, fmt.mantissa_bits)
            self.r_acc = Rounder(unbounded, acc.rounding, seed=seed, zero_sign=acc.zero_sign)
            self.tiny_fmt = fmt
        self.r_block = rounder(fmt, acc.block_rounding)
        self.r_promote = rounder(acc.promote_format, acc.promote_rounding)
        self.r_scale = rounder(acc.promote_format, "nearest_even")
        self.r_product = (
            None
            if acc.product_format is None
            else rounder(acc.product_format, acc.product_rounding)
        )
        #: spec 3e, a separate lane tail in a format of its own (OpenBLAS sdot: double)
        self.r_tail = None if acc.tail_format is None else rounder(acc.tail_format, acc.rounding)
        self.r_tail_product = (
            None
            if acc.tail_product_format is None
            else rounder(acc.tail_product_format, "nearest_even")
        )
        self.out_rounder = rounder(out_fmt, acc.out_rounding)
        self.stochastic = acc.stochastic
        self.kblock = kblock
        self.promote, self.seg = acc.segments(k, kblock, scaled)
        self.fma64 = max(fa.precision, fb.precision) > _EXACT_PRODUCT_BITS
        if acc.scales == "in_block":  # spec 3b: the scales enter the block FMA, no segments
            self.promote, self.seg = False, max(k, 1)
        pq, pmax, pprec = _products(acc, fa, fb)
        self.sum_exact = sum_is_exact(acc, fa, fb)
        # the float32 fast path: IEEE float32 addition is exactly round(x + p, fp32, RNE)
        self.fp32_native = (
            fmt == _FP32
            and acc.rounding == "nearest_even"
            and acc.overflow in ("ieee", "infinity")  # (the same under nearest_even)
            and acc.zero_sign == "ieee"
            and acc.subnormals == "keep"
            and pprec <= 24
            and pq >= 2.0**-149
            and pmax < float(np.finfo(np.float32).max)
        )
        if acc.order == "block_fma":
            self.emin_a, self.emin_b = fa.emin, fb.emin
            self.emin_acc = fmt.emin
        #: format of the scales of spec 3b's groups (their exponents' lower clamp)
        sf = acc.scale_format
        self.scale_emin = -(1 << 16) if not isinstance(sf, FloatFormat) else sf.emin
        _check_groups(acc, fa, fb, kblock)
        #: alignment exponent of a zero product, group or running value (block_fma)
        self.zero_exp = acc.zero_exponent if acc.zeros_in_anchor else _NO_TERM
        #: the inputs hold infinities or NaNs (set by run_all): additions combine them (spec 5)
        self.special = False

    # ----- random words -----------------------------------------------------------------
    def words(self, event: int, shape: tuple[int, ...]) -> np.ndarray | None:
        if not self.stochastic:
            return None
        return stochastic_words(self.seed, event, self.total, shape, self.acc.random_bits)

    # ----- driver -----------------------------------------------------------------------
    def run_all(
        self,
        A: np.ndarray,
        B: np.ndarray,
        C: np.ndarray,
        sa: np.ndarray | None,
        sb: np.ndarray | None,
        W: np.ndarray,
    ) -> None:
        nb, m, _ = A.shape
        n = B.shape[2]
        special = not (np.isfinite(A).all() and np.isfinite(B).all() and np.isfinite(C).all())
        blas_special = special and self.acc.order == "blas"
        Araw = Braw = None
        if blas_special:  # the IEEE float64 sum's special values (spec section 5)
            shadow = self._shadow(A, B, C)
            C = np.where(np.isfinite(C), C, 0.0)
        if special:
            # the model's arithmetic runs on zeros in their place; the special values enter
            # each step in order (_product, _add, _special_step)
            Araw, Braw = A, B
            A = np.where(np.isfinite(A), A, 0.0)
            B = np.where(np.isfinite(B), B, 0.0)
            self.special = not blas_special

        def one(item: tuple[slice, slice]) -> None:
            bs, rs = item
            ch = _Chunk(
                A[bs, rs],
                B[bs],
                C[bs, rs],
                None if sa is None else sa[bs, rs if sa.shape[1] > 1 else slice(None)],
                None if sb is None else sb[bs],
                None if not self.special or Araw is None else Araw[bs, rs],
                None if not self.special or Braw is None else Braw[bs],
            )
            W[bs, rs] = self.run(ch)

        if self.stochastic:  # random words are indexed over the whole output: one item
            one((slice(None), slice(None)))
        else:
            if m * n >= _CHUNK_ELEMENTS:  # blocks of rows of one matrix
                rows = max(1, _CHUNK_ELEMENTS // max(n, 1))
                items = [
                    (slice(i, i + 1), slice(r, min(r + rows, m)))
                    for i in range(nb)
                    for r in range(0, m, rows)
                ]
            else:  # whole matrices, several batch entries at a time
                per = max(1, _CHUNK_ELEMENTS // max(m * n, 1))
                items = [(slice(i, min(i + per, nb)), slice(None)) for i in range(0, nb, per)]
            workers = min(os.cpu_count() or 1, len(items))
            if workers > 1:
                with ThreadPoolExecutor(max_workers=workers) as pool:
                    list(pool.map(one, items))
            else:
                for it in items:
                    one(it)
        if blas_special:
            bad = ~np.isfinite(shadow)
            W[bad] = shadow[bad]

    @staticmethod
    def _shadow(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> np.ndarray:
        """IEEE float64 sum: its NaN/inf pattern is the model's (finite inputs never overflow)."""
        s = C.copy()
        with np.errstate(invalid="ignore", over="ignore"):
            for k in range(A.shape[2]):
                s += A[:, :, k, None] * B[:, None, k, :]
        return s

    def run(self, ch: _Chunk) -> np.ndarray:
        """The promoted result W of one chunk (float64)."""
        K = self.K
        if K == 0:
            return ch.C.copy()
        if K == 1 and self.acc.k1_product and not self.promote:  # spec 3f
            v = self.segment(ch, 0, K, ch.C)
            p = self._product(ch, 0)
            alone = (ch.C == 0) & ~np.signbit(ch.C) & np.isfinite(p)
            return np.where(alone, self.r_acc.round(p), v)
        if not self.promote:
            return self.segment(ch, 0, K, ch.C)
        W = ch.C.copy()
        for s, k0 in enumerate(range(0, K, self.seg)):
            k1 = min(k0 + self.seg, K)
            P = self.segment(ch, k0, k1, None)
            if ch.sa is not None and ch.sb is not None:
                kb = 0 if self.kblock is None else k0 // self.kblock
                kb_a = kb if ch.sa.shape[2] > 1 else 0
                kb_b = kb if ch.sb.shape[1] > 1 else 0
                sig = self.r_scale.round(ch.sa[:, :, kb_a, None] * ch.sb[:, None, kb_b, :])
                P = P * sig  # exact: precisions add up to <= 53 bits (checked)
            W = self._add(W, P, self.r_promote, 2 * K + s, exact_hint=False)
        return W

    # ----- one segment ------------------------------------------------------------------
    def segment(self, ch: _Chunk, k0: int, k1: int, s0: np.ndarray | None) -> np.ndarray:
        if not self.acc.fields_3d_default():
            return self._structured(ch, k0, k1, s0)
        return self._ordered(ch, k0, k1, s0)

    def _ordered(self, ch: _Chunk, k0: int, k1: int, s0: np.ndarray | None) -> np.ndarray:
        order = self.acc.order
        if order == "sequential":
            return self._sequential(ch, k0, k1, s0)
        if order == "blocked":
            return self._blocked(ch, k0, k1, s0)
        if order == "pairwise":
            return self._pairwise(ch, k0, k1, s0)
        if order == "block_fma":
            return self._block_fma(ch, k0, k1, s0)
        if order == "compensated":
            return self._compensated(ch, k0, k1, s0)
        if order == "exact_block":
            return self._exact_block(ch, k0, k1, s0)
        return self._blas(ch, k0, k1, s0)

    # ----- spec 3e: lanes and split-K (deterministic modes only: no event numbers) ----------
    def _structured(self, ch: _Chunk, k0: int, k1: int, s0: np.ndarray | None) -> np.ndarray:
        """A segment reduced with lanes and split-K (spec 3e)."""
        acc = self.acc
        S = acc.split_k
        r = self.r_acc
        parts: list[np.ndarray]
        if S is None:
            T = self._lanes(ch, k0, k1)
        elif acc.split_combine == "sequential":
            t: np.ndarray | None = None
            j0 = k0
            chunks = split_chunks(k1 - k0, S, acc.split_balance, acc.split_equal, acc.split_half)
            for step in chunks:
                v = self._lanes(ch, j0, j0 + step)
                t = self._plus(s0, v) if t is None else self._add(t, v, r, 0, exact_hint=False)
                j0 += step
            assert t is not None
            return t
        elif acc.split_combine == "pairwise":
            parts = [self._lanes(ch, j0, min(j0 + S, k1)) for j0 in range(k0, k1, S)]
            T = self._tree(combine_tree("pairwise", len(parts)), parts)
        else:
            T = self._halving(ch, k0, k1)
        return self._plus(s0, T)

    def _plus(self, s0: np.ndarray | None, T: np.ndarray) -> np.ndarray:
        """``s0 + T`` (spec 3e; ``T`` without ``s0``)."""
        if s0 is None:
            return T
        return self._add(s0, T, self.r_acc, 0, exact_hint=False)

    def _halving(self, ch: _Chunk, k0: int, k1: int) -> np.ndarray:
        """numpy's ``pairwise_sum``: halves cut at a multiple of the lanes (spec 3e)."""
        S = self.acc.split_k
        assert S is not None
        h = halving_cut(k1 - k0, self.acc.lanes)
        if k1 - k0 <= S or h < 1:
            return self._lanes(ch, k0, k1)
        x = self._halving(ch, k0, k0 + h)
        y = self._halving(ch, k0 + h, k1)
        return self._add(x, y, self.r_acc, 0, exact_hint=False)

    def _lanes(self, ch: _Chunk, k0: int, k1: int) -> np.ndarray:
        """The value of the products ``k0 .. k1-1`` from 0: lanes, their tree, the tail."""
        acc = self.acc
        L, n = acc.lanes, k1 - k0
        if n == 0:
            shape = (ch.A.shape[0], ch.A.shape[1], ch.B.shape[2])
            return np.zeros(shape)
        if L is None or (acc.small_k is not None and n < acc.small_k):
            return self._ordered(ch, k0, k1, None)
        tail_rule = acc.lane_tail
        full = n if tail_rule == "lanes" else n - n % (acc.lane_unroll or L)
        V = acc.lane_vector  # a cleanup loop: products full .. full2 - 1 in lanes i mod V
        full2 = n - n % V if V else full
        tail = list(range(k0 + full2, k1))
        values = []
        if acc.lane_run is not None:  # runs of R products, run r in lane r mod L
            return self._tree(
                prune_tree(combine_tree(acc.lane_combine, L), min(L, -(-n // acc.lane_run))),
                self._run_lanes(ch, k0, k1),
            )
        for lane in range(max(min(L, full), min(V or 0, full2 - full))):
            ks = list(range(k0 + lane, k0 + full, L))
            if lane == 0 and tail_rule == "first":
                ks += tail
            v: np.ndarray | None = None
            if ks:
                v = self._ordered(self._gather(ch, ks), 0, len(ks), None)
            if V and lane < V:  # the cleanup loop's products, one by one after the lane's own
                for k in range(k0 + full + lane, k0 + full2, V):
                    p = self._product(ch, k)
                    v = self._add(np.zeros(p.shape) if v is None else v, p, self.r_acc, 0,
                                  exact_hint=False)  # fmt: skip
            assert v is not None
            values.append(v)
        if not values and tail_rule == "first":  # (no main loop: the tail is lane 0)
            values.append(self._ordered(self._gather(ch, tail), 0, len(tail), None))
        t: np.ndarray | None = None
        if tail and tail_rule == "separate_first":  # the tail's sum joins the first child
            tv = self._ordered(self._gather(ch, tail), 0, len(tail), None)
            whole = join_tail(combine_tree(acc.lane_combine, L), V, -1)  # (-1: the tail's sum)
            return self._tree(prune_tree(whole, len(values)), [*values, tv])
        if values:
            tree = prune_tree(combine_tree(acc.lane_combine, L), len(values))
            t = self._tree(tree, values)
        if tail and tail_rule == "separate" and self.r_tail is not None:
            return self._wide_tail(ch, tail, t)
        if tail and tail_rule == "separate":
            v = self._ordered(self._gather(ch, tail), 0, len(tail), None)
            t = v if t is None else self._add(t, v, self.r_acc, 0, exact_hint=False)
        elif tail_rule == "after":
            for k in tail:
                p = self._product(ch, k)
                z = np.zeros(p.shape) if t is None else t
                t = self._add(z, p, self.r_acc, 0, exact_hint=False)
        assert t is not None
        return t

    def _run_lanes(self, ch: _Chunk, k0: int, k1: int) -> list[np.ndarray]:
        """Spec 3e's ``lane_run``: each lane from 0 takes the sums of its runs of products
        (each run summed left to right from its first product)."""
        acc = self.acc
        L, R = acc.lanes, acc.lane_run
        assert L is not None and R is not None
        starts = list(range(k0, k1, R))
        values: list[np.ndarray] = []
        for lane in range(min(L, len(starts))):
            v: np.ndarray | None = None
            for j in starts[lane::L]:
                run = self._product(ch, j)
                for k in range(j + 1, min(j + R, k1)):
                    run = self._add(run, self._product(ch, k), self.r_acc, 0, exact_hint=False)
                v = self._add(np.zeros(run.shape) if v is None else v, run, self.r_acc, 0,
                              exact_hint=False)  # fmt: skip
            assert v is not None
            values.append(v)
        return values

    def _wide_tail(self, ch: _Chunk, tail: list[int], lanes: np.ndarray | None) -> np.ndarray:
        """Spec 3e's ``tail_format``: the tail summed in its own format from ``+0`` (products
        rounded to ``tail_product_format`` first), the lanes' value added to it there, the
        result rounded to the accumulator (OpenBLAS sdot: ``double dot += x[i] * y[i]``)."""
        assert self.r_tail is not None
        s: np.ndarray | None = None
        for k in tail:
            p = self._product_in(ch, k, self.r_tail_product)
            s = self._add(np.zeros(p.shape) if s is None else s, p, self.r_tail, 0,
                          exact_hint=False)  # fmt: skip
        assert s is not None
        if lanes is not None:
            s = self._add(lanes, s, self.r_tail, 0, exact_hint=False)
        return self.r_acc.round(s)

    def _tree(self, tree: Any, values: list[np.ndarray]) -> np.ndarray:
        """Evaluate a combination tree (spec 3e): a tuple's children added left to right."""
        if not isinstance(tree, tuple):
            return values[tree]
        out = self._tree(tree[0], values)
        for ch in tree[1:]:
            out = self._add(out, self._tree(ch, values), self.r_acc, 0, exact_hint=False)
        return out

    @staticmethod
    def _gather(ch: _Chunk, ks: list[int]) -> _Chunk:
        """The chunk restricted to the products ``ks`` (one lane), in that order."""
        return _Chunk(
            ch.A[:, :, ks],
            ch.B[:, ks, :],
            ch.C,
            None,
            None,
            None if ch.Araw is None else ch.Araw[:, :, ks],
            None if ch.Braw is None else ch.Braw[:, ks, :],
        )

    def _product(self, ch: _Chunk, k: int) -> np.ndarray:
        return self._product_in(ch, k, self.r_product)

    def _product_in(self, ch: _Chunk, k: int, r: Rounder | None) -> np.ndarray:
        """Product ``k`` rounded by ``r`` (None: exact), infinities and NaNs as IEEE's."""
        p = ch.A[:, :, k, None] * ch.B[:, None, k, :]
        if r is not None:
            p = r.round(p, self.words(4 * self.K + k, p.shape))
        if ch.Araw is not None and ch.Braw is not None:  # IEEE products of inf/NaN inputs
            with np.errstate(invalid="ignore"):
                raw = ch.Araw[:, :, k, None] * ch.Braw[:, None, k, :]
            p = np.where(np.isfinite(raw), p, raw)
        return p

    def _specials(self, ch: _Chunk, ks: range | list[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """(IEEE sum of the non-finite products ``ks``, where there is one), or None."""
        if ch.Araw is None or ch.Braw is None:
            return None
        q = has = None
        with np.errstate(invalid="ignore"):
            for k in ks:
                raw = ch.Araw[:, :, k, None] * ch.Braw[:, None, k, :]
                bad = ~np.isfinite(raw)
                if bad.any():
                    part = np.where(bad, raw, 0.0)
                    q = part if q is None else q + part
                    has = bad if has is None else has | bad
        return None if q is None or has is None else (q, has)

    @staticmethod
    def _special_step(
        r: np.ndarray, new: np.ndarray, sp: tuple[np.ndarray, np.ndarray] | None
    ) -> np.ndarray:
        """The running value after a block step: ``new``, unless the running value ``r`` or
        the step's products ``sp`` hold special values: then their IEEE sum (spec 5)."""
        if sp is None:
            return np.where(np.isfinite(r), new, r)
        q, has = sp
        with np.errstate(invalid="ignore"):
            return np.where(has | ~np.isfinite(r), r + q, new)

    def _add(
        self, x: np.ndarray, y: np.ndarray, r: Rounder, event: int, exact_hint: bool
    ) -> np.ndarray:
        """round(x + y) onto r's format, one rounding of the exact sum (an exact zero sum is
        +0, -0 under round-down: :func:`~precision_lab.core.exact.two_sum`'s ``down``)."""
        w = self.words(event, x.shape)
        down = r.mode == "down"
        if exact_hint:
            with np.errstate(invalid="ignore", over="ignore"):
                z = -((-x) + (-y)) if down else x + y
            out = r.round(z, w)
        else:
            s, t = two_sum(x, y, down=down)
            out = round_sum(s, t, r, w)
        if self.special:  # infinities and NaNs are added unrounded (spec section 5)
            with np.errstate(invalid="ignore"):
                bad = ~(np.isfinite(x) & np.isfinite(y))
                if bad.any():
                    out = np.where(bad, x + y, out)
        if self.tiny_fmt is not None and r is self.r_acc:  # spec 3d: every step (lanes too)
            out = self._tiny_flush(out)
        return out

    def _sequential(self, ch: _Chunk, k0: int, k1: int, s0: np.ndarray | None) -> np.ndarray:
        shape = (ch.A.shape[0], ch.A.shape[1], ch.B.shape[2])
        if (
            self.fp32_native
            and self.r_product is None
            and (s0 is None or bool((s0.astype(np.float32) == s0).all()))
        ):
            acc32 = np.zeros(shape, np.float32) if s0 is None else s0.astype(np.float32)
            # (float32 arithmetic is IEEE: the raw inputs' infinities and NaNs follow spec 5)
            a32 = (ch.A if ch.Araw is None else ch.Araw)[:, :, k0:k1].astype(np.float32)
            b32 = (ch.B if ch.Braw is None else ch.Braw)[:, k0:k1, :].astype(np.float32)
            tmp = np.empty(shape, np.float32)
            with np.errstate(over="ignore", invalid="ignore"):
                for j in range(k1 - k0):
                    np.multiply(a32[:, :, j, None], b32[:, None, j, :], out=tmp)
                    acc32 += tmp
            return acc32.astype(np.float64)
        acc = np.zeros(shape) if s0 is None else s0
        if self.fma64:  # fp64 inputs: a chain of fused multiply-adds in fp64 (specials: IEEE
            # fma's, _fma64: an infinite running value meets only the inputs' inf/NaN)
            A = ch.A if ch.Araw is None else ch.Araw  # (the raw inputs, inf and NaN kept)
            B = ch.B if ch.Braw is None else ch.Braw
            for k in range(k0, k1):
                acc = self.r_acc.round(_fma64(A[:, :, k, None], B[:, None, k, :], acc))
            return acc
        for k in range(k0, k1):
            first_c = s0 is not None and k == k0  # c may be off the accumulator's grid
            acc = self._add(
                acc, self._product(ch, k), self.r_acc, k, exact_hint=self.sum_exact and not first_c
            )
            if self.tiny_fmt is not None:
                acc = self._tiny_flush(acc)
        return acc

    def _tiny_flush(self, x: np.ndarray) -> np.ndarray:
        """Spec 3d: ``x`` (rounded with an unbounded exponent) flushed to a signed zero below
        the smallest normal; the format's overflow rule applied above its range."""
        fmt = self.tiny_fmt
        assert fmt is not None
        core_ov = "ieee" if self.acc.overflow == "infinity" else self.acc.overflow
        out = round_to(x, fmt, rounding=self.acc.rounding, overflow=core_ov).astype(np.float64)
        return np.where(np.abs(x) < fmt.smallest_normal, np.copysign(0.0, x), out)

    def _blocked(self, ch: _Chunk, k0: int, k1: int, s0: np.ndarray | None) -> np.ndarray:
        blk = self.acc.block
        assert blk is not None
        shape = (ch.A.shape[0], ch.A.shape[1], ch.B.shape[2])
        total = np.zeros(shape) if s0 is None else s0
        for j0 in range(k0, k1, blk):
            bsum = np.zeros(shape)
            for k in range(j0, min(j0 + blk, k1)):
                bsum = self._add(
                    bsum, self._product(ch, k), self.r_acc, k, exact_hint=self.sum_exact
                )
            first_c = s0 is not None and j0 == k0
            total = self._add(
                total,
                bsum,
                self.r_acc,
                self.K + j0 // blk,
                exact_hint=False if first_c else self._acc_sum_exact,
            )
        return total

    @property
    def _acc_sum_exact(self) -> bool:
        fmt = self.acc.format
        assert isinstance(fmt, FloatFormat)
        return math.log2(2 * fmt.max) - math.log2(fmt.smallest_subnormal) < 52

    def _pairwise(self, ch: _Chunk, k0: int, k1: int, s0: np.ndarray | None) -> np.ndarray:
        n = k1 - k0
        counts = [n]  # number of values at each level
        while counts[-1] > 1:
            counts.append(-(-counts[-1] // 2))
        offsets = [0, 0]  # offsets[lev]: event number of the first pair of level lev
        for lev in range(1, len(counts) - 1):
            offsets.append(offsets[lev] + counts[lev - 1] // 2)
        exact = self.sum_exact and self._acc_sum_exact

        def node(lev: int, q: int) -> np.ndarray:
            if lev == 0:
                return self._product(ch, k0 + q)
            if 2 * q + 1 >= counts[lev - 1]:  # odd one out: carried to the next level
                return node(lev - 1, 2 * q)
            x = node(lev - 1, 2 * q)
            y = node(lev - 1, 2 * q + 1)
            return self._add(x, y, self.r_acc, k0 + offsets[lev] + q, exact_hint=exact and lev > 1)

        top = node(len(counts) - 1, 0)
        if s0 is None and n > 1:  # a pair sum: already on the grid
            return top
        s0 = np.zeros(top.shape) if s0 is None else s0
        return self._add(s0, top, self.r_acc, self.K + k0, exact_hint=False)

    def _compensated(self, ch: _Chunk, k0: int, k1: int, s0: np.ndarray | None) -> np.ndarray:
        """Kahan's compensated summation, every operation rounded to the accumulator."""
        K, r = self.K, self.r_acc
        shape = (ch.A.shape[0], ch.A.shape[1], ch.B.shape[2])
        s = np.zeros(shape) if s0 is None else s0
        comp = np.zeros(shape)
        for k in range(k0, k1):
            p = self._product(ch, k)
            y = self._add(p, -comp, r, 5 * K + k, exact_hint=False)
            t = self._add(s, y, r, k, exact_hint=False)
            d = self._add(t, -s, r, 6 * K + k, exact_hint=False)
            comp = self._add(d, -y, r, 7 * K + k, exact_hint=False)
            # a special value (an inf/NaN product, or a sum that overflowed) is added as it
            # is and the compensation dropped: IEEE Kahan would turn inf into NaN (spec 5)
            with np.errstate(invalid="ignore"):
                bad = ~(np.isfinite(p) & np.isfinite(s))
                if bad.any():
                    t = np.where(bad, s + p, t)
                    comp = np.where(bad, 0.0, comp)
            s = t
        return s

    def _block_fma(self, ch: _Chunk, k0: int, k1: int, s0: np.ndarray | None) -> np.ndarray:
        acc = self.acc
        n = acc.block
        assert n is not None
        shape = (ch.A.shape[0], ch.A.shape[1], ch.B.shape[2])
        r = np.zeros(shape) if s0 is None else s0
        if acc.scales == "in_block" and acc.group is not None:
            return self._block_fma_grouped(ch, k0, k1, r)
        ea_all = _exponents(ch.A[:, :, k0:k1], self.emin_a)  # (zero products: _fma_sum)
        eb_all = _exponents(ch.B[:, k0:k1, :], self.emin_b)
        if acc.scales == "in_block" and ch.sa is not None and ch.sb is not None:
            ch, ea_all, eb_all = self._scaled_terms(ch, k0, k1, ea_all, eb_all)
        for j0 in range(k0, k1, n):
            j1 = min(j0 + n, k1)
            if acc.addend == "separate":
                new = self._separate(ch, j0, j1, r, ea_all, eb_all, k0)
                r = self._special_step(r, new, self._separate_specials(ch, j0, j1))
                continue
            if acc.addend == "in_block":
                cf = acc.c_format  # (spec 1: c's own format aligns it in the first block)
                c_emin = cf.emin if isinstance(cf, FloatFormat) and s0 is not None else None
                X = self._fma_sum(ch, range(j0, j1), r, ea_all, eb_all, k0,
                                  c_emin if j0 == 0 else None)  # fmt: skip
                new = self.r_acc.round(X, self.words(j0, shape))
                r = self._special_step(r, new, self._specials(ch, range(j0, j1)))
                continue
            if acc.inner_block is None:
                X = self._fma_sum(ch, range(j0, j1), None, ea_all, eb_all, k0)
                t = self.r_block.round(X, self.words(j0, shape))
                t = self._special_step(np.zeros(shape), t, self._specials(ch, range(j0, j1)))
            else:  # a chain of inner block FMAs from 0 (FP8 emulated on fp16 tensor cores)
                groups = n // acc.inner_block
                q = acc.inner_interleave or acc.inner_block
                t = np.zeros(shape)
                for i in range(groups):
                    ks = [k for k in range(j0, j1) if ((k - j0) // q) % groups == i]
                    X = self._fma_sum(ch, ks, t, ea_all, eb_all, k0)
                    new = self.r_block.round(X, self.words(j0 + i, shape))
                    t = self._special_step(t, new, self._specials(ch, ks))
            new = self._add(r, t, self.r_acc, self.K + j0, exact_hint=False)
            # an infinite or NaN r or t (an overflow, special inputs) gives their IEEE sum (spec
            # 5: inf meets -inf is NaN), whether or not other rows' inputs are special
            with np.errstate(invalid="ignore"):
                r = np.where(np.isfinite(r) & np.isfinite(t), new, r + t)
        return r

    def _fma_sum(
        self,
        ch: _Chunk,
        ks: range | list[int],
        r: np.ndarray | None,
        ea_all: np.ndarray,
        eb_all: np.ndarray,
        k0: int,
        r_emin: int | None = None,
    ) -> np.ndarray:
        """Exact sum ``X`` of one block FMA: products ``ks`` (and ``r`` when given) aligned
        to the largest exponent and truncated to ``align_bits`` fraction bits; +0 if empty.
        ``r_emin``: the least exponent of ``r`` (default the accumulator's emin; c's format
        with ``c_format`` in the first block)."""
        F = self.acc.align_bits
        assert F is not None
        shape = (ch.A.shape[0], ch.A.shape[1], ch.B.shape[2])
        E = np.full(shape, _NO_TERM, np.int32)
        for k in ks:
            np.maximum(E, ea_all[:, :, k - k0, None] + eb_all[:, None, k - k0, :], out=E)
        if self.zero_exp != _NO_TERM and len(ks):  # a zero product aligns at zero_exponent
            zero = np.zeros(shape, bool)
            for k in ks:
                zero |= (ch.A[:, :, k, None] == 0) | (ch.B[:, None, k, :] == 0)
            np.maximum(E, np.where(zero, self.zero_exp, _NO_TERM), out=E)
        if r is not None:
            rr = np.where(np.isfinite(r), r, 0.0)
            emin_r = self.emin_acc if r_emin is None else r_emin
            np.maximum(E, _exponents(rr, emin_r, self.zero_exp), out=E)
        scale = np.ldexp(1.0, np.clip(F - E, -1000, 1000))
        S = np.zeros(shape)
        tmp = np.empty(shape)
        for k in ks:
            np.multiply(ch.A[:, :, k, None], ch.B[:, None, k, :], out=tmp)
            tmp *= scale
            np.trunc(tmp, out=tmp)
            S += tmp
        if r is not None:
            np.multiply(rr, scale, out=tmp)
            np.trunc(tmp, out=tmp)
            S += tmp
        X = S / scale  # exact: S is an integer below 2**53
        X[E == _NO_TERM] = 0.0
        X += 0.0  # -0 -> +0
        return X

    # ----- block-scaled MMA, AMD CDNA3 and CDNA1 (spec 3b, addend="separate", exact_block) ----
    def _k_scales(self, ch: _Chunk, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
        """Scales of each k in [k0, k1): (b, m or 1, k1-k0) and (b, k1-k0, n or 1)."""
        assert ch.sa is not None and ch.sb is not None
        ks = np.arange(k0, k1)
        blk = self.kblock or max(self.K, 1)
        ia = ks // blk if ch.sa.shape[2] > 1 else np.zeros_like(ks)
        ib = ks // blk if ch.sb.shape[1] > 1 else np.zeros_like(ks)
        return ch.sa[:, :, ia], ch.sb[:, ib, :]

    def _scaled_terms(
        self, ch: _Chunk, k0: int, k1: int, ea: np.ndarray, eb: np.ndarray
    ) -> tuple[_Chunk, np.ndarray, np.ndarray]:
        """Spec 3b without groups: products times their power-of-two scales (exact), alignment
        exponents raised by the scales' exponents."""
        sa, sb = self._k_scales(ch, k0, k1)
        _check_power_of_two_scales(sa, sb)
        A = ch.A.copy()
        B = ch.B.copy()
        A[:, :, k0:k1] *= sa
        B[:, k0:k1, :] *= sb
        ea = ea + (np.frexp(sa)[1] - 1).astype(np.int32)
        eb = eb + (np.frexp(sb)[1] - 1).astype(np.int32)
        # (a zero product's exponent, zero_exponent, is not scaled: _fma_sum)
        return _Chunk(A, B, ch.C, ch.sa, ch.sb, ch.Araw, ch.Braw), ea, eb

    def _block_fma_grouped(self, ch: _Chunk, k0: int, k1: int, r: np.ndarray) -> np.ndarray:
        """Spec 3b with groups (``kind::mxf4nvf4``): exact group sums times their scales, each
        aligned at its scales' exponent, with the running value, in one block FMA."""
        acc = self.acc
        n, g, F = acc.block, acc.group, acc.align_bits
        assert n is not None and g is not None and F is not None
        shape = r.shape
        if ch.sa is None or ch.sb is None:
            sa = np.ones((shape[0], 1, k1 - k0))
            sb = np.ones((shape[0], k1 - k0, 1))
        else:
            sa, sb = self._k_scales(ch, k0, k1)
        for j0 in range(k0, k1, n):
            j1 = min(j0 + n, k1)
            terms: list[tuple[np.ndarray, np.ndarray]] = []
            for g0 in range(j0, j1, g):
                g1 = min(g0 + g, j1)
                # the group's exact sum: products of small formats, checked in _Model
                val = np.einsum("bmk,bkn->bmn", ch.A[:, :, g0:g1], ch.B[:, g0:g1, :])
                s_a = sa[:, :, g0 - k0, None]
                s_b = sb[:, None, g0 - k0, :]
                e = _exponents(s_a, self.scale_emin) + _exponents(s_b, self.scale_emin)
                e = np.broadcast_to(e, shape).copy()
                if self.zero_exp == _NO_TERM:  # a zero group takes no part
                    e[val == 0] = _NO_TERM
                else:  # MMA-Sim's GST-FDPA: all products zero, or a zero scale: zero_exponent;
                    # a group whose products cancel keeps its scales' exponent
                    nz = np.einsum(
                        "bmk,bkn->bmn",
                        (ch.A[:, :, g0:g1] != 0).astype(np.int64),
                        (ch.B[:, g0:g1, :] != 0).astype(np.int64),
                    )
                    e[(nz == 0) | np.broadcast_to((s_a == 0) | (s_b == 0), shape)] = self.zero_exp
                terms.append((val * s_a * s_b, e))
            rr = np.where(np.isfinite(r), r, 0.0)
            E = _exponents(rr, self.emin_acc, self.zero_exp)
            for _, e in terms:
                np.maximum(E, e, out=E)
            scale = np.ldexp(1.0, np.clip(F - E, -1000, 1000))
            S = np.trunc(rr * scale)
            for v, _ in terms:
                S += np.trunc(v * scale)
            X = S / scale
            X[E == _NO_TERM] = 0.0
            X += 0.0
            new = self.r_acc.round(X, self.words(j0, shape))
            r = self._special_step(r, new, self._specials(ch, range(j0, j1)))
        return r

    def _aligned(
        self, ch: _Chunk, ks: range | list[int], ea: np.ndarray, eb: np.ndarray, k0: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(X, e_p): products ``ks`` aligned to their own anchor ``e_p`` and truncated to
        ``align_bits`` fraction bits, summed exactly (``e_p = _NO_TERM``, ``X = 0``: none)."""
        F = self.acc.align_bits
        assert F is not None
        shape = (ch.A.shape[0], ch.A.shape[1], ch.B.shape[2])
        E = np.full(shape, _NO_TERM, np.int32)
        for k in ks:
            np.maximum(E, ea[:, :, k - k0, None] + eb[:, None, k - k0, :], out=E)
        scale = np.ldexp(1.0, np.clip(F - E, -1000, 1000))
        S = np.zeros(shape)
        for k in ks:
            S += np.trunc(ch.A[:, :, k, None] * ch.B[:, None, k, :] * scale)
        X = S / scale
        X[E == _NO_TERM] = 0.0
        return X, E

    def _separate(
        self,
        ch: _Chunk,
        j0: int,
        j1: int,
        r: np.ndarray,
        ea: np.ndarray,
        eb: np.ndarray,
        k0: int,
    ) -> np.ndarray:
        """``addend="separate"`` (AMD CDNA3, MMA-Sim 2.1.1's TR-FDPA / GTR-FDPA): one block
        (the spec's steps; the products that overflow, and special values, in the caller)."""
        acc = self.acc
        F, F2, mode = acc.align_bits, acc.sum_bits, acc.align_rounding
        assert F is not None and F2 is not None
        if acc.inner_block is None:
            X, ep = self._aligned(ch, range(j0, j1), ea, eb, k0)
        else:
            groups = (acc.block or 1) // acc.inner_block
            q = acc.inner_interleave or acc.inner_block
            parts = [
                self._aligned(ch, [k for k in range(j0, j1) if ((k - j0) // q) % groups == i],
                              ea, eb, k0)
                for i in range(groups)
            ]  # fmt: skip
            ep = np.max(np.stack([e for _, e in parts]), axis=0)
            X = np.zeros(r.shape)
            for Xi, _ in parts:
                X += _cut(Xi, ep - F, mode)
        rr = np.where(np.isfinite(r), r, 0.0)
        er = _exponents(rr, self.emin_acc, self.emin_acc)  # (a zero r: emin)
        E = np.maximum(ep, er)
        rc = _cut(rr, E - F, mode)
        if acc.drop_bits is not None:
            rc[er < E - acc.drop_bits] = 0.0
        S = _cut(X, E - F2 - 1, mode) + rc  # exact: multiples of 2**(E - F2 - 1) below 2**(E + 8)
        total = _cut(S, _exponents(S, self.emin_acc, self.emin_acc) - F2, mode) + 0.0
        return self.r_acc.round(total, self.words(j0, r.shape))

    def _separate_specials(
        self, ch: _Chunk, j0: int, j1: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`_specials` of a ``separate`` block, with the products at or beyond
        ``2**(acc.emax + 1)`` as ±inf (MMA-Sim's TR-FDPA: a product exponent of 128 is inf)."""
        sp = self._specials(ch, range(j0, j1))
        fmt = self.acc.format
        assert isinstance(fmt, FloatFormat)
        if self.fa.max * self.fb.max < 2.0 ** (fmt.emax + 1):
            return sp
        big = 2.0 ** (fmt.emax + 1)
        q = has = None
        for k in range(j0, j1):
            p = ch.A[:, :, k, None] * ch.B[:, None, k, :]
            over = np.abs(p) >= big
            if over.any():
                part = np.where(over, np.copysign(np.inf, p), 0.0)
                with np.errstate(invalid="ignore"):
                    q = part if q is None else q + part
                has = over if has is None else has | over
        if q is None or has is None:
            return sp
        if sp is not None:
            with np.errstate(invalid="ignore"):
                q, has = q + sp[0], has | sp[1]
        return q, has

    def _exact_block(self, ch: _Chunk, k0: int, k1: int, s0: np.ndarray | None) -> np.ndarray:
        """``order="exact_block"`` (AMD CDNA1, MMA-Sim's E-FDPA): each block of products and
        the running value summed exactly (math.fsum, and the exact residual's sign) and
        rounded once."""
        n = self.acc.block
        assert n is not None
        shape = (ch.A.shape[0], ch.A.shape[1], ch.B.shape[2])
        r = np.zeros(shape) if s0 is None else s0
        for j0 in range(k0, k1, n):
            j1 = min(j0 + n, k1)
            terms = [ch.A[:, :, k, None] * ch.B[:, None, k, :] for k in range(j0, j1)]
            ok = np.isfinite(r)
            rows = np.stack([np.where(ok, r, 0.0), *terms], axis=-1).reshape(-1, j1 - j0 + 1)
            s = np.array([math.fsum(row) for row in rows.tolist()])
            t = np.array(
                [math.fsum([*row, -v]) for row, v in zip(rows.tolist(), s.tolist(), strict=True)]
            )
            new = round_sum(s.reshape(shape), t.reshape(shape), self.r_acc)
            r = self._special_step(r, new, self._specials(ch, range(j0, j1)))
        return r

    def _blas(self, ch: _Chunk, k0: int, k1: int, s0: np.ndarray | None) -> np.ndarray:
        a32 = ch.A[:, :, k0:k1].astype(np.float32)
        b32 = ch.B[:, k0:k1, :].astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            p = np.matmul(a32, b32)
            if s0 is not None:
                p = p + s0.astype(np.float32)
        return p.astype(np.float64)


def _products(acc: Accumulator, fa: FloatFormat, fb: FloatFormat) -> tuple[float, float, int]:
    """(quantum, bound, precision) of the model's products."""
    if acc.product_format is None:
        return (
            fa.smallest_subnormal * fb.smallest_subnormal,
            fa.max * fb.max,
            fa.precision + fb.precision,
        )
    pf = acc.product_format
    assert isinstance(pf, FloatFormat)
    return pf.smallest_subnormal, pf.max, pf.precision


def sum_bound(acc: Accumulator, fa: FloatFormat, fb: FloatFormat) -> float:
    """A bound on ``|x + p|`` for accumulator values x and products p.

    >>> sum_bound(Accumulator("fp16"), get_format("e4m3"), get_format("e4m3"))
    266208.0
    """
    fmt = acc.format
    assert isinstance(fmt, FloatFormat)
    return fmt.max + _products(acc, fa, fb)[1]


def sum_is_exact(acc: Accumulator, fa: FloatFormat, fb: FloatFormat) -> bool:
    """Whether ``x + p`` is exact in float64 for every accumulator value x and product p.

    >>> sum_is_exact(Accumulator("fp16"), get_format("e4m3"), get_format("e4m3"))
    True
    """
    fmt = acc.format
    assert isinstance(fmt, FloatFormat)
    pq = _products(acc, fa, fb)[0]
    bound = sum_bound(acc, fa, fb)
    if pq == 0 or not math.isfinite(bound):  # fp64 operands: products beyond float64
        return False
    span = math.log2(bound) - math.log2(min(fmt.smallest_subnormal, pq))
    return span < 52


def _exponents(x: np.ndarray, emin: int, zero: int = _NO_TERM) -> np.ndarray:
    """Alignment exponents ``max(floor(log2|x|), emin)`` (int32); zeros get ``zero``
    (``_NO_TERM``: they take no part; the accumulator's ``zero_exponent`` with
    ``zeros_in_anchor``)."""
    e = np.frexp(x)[1].astype(np.int32) - 1
    np.maximum(e, emin, out=e)
    e[x == 0] = zero
    return e


def _cut(x: np.ndarray, q: np.ndarray, mode: str) -> np.ndarray:
    """``x`` cut to a multiple of ``2**q`` (``toward_zero`` or ``down``); exact in float64."""
    scale = np.ldexp(1.0, np.clip(-q, -1000, 1000))
    v = x * scale
    v = np.floor(v) if mode == "down" else np.trunc(v)
    return v / scale


def _fma64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``fma(a, b, c)`` in float64: ``RN(a * b + c)`` rounded once, as IEEE 754's
    fusedMultiplyAdd (and the hardware's). Boldo & Melquiond 2008 ("Emulation of FMA and
    correctly rounded sums: proved algorithms using rounding to odd", algorithm 5.4: ``a*b = p +
    e`` exactly (Dekker), ``c + p = th + tl`` (two-sum), ``v = RO(tl + e)``, result ``RN(th +
    v)``) where it is exact: ``2**-969 <= |a*b| < 2**1022``, ``|a|, |b| < 2**995`` (Dekker's
    split and error term stay in range) and ``c + p`` finite; the other finite cases (rare)
    from exact rationals (:func:`_fma_exact`). Special values as IEEE: a finite ``a * b`` (even
    one beyond float64's range) added to an infinite ``c`` gives ``c``; an infinite or NaN
    ``a`` or ``b`` gives ``a * b + c``."""
    a, b, c = np.broadcast_arrays(a, b, c)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        p = a * b
        e = two_product_error(a, b, p)
        np.copyto(e, 0.0, where=~np.isfinite(e))
        th, tl = two_sum(c, p)
        u, w = two_sum(tl, e)
        v = odd_collapse(u, w)
        out = np.where(v == 0, th, th + v)  # (v = 0: th, the IEEE sum c + p, its zero's sign)
        fin_ab = np.isfinite(a) & np.isfinite(b)
        fin = fin_ab & np.isfinite(c)
        out = np.where(fin, out, np.where(fin_ab, c, p + c))
        # an exact zero product: fma is c + (±0), IEEE's sign of zero included (-0 + -0 = -0;
        # the two-sum above loses it)
        out = np.where(fin & ((a == 0) | (b == 0)), p + c, out)
        ap = np.abs(p)
        risky = (
            fin
            & (a != 0)
            & (b != 0)
            & (
                (ap < 2.0**-969)
                | (ap >= 2.0**1022)
                | (np.maximum(np.abs(a), np.abs(b)) >= 2.0**995)
                | ~np.isfinite(th)
            )
        )
    if risky.any():
        out = out.copy()
        for i in zip(*np.nonzero(risky), strict=True):
            out[i] = _fma_exact(float(a[i]), float(b[i]), float(c[i]))
    return out


def _fma_exact(a: float, b: float, c: float) -> float:
    """``fma(a, b, c)`` of finite non-zero ``a``, ``b`` and finite ``c`` from exact rationals
    (``int / int`` is correctly rounded to nearest even, subnormals included; an exact zero is
    +0: ``a * b`` is not zero).

    >>> _fma_exact(2.0**600, 2.0**424, -(2.0**1023)) == 2.0**1023   # a * b alone overflows
    True
    >>> _fma_exact(2.0**-537, 2.0**-537, 0.0) == 2.0**-1074, _fma_exact(2.0**-600, 2.0**-500, 1.0)
    (True, 1.0)
    """
    x = Fraction(a) * Fraction(b) + Fraction(c)
    try:
        return float(x)  # (exact zero: +0.0)
    except OverflowError:
        return math.inf if x > 0 else -math.inf
