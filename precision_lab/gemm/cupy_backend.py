"""CuPy backend of :func:`precision_lab.gemm`: the accumulator models as CUDA kernels.

:func:`precision_lab.gemm` sends CuPy arrays (or ``backend="cupy"``) here after checking its
arguments. The kernels (``precision_lab/cuda/pl_gemm.cu``) compute the model of
:mod:`precision_lab.gemm.accumulator` bit for bit like the numpy reference:

* ``pl_gemm_fma_*``: fp32 sequential accumulation with exact products (nearest_even, toward_zero
  or up, IEEE overflow, subnormals kept, no promotion): a fixed-order FMA loop, where each FMA is
  exactly the model's ``round(s + a*b)``;
* ``pl_gemm_generic_*``: every other model (pairwise, blocked, block-FMA tensor-core models,
  narrow accumulators in every rounding mode incl. stochastic, rounded products, promotion,
  scales, special values), one output element per thread over shared-memory tiles.

The Python side is written over an array module ``xp`` and a kernel launcher, so the test suite
runs it with numpy and the kernels compiled for the CPU (``tests/backends/test_cuda_host.py``).

>>> import numpy as np, precision_lab as pl
>>> plan = kernel_plan((2, 3), (3, 4), fa=pl.get_format("e4m3"), fb=pl.get_format("e4m3"),
...                    acc=pl.Accumulator(), out_fmt=pl.get_format("fp32"), has_c=False,
...                    has_special=False, scales=None)
>>> plan.kernel, plan.grid, plan.block
('pl_gemm_fma_rn_f32', (1, 1, 1), (16, 16, 1))
>>> kernel_plan((2, 3), (3, 4), fa=pl.get_format("e4m3"), fb=pl.get_format("e4m3"),
...             acc=pl.tensor_core("h100", "e4m3"), out_fmt=pl.get_format("fp32"),
...             has_c=False, has_special=False, scales=None).kernel
'pl_gemm_generic_f32'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.gpu import module, require_cupy
from ..backends.kernel_sources import format_args
from ..core.exact import Rounder
from ..core.formats import FloatFormat, get_format
from ..core.rounding import ROUNDING_MODES, _fits_float32, check_rounding, round_to
from ..core.shapes import broadcast_shapes
from .accumulator import (
    LANE_TAILS,
    SPLIT_COMBINES,
    SPLIT_HALVES,
    Accumulator,
    combine_tree,
    join_tail,
)
from .reference import (
    _EXACT_PRODUCT_BITS,
    _check_groups,
    _check_power_of_two_scales,
    _check_wide_inputs,
    _flushed,
    _on_grid,
)
from .scales import expand_scales
from .shapes import gemm_shapes

__all__ = ["KernelPlan", "gemm", "kernel_plan", "lanes_in_float32", "run"]

_FP32 = get_format("fp32")
_FP64 = get_format("fp64")
_ORDERS = {"sequential": 0, "pairwise": 1, "blocked": 2, "block_fma": 3, "exact_block": 4}
_EB_MAX = 32  # pl_gemm.cuh's PL_EB_MAX: the longest exact_block block
_FMA_MODES = {"nearest_even": "rn", "toward_zero": "rz", "up": "ru"}
_G_TILE, _G_TKMAX, _F_TILE = 16, 128, 128
# indices of the int64 parameter block (pl_gemm.cuh, PL_P_*)
_P = {
    name: i
    for i, name in enumerate(
        "M N K NB T ORDER BLOCK ALIGN IN_BLOCK SEG PROMOTE PRODUCT SCALES SA_ROWS SB_COLS NK "
        "KBLOCK EMIN_A EMIN_B SEED_LO SEED_HI RBITS SPECIAL TK HAS_C STOCHASTIC INNER "
        "INTERLEAVE ZEROS ZERO_POS INF_OVER SCALES_IN FMA64 SEP SEP_DOWN GROUP SCALE_EMIN "
        "ZERO_EXP".split()
    )
}
_P_ROUNDERS = 40
# spec 3e's entries after the rounders (PL_P_LANES ...), then the lane tree (PL_P_TREE)
_P.update(
    {
        name: 40 + 6 * 9 + i
        for i, name in enumerate(
            "LANES LANE_TAIL LANE_UNROLL SMALL_K SPLIT_K SPLIT_COMBINE SPLIT_BALANCE K1 "
            "SPLIT_EQUAL LANE_VECTOR SPLIT_HALF LANE_F32 TREE_LEN TREE".split()
        )
    }
)
_LANES_MAX = 64  # pl_gemm.cuh's PL_LANES_MAX (its tree: at most 2 * 64 tokens)
_P_SIZE = _P["TREE"] + 2 * _LANES_MAX
_GROUPS_MAX = 16  # pl_gemm.cuh's PL_GROUPS_MAX and PL_SEP_GROUPS: parts of a block

Launcher = Callable[[str, tuple[int, int, int], tuple[int, int, int], tuple[Any, ...]], None]


@dataclass(frozen=True)
class KernelPlan:
    """Which kernel runs a GEMM, its launch shape and its int64 parameter block."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: np.ndarray
    out_dtype: np.dtype
    fma: bool


def _rounder(fmt: FloatFormat, mode: str, acc: Accumulator) -> list[int]:
    mode = check_rounding(mode)
    native = int(fmt == _FP64 and mode == "nearest_even")
    return [
        *format_args(fmt),
        ROUNDING_MODES.index(mode),
        int(acc.overflow == "saturate"),
        int(acc.subnormals == "flush"),
        native,
    ]


def kernel_plan(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    *,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    out_fmt: FloatFormat,
    has_c: bool,
    has_special: bool,
    scales: tuple[np.ndarray, np.ndarray, int | None] | None,
) -> KernelPlan:
    """Kernel, launch shape and parameters of ``a @ b``: shapes ``(..., M, K)``, ``(..., K, N)``."""
    batch = broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
    m, k = a_shape[-2:]
    n = b_shape[-1]
    nb = math.prod(batch)
    fmt = acc.format
    assert isinstance(fmt, FloatFormat) and isinstance(acc.promote_format, FloatFormat)
    if acc.order == "blas":
        raise ValueError("order='blas' has no kernel (run() uses cupy.matmul)")
    if acc.order not in _ORDERS:
        raise NotImplementedError(
            f"order={acc.order!r} has no CuPy kernel: use backend='numpy' (the reference)"
        )
    kblock = None if scales is None else scales[2]
    promote, seg = acc.segments(k, kblock, scales is not None)
    in_block = acc.scales == "in_block" and scales is not None
    if acc.scales == "in_block":  # spec 3b: the scales enter the block FMAs, no segments
        promote, seg = False, max(k, 1)
    if acc.order in ("block_fma", "exact_block"):
        why = _block_limit(acc)
        if why is not None:
            raise ValueError(why)
        blk = int(acc.block or 1)
        tk = blk * max(1, 32 // blk)
    else:
        tk = 32
    seed = 0 if acc.seed is None else int(acc.seed)
    p = [0] * _P_SIZE
    vals = {
        "M": m,
        "N": n,
        "K": k,
        "NB": nb,
        "T": nb * m * n,
        "ORDER": _ORDERS[acc.order],
        "BLOCK": acc.block or 1,
        "ALIGN": acc.align_bits or 0,
        "IN_BLOCK": int(acc.addend == "in_block"),
        "SEG": seg,
        "PROMOTE": int(promote),
        "PRODUCT": int(acc.product_format is not None),
        "SCALES": int(scales is not None),
        "SA_ROWS": 1 if scales is None else scales[0].shape[1],
        "SB_COLS": 1 if scales is None else scales[1].shape[2],
        "NK": 1 if scales is None else scales[0].shape[2],
        "KBLOCK": kblock or 0,
        "EMIN_A": fa.emin,
        "EMIN_B": fb.emin,
        "SEED_LO": seed & ((1 << 64) - 1),
        "SEED_HI": seed >> 64,
        "RBITS": acc.random_bits or 64,
        "SPECIAL": int(has_special),
        "TK": tk,
        "HAS_C": int(has_c),
        "STOCHASTIC": int(acc.stochastic),
        "INNER": getattr(acc, "inner_block", None) or 0,
        "INTERLEAVE": getattr(acc, "inner_interleave", None) or 0,
        "ZEROS": int(acc.zeros_in_anchor),
        "ZERO_EXP": acc.zero_exponent,
        "ZERO_POS": int(acc.zero_sign == "positive"),
        "INF_OVER": int(acc.overflow == "infinity"),
        "SCALES_IN": int(in_block),
        # fp64 inputs (reference._check_wide_inputs: fp64 nearest_even sequential only)
        "FMA64": int(max(fa.precision, fb.precision) > _EXACT_PRODUCT_BITS),
        "SEP": int(acc.sum_bits or 0) + 1 if acc.addend == "separate" else 0,
        # bit 0: the cuts floor; bits 1-: drop_bits (0: none)
        "SEP_DOWN": int(acc.align_rounding == "down") | (acc.drop_bits or 0) << 1,
        "GROUP": acc.group or 0,
        "SCALE_EMIN": acc.scale_format.emin
        if isinstance(acc.scale_format, FloatFormat)
        else -(1 << 16),  # (reference._Model.scale_emin)
    }
    vals.update(_lanes_params(acc))
    # the lanes' steps are float32 fmaf and additions (pl_lane_fma / pl_lane_add): fp32
    # nearest_even with the IEEE rules, exact products of inputs that float32 holds, no inf/NaN
    vals["LANE_F32"] = int(lanes_in_float32(acc, fa, fb) and not has_special)
    for name, v in vals.items():
        p[_P[name]] = int(v)
    tree = _tree_tokens(acc)
    p[_P["TREE"] : _P["TREE"] + len(tree)] = tree
    prod_fmt = acc.product_format if isinstance(acc.product_format, FloatFormat) else fmt
    rounders = [
        _rounder(fmt, acc.rounding, acc),
        _rounder(fmt, acc.block_rounding, acc),
        _rounder(acc.promote_format, acc.promote_rounding, acc),
        _rounder(acc.promote_format, "nearest_even", acc),
        _rounder(prod_fmt, acc.product_rounding, acc),
        _rounder(out_fmt, acc.out_rounding, acc),
    ]
    for j, r in enumerate(rounders):
        p[_P_ROUNDERS + 9 * j : _P_ROUNDERS + 9 * j + 9] = r
    params = np.array([v - (1 << 64) if v >= 1 << 63 else v for v in p], dtype=np.int64)
    out_dtype = np.dtype(np.float32 if _fits_float32(out_fmt) else np.float64)
    sfx = "f32" if out_dtype == np.float32 else "f64"
    fma = (
        acc.order == "sequential"
        and acc.fields_3d_default()
        and not (acc.k1_product and k == 1)
        and fmt == _FP32
        and acc.rounding in _FMA_MODES
        and acc.overflow == "ieee"
        and acc.zero_sign == "ieee"
        and acc.subnormals == "keep"
        and acc.product_format is None
        and not promote
        and _fits_float32(fa)
        and _fits_float32(fb)
        and (not has_c or _fits_float32(out_fmt))
        and not has_special
        and out_dtype == np.float32
    )
    if fma:
        name = f"pl_gemm_fma_{_FMA_MODES[acc.rounding]}_{sfx}"
        grid = (-(-n // _F_TILE), -(-m // _F_TILE), nb)
    else:
        name = f"pl_gemm_generic_{sfx}"
        grid = (-(-n // _G_TILE), -(-m // _G_TILE), nb)
    return KernelPlan(
        name, (max(grid[0], 1), max(grid[1], 1), grid[2]), (16, 16, 1), params, out_dtype, fma
    )


def lanes_in_float32(acc: Accumulator, fa: FloatFormat, fb: FloatFormat) -> bool:
    """Whether every step of spec 3e's lanes is one IEEE float32 ``fmaf`` or addition in
    ``pl_gemm.cuh`` (``pl_lane_fma``, ``pl_lane_add``; the kernels also need inputs without inf
    or NaN): order sequential or blocked, fp32 nearest_even with the IEEE overflow, zero-sign
    and subnormal rules, exact products of inputs that float32 holds.

    >>> bf16 = get_format("bf16")
    >>> lanes_in_float32(Accumulator("fp32", lanes=8), bf16, bf16)
    True
    >>> lanes_in_float32(Accumulator("bf16", lanes=8), bf16, bf16)
    False
    """
    return (
        acc.order in ("sequential", "blocked")
        and acc.format == _FP32
        and check_rounding(acc.rounding) == "nearest_even"
        and acc.overflow == "ieee"
        and acc.zero_sign == "ieee"
        and acc.subnormals == "keep"
        and acc.product_format is None
        and _fits_float32(fa)
        and _fits_float32(fb)
    )


def _lanes_params(acc: Accumulator) -> dict[str, int]:
    """Spec 3e's and 3f's entries of the parameter block (0: off)."""
    return {
        "LANES": acc.lanes or 0,
        "LANE_TAIL": LANE_TAILS.index(acc.lane_tail),
        "LANE_UNROLL": acc.lane_unroll or 0,
        "SMALL_K": acc.small_k or 0,
        "SPLIT_K": acc.split_k or 0,
        "SPLIT_COMBINE": SPLIT_COMBINES.index(acc.split_combine),
        "SPLIT_BALANCE": acc.split_balance or 0,
        "K1": int(acc.k1_product),
        "SPLIT_EQUAL": acc.split_equal or 0,
        "LANE_VECTOR": acc.lane_vector or 0,
        "SPLIT_HALF": SPLIT_HALVES.index(acc.split_half),
        "TREE_LEN": len(_tree_tokens(acc)),
    }


def _tree_tokens(acc: Accumulator) -> list[int]:
    """The lane tree of ``acc`` (:func:`~precision_lab.gemm.accumulator.combine_tree`, named or
    explicit) in postfix, as pl_gemm.cuh's ``pl_lane_tree`` reads it: a lane number, or ``-m``
    for the sum of the ``m`` values before it, left to right; empty without lanes.

    >>> _tree_tokens(Accumulator(lanes=4, lane_combine="pairwise"))
    [0, 1, -2, 2, 3, -2, -2]
    """
    if acc.lanes is None:
        return []
    out: list[int] = []
    tree: Any = combine_tree(acc.lane_combine, acc.lanes)
    if acc.lane_tail == "separate_first":  # where the tail's sum joins (accumulator.join_tail)
        tree = join_tail(tree, acc.lane_vector, _LANES_MAX)

    def walk(node: Any) -> None:
        if isinstance(node, tuple):
            for ch in node:
                walk(ch)
            out.append(-len(node))
        else:
            out.append(int(node))

    walk(tree)
    return out


def _block_limit(acc: Accumulator) -> str | None:
    """Why kernel_plan takes no block of ``acc``'s length (None: it does): block_fma blocks fill
    tiles of at most _G_TKMAX products, exact_block blocks per-thread arrays of PL_EB_MAX."""
    most = {"block_fma": _G_TKMAX, "exact_block": _EB_MAX}.get(acc.order)
    blk = int(acc.block or 1)
    if most is not None and blk > most:
        return f"the cupy backend runs {acc.order} with block <= {most}, got block={blk}"
    return None


def _parts_limit(acc: Accumulator) -> str | None:
    """Why the per-thread arrays of pl_gemm.cuh's block steps do not hold ``acc``'s parts of a
    block (None: they do): at most PL_GROUPS_MAX scale groups and PL_SEP_GROUPS inner blocks of
    ``addend="separate"``. run() checks it for the kernels it launches; the native fast kernels,
    which share kernel_plan, have no such limit.

    >>> _parts_limit(Accumulator(order="block_fma", block=64, align_bits=35,
    ...              scales="in_block", group=2))
    'the cupy backend runs at most 16 scale groups per block, got block=64 in parts of 2'
    """
    blk = int(acc.block or 1)
    sep_inner = acc.inner_block if acc.addend == "separate" else None
    for parts, what in ((acc.group, "scale groups"), (sep_inner, "inner blocks")):
        if parts is not None and -(-blk // parts) > _GROUPS_MAX:
            return (
                f"the cupy backend runs at most {_GROUPS_MAX} {what} per block, got "
                f"block={blk} in parts of {parts}"
            )
    return None


def header_limit(acc: Accumulator) -> str | None:
    """Why the kernels of pl_gemm.cuh cannot run ``acc`` (blocks too long, too many parts of a
    block), or None: the CuPy backend raises it, and the native backend's per-element kernels
    (the same header) decline such models (``native_backend.covers``).

    >>> header_limit(Accumulator(order="exact_block", block=64))
    'the cupy backend runs exact_block with block <= 32, got block=64'
    """
    if acc.lanes is not None and acc.lanes > _LANES_MAX:
        return f"the cupy backend runs at most {_LANES_MAX} lanes, got lanes={acc.lanes}"
    return _block_limit(acc) or _parts_limit(acc)


def _float_array(xp: Any, x: Any, name: str) -> Any:
    arr = xp.asarray(x)
    dt = np.dtype(arr.dtype)
    if dt.kind != "f" or dt.itemsize > 8:
        raise TypeError(
            f"{name} must hold floating-point numbers, got an array of {dt.name} "
            "(expected float16, float32 or float64)"
        )
    return arr


def _host(x: Any) -> Any:
    return x.get() if hasattr(x, "get") else x


def run(
    xp: Any,
    launch: Launcher,
    a: Any,
    b: Any,
    c: Any = None,
    *,
    input_format: str | FloatFormat | tuple[str | FloatFormat, str | FloatFormat],
    accumulator: Accumulator,
    out_format: str | FloatFormat,
    input_rounding: str = "nearest_even",
    scale_a: Any = None,
    scale_b: Any = None,
    scale_block: int | None = None,
) -> Any:
    """The GEMM over array module ``xp`` (cupy, or numpy in tests), kernels run by ``launch``."""
    if isinstance(input_format, tuple | list):
        fa, fb = (get_format(f) for f in input_format)
    else:
        fa = fb = get_format(input_format)
    out_fmt = get_format(out_format)
    acc = accumulator
    if acc.order not in _ORDERS and acc.order != "blas":
        raise NotImplementedError(
            f"order={acc.order!r} has no CuPy kernel: use backend='numpy' (the reference)"
        )
    assert isinstance(fa, FloatFormat) and isinstance(fb, FloatFormat)
    assert isinstance(out_fmt, FloatFormat)
    _check_wide_inputs(acc, fa, fb)  # (fp64 inputs: the FMA chain of FP64 DMMA only)
    why = _parts_limit(acc)
    if why is not None:
        raise ValueError(why)
    a = _float_array(xp, a, "a")
    b = _float_array(xp, b, "b")
    batch, m, k, n = gemm_shapes(tuple(a.shape), tuple(b.shape))
    out_shape = (*batch, m, n)
    nb = math.prod(batch)
    seed = 0 if acc.seed is None else acc.seed
    a64 = _on_grid(a.astype(np.float64), fa, "a", input_rounding, seed, xp)
    b64 = _on_grid(b.astype(np.float64), fb, "b", input_rounding, seed + 1, xp)
    has_c = c is not None
    if has_c:
        c_arr = _float_array(xp, c, "c")
        try:
            c_arr = xp.broadcast_to(c_arr, out_shape)
        except ValueError:
            raise ValueError(
                f"c of shape {c_arr.shape} does not broadcast to the output shape {out_shape}"
            ) from None
        c64 = round_to(xp.ascontiguousarray(c_arr, dtype=np.float64), out_fmt)
        c64 = c64.astype(np.float64)
    if acc.input_subnormals == "flush":  # spec 3c (AMD CDNA2): subnormal inputs become +0
        a64, b64 = _flushed(a64, fa), _flushed(b64, fb)
        if has_c:
            c64 = _flushed(c64, out_fmt)
        acc = acc.replace(input_subnormals="keep")
    sa, sb, kblock = expand_scales(a, b, _host(scale_a), _host(scale_b), scale_block)
    scales = None if sa is None or sb is None else (sa, sb, kblock)
    _check_groups(acc, fa, fb, kblock)  # (groups: exact float64 sums, sharing their scales)
    if scales is not None and acc.scales == "in_block" and acc.group is None:
        _check_power_of_two_scales(_host(sa), _host(sb))
    elif scales is not None:
        assert isinstance(acc.format, FloatFormat) and isinstance(acc.promote_format, FloatFormat)
        if acc.format.precision + acc.promote_format.precision > 53:
            raise ValueError(
                f"scales need accumulator precision + promote precision <= 53 bits, got "
                f"{acc.format.precision} + {acc.promote_format.precision}"
            )
    A = xp.ascontiguousarray(xp.broadcast_to(a64, (*batch, m, k))).reshape(nb, m, k)
    B = xp.ascontiguousarray(xp.broadcast_to(b64, (*batch, k, n))).reshape(nb, k, n)
    C = c64.reshape(nb, m, n) if has_c else None
    if acc.order == "blas":
        return _blas(xp, A, B, C, acc, out_fmt, out_shape, scales)
    has_special = not (
        bool(xp.isfinite(A).all())
        and bool(xp.isfinite(B).all())
        and (C is None or bool(xp.isfinite(C).all()))
    )
    plan = kernel_plan(
        a.shape,
        b.shape,
        fa=fa,
        fb=fb,
        acc=acc,
        out_fmt=out_fmt,
        has_c=has_c,
        has_special=has_special,
        scales=scales,
    )
    D = xp.empty((nb, m, n), dtype=plan.out_dtype)
    if nb * m * n == 0:
        return D.reshape(out_shape)
    params = xp.asarray(plan.params)
    if plan.fma:
        f32 = np.float32
        Cx = C.astype(f32) if C is not None else xp.zeros(1, dtype=f32)
        args: tuple[Any, ...] = (A.astype(f32), B.astype(f32), Cx, D, params)
    else:
        Cx = C if C is not None else xp.zeros(1, dtype=np.float64)
        SA = xp.asarray(sa) if sa is not None else xp.ones(1, dtype=np.float64)
        SB = xp.asarray(sb) if sb is not None else xp.ones(1, dtype=np.float64)
        args = (A, B, Cx, SA, SB, D, params)
    launch(plan.kernel, plan.grid, plan.block, args)
    return D.reshape(out_shape)


def _blas(
    xp: Any,
    A: Any,
    B: Any,
    C: Any,
    acc: Accumulator,
    out_fmt: FloatFormat,
    out_shape: tuple[int, ...],
    scales: Any,
) -> Any:
    if scales is not None or acc.promote_every is not None or acc.stochastic:
        raise ValueError(
            "order='blas' on the GPU takes no scales, promotion or stochastic rounding"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        p = xp.matmul(A.astype(np.float32), B.astype(np.float32))
        if C is not None:
            p = p + C.astype(np.float32)
    d = Rounder(
        out_fmt, acc.out_rounding, acc.overflow, acc.subnormals, zero_sign=acc.zero_sign
    ).round(p.astype(np.float64))
    dtype = np.float32 if _fits_float32(out_fmt) else np.float64
    return d.astype(dtype).reshape(out_shape)


def _cupy_launch(
    name: str, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple[Any, ...]
) -> None:
    module("pl_gemm.cu").get_function(name)(grid, block, args)


def gemm(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    input_format: str | FloatFormat | tuple[str | FloatFormat, str | FloatFormat],
    accumulator: Accumulator,
    out_format: str | FloatFormat,
    input_rounding: str = "nearest_even",
    scale_a: Any = None,
    scale_b: Any = None,
    scale_block: int | None = None,
) -> Any:
    """:func:`precision_lab.gemm` on the GPU (CuPy arrays in and out; arguments checked there)."""
    cp = require_cupy()
    return run(
        cp,
        _cupy_launch,
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
