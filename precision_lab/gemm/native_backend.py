"""Native (C++) CPU backend of :func:`precision_lab.gemm`: the accumulator models compiled.

The kernels live in the extension ``precision_lab._native_kernels`` (``precision_lab/native/``),
built by ``setup.py`` from the same ``__host__ __device__`` header as the CUDA kernels
(``precision_lab/cuda/pl_gemm.cuh``, which uses ``pl_round.cuh``), so CPU and GPU share the
arithmetic; they equal the numpy reference bit for bit. The Python side is the CuPy backend's
:func:`~precision_lab.gemm.cupy_backend.run` over numpy with a launcher that runs the kernels on
the CPU: output rows are split over :func:`precision_lab.core.pool.for_chunks` (the GIL is
released inside the kernels). Four kernels:

* fp32 sequential round-to-nearest-even with exact products (:func:`fma32_applies`; the CUDA
  ``pl_gemm_fma_rn`` kernel's model): ``s = fmaf(a, b, s)`` in increasing ``k`` on float32
  inputs, register tiles of 12 x 32 (AVX-512) or 6 x 16 (AVX2) outputs over packed panels, one
  range of rows per worker; float32 inputs are put on their grids by the packs themselves (the
  header's rounding, see ``_packed_input``); an output that is not finite sends the whole
  call to the general kernels;
* the block-FMA fast path for ``block_fma`` without scales (every tensor-core preset;
  :func:`blockfma_applies`, ``backends/native/blockfma_fast.inc``): A and B are decoded once
  while they are packed (per block FMA, each input as its alignment exponent and its value
  scaled by a power of two), the anchors are a max-plus register tile of int32 exponents, the
  aligned, truncated products (exact fixed-point numbers) are summed in int32 SIMD lanes, and
  on AVX-512 the running value and the rounding of each block stay in registers (toward zero
  into float32-range accumulators, the tensor cores' datapath); anything else, a result that
  is not a normal number or int32 overflow, runs the float64 unit for that tile; inf/NaN
  inputs, and bf16/tf32 exponents spread beyond float32's range within a block, hand the
  call to the general kernels. It computes the special-value rules of the spec
  (``zeros_in_anchor``, ``overflow="infinity"``, ``zero_sign``), as the general kernels do;
* tile kernels for ``sequential`` (any format and deterministic mode, promotion, scales) and
  ``block_fma`` (what the fast path does not take): a tile of outputs of one row, ``k``
  outermost so the compiler vectorises across columns, rounding by bit operations in the
  format's normal range,
  every other element (zero, subnormal, overflow) by the header's exact routine;
* the header's per-element state machine for everything else (pairwise, blocked, rounded
  products, stochastic rounding, inf/NaN inputs).

Also: block-scaled MMA on the block-FMA fast path (:func:`gemm_block_scaled`: the scales'
exponents raise the alignment exponents; with groups, ``bfma_grouped_rows``), AMD CDNA3's
``addend="separate"`` on its packs and float64 units (:func:`gemm_separate`), CDNA1's exact
block sums (:func:`gemm_exact_block`), the fp64 FMA chain of FP64 DMMA and AMD's f64 MFMA
(:func:`gemm_fma64`: the hardware's fma), CDNA2's promoted float32 pairwise sums
(:func:`pairwise32_applies`), and ``input_subnormals="flush"`` (the reference flushes the
inputs, these kernels run the model with them kept).

Not covered (``gemm`` uses numpy): ``order="blas"`` (numpy's float32 BLAS is that model),
``order="compensated"`` and
``block_fma`` blocks longer than 128 products.

>>> import numpy as np, precision_lab as pl
>>> acc = pl.Accumulator("bf16")
>>> covers(acc) == available()
True
>>> a = np.full((1, 4096), 0.75); b = np.full((4096, 1), 0.625)
>>> if available():
...     d = pl.gemm(a, b, input_format="e4m3", accumulator=acc, backend="native")
...     assert float(d[0, 0]) == 128.0
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import numpy as np

from ..backends.kernel_sources import format_args
from ..backends.native.kernels import available, ext, isa
from ..core import pool as _parallel
from ..core.formats import FloatFormat, get_format
from ..core.rounding import (
    ROUNDING_MODES,
    _fits_float32,
    check_rounding,
    for_chunks,
    is_stochastic,
    round_to,
)
from ..core.scratch import scratch
from .accumulator import Accumulator, reference_only
from .shapes import gemm_shapes

__all__ = [
    "available",
    "blockfma_applies",
    "covers",
    "fma32_applies",
    "gemm",
    "isa",
    "promoted_fma32_applies",
]

_FP32: FloatFormat = get_format("fp32")  # type: ignore[assignment]
#: True while the operands of input_rounding="exact" GEMMs are decoded element codes, on their
#: formats' grids by construction (gemm_blocks sets it): _grid32 then takes them as they are
#: instead of rounding them again to check (a NaN still reaches the kernel's own check on the
#: unscaled path, then the general path, as before). 10 ms of a te_nvfp4 step of
#: benchmarks/bench_simulate.py, measured on this Xeon.
ON_GRID: ContextVar[bool] = ContextVar("precision_lab_on_grid", default=False)
#: floats of A that one work item of the fp32 FMA kernel packs
_PACKED_A = 1 << 20
#: packed B of at most this many floats is packed in the calling thread (no parallel dispatch)
_PACKED_B = 1 << 19
#: GEMMs of fewer multiply-adds run in the calling thread (a dispatch costs more than they do).
#: Measured on the 2-core Xeon (AVX-512) of this project with benchmarks/bench_simulate.py
#: (a GPT of d = 128: GEMMs of 2**21 to 2**25 multiply-adds, 0.05 to 0.5 ms of kernel work), median
#: ratio to FP32 torch over 5 interleaved rounds, thresholds 2**20 / 2**24 / 2**26 / never: float32
#: 2.77x / 2.59x / 2.55x / 2.66x, mixed_bfloat16 3.17x / 2.93x / 2.85x / 2.97x (a repeat gave the
#: same order): the wake-up of a pool thread and the GIL hand-off cost more than a second core
#: saves on a GEMM below about 0.5 ms.
_PARALLEL_MACS = 1 << 25

_MAX_BLOCK = 128  # cupy_backend.kernel_plan's limit on block_fma blocks (shared parameters)
#: output elements per work item
_CHUNK_ELEMENTS = 1 << 14

_ext = ext


def _run(*args: Any, **kwargs: Any) -> Any:
    """cupy_backend.run (imported on first use: it imports reference, which imports us lazily)."""
    from .cupy_backend import run

    return run(*args, **kwargs)


def covers(accumulator: Accumulator, **_: Any) -> bool:
    """Whether the native backend computes ``accumulator``'s model (False: numpy does).

    >>> covers(Accumulator(order="blas")), covers(Accumulator(order="compensated"))
    (False, False)
    """
    if _ext is None:
        return False
    if accumulator.input_subnormals == "flush":  # (flushed first, then the model kept)
        accumulator = accumulator.replace(input_subnormals="keep")
    if accumulator.order in ("blas", "compensated") or reference_only(accumulator):
        return False
    if zero_products_matter(accumulator):
        return False
    from .cupy_backend import header_limit  # (the per-element kernels' header)

    return header_limit(accumulator) is None


def numpy_is_faster(acc: Accumulator, fa: FloatFormat, fb: FloatFormat) -> bool:
    """Whether ``backend="auto"`` hands ``acc`` to the numpy reference although this backend
    computes it: spec 3e's lanes and split-K whose steps are not float32 operations
    (:func:`~precision_lab.gemm.cupy_backend.lanes_in_float32`). The per-element kernels round
    every step with the general rounding (``pl_round_sum``), one output at a time; numpy rounds a
    whole M x N step at once. Measured at 256x1024x256, 2 cores at load 2.5: bf16 accumulator,
    4 lanes: numpy 0.28 s, native 0.92 s; fp32 accumulator, 16 lanes: numpy 0.29 s, native
    0.18 s (bf16 inputs).

    >>> bf16 = get_format("bf16")
    >>> numpy_is_faster(Accumulator("bf16", lanes=4), bf16, bf16)
    True
    >>> numpy_is_faster(Accumulator("fp32", lanes=4), bf16, bf16)
    False
    """
    from .cupy_backend import lanes_in_float32

    return not acc.fields_3d_default() and not lanes_in_float32(acc, fa, fb)


def zero_products_matter(acc: Accumulator) -> bool:
    """Whether a zero product's ``zero_exponent`` can move a block FMA's anchor (spec 3): with
    ``zeros_in_anchor``, unless every block FMA aligns a running value too (``addend=
    "in_block"``, or inner blocks chained from their ``t``) and ``zero_exponent`` is at most
    the accumulator's ``emin`` (a running value's exponent is ``zero_exponent`` when zero and
    at least ``emin`` otherwise), as in every preset; or block-scaled groups, whose cancelled
    sums keep their scales' exponent. The native kernels take zero products as no term and
    decline these models (the numpy reference computes them).

    >>> from precision_lab.gemm.tensor_core import tensor_core
    >>> zero_products_matter(tensor_core("h100", "bf16"))
    False
    >>> zero_products_matter(tensor_core("h100", "bf16").replace(zero_exponent=0))
    True
    """
    if not acc.zeros_in_anchor or acc.order != "block_fma":
        return False
    fmt = acc.format
    assert isinstance(fmt, FloatFormat)
    r_in_block = acc.addend == "in_block" or (
        acc.addend == "after_block" and acc.inner_block is not None
    )
    return not r_in_block or acc.zero_exponent > fmt.emin or acc.group is not None


def _rows_chunk(rows: int, per_row: int) -> int:
    """Rows per work item: about _CHUNK_ELEMENTS outputs, and at least 4 items per worker."""
    by_size = max(1, _CHUNK_ELEMENTS // max(per_row, 1))
    by_workers = max(1, rows // (4 * _parallel.current_workers()))
    return max(1, min(by_size, by_workers))


def _float32_sums(acc: Accumulator, fa: FloatFormat, fb: FloatFormat) -> bool:
    """Whether a block FMA's truncated terms and their sums are exact float32 numbers.

    Products of the inputs exact and normal in float32, the running value a float32 number,
    and ``(block + 1) * 2**(align_bits + 2) <= 2**24`` (every term below 2**(align_bits + 2)
    units); the kernel also checks, per block, that the alignment factors are normal float32
    numbers. H100 FP8 (13 bits kept, blocks of 32) qualifies; fp16/bf16 models (23-25 bits) not.

    >>> from precision_lab.gemm.tensor_core import tensor_core
    >>> from precision_lab.core.formats import get_format
    >>> e4m3 = get_format("e4m3")
    >>> _float32_sums(tensor_core("h100", "e4m3"), e4m3, e4m3)
    True
    >>> _float32_sums(tensor_core("b200", "e4m3"), e4m3, e4m3)
    False
    """
    fmt = acc.format
    if acc.order != "block_fma" or acc.align_bits is None or acc.block is None:
        return False
    assert isinstance(fmt, FloatFormat)
    return (
        fa.precision + fb.precision <= 24
        and fa.smallest_subnormal * fb.smallest_subnormal >= 2.0**-126
        and fa.max * fb.max < 2.0**126
        and _fits_float32(fmt)
        and (acc.block + 1) * 2.0 ** (acc.align_bits + 2) <= 2.0**24
    )


def _launch(
    name: str,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    args: tuple[Any, ...],
    flags: int = 0,
) -> None:
    """Run the CUDA kernel ``name``'s model on the CPU (the launcher of cupy_backend.run);
    ``flags`` bit 0: every accumulation sum is exact in float64 (no two-sum needed); bit 1:
    no accumulation sum overflows float64; bit 2: block-FMA sums are exact in float32
    (:func:`_float32_sums`)."""
    del grid, block
    if name.startswith("pl_gemm_fma_"):
        # the fp32 FMA model that _fma32_gemm handed back (an infinite result) or does not run
        # (toward_zero, up): the tile kernel in float64 (same model)
        A, B, Cx, D, params = args
        C = Cx.astype(np.float64) if bool(params[24]) else None
        _run_generic(params, A.astype(np.float64), B.astype(np.float64), C, None, None, D, flags)
        return
    A, B, Cx, SA, SB, D, params = args
    has_c, has_scales = bool(params[24]), bool(params[12])
    _run_generic(
        params,
        A,
        B,
        Cx if has_c else None,
        SA if has_scales else None,
        SB if has_scales else None,
        D,
        flags,
    )


def _run_generic(
    params: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray | None,
    SA: np.ndarray | None,
    SB: np.ndarray | None,
    D: np.ndarray,
    flags: int,
) -> None:
    m, n, k, nb = (int(v) for v in params[:4])
    EA = EB = B32 = None
    if int(params[5]) == 3 and not bool(params[22]):  # block_fma without inf/NaN: exponents
        EA = np.empty(A.shape, np.int16)
        EB = np.empty(B.shape, np.int16)
        _ext.align_exponents(A, int(params[17]), EA)
        _ext.align_exponents(B, int(params[18]), EB)
        # (zero operands take no part: covers() declines models where a zero product's
        # zero_exponent can move an anchor; a zero running value takes it in the kernel)
        if flags & 4:
            B32 = B.astype(np.float32)  # exact: B is on a grid that float32 holds
    else:
        flags &= ~4
    from .cupy_backend import _P

    if bool(params[_P["LANES"]]) or bool(params[_P["SPLIT_K"]]):  # spec 3e: the products of an
        # output are read at random along K: B handed over as (batch, N, K), flags bit 3
        B = np.ascontiguousarray(np.swapaxes(B.reshape(nb, k, n), 1, 2))
        flags |= 8
    SA = None if SA is None else np.ascontiguousarray(SA, dtype=np.float64)
    SB = None if SB is None else np.ascontiguousarray(SB, dtype=np.float64)
    for_chunks(
        nb * m,
        lambda lo, hi: _ext.gemm(params, A, B, C, SA, SB, EA, EB, D, lo, hi, flags, B32),
        _rows_chunk(nb * m, n * max(k, 1) // 64 + n),
    )


def gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    *,
    input_format: FloatFormat | tuple[FloatFormat, FloatFormat],
    accumulator: Accumulator,
    out_format: FloatFormat,
    input_rounding: str = "nearest_even",
    scale_a: Any = None,
    scale_b: Any = None,
    scale_block: int | None = None,
) -> np.ndarray:
    """:func:`precision_lab.gemm` on the native kernels (numpy arrays; arguments checked there)."""
    if _ext is None:
        raise ImportError(
            "backend='native' needs the compiled extension precision_lab._native_kernels, which "
            "is not built here (reinstall with a C++ compiler: pip install -e .)"
        )
    from .reference import sum_bound, sum_is_exact

    fa, fb = input_format if isinstance(input_format, tuple) else (input_format, input_format)
    if accumulator.input_subnormals == "flush":  # spec 3c: the inputs flushed, then kept
        scales = {"scale_a": scale_a, "scale_b": scale_b, "scale_block": scale_block}
        out = _flushed_gemm(a, b, c, fa, fb, accumulator, out_format, input_rounding, **scales)
        if out is not None:
            return out
    # the fast kernels of AMD CDNA1's exact blocks (fp32 nearest_even) and CDNA3's separate
    # addend; what they do not take runs on the per-element kernels (generic_rows)
    plain = scale_a is None and scale_b is None
    # spec 3e (lanes, split-K) and 3f (k1_product at K = 1): the per-element kernels alone
    # (pl_gemm.cuh's pl_gemm_structured and pl_gemm_k1); the fast kernels do not take them
    per_element = not accumulator.fields_3d_default() or (
        accumulator.k1_product and a.shape[-1] == 1
    )
    plain = plain and not per_element
    fast = None
    if accumulator.order == "exact_block" and plain:
        fast = gemm_exact_block
    elif accumulator.addend == "separate" and plain:
        fast = gemm_separate
    if fast is not None:
        out = fast(
            a, b, c, input_format=input_format, accumulator=accumulator, out_format=out_format,
            input_rounding=input_rounding,
        )  # fmt: skip
        if out is not None:
            return out
    if accumulator.scales == "in_block" and not per_element:  # block-scaled MMA: fast path
        out = gemm_block_scaled(
            a, b, c, input_format=input_format, accumulator=accumulator, out_format=out_format,
            input_rounding=input_rounding, scale_a=scale_a, scale_b=scale_b,
            scale_block=scale_block,
        )  # fmt: skip
        if out is not None:
            return out
    scaled = scale_a is not None or scale_b is not None
    if scaled and not per_element and promoted_fma32_applies(accumulator, fa, fb, out_format):
        out = _promoted_fma32_gemm(
            a, b, c, fa, fb, accumulator, out_format, input_rounding, scale_a, scale_b,
            scale_block,
        )  # fmt: skip
        if out is not None:
            return out
    if plain and fma32_applies(accumulator, fa, fb, out_format):
        out = _fma32_gemm(a, b, c, fa, fb, accumulator, out_format, input_rounding)
        if out is not None:
            return out
    if plain and pairwise32_applies(accumulator, fa, fb, out_format):
        out = _pairwise32_gemm(a, b, c, fa, fb, accumulator, input_rounding)
        if out is not None:
            return out
    if (
        plain
        and accumulator.addend != "separate"  # (gemm_separate declined: products may overflow)
        and blockfma_applies(accumulator, fa, fb, out_format)
    ):
        out = _blockfma_gemm(a, b, c, fa, fb, accumulator, out_format, input_rounding)
        if out is not None:
            return out
    flags = (
        int(sum_is_exact(accumulator, fa, fb))
        | int(sum_bound(accumulator, fa, fb) < 2.0**1022) << 1
        | int(_float32_sums(accumulator, fa, fb)) << 2
    )
    return _run(
        np,
        functools.partial(_launch, flags=flags),
        a,
        b,
        c,
        input_format=input_format,
        accumulator=accumulator,
        out_format=out_format,
        input_rounding=input_rounding,
        scale_a=scale_a,
        scale_b=scale_b,
        scale_block=scale_block,
    )


def fma32_applies(acc: Accumulator, fa: FloatFormat, fb: FloatFormat, out_fmt: FloatFormat) -> bool:
    """Whether the fp32 FMA kernel computes ``acc``'s model (without scales).

    The model must be the sequential fp32 sum in nearest_even with exact products, subnormals
    kept, no promotion, and inputs and output that float32 holds. An FMA then rounds each step
    ``round(s + a*b)`` exactly as the model does, with IEEE overflow; with ``overflow="saturate"``
    the results agree as long as no step overflows, and a step that overflows leaves an
    infinite (or NaN) accumulator, which sends the call to the general kernels.

    >>> e4m3, fp32 = get_format("e4m3"), get_format("fp32")
    >>> fma32_applies(Accumulator("fp32"), e4m3, e4m3, fp32)
    True
    >>> fma32_applies(Accumulator("fp32", subnormals="flush"), e4m3, e4m3, fp32)
    False
    """
    return (
        acc.order == "sequential"
        and acc.format == _FP32
        and acc.rounding == "nearest_even"
        and acc.subnormals == "keep"
        and acc.zero_sign == "ieee"
        and acc.product_format is None
        and acc.promote_every is None
        and _fits_float32(fa)
        and _fits_float32(fb)
        and _fits_float32(out_fmt)
    )


@functools.lru_cache(maxsize=64)
def _unpromoted(acc: Accumulator) -> Accumulator:
    """``acc`` without ``promote_every``: the model of one segment's sum (cached: building an
    Accumulator validates every field)."""
    return dataclasses.replace(acc, promote_every=None)


def promoted_fma32_applies(
    acc: Accumulator, fa: FloatFormat, fb: FloatFormat, out_fmt: FloatFormat
) -> bool:
    """Whether a scaled GEMM (spec 2: scales applied at promotion) can run as a batched GEMM of
    its K-segments on the fp32 FMA kernel, then the promotions in numpy.

    The segment sums must be the fp32 FMA kernel's model (:func:`fma32_applies` without the
    promotion), the promotion deterministic (not stochastic) into a format that float32 holds,
    with ``acc`` precision + promote precision <= 53 (the reference's condition for exact
    ``P_s * sigma_s``).

    >>> e4m3, fp32 = get_format("e4m3"), get_format("fp32")
    >>> promoted_fma32_applies(Accumulator("fp32"), e4m3, e4m3, fp32)
    True
    >>> promoted_fma32_applies(Accumulator("fp32", promote_rounding="stochastic"), e4m3, e4m3,
    ...                        fp32)
    False
    """
    seg = _unpromoted(acc)
    pf = acc.promote_format
    return (
        acc.scales == "promote"
        and not acc.stochastic
        and not is_stochastic(acc.promote_rounding)
        and acc.input_subnormals == "keep"
        and acc.c_format is None
        and isinstance(pf, FloatFormat)
        and _fits_float32(pf)
        and _FP32.precision + pf.precision <= 53
        and fma32_applies(seg, fa, fb, out_fmt)
    )


def _promoted_fma32_gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    input_rounding: str,
    scale_a: Any,
    scale_b: Any,
    scale_block: int | None,
) -> np.ndarray | None:
    """A scaled GEMM (:func:`promoted_fma32_applies`) as the reference's model computes it, or
    None (an input or a partial sum not finite: the general path decides).

    Spec 2 of :mod:`precision_lab.gemm.accumulator`: K is cut into segments (the scales'
    K-blocks, or ``promote_every``); each segment's sum ``P_s``, from +0, is the sequential fp32
    FMA chain: one batched call of the fp32 FMA kernel over every segment at once (the last
    segment padded with zeros, which add exactly nothing to a chain started at +0). The wide
    accumulator starts at ``c`` and takes ``W = round(W + P_s * sigma_s)`` (``P_s * sigma_s``
    exact in float64, one rounding of the exact sum: the reference's ``_Model._add``), then the
    output rounding: the reference's own rounders, so the bits are the general kernel's (the
    tests of tests/gemm hold every backend to the reference).
    """
    from .scales import expand_scales

    if a.dtype.kind != "f" or b.dtype.kind != "f":
        return None
    batch, m, k, n = gemm_shapes(a.shape, b.shape)
    if k == 0 or math.prod(batch) * m * n == 0:
        return None
    sa, sb, kblock = expand_scales(a, b, scale_a, scale_b, scale_block)
    if sa is None or sb is None:
        return None
    return _promoted_fma32_expanded(a, b, c, fa, fb, acc, out_fmt, input_rounding, sa, sb, kblock)


@functools.lru_cache(maxsize=64)
def _promotes_in_float32(acc: Accumulator) -> bool:
    """Whether ``acc``'s promotion rounds as IEEE float32 addition (:func:`_ieee_float32` of
    the reference model's promotion rounder, which the seed does not change)."""
    from .reference import _acc_rounder

    return _ieee_float32(_acc_rounder(acc, acc.promote_format, acc.promote_rounding, 0))


def _promoted_fma32_expanded(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    input_rounding: str,
    sa: np.ndarray,
    sb: np.ndarray,
    kblock: int | None,
) -> np.ndarray | None:
    """:func:`_promoted_fma32_gemm` from its scales as :func:`~.scales.expand_scales` returns
    them (float64 ``(nb, M or 1, nk)`` and ``(nb, nk, N or 1)``, positive, finite, on the fp32
    grid), ``a`` and ``b`` float arrays with at least one output and K > 0. The reference's
    model is built only where a result needs it (the output rounding of a format other than
    fp32, the general promotions): 30 to 70 us a call."""
    from .reference import _broadcast_c, _Model

    batch, m, k, n = gemm_shapes(a.shape, b.shape)
    _, seg = acc.segments(k, kblock, True)
    nseg = -(-k // seg)
    pad = nseg * seg - k
    seg_acc = _unpromoted(acc)
    nb = math.prod(batch)
    seed = 0 if acc.seed is None else acc.seed

    def model() -> _Model:
        return _Model(acc, fa, fb, out_fmt, k, kblock, nb * m * n, seed, scaled=True)

    if _promotes_in_float32(acc):
        if not is_stochastic(seg_acc.out_rounding):  # the kernel adds the segments itself
            W = _prescaled_segments(
                a, b, fa, fb, sa, sb, kblock, seg, nseg, pad, seg_acc, input_rounding,
                fused=(c, out_fmt),
            )  # fmt: skip
            if W is not None:
                return _promoted_out(W, (*batch, m, n), acc, model, out_fmt)
        pre = _prescaled_segments(
            a, b, fa, fb, sa, sb, kblock, seg, nseg, pad, seg_acc, input_rounding
        )
        if pre is not None:  # P_s * sigma_s straight from the kernel (float32, exact)
            return _promoted_float32(pre, c, (*batch, m, n), acc, model, out_fmt)
    a3, b3 = a, b
    if pad:
        a3 = np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, pad)])
        b3 = np.pad(b, [(0, 0)] * (b.ndim - 2) + [(0, pad), (0, 0)])
    # (..., M, K) -> (..., nseg, M, seg); (..., K, N) -> (..., nseg, seg, N)
    a_seg = np.moveaxis(a3.reshape(*a3.shape[:-1], nseg, seg), -2, -3)
    b_seg = b3.reshape(*b3.shape[:-2], nseg, seg, n)
    parts = _fma32_gemm(a_seg, b_seg, None, fa, fb, seg_acc, _FP32, input_rounding)
    if parts is None:
        return None
    P = np.ascontiguousarray(np.broadcast_to(parts, (*batch, nseg, m, n))).reshape(nb, nseg, m, n)
    if not np.isfinite(P).all():
        return None
    out_shape = (*batch, m, n)
    if c is None:
        W = np.zeros((nb, m, n))
    else:
        c64 = _broadcast_c(c, out_shape).astype(np.float64)
        if not np.isfinite(c64).all():
            return None
        W = np.ascontiguousarray(round_to(c64, out_fmt).astype(np.float64)).reshape(nb, m, n)
    mod = model()
    # the scales of every segment: (nb, nseg, M or 1, N or 1)
    kbs = np.array([0 if kblock is None else (s * seg) // kblock for s in range(nseg)])
    sa_s = sa[:, :, kbs if sa.shape[2] > 1 else np.zeros(nseg, int)]  # (nb, M or 1, nseg)
    sb_s = sb[:, kbs if sb.shape[1] > 1 else np.zeros(nseg, int)]  # (nb, nseg, N or 1)
    rs, r = mod.r_scale, mod.r_promote
    sig = None
    if _ieee_float32(rs):  # sigma = RN32(sa * sb) is the float32 product (scales are fp32)
        with np.errstate(over="ignore"):
            sig32 = (
                np.moveaxis(sa_s.astype(np.float32), 2, 1)[..., None]
                * sb_s.astype(np.float32)[:, :, None, :]
            )
        if np.isfinite(sig32).all():
            sig = sig32.astype(np.float64)
    if sig is None:
        sig = rs.round(np.moveaxis(sa_s, 2, 1)[..., None] * sb_s[:, :, None, :])
    X = P.astype(np.float64) * sig  # exact: precisions add up to <= 53 bits
    # W + P_s * sigma_s rounded once to fp32 (nearest even, IEEE overflow and zeros) is the
    # float32 addition of W and P_s * sigma_s wherever that product is a float32 number (MX
    # scales are powers of two; NVFP4's few-bit partial sums times E4M3 scale products): a
    # segment whose products float32 does not hold takes the two-sum rounding of the reference
    W32 = None
    X32, exact = X, np.zeros(nseg, dtype=bool)
    if _ieee_float32(r):
        with np.errstate(over="ignore"):
            X32 = X.astype(np.float32)
        exact = (X32 == X).reshape(nb, nseg, -1).all(axis=(0, 2))
        W32 = W.astype(np.float32)  # (W is on the fp32 grid: exact)
    for s in range(nseg):
        if W32 is not None and exact[s]:
            with np.errstate(over="ignore", invalid="ignore"):
                W32 += X32[:, s]
            continue
        if W32 is not None:
            W = W32.astype(np.float64)
        W = mod._add(W, X[:, s], r, 2 * k + s, exact_hint=False)
        if W32 is not None:
            W32 = W.astype(np.float32)
    if W32 is not None:
        if not np.isfinite(W32).all():
            return None  # (an overflow: the general path decides)
        if out_fmt == _FP32:  # (acc.zero_sign is "ieee": the output rounding keeps W)
            return W32.reshape(out_shape)
        W = W32.astype(np.float64)
    out = mod.out_rounder.round(W, None)
    dtype = np.float32 if _fits_float32(out_fmt) else np.float64
    return np.asarray(out.astype(dtype).reshape(out_shape))


def _significands(x: np.ndarray) -> np.ndarray:
    """The stored significand bits of every value of ``x`` as float64 (uint64, flattened)."""
    return np.ravel(np.asarray(x, dtype=np.float64)).view(np.uint64) & np.uint64((1 << 52) - 1)


def _sig_bits(x: np.ndarray) -> int:
    """The most significant bits of any value of ``x`` (positive normal float64 numbers; float32
    scales), from the bits: 53 less the trailing zeros of the OR of the significands (the
    implicit bit included). (np.frexp and an int64 pass took 3x as long, and cut a float64
    significand to 24 bits first.)

    >>> _sig_bits(np.array([1.0, 0.75, 2.0**-100]))
    2
    """
    if not x.size:
        return 0
    m = int(np.bitwise_or.reduce(_significands(x))) | (1 << 52)
    return 53 - ((m & -m).bit_length() - 1)


def _pow2_all(x: np.ndarray) -> bool:
    """Whether every value of ``x`` (positive normal float64 numbers) is a power of two: no
    significand bit set."""
    return not _significands(x).any()


def _prescaled_segments(
    a: np.ndarray,
    b: np.ndarray,
    fa: FloatFormat,
    fb: FloatFormat,
    sa: np.ndarray,
    sb: np.ndarray,
    kblock: int | None,
    seg: int,
    nseg: int,
    pad: int,
    seg_acc: Accumulator,
    input_rounding: str,
    fused: tuple[Any, FloatFormat] | None = None,
) -> np.ndarray | None:
    """Every ``P_s * sigma_s`` (float32, ``(nb, nseg, M, N)``) as the fp32 FMA kernel's segment
    sums of the operands multiplied by their scales, where that is provably exact; else None.
    With ``fused=(c, out_fmt)``: the kernel adds them itself, ``W = c`` (rounded to
    ``out_fmt``, float32) then ``W = fl32(W + P_s * sigma_s)`` segment after segment, the sums
    of :func:`_promoted_float32` (float32 ``(nb, M, N)``, or None: not finite, or a segment
    longer than the kernel's K block).

    Two cases, decided from the formats and the scales alone (never from the results):

    * every scale a power of two (MX's E8M0): a' = a * sa and b' = b * sb are exact, every
      product a'b' is ab * sigma, and rounding commutes with a power-of-two factor wherever no
      value is subnormal or overflows: the products' quanta (``lsb(a) lsb(b)``, times sigma for
      the scaled ones) are at least 2**-149, so every sum is exact or rounded at a normal
      magnitude (2**23 quanta or more), and the sums stay below 2**127;
    * the segment sums exact in both (NVFP4: E2M1 elements, E4M3 scales): with ``p_a``, ``p_b``
      the scales' significant bits, ``seg * (max_a / lsb_a) * (max_b / lsb_b) * 2**(p_a + p_b)
      <= 2**24`` quanta, so every partial sum of ab and of ab * sigma, and P_s * sigma itself,
      is a float32 number (quanta of 2**-149 or more, below 2**127): no rounding anywhere.

    Then the kernel's segment sums are ``P_s * sigma_s`` exactly, and ``W + P_s * sigma_s``
    rounded once to fp32 is their float32 addition.

    The bounds take the scales of the blocks that hold a non-zero (or NaN) element only
    (:func:`_live_scales`): a block of zeros multiplies to exact zeros (signed zeros, which a
    chain from +0 absorbs) whatever its scale. MX gives such a block the smallest scale,
    2**-127 (E8M0 of an amax of 0): the causal mask's zeros in attention's probabilities and
    their gradients put it in 10 of the 117 GEMMs of three steps of
    benchmarks/bench_simulate.py under te_mxfp8, which then took the float64 path.
    """
    if kblock is not None and seg != kblock:
        return None  # (promote_every within a scale block: not taken)
    scales_a, scales_b = sa, sb
    ok = _prescaled_bounds(fa, fb, sa, sb, seg)
    if not ok:  # the scales of blocks with a non-zero element: the others multiply to zeros
        ok = _prescaled_bounds(
            fa, fb, _live_scales(a, sa, kblock, "a"), _live_scales(b, sb, kblock, "b"), seg
        )
    if not ok:
        return None
    seed = 0 if seg_acc.seed is None else seg_acc.seed
    a32 = _grid32(a, fa, input_rounding, seed)
    b32 = _grid32(b, fb, input_rounding, seed + 1) if a32 is not None else None
    if a32 is None or b32 is None:
        return None
    k = a.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    nb = math.prod(batch)
    m, n = a.shape[-2], b.shape[-1]
    A = _batched(a32, (*batch, m, k))
    B = _batched(b32, (*batch, k, n))
    blk = k if kblock is None else kblock
    A = _times_block_scales(A, scales_a.astype(np.float32), blk, 2)  # exact (see above)
    B = _times_block_scales(B, scales_b.astype(np.float32), blk, 1)
    if fused is not None:
        from .reference import _broadcast_c

        c, out_fmt = fused
        C = None
        if c is not None:
            c64 = _broadcast_c(c, (*batch, m, n)).astype(np.float64)
            C = np.ascontiguousarray(round_to(c64, out_fmt).astype(np.float32)).reshape(nb, m, n)
        # (a short last segment: the kernel stops at K, as the zeros of the padding add nothing)
        return _fma32_gemm(A, B, C, _FP32, _FP32, seg_acc, _FP32, "nearest_even", seg=seg)
    if pad:
        A = np.pad(A, [(0, 0), (0, 0), (0, pad)])
        B = np.pad(B, [(0, 0), (0, pad), (0, 0)])
    a_seg = np.moveaxis(A.reshape(nb, m, nseg, seg), 2, 1)  # (nb, nseg, M, seg)
    b_seg = B.reshape(nb, nseg, seg, n)
    return _fma32_gemm(a_seg, b_seg, None, _FP32, _FP32, seg_acc, _FP32, "nearest_even")


def _times_block_scales(x: np.ndarray, s: np.ndarray, blk: int, axis: int) -> np.ndarray:
    """``x`` (``(nb, M, K)`` with ``axis=2``, ``(nb, K, N)`` with ``axis=1``) times its
    float32 block scales ``s`` (``(nb, M or 1, nk)``, ``(nb, nk, N or 1)``; a block of ``blk``
    along K), each product one float32 multiplication: through a blocked view where K is
    ``nk * blk`` (no repeated copy of the scales: 2 passes over the operand instead of 3), else
    with the scales repeated along K. The result is per-thread scratch memory (key ``axis``,
    :func:`~precision_lab.core.scratch.scratch`), valid until the next call with that axis in
    this thread: the GEMM reads it once, and a fresh array cost a page fault per 4 KiB.

    >>> x = np.ones((1, 2, 4), np.float32)
    >>> _times_block_scales(x, np.array([[[2.0, 0.5]]], np.float32), 2, 2)[0, 0].tolist()
    [2.0, 2.0, 0.5, 0.5]
    """
    k, nk = x.shape[axis], s.shape[axis]
    dt = np.result_type(x, s)
    out = scratch(dt, x.size, ("times_block_scales", axis)).reshape(x.shape)
    if nk == 1:
        return np.multiply(x, s, out=out)
    if nk * blk != k:
        return np.multiply(x, np.repeat(s, blk, axis=axis).take(np.arange(k), axis=axis), out=out)
    if axis == 2:  # (blocks of rows across: one long inner loop per element of a block, not
        # one of blk elements per block; 54 -> 31 us for (512, 128) in blocks of 16, this Zen 3)
        nb, m = x.shape[:2]
        rows = nb * m * nk
        st = np.broadcast_to(s, (nb, m, nk)).reshape(rows)
        np.multiply(x.reshape(rows, blk).T, st, out=out.reshape(rows, blk).T)
        return out
    nb, n = x.shape[0], x.shape[2]
    np.multiply(x.reshape(nb, nk, blk, n), s[:, :, None, :], out=out.reshape(nb, nk, blk, n))
    return out


def _prescaled_bounds(
    fa: FloatFormat, fb: FloatFormat, sa: np.ndarray, sb: np.ndarray, seg: int
) -> bool:
    """The conditions of :func:`_prescaled_segments` on the scales ``sa``, ``sb`` (any shapes)
    of the formats ``fa``, ``fb`` and segments of ``seg`` products."""
    lo_a, lo_b = fa.smallest_subnormal, fb.smallest_subnormal
    sa_min, sa_max, sb_min, sb_max = (
        float(sa.min()),
        float(sa.max()),
        float(sb.min()),
        float(sb.max()),
    )
    tiny, big = 2.0**-149, 2.0**127
    if fa.max * sa_max >= big or fb.max * sb_max >= big or seg * fa.max * fb.max >= big:
        return False
    if lo_a * sa_min < tiny or lo_b * sb_min < tiny or lo_a * lo_b < tiny:
        return False
    pow2 = _pow2_all(sa) and _pow2_all(sb)  # (sa, sb > 0 here: the checks above)
    if pow2:
        return bool(
            lo_a * lo_b * sa_min * sb_min >= tiny and seg * fa.max * fb.max * sa_max * sb_max < big
        )
    pa, pb = _sig_bits(sa), _sig_bits(sb)
    units = seg * (fa.max / lo_a) * (fb.max / lo_b) * 2.0 ** (pa + pb)
    unit = lo_a * lo_b * sa_min * sb_min * 2.0 ** -(pa + pb)
    return bool(
        pa + pb <= 24
        and fa.precision + pa <= 24
        and fb.precision + pb <= 24
        and units <= 2.0**24
        and unit >= tiny
        and sa_min * sb_min >= 2.0**-126
        and sa_max * sb_max < big
        and seg * fa.max * fb.max * sa_max * sb_max < big
    )


def _live_scales(x: np.ndarray, s: np.ndarray, kblock: int | None, which: str) -> np.ndarray:
    """The scales of ``s`` (:func:`~precision_lab.gemm.scales.expand_scales`: ``(nb, M or 1,
    nk)`` for ``which="a"``, ``(nb, nk, N or 1)`` for ``"b"``) whose block of ``x`` (``(..., M,
    K)`` or ``(..., K, N)``) holds an element that is not zero (NaN included), as a 1-D array;
    ``[1.0]`` where every element is zero.

    >>> x = np.array([[0.0, 0.0, 3.0, 0.0]])
    >>> _live_scales(x, np.array([[[2.0**-127, 0.5]]]), 2, "a").tolist()
    [0.5]
    """
    nb, nk = s.shape[0], s.shape[2 if which == "a" else 1]
    k = x.shape[-1] if which == "a" else x.shape[-2]
    blk = k if kblock is None or nk == 1 else kblock
    nz: np.ndarray = np.asarray(x != 0)
    if which == "b":
        nz = np.swapaxes(nz, -1, -2)  # (..., N, K)
    rows, xb = nz.shape[-2], math.prod(nz.shape[:-2])
    if xb not in (1, nb) or nk * blk < k:
        return s.ravel()  # (a batch broadcast from a shape of its own: every scale)
    if nk * blk != k:
        nz = np.concatenate([nz, np.zeros((*nz.shape[:-1], nk * blk - k), bool)], axis=-1)
    live: np.ndarray = np.asarray(nz.reshape(xb, rows, nk, blk).any(axis=-1))  # (nb or 1, rows, nk)
    if xb != nb:
        live = np.broadcast_to(live, (nb, rows, nk))
    if which == "b":
        live = np.swapaxes(live, -1, -2)  # (nb, nk, N)
    axis = 1 if which == "a" else 2
    if s.shape[axis] == 1:
        live = np.asarray(live.any(axis=axis, keepdims=True))
    used = s[np.broadcast_to(live, s.shape)]
    return used if used.size else np.ones(1)


def _promoted_float32(
    parts: np.ndarray,
    c: Any,
    out_shape: tuple[int, ...],
    acc: Accumulator,
    model: Any,
    out_fmt: FloatFormat,
) -> np.ndarray | None:
    """W = c, then W = fl32(W + X_s) for the float32 numbers ``X_s = parts[:, s]`` (= P_s *
    sigma_s; ``model.r_promote`` is IEEE float32's rounding), then the model's output rounding;
    None where a value is not finite."""
    from .reference import _broadcast_c

    nb, nseg, m, n = parts.shape
    if c is None:
        W = np.zeros((nb, m, n), np.float32)
    else:
        c64 = _broadcast_c(c, out_shape).astype(np.float64)
        W = np.ascontiguousarray(round_to(c64, out_fmt).astype(np.float32)).reshape(nb, m, n)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(nseg):
            W += parts[:, s]
    if not np.isfinite(W).all():
        return None
    return _promoted_out(W, out_shape, acc, model, out_fmt)


def _promoted_out(
    W: np.ndarray,
    out_shape: tuple[int, ...],
    acc: Accumulator,
    model: Callable[[], Any],
    out_fmt: FloatFormat,
) -> np.ndarray:
    """The output rounding of the finite float32 wide accumulator ``W`` (``model()`` builds the
    reference's model, whose output rounder serves where the result is not ``W`` itself)."""
    if out_fmt == _FP32 and acc.zero_sign == "ieee":  # the output rounding keeps W
        return W.reshape(out_shape)
    out = model().out_rounder.round(W.astype(np.float64), None)
    dtype = np.float32 if _fits_float32(out_fmt) else np.float64
    return np.asarray(out.astype(dtype).reshape(out_shape))


def _ieee_float32(r: Any) -> bool:
    """Whether the rounder ``r`` (:class:`~precision_lab.core.exact.Rounder`) is IEEE float32
    arithmetic's rounding on finite results: fp32, nearest even, IEEE zeros, subnormals kept
    (its overflow to inf is IEEE's too, or a non-finite result the caller declines)."""
    return bool(
        r.fmt == _FP32
        and r.mode == "nearest_even"
        and r.overflow in ("ieee", "infinity")
        and r.zero_sign == "ieee"
        and r.subnormals == "keep"
    )


def _grid32(x: np.ndarray, fmt: FloatFormat, mode: str, seed: int) -> np.ndarray | None:
    """``x`` put on ``fmt``'s grid as float32, or None where the general path must decide
    (stochastic rounding, an unknown mode, a value off the grid with ``"exact"``: it raises)."""
    if mode == "exact":
        if ON_GRID.get():
            return x.astype(np.float32, copy=False)
        r = round_to(x, fmt)
        if not np.array_equal(r, x):  # (NaN too: the general path checks and handles it)
            return None
        return x.astype(np.float32, copy=False)
    det = _deterministic(mode)
    if det is None:
        return None
    return round_to(x, fmt, rounding=det, seed=seed).astype(np.float32, copy=False)


def _deterministic(mode: str) -> str | None:
    """The full name of a deterministic rounding mode, else None (stochastic or unknown: the
    general path decides, and raises for an unknown one)."""
    try:
        mode = check_rounding(mode)
    except ValueError:
        return None
    return None if is_stochastic(mode) else mode


def _packed_input(
    x: np.ndarray, fmt: FloatFormat, mode: str, seed: int
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """``x`` as the float32 values the kernel packs, and how the pack puts them on ``fmt``'s
    grid (None: they are on it), or None where the general path must decide (see _grid32).

    float32 input is rounded by the packs themselves (``grid32`` in fma32.inc: the header's
    rounding, ``round_to``'s bits), so it is read once; other dtypes go through :func:`_grid32`.

    >>> x = np.array([0.3, -0.0], np.float32)
    >>> _packed_input(x, get_format("e4m3"), "rtz", 0)[1].tolist()
    [4, 3, 7, 1, 14, 2, 0]
    >>> _packed_input(x, get_format("e4m3"), "stochastic", 0) is None
    True
    """
    if x.dtype != np.float32:
        x32 = _grid32(x, fmt, mode, seed)
        return None if x32 is None else (x32, None)
    check = mode == "exact"
    det = "nearest_even" if check else _deterministic(mode)  # ("exact": nearest_even's check)
    if det is None:
        return None
    if fmt == _FP32 and not check:  # every float32 is on fp32's grid: no pass (10% of a GEMM)
        return x, None
    code = ROUNDING_MODES.index(det)
    return x, np.array([*format_args(fmt), code, int(check)], dtype=np.int32)


@functools.lru_cache(maxsize=64)
def _store_grid(fmt: FloatFormat) -> np.ndarray:
    """The fp32 FMA kernel's ``grid_out`` for a store in ``fmt``: its format, nearest_even, no
    check (read only: shared between calls).

    >>> _store_grid(get_format("bf16")).tolist()
    [8, 7, 127, 0, 15, 0, 0]
    """
    g = np.array([*format_args(fmt), ROUNDING_MODES.index("nearest_even"), 0], dtype=np.int32)
    g.flags.writeable = False
    return g


def _is_transposed(x: np.ndarray, shape: tuple[int, ...]) -> bool:
    """Whether ``x`` has ``shape`` (no broadcast) and is the transpose of a C-contiguous array
    in its last two axes (the backward's ``x^T`` of a linear layer): the fp32 FMA kernel packs
    it as it is (``a_trans``) instead of a transposing copy, which numpy makes at about 2 GB/s
    (0.3 to 0.6 ms for 512 x 512 float32 on this Xeon).

    >>> a = np.zeros((3, 4), np.float32)
    >>> _is_transposed(a.T, (4, 3)), _is_transposed(a, (3, 4))
    (True, False)
    """
    if x.ndim < 2 or tuple(x.shape) != tuple(shape) or x.shape[-1] < 2 or x.shape[-2] < 2:
        return False
    return bool(not x.flags.c_contiguous and np.swapaxes(x, -1, -2).flags.c_contiguous)


def _batched(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``x`` broadcast to ``shape`` (batch, rows, columns), C-contiguous, as (batch entries, rows,
    columns): ``x`` itself where it is that already."""
    if x.shape != shape or not x.flags.c_contiguous:
        x = np.ascontiguousarray(np.broadcast_to(x, shape))
    return x.reshape(math.prod(shape[:-2]), *shape[-2:])


@functools.lru_cache(maxsize=64)
def _fma32_plan(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    has_c: bool,
) -> tuple[np.ndarray, np.dtype]:
    """The kernel's parameter block (read-only: shared between calls) and output dtype."""
    from .cupy_backend import kernel_plan

    plan = kernel_plan(
        a_shape,
        b_shape,
        fa=fa,
        fb=fb,
        acc=acc,
        out_fmt=out_fmt,
        has_c=has_c,
        has_special=False,
        scales=None,
    )
    plan.params.flags.writeable = False
    return plan.params, plan.out_dtype


def _row_items(rows: int, mr: int, k: int, workers: int) -> list[tuple[int, int]]:
    """Work items of whole register tiles of ``mr`` rows: about 6 per worker, of equal numbers
    of tiles (within one), each packing at most ``_PACKED_A`` floats of A. The workers take them
    one at a time, so one that another process delays takes fewer; equal items let two equal
    workers finish together (``-(-tiles // (6 * workers))`` tiles per item left 11 items of 8
    tiles for 86 tiles: 6 for one worker, 5 for the other).

    >>> _row_items(20, 6, 10, 1)
    [(0, 6), (6, 12), (12, 18), (18, 20)]
    >>> [(hi - lo) // 6 for lo, hi in _row_items(516, 6, 512, 2)]
    [7, 7, 7, 7, 7, 8, 7, 7, 7, 7, 7, 8]
    """
    tiles = -(-rows // mr)
    cap = max(1, _PACKED_A // (mr * max(k, 1)))  # tiles per item
    items = min(tiles, max(6 * workers, -(-tiles // cap)))
    cuts = [tiles * i // items * mr for i in range(items)] + [rows]
    return list(itertools.pairwise(cuts))


def _fma32_gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    input_rounding: str,
    seg: int = 0,
    store: FloatFormat | None = None,
) -> np.ndarray | None:
    """The GEMM on the fp32 FMA kernel (:func:`fma32_applies`), or None: use the general path.

    ``store`` (not fp32): the result then rounded to ``store`` as ``round_to(result, store)``
    would (nearest even, IEEE overflow, subnormals kept); with a float32 ``out_fmt`` stored as it
    is (fp32), by the kernel as it writes each panel of outputs (``grid_out``): the rounding of a
    tensor kept in a lower precision after the GEMM, without a second pass over the output.

    ``seg > 0``: the promoted form of :func:`_prescaled_segments` (the kernel's
    ``fma32_tile_seg``): each segment of ``seg`` k's is the FMA chain from +0, and the output
    starts at ``c`` and adds the segment sums in turn, float32 additions; None also where the
    kernel does not take ``seg`` (longer than its K block).

    Inputs are put on their formats' grids as float32 (exact, as the formats fit in float32)
    while the kernel packs them (``_packed_input``), ``c`` on ``out_fmt``'s grid: the values
    of the general path, without its float64 copies. With ``"exact"`` an input off its grid
    (or NaN) hands the call to the general path, which raises. An output is finite only if every
    input of its row of ``a``, column of ``b`` and ``c`` is (inf and NaN propagate through every
    FMA after them) and no step overflowed, so a non-finite count of zero proves the result is
    the model's.
    """
    from .reference import _broadcast_c

    batch, m, k, n = gemm_shapes(a.shape, b.shape)
    seed = 0 if acc.seed is None else acc.seed
    pa = _packed_input(a, fa, input_rounding, seed)
    pb = _packed_input(b, fb, input_rounding, seed + 1) if pa is not None else None
    if pa is None or pb is None:
        return None
    (a32, grid_a), (b32, grid_b) = pa, pb
    out_shape = (*batch, m, n)
    nb = math.prod(batch)
    a_trans = int(_is_transposed(a32, (*batch, m, k)))
    if a_trans:  # the kernel gathers the rows of a transposed A as it packs them
        A = np.swapaxes(a32, -1, -2).reshape(nb, k, m)
    else:
        A = _batched(a32, (*batch, m, k))
    # likewise a transposed B (a linear layer's weight: the forward GEMM takes w.T), which the
    # pack reads row by row; a numpy copy of it cost 50-100 us per GEMM (this Zen 3)
    b_trans = int(_is_transposed(b32, (*batch, k, n)))
    if b_trans:
        B = np.swapaxes(b32, -1, -2).reshape(nb, n, k)
    else:
        B = _batched(b32, (*batch, k, n))
    C = None
    if c is not None:
        _broadcast_c(c, out_shape)  # (the shape check)
        # rounded before it is broadcast (elementwise: the same values; a bias is N values, not
        # M x N: 0.15 ms of a (512, 384) linear layer, this Xeon)
        C = np.broadcast_to(round_to(np.asarray(c), out_fmt).astype(np.float32), out_shape)
        C = np.ascontiguousarray(C).reshape(nb, m, n)
    params, out_dtype = _fma32_plan(a.shape, b.shape, fa, fb, acc, out_fmt, C is not None)
    D = np.empty((nb, m, n), dtype=out_dtype)
    if nb * m * n == 0:  # (nothing packed: "exact" checks the inputs here)
        if grid_a is not None and grid_a[6] and _grid32(a, fa, "exact", 0) is None:
            return None
        if grid_b is not None and grid_b[6] and _grid32(b, fb, "exact", 0) is None:
            return None
        return D.reshape(out_shape)
    mr, nr = _ext.fma32_tile()
    panels = nb * -(-n // nr)
    Bp = scratch(np.float32, panels * k * nr, "fma32_packed_b")  # (read only in this call)
    workers = _parallel.current_workers() if nb * m * n * k >= _PARALLEL_MACS else 1
    bad: list[int] = []
    if k:
        # a small B in the caller (a parallel dispatch costs more), else spread over the pool
        per = panels if panels * k * nr <= _PACKED_B else max(1, panels // (4 * workers))
        for_chunks(
            panels,
            lambda lo, hi: bad.append(_ext.fma32_pack(B, Bp, k, n, lo, hi, grid_b, b_trans)),
            per,
        )
        if any(bad):
            return None  # (an input off its grid)
    same_out = int(out_fmt == _FP32 and not is_stochastic(acc.out_rounding))
    fused = store is not None and same_out and out_dtype == np.float32
    grid_out = _store_grid(store) if fused else None
    rows = nb * m
    # (the caller is one of the workers)
    items = _row_items(rows, mr, k, workers)
    starts = iter(items)  # (shared: next() is atomic under the GIL)
    stop = threading.Event()  # set by a worker that raised (Ctrl-C in the caller too)

    def worker() -> int:
        count = 0
        try:
            for r, hi in starts:
                if stop.is_set():
                    break
                got = _ext.gemm_fma32(
                    params, A, Bp, C, D, same_out, r, hi, grid_a, seg, a_trans, grid_out
                )
                if got < 0:  # (seg declined)
                    return 1
                count += got
        except BaseException:
            stop.set()
            raise
        return count

    bad += _parallel.run_together(*([worker] * min(workers, len(items))))
    if any(bad):
        return None
    if store is not None and not fused:
        D = round_to(D, store)
    return D.reshape(out_shape)


# ----- the block-FMA fast path (backends/native/blockfma_fast.inc) --------------------------------
#: alignment exponent of a term that takes no part in a block's anchor (pl_gemm.cuh)
_NO_TERM = -(1 << 20)
#: fraction bits kept after alignment that the fast path takes (terms below 2**(F + 2) units fit
#: int32 lanes)
_BLOCKFMA_MAX_ALIGN = 28
#: fraction bits kept that the grouped kernel (block-scaled MMA with groups) takes: its terms,
#: below 2**(F + 13) units (FP4 group sums times scales), and their sums are float64 integers
_GROUPED_MAX_ALIGN = 38
#: binades that a unit's a and b (non-zero, together) and F may span: 2**g stays a float32 normal
_BLOCKFMA_SPAN = 120


_NEAREST = ("nearest_even", "nearest_away", "nearest_zero")


def _blockfma_accepts(acc: Accumulator, max_align: int = _BLOCKFMA_MAX_ALIGN) -> bool:
    """The part of :func:`blockfma_applies` that does not depend on the formats of a call.

    With ``overflow="infinity"`` the roundings outside a block FMA (the addition of an
    ``after_block`` block sum, promotion, the output) must round to nearest, where the rule
    changes nothing (the fast path applies it only to its block-FMA and general roundings).

    >>> _blockfma_accepts(Accumulator(order="block_fma", block=16, align_bits=25))
    True
    >>> _blockfma_accepts(Accumulator(order="block_fma", block=16, align_bits=25,
    ...                               rounding="sr"))
    False
    """
    fmt, pfmt = acc.format, acc.promote_format
    assert isinstance(fmt, FloatFormat) and isinstance(pfmt, FloatFormat)
    if acc.overflow == "infinity":
        modes = [acc.out_rounding]
        if acc.addend == "after_block":
            modes.append(acc.rounding)
        if acc.promote_every is not None:
            modes.append(acc.promote_rounding)
        if any(check_rounding(m) not in _NEAREST for m in modes):
            return False
    return (
        _ext is not None
        and acc.order == "block_fma"
        and not zero_products_matter(acc)
        and acc.c_format is None
        and acc.block is not None
        and acc.block <= _MAX_BLOCK
        and acc.align_bits is not None
        and 0 <= acc.align_bits <= max_align
        and not acc.stochastic
        and acc.product_format is None
        and fmt.precision <= 51
        and pfmt.precision <= 51
        and fmt.emin >= -1022
    )


def blockfma_applies(
    acc: Accumulator,
    fa: FloatFormat,
    fb: FloatFormat,
    out_fmt: FloatFormat,
    max_align: int = _BLOCKFMA_MAX_ALIGN,
) -> bool:
    """Whether the block-FMA fast path (``blockfma_fast.inc``) computes ``acc``'s model (without
    scales): ``order="block_fma"`` with deterministic roundings, exact products, inputs whose
    products are exact float32 numbers (precisions adding up to <= 24 bits), at most
    ``_BLOCKFMA_MAX_ALIGN`` fraction bits kept, and an output format that float32 holds; every
    special-value rule of the spec (``zeros_in_anchor``, ``overflow="infinity"`` where the
    roundings outside the block FMAs are to nearest, ``zero_sign``). Every tensor-core preset
    qualifies. The call may still hand back to the general kernels (inf/NaN inputs, exponents
    spread too wide within a block).

    >>> from precision_lab.gemm.tensor_core import tensor_core
    >>> e4m3, fp32 = get_format("e4m3"), get_format("fp32")
    >>> blockfma_applies(tensor_core("h100", "e4m3"), e4m3, e4m3, fp32)
    True
    >>> blockfma_applies(tensor_core("h100", "e4m3").replace(rounding="sr"), e4m3, e4m3, fp32)
    False
    """
    return (
        _blockfma_accepts(acc, max_align)
        and fa.precision + fb.precision <= 24
        and _fits_float32(fa)
        and _fits_float32(fb)
        and _fits_float32(out_fmt)
    )


def _blockfma_opts(
    acc: Accumulator, fa: FloatFormat, fb: FloatFormat, kblock: int = 0
) -> np.ndarray:
    """The int32 options of the fast path: products per int32 run (the most whose truncated
    terms, each at most ``(2 - 2**-ma) * (2 - 2**-mb) * 2**F``, sum below 2**31), the alignment
    exponents of zero operands (no part in the anchor: :func:`zero_products_matter`) and of a
    zero running value (none, or ``zero_exponent`` with ``zeros_in_anchor``), the
    largest exponent span of a unit's inputs (``2**(F + span)`` stays a float32 normal), and
    whether a block's int32 sum plus the running value's term (below ``2**(F + 1)``) stays
    below 2**31, and the special-value rules (bit 0 ``overflow="infinity"``, bit 1
    ``zero_sign="positive"``), the scale block along K of block-scaled MMA (0: none), and
    ``addend="separate"``'s ``sum_bits + 1`` (0: another addend) and whether its
    ``align_rounding`` is ``"down"`` (bit 0) with its ``drop_bits`` (bits 1-, 0: none); the last
    entry (whether block-scaled groups sum exactly
    in float32) is set by :func:`_grouped_gemm` on its copy."""
    F = int(acc.align_bits or 0)
    sig_a = 2.0 - 2.0**-fa.mantissa_bits
    sig_b = 2.0 - 2.0**-fb.mantissa_bits
    term = math.floor(sig_a * sig_b * 2.0**F)
    run = max(1, (2**31 - 1) // max(term, 1))
    unit = acc.inner_block if acc.addend == "after_block" and acc.inner_block else acc.block
    safe = int((unit or 1) * term + 2 ** (F + 1) <= 2**31 - 1)
    zero = acc.zero_exponent if acc.zeros_in_anchor else _NO_TERM  # (a zero running value)
    rules = int(acc.overflow == "infinity") | int(acc.zero_sign == "positive") << 1
    sep = int(acc.sum_bits) + 1 if acc.addend == "separate" and acc.sum_bits is not None else 0
    down = int(acc.align_rounding == "down") | (acc.drop_bits or 0) << 1
    return np.array(
        [run, _NO_TERM, _NO_TERM, zero, _BLOCKFMA_SPAN - F, safe, rules, kblock, sep, down, 0],
        dtype=np.int32,
    )


@functools.lru_cache(maxsize=64)
def _blockfma_plan(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    has_c: bool,
    kblock: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.dtype, tuple[int, int, int]]:
    """The kernel's parameter block and options (read-only: shared between calls), the output
    dtype and (MR, NR, entries of OB per column: units x planes)."""
    params, out_dtype = _fma32_plan(a_shape, b_shape, fa, fb, acc, out_fmt, has_c)
    opts = _blockfma_opts(acc, fa, fb, kblock)
    opts.flags.writeable = False
    return params, opts, out_dtype, tuple(_ext.bfma_info(params, opts))


def _blockfma_gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    input_rounding: str,
    scales: tuple[np.ndarray, np.ndarray, int] | None = None,
) -> np.ndarray | None:
    """The GEMM on the block-FMA fast path (:func:`blockfma_applies`), or None: use the general
    path (an input or ``c`` not finite, an input off its grid with ``"exact"``, exponents of a
    block spread too wide, a stochastic input rounding). ``scales``: block-scaled MMA (see
    :func:`gemm_block_scaled`), the int32 exponents of A's and B's scales (batch entries x M x
    scale blocks, batch entries x scale blocks x N) and the scale block (0: one along K).

    The inputs are put on their grids as float32 while the kernels pack them (as
    :func:`_fma32_gemm`), decoded once: B into panels of NR columns, A into tiles of MR rows,
    each input as its alignment exponent and its value scaled by a power of two per block (see
    ``blockfma_fast.inc``); output rows are split over the worker threads.
    """
    from .reference import _broadcast_c

    batch, m, k, n = gemm_shapes(a.shape, b.shape)
    seed = 0 if acc.seed is None else acc.seed
    pa = _packed_input(a, fa, input_rounding, seed)
    pb = _packed_input(b, fb, input_rounding, seed + 1) if pa is not None else None
    if pa is None or pb is None:
        return None
    (a32, grid_a), (b32, grid_b) = pa, pb
    out_shape = (*batch, m, n)
    nb = math.prod(batch)
    C = None
    if c is not None:
        C = round_to(_broadcast_c(c, out_shape), out_fmt).astype(np.float32)
        if not np.isfinite(C).all():
            return None
        C = np.ascontiguousarray(C).reshape(nb, m, n)
    sexp_a, sexp_b, kblock = (None, None, 0) if scales is None else scales
    params, opts, out_dtype, (mr, nr, units) = _blockfma_plan(
        a.shape, b.shape, fa, fb, acc, out_fmt, C is not None, kblock
    )
    if nb * m * n == 0 or k == 0:
        return None  # (nothing to pack: the general path checks the inputs and handles K = 0)
    A = _batched(a32, (*batch, m, k))
    B = _batched(b32, (*batch, k, n))
    panels = nb * -(-n // nr)
    Bs = np.empty(panels * k * nr, dtype=np.float32)
    Be = np.empty(panels * k * nr, dtype=np.int32)
    OB = np.empty(panels * units * nr, dtype=np.int32)
    workers = _parallel.current_workers() if nb * m * n * k >= _PARALLEL_MACS else 1
    # B in one contiguous range of panels per worker (the pack reads B row by row across its
    # panels), in parallel from _PACKED_B / 8 floats (decoding costs about 10x fma32_pack's)
    parts = min(workers, panels) if panels * k * nr * 8 > _PACKED_B else 1
    bounds = [panels * i // parts for i in range(parts + 1)]
    packed = _parallel.run_together(
        *(
            functools.partial(_ext.bfma_pack_b, params, opts, B, Bs, Be, OB, lo, hi, grid_b, sexp_b)
            for lo, hi in itertools.pairwise(bounds)
        )
    )
    if any(bad for bad, _ in packed):
        return None
    spread_b = max(sp for _, sp in packed)
    D = np.empty((nb, m, n), dtype=out_dtype)
    rows = nb * m
    items = _row_items(rows, mr, k, workers)
    starts = iter(items)  # (shared: next() is atomic under the GIL)
    stop = threading.Event()

    def worker() -> int:
        count = 0
        try:
            for r, hi in starts:
                if stop.is_set() or count:
                    break
                count += _ext.bfma_rows(
                    params, opts, A, Bs, Be, OB, C, D, r, hi, grid_a, spread_b, sexp_a
                )
        except BaseException:
            stop.set()
            raise
        if count:
            stop.set()
        return count

    bad = _parallel.run_together(*([worker] * min(workers, len(items))))
    return None if any(bad) else D.reshape(out_shape)


def gemm_block_scaled(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    *,
    input_format: FloatFormat | tuple[FloatFormat, FloatFormat],
    accumulator: Accumulator,
    out_format: FloatFormat,
    input_rounding: str,
    scale_a: Any,
    scale_b: Any,
    scale_block: int | None,
) -> np.ndarray | None:
    """Block-scaled MMA (``scales="in_block"`` without ``group``, spec 3b: tcgen05
    ``kind::mxf8f6f4``, sm_120 ``mma.block_scale`` with E8M0 scales) on the block-FMA fast path,
    or None where it does not apply (then the numpy reference computes it).

    Each product's power-of-two scale ``sa * sb`` is constant over a block FMA (the scale block
    is a multiple of the block), so the fast path runs on the unscaled inputs with every
    non-zero input's alignment exponent, and the offset its terms are scaled by, raised by its
    scale's exponent (a zero's exponent is not scaled: reference ``_Model._scaled_terms``). It
    declines grouped models (``kind::mxf4nvf4``), scales that are not powers of two, and
    whatever :func:`blockfma_applies` does not take; the kernels hand back inputs that are not
    finite (NaN blocks) and exponents spread too wide.

    >>> import precision_lab as pl
    >>> acc = pl.tensor_core("b200", "mxfp8_e4m3", instruction="tcgen05")
    >>> a = np.ones((2, 64)); b = np.full((64, 3), 0.5)
    >>> sa = np.array([[2.0**-3, 4.0]] * 2); sb = np.ones((2, 3))
    >>> if available():
    ...     d = gemm_block_scaled(a, b, None, input_format=get_format("e4m3"), accumulator=acc,
    ...                           out_format=get_format("fp32"), input_rounding="exact",
    ...                           scale_a=sa, scale_b=sb, scale_block=32)
    ...     assert d.tolist() == [[66.0] * 3] * 2   # 32 * 0.5 * (2**-3 + 4)
    """
    from .scales import expand_scales

    acc = accumulator
    fa, fb = input_format if isinstance(input_format, tuple) else (input_format, input_format)
    if _ext is None or acc.scales != "in_block" or acc.block is None:
        return None
    plain = acc.replace(scales="promote", scale_format=None, group=None)
    # (groups: float64 terms below 2**(F + 13) of 2**(E - F), so F up to 40; int32 lanes: 28)
    limit = _GROUPED_MAX_ALIGN if acc.group is not None else _BLOCKFMA_MAX_ALIGN
    if reference_only(plain) is not None or not blockfma_applies(plain, fa, fb, out_format, limit):
        return None
    if acc.group is not None:
        if acc.zeros_in_anchor:  # (cancelled groups keep their scales' exponent: the reference)
            return None
        return _grouped_gemm(a, b, c, fa, fb, acc, plain, out_format, input_rounding,
                             (scale_a, scale_b, scale_block))  # fmt: skip
    sa, sb, kblock = expand_scales(a, b, scale_a, scale_b, scale_block)
    if sa is None or sb is None or (kblock is not None and kblock % acc.block):
        return None
    batch, m, _, n = gemm_shapes(a.shape, b.shape)
    nb = math.prod(batch)
    exps = []
    for s, shape in ((sa, (nb, m, sa.shape[-1])), (sb, (nb, sb.shape[1], n))):
        frac, e = np.frexp(np.broadcast_to(s, shape))
        if not (frac == 0.5).all():
            return None  # (not powers of two: the reference says so)
        exps.append(np.ascontiguousarray(e - 1, dtype=np.int32).reshape(-1))
    return _blockfma_gemm(
        a, b, c, fa, fb, plain, out_format, input_rounding, (exps[0], exps[1], kblock or 0)
    )


def _row_operands(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: Any,
    input_rounding: str | None,
    dtype: Any = np.float64,
) -> tuple[tuple[int, ...], np.ndarray, np.ndarray, np.ndarray | None]:
    """The operands of the row kernels (fma64, exact_block, pairwise32, grouped): a and b put on
    their grids (input_rounding None: taken as they are, the kernel checks them) as ``dtype``,
    batched to (entries, M, K) and (entries, K, N); c rounded to ``out_fmt`` (entries, M, N), or
    None; and the output shape.

    >>> e4m3, fp32 = get_format("e4m3"), get_format("fp32")
    >>> shape, A, B, C = _row_operands(np.full((2, 3), 0.3), np.ones((3, 1)), 1.0, e4m3, e4m3,
    ...                                Accumulator(), fp32, "nearest_even")
    >>> shape, A[0, 0].tolist(), C.shape
    ((2, 1), [0.3125, 0.3125, 0.3125], (1, 2, 1))
    """
    from .reference import _broadcast_c, _on_grid

    batch, m, k, n = gemm_shapes(a.shape, b.shape)
    seed = 0 if acc.seed is None else acc.seed
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if input_rounding is not None:
        a64 = _on_grid(a64, fa, "a", input_rounding, seed)
        b64 = _on_grid(b64, fb, "b", input_rounding, seed + 1)
    nb = math.prod(batch)
    A = _batched(a64.astype(dtype, copy=False), (*batch, m, k)).reshape(nb, m, k)
    B = _batched(b64.astype(dtype, copy=False), (*batch, k, n)).reshape(nb, k, n)
    C = None
    if c is not None:
        C = np.asarray(round_to(_broadcast_c(c, (*batch, m, n)), out_fmt), dtype=dtype)
        C = np.ascontiguousarray(C).reshape(nb, m, n)
    return (*batch, m, n), A, B, C


def _finite(*xs: np.ndarray | None) -> bool:
    """Whether every value of the given arrays (None: none) is finite."""
    return all(x is None or bool(np.isfinite(x).all()) for x in xs)


def _ieee_nearest_even(acc: Accumulator) -> bool:
    """Whether every rounding of ``acc`` is to nearest even with the IEEE rules (overflow to
    inf, IEEE zero signs, subnormals kept), its products exact, without promotion, input flush
    or in-block scales (the row kernels' common ground).

    >>> _ieee_nearest_even(Accumulator("fp32")), _ieee_nearest_even(Accumulator("fp32", "rtz"))
    (True, False)
    """
    return (
        acc.rounding == "nearest_even"
        and acc.product_format is None
        and acc.promote_every is None
        and acc.overflow in ("ieee", "infinity")  # (the same under nearest_even)
        and acc.zero_sign == "ieee"
        and acc.subnormals == "keep"
        and acc.input_subnormals == "keep"
        and acc.scales != "in_block"
    )


def gemm_fma64(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    *,
    input_format: FloatFormat | tuple[FloatFormat, FloatFormat],
    accumulator: Accumulator,
    out_format: FloatFormat,
    input_rounding: str,
) -> np.ndarray | None:
    """The fp64 FMA chain (FP64 DMMA, AMD f64 MFMA: ``order="sequential"`` in fp64,
    ``nearest_even``, exact products, the IEEE rules) on the native kernel ``fma64_rows``: ``s =
    fma(a_k, b_k, s)`` in increasing k, the hardware's fused multiply-add, which rounds the exact
    ``a*b + s`` once (also where ``a*b`` alone overflows or underflows) and gives IEEE results
    for inf/NaN. None where the model is not that chain (another rule, output format or
    rounding; the numpy reference computes it).

    >>> import precision_lab as pl
    >>> acc = pl.tensor_core("h100", "fp64", out_format="fp64")
    >>> a = np.array([[1.0, 2.0**-60]]); b = np.array([[1.0 + 2.0**-52], [1.0]])
    >>> if available():
    ...     d = gemm_fma64(a, b, None, input_format=get_format("fp64"), accumulator=acc,
    ...                    out_format=get_format("fp64"), input_rounding="nearest_even")
    ...     assert d[0, 0] == 1.0 + 2.0**-52   # (+ 2**-60 rounds away: one rounding per step)
    """

    acc = accumulator
    fa, fb = input_format if isinstance(input_format, tuple) else (input_format, input_format)
    fp64 = get_format("fp64")
    if (
        _ext is None
        or acc.order != "sequential"
        or acc.format != fp64
        or out_format != fp64
        or not _ieee_nearest_even(acc)
    ):
        return None
    shape, A, B, C = _row_operands(a, b, c, fa, fb, acc, out_format, input_rounding)
    nb, m, k = A.shape
    n = B.shape[2]
    D = np.empty((nb, m, n))
    if nb * m * n:
        for_chunks(
            nb * m,
            lambda lo, hi: _ext.fma64_rows(A, B, C, D, m, n, k, lo, hi),
            _rows_chunk(nb * m, n * max(k, 1) // 64 + n),
        )
    return D.reshape(shape)


def gemm_separate(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    *,
    input_format: FloatFormat | tuple[FloatFormat, FloatFormat],
    accumulator: Accumulator,
    out_format: FloatFormat,
    input_rounding: str,
) -> np.ndarray | None:
    """``addend="separate"`` (AMD CDNA3 MFMA, MMA-Sim's TR-FDPA / GTR-FDPA) on the block-FMA
    fast path's packs and float64 units, or None where it does not apply (the numpy reference
    computes it). Each unit (a block, or its inner blocks) is summed exactly at its own anchor as
    in the other block FMAs; ``blockfma_fast.inc``'s ``bf_tile_run_separate`` then aligns the
    block's sum and the running value as the spec says. It declines what
    :func:`blockfma_applies` does not take (rounded products, stochastic modes ...); the kernels
    hand back inputs that are not finite and exponents spread too wide.

    >>> import precision_lab as pl
    >>> acc = pl.tensor_core("mi300x", "fp16")
    >>> a = np.array([[1.0, -(2.0**-14)] + [0.0] * 6])
    >>> b = np.array([[1.0, 2.0**-14] + [0.0] * 6]).T
    >>> if available():
    ...     d = gemm_separate(a, b, None, input_format=get_format("fp16"), accumulator=acc,
    ...                       out_format=get_format("fp32"), input_rounding="exact")
    ...     assert d[0, 0] == 1.0   # -2**-28 lies below the block's 24 fraction bits: cut
    """
    acc = accumulator
    fa, fb = input_format if isinstance(input_format, tuple) else (input_format, input_format)
    if _ext is None or acc.addend != "separate" or acc.scales == "in_block":
        return None
    if acc.input_subnormals != "keep" or not blockfma_applies(acc, fa, fb, out_format):
        return None
    fmt = acc.format
    assert isinstance(fmt, FloatFormat)
    if fa.max * fb.max >= 2.0 ** (fmt.emax + 1):  # products may overflow (bf16, tf32): they
        big = [float(np.max(np.abs(x), initial=0.0)) for x in (a, b)]  # are inf (spec 3), a
        if not big[0] * big[1] < 2.0**fmt.emax:  # rule of the per-element kernels (NaN: too)
            return None
    return _blockfma_gemm(a, b, c, fa, fb, acc, out_format, input_rounding)


def gemm_exact_block(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    *,
    input_format: FloatFormat | tuple[FloatFormat, FloatFormat],
    accumulator: Accumulator,
    out_format: FloatFormat,
    input_rounding: str,
) -> np.ndarray | None:
    """``order="exact_block"`` into fp32 (AMD CDNA1 fp16/bf16 MFMA, MMA-Sim's E-FDPA) on the
    native kernel ``exact_block_rows``: per block, the running value plus the block's products
    summed exactly (Shewchuk's partials, as ``math.fsum``) and rounded once to float32 (a 53-bit
    round-to-odd, then float32's rounding to nearest even), as the reference. None where the
    model is not that (another format, rounding or rule, promotion, rounded products, fp32
    output rounding elsewhere) or an input or c is not finite: the reference computes it.

    >>> import precision_lab as pl
    >>> acc = pl.tensor_core("mi100", "fp16")
    >>> a = np.array([[1.0, 2.0**-24, 2.0**-24, 0.0]]); b = np.ones((4, 1))
    >>> if available():
    ...     d = gemm_exact_block(a, b, None, input_format=get_format("fp16"), accumulator=acc,
    ...                          out_format=get_format("fp32"), input_rounding="exact")
    ...     assert d[0, 0] == 1.0 + 2.0**-23   # (sequential fp32 sums would give 1.0)
    """

    acc = accumulator
    fa, fb = input_format if isinstance(input_format, tuple) else (input_format, input_format)
    if (
        _ext is None
        or acc.order != "exact_block"
        or acc.block is None
        or acc.format != _FP32
        or out_format != _FP32
        or not _ieee_nearest_even(acc)
        or max(fa.precision, fb.precision) > 26  # (products exact in float64)
    ):
        return None
    shape, A, B, C = _row_operands(a, b, c, fa, fb, acc, out_format, input_rounding)
    if not _finite(A, B, C):
        return None
    if float(np.abs(A).max(initial=0)) * float(np.abs(B).max(initial=0)) > 2.0**900:
        return None  # (the partials' sums must not overflow)
    nb, m, k = A.shape
    n = B.shape[2]
    D = np.empty((nb, m, n), dtype=np.float32)
    if nb * m * n:
        for_chunks(
            nb * m,
            lambda lo, hi: _ext.exact_block_rows(A, B, C, D, m, n, k, acc.block, lo, hi),
            _rows_chunk(nb * m, n * max(k, 1) // 8 + n),
        )
    return D.reshape(shape)


def pairwise32_applies(
    acc: Accumulator, fa: FloatFormat, fb: FloatFormat, out_fmt: FloatFormat
) -> bool:
    """Whether the float32 pairwise kernel (``pairwise32_rows``) computes ``acc``'s model
    (without scales): order ``"pairwise"`` in fp32 to nearest even, products rounded to fp32
    (nearest even), promoted every ``P <= 64`` products into fp32 to nearest even, the IEEE
    overflow and zero-sign rules, subnormal results kept or flushed, fp32 output: AMD CDNA2's
    fp16/bf16 MFMA (whose inputs ``gemm`` flushes first). Every step is then one IEEE float32
    operation (and the flush).

    >>> import precision_lab as pl
    >>> fp16, fp32 = get_format("fp16"), get_format("fp32")
    >>> acc = pl.tensor_core("mi210", "fp16")
    >>> pairwise32_applies(acc.replace(input_subnormals="keep"), fp16, fp16, fp32)
    True
    >>> pairwise32_applies(acc.replace(promote_every=None), fp16, fp16, fp32)
    False
    """
    fp32 = _FP32
    return (
        _ext is not None
        and acc.order == "pairwise"
        and acc.format == fp32
        and acc.rounding == "nearest_even"
        and acc.product_format == fp32
        and acc.product_rounding == "nearest_even"
        and acc.promote_every is not None
        and 1 <= acc.promote_every <= 64
        and acc.promote_format == fp32
        and acc.promote_rounding == "nearest_even"
        and out_fmt == fp32
        and acc.out_rounding == "nearest_even"
        and acc.overflow in ("ieee", "infinity")  # (the same under nearest_even)
        and acc.zero_sign == "ieee"
        and acc.input_subnormals == "keep"
        and not acc.stochastic
        and _fits_float32(fa)
        and _fits_float32(fb)
    )


def _pairwise32_gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    input_rounding: str,
) -> np.ndarray | None:
    """The model of :func:`pairwise32_applies` on ``pairwise32_rows``, or None (the general
    kernels): an input or c not finite, or an output not finite (an overflow on the way, whose
    special values the general kernels follow step by step)."""
    shape, A, B, C = _row_operands(a, b, c, fa, fb, acc, _FP32, input_rounding, np.float32)
    if not _finite(A, B, C):
        return None
    nb, m, k = A.shape
    n = B.shape[2]
    D = np.empty((nb, m, n), dtype=np.float32)
    flush = int(acc.subnormals == "flush")
    assert acc.promote_every is not None
    if nb * m * n:
        for_chunks(
            nb * m,
            lambda lo, hi: _ext.pairwise32_rows(
                A, B, C, D, m, n, k, acc.promote_every, flush, lo, hi
            ),
            _rows_chunk(nb * m, n * max(k, 1) // 16 + n),
        )
    if not np.isfinite(D).all():
        return None
    return D.reshape(shape)


def _grouped_gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    plain: Accumulator,
    out_fmt: FloatFormat,
    input_rounding: str,
    scales: tuple[Any, Any, int | None],
) -> np.ndarray | None:
    """Block-scaled MMA with groups (``kind::mxf4nvf4``: exact sums of ``group`` products times
    their scales, spec 3b) on ``bfma_grouped_rows``, or None (the reference: group sums that
    float64 may not hold, a scale block that is not a multiple of the group, inputs or c not
    finite, inputs off their grids with ``"exact"``: the kernel checks them, once, as it reads
    them). ``plain``: ``acc`` without the scales (the kernel's parameter block)."""
    from .reference import _exponents
    from .scales import expand_scales

    g = int(acc.group or 1)
    span = math.log2(fa.max * fb.max * g) - math.log2(fa.smallest_subnormal * fb.smallest_subnormal)
    if span > 52:
        return None  # (the reference raises)
    batch, m, k, n = gemm_shapes(a.shape, b.shape)
    sa, sb, kblock = expand_scales(a, b, *scales)
    kb = kblock or max(k, 1)
    if sa is None or sb is None or kb % g or k == 0:
        return None
    nb = math.prod(batch)
    grid = None  # ("exact": the kernel checks the inputs, inf and NaN included)
    rounding: str | None = input_rounding
    if input_rounding == "exact":
        grid = np.array([f for x in (fa, fb) for f in (x.mantissa_bits, x.emin, x.max)])
        rounding = None
    _, A, B, C = _row_operands(a, b, c, fa, fb, acc, out_fmt, rounding)
    if grid is None and not _finite(A, B):
        return None
    nk = max(sa.shape[-1], sb.shape[1])
    SA = np.ascontiguousarray(np.broadcast_to(sa, (nb, m, nk)), dtype=np.float64)
    SB = np.ascontiguousarray(np.broadcast_to(sb, (nb, nk, n)), dtype=np.float64)
    if not (np.isfinite(SA).all() and np.isfinite(SB).all() and (SA > 0).all() and (SB > 0).all()):
        return None
    sf = acc.scale_format
    emin = sf.emin if isinstance(sf, FloatFormat) else -(1 << 16)
    ESA = np.ascontiguousarray(_exponents(SA, emin), dtype=np.int32)
    ESB = np.ascontiguousarray(_exponents(SB, emin), dtype=np.int32)
    C = None if C is None else C.astype(np.float32)
    if not _finite(C):
        return None
    params, opts, out_dtype, (mr, _, _) = _blockfma_plan(
        a.shape, b.shape, fa, fb, plain, out_fmt, C is not None
    )
    if span <= 24 and fa.max * fb.max * g < 2.0**127:  # (every group sum an exact float32)
        opts = opts.copy()
        opts[-1] = 1
    D = np.empty((nb, m, n), dtype=out_dtype)
    rows = max(mr, _rows_chunk(nb * m, n * k // 16 + n) // mr * mr)  # (whole register tiles)
    bad: list[int] = []
    for_chunks(
        nb * m,
        lambda lo, hi: bad.append(
            _ext.bfma_grouped_rows(params, opts, A, B, SA, SB, ESA, ESB, C, D, g, kb, lo, hi, grid)
        ),
        rows,
    )
    return None if any(bad) else D.reshape(*batch, m, n)


def _flushed_gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    input_rounding: str,
    **scales: Any,
) -> np.ndarray | None:
    """Spec 3c (``input_subnormals="flush"``, AMD CDNA2) on the native kernels: the inputs put on
    their grids and flushed here (as the reference does), then the model with
    ``input_subnormals="keep"`` on inputs that are on their grids; None where this backend does
    not compute that model."""
    from .reference import _broadcast_c, _flushed, _on_grid

    keep = acc.replace(input_subnormals="keep")
    if not covers(keep) or reference_only(keep) is not None:
        return None
    seed = 0 if acc.seed is None else acc.seed
    a64 = _flushed(_on_grid(a.astype(np.float64), fa, "a", input_rounding, seed), fa)
    b64 = _flushed(_on_grid(b.astype(np.float64), fb, "b", input_rounding, seed + 1), fb)
    c64 = None
    if c is not None:
        batch, m, _, n = gemm_shapes(a.shape, b.shape)
        c64 = round_to(_broadcast_c(c, (*batch, m, n)).astype(np.float64), out_fmt)
        c64 = _flushed(np.asarray(c64, dtype=np.float64), out_fmt)
    return gemm(
        a64, b64, c64, input_format=(fa, fb), accumulator=keep, out_format=out_fmt,
        input_rounding="exact", **scales,
    )  # fmt: skip


def gemm_special(
    a: np.ndarray,
    b: np.ndarray,
    c: Any,
    *,
    input_format: FloatFormat | tuple[FloatFormat, FloatFormat],
    accumulator: Accumulator,
    out_format: FloatFormat,
    input_rounding: str,
    scale_a: Any = None,
    scale_b: Any = None,
    scale_block: int | None = None,
) -> np.ndarray | None:
    """The models that the general kernels do not compute (:func:`covers` is False or the inputs
    are fp64), on this backend's kernels for them: fp64 FMA chains (:func:`gemm_fma64`), flushed
    inputs (AMD CDNA2), ``addend="separate"`` (:func:`gemm_separate`), ``order="exact_block"``
    (:func:`gemm_exact_block`) and block-scaled MMA (:func:`gemm_block_scaled`); None where
    none of them applies (the numpy reference computes the model).

    >>> import precision_lab as pl
    >>> fp64 = get_format("fp64")
    >>> acc = pl.tensor_core("h100", "fp64", out_format="fp64")
    >>> if available():
    ...     d = gemm_special(np.ones((1, 3)), np.ones((3, 1)), None, input_format=fp64,
    ...                      accumulator=acc, out_format=fp64, input_rounding="nearest_even")
    ...     assert d.tolist() == [[3.0]]
    """
    from .reference import _EXACT_PRODUCT_BITS

    acc = accumulator
    if not acc.fields_3d_default() or acc.k1_product:  # (spec 3e, 3f: the kernels below lack)
        return None
    fa, fb = input_format if isinstance(input_format, tuple) else (input_format, input_format)
    kw: dict[str, Any] = {
        "input_format": input_format, "accumulator": acc, "out_format": out_format,
        "input_rounding": input_rounding,
    }  # fmt: skip
    plain = scale_a is None and scale_b is None
    if max(fa.precision, fb.precision) > _EXACT_PRODUCT_BITS:
        return gemm_fma64(a, b, c, **kw) if plain else None
    scales = {"scale_a": scale_a, "scale_b": scale_b, "scale_block": scale_block}
    if acc.input_subnormals == "flush":
        return _flushed_gemm(a, b, c, fa, fb, acc, out_format, input_rounding, **scales)
    if acc.addend == "separate":
        return gemm_separate(a, b, c, **kw) if plain else None
    if acc.order == "exact_block":
        return gemm_exact_block(a, b, c, **kw) if plain else None
    if acc.scales == "in_block":
        return gemm_block_scaled(a, b, c, **kw, **scales)
    return None
