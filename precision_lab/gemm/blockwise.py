"""Fine-grained (1x128 / 128x128) FP8 GEMM as cuBLAS, CUTLASS and DeepGEMM run it.

:func:`blockwise_gemm`.

DeepSeek-V3's FP8 GEMM (arXiv 2412.19437, section 3.3) and Transformer Engine's
``Float8BlockScaling`` quantize activations and gradients in 1x128 tiles and weights in 128x128
tiles (:mod:`precision_lab.quant.fine_grained`). The GEMM then runs per 128-wide K tile:

1. the tensor-core partial ``P_t`` of the tile: the 128 products summed by the matrix core from
   zero (default: the H100 FP8 ``wgmma`` preset, ``pl.tensor_core("h100", "e4m3")``: four
   ``wgmma`` of k = 32, chained in the 14-bit accumulator, then read out into FP32 registers).
   This is the *split accumulator* of cuBLAS (``use_split_accumulator=True``, which TE's
   Float8BlockScaling requires): "every 4 QMMA partial accumulation results are accumulated into
   float32 registers" (TE's ``tests/pytorch/references/blockwise_fp8_gemm_reference.py``). TE's
   reference computes each tile's partial with ``torch._scaled_mm(..., use_fast_accum=not
   use_split_accumulator)`` on K = 128, where the fast-accumulation variant (promotion only at
   the end of the K loop) promotes at the same place: one tile is one promotion interval, so
   both variants give the same partial here (inferred from that reference; where fast
   accumulation differs is a per-tensor FP8 GEMM over a long K, :func:`promotion_error`).
2. the scales applied in FP32, in the peer's order (``sa``, ``sb``: the tile's dequantization
   scales of the row of A and the column of B; ``fma`` one rounding, ``*`` rounded to FP32):

   ``order="cublas"`` (TE's reference equations for cuBLAS, same file):

   * 1Dx1D and 1Dx2D: ``y = fma(fp32(P_t * sa), sb, y)``
   * 2Dx1D (operands' roles swapped): ``y = fma(fp32(P_t * sb), sa, y)``
   * 2Dx2D: ``y = fma(P_t, fp32(sa * sb), y)``

   ``order="cutlass"`` (CUTLASS's SM90 blockwise-scaled mainloop,
   ``sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp`` and
   ``fp8_accumulation.hpp``, NVIDIA/cutlass 7107b05): with per-row A scales *and* per-column B
   scales (1Dx1D) ``accum += accum_temp * scaleA * scaleB``, i.e.
   ``y = fma(fp32(P_t * sa), sb, y)`` (cuBLAS's 1Dx1D equation); otherwise the two scales are
   multiplied first (``tCrSFA * tCrSFB``) and ``accum += accum_temp * scale``:
   ``y = fma(P_t, fp32(sa * sb), y)``.

   ``order="deepgemm"`` (DeepGEMM's ``sm90_fp8_gemm_1d1d.cuh`` and ``sm90_fp8_gemm_1d2d.cuh``:
   ``final_accum += scale_a * scale_b * accum``): ``y = fma(P_t, fp32(sa * sb), y)`` in every
   case. This is also what :func:`~precision_lab.gemm_blocks` computes (the library's promotion
   ``W = round(W + P * round(sa * sb))``; the tests check they agree bit for bit).

   ``a += b * c`` becomes one FMA under nvcc's default ``-fmad=true`` (inferred; the C++
   expressions are the evidence, not a disassembly). The orders differ only for
   non-power-of-two (FP32) scales; with UE8M0 or TE's power-of-two scales every product is
   exact (outside overflow and underflow) and all orders agree.
3. the output conversion after the last tile (``d = round(y, out_format)``, nearest even: bf16
   by ``__float22bfloat162_rn`` in DeepGEMM), and with ``c`` (cuBLAS ``accumulate=True``) C
   added *after* the conversion, ``d = round(fp32(round(y, out) + c), out)``: "cublas
   accumulation first convert to output dtype, then accumulate" (TE's reference, which adds in
   torch: an FP32 sum rounded to the output type).

K not a multiple of 128 is padded with zeros (the tensor memory accelerator fills the last tile
with zeros). A tile whose scale is NaN (a NaN block) gives NaN.

>>> import numpy as np, precision_lab as pl
>>> from precision_lab.quant.fine_grained import deepgemm_quantize
>>> rng = np.random.default_rng(0)
>>> x, w = rng.standard_normal((4, 256)), rng.standard_normal((256, 128))
>>> qa = deepgemm_quantize(x, tile=(1, 128))
>>> qb = deepgemm_quantize(w, tile=(128, 128))
>>> d = blockwise_gemm(qa, qb)
>>> bool(np.abs(d - x @ w).max() < 0.1 * np.abs(x @ w).max())
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.exact import Rounder, round_sum, two_sum
from ..core.formats import FloatFormat, get_format
from ..core.rounding import as_float_array, round_to
from ..quant.blocks import QuantizedBlocks
from .accumulator import Accumulator
from .blocks import _gemm_operand, _k_block
from .reference import gemm
from .tensor_core import tensor_core

__all__ = ["SCALE_ORDERS", "blockwise_gemm", "fma32", "promotion_error"]

#: where the tile scales enter: cuBLAS's equations (TE's reference), CUTLASS's, DeepGEMM's
SCALE_ORDERS = ("cublas", "cutlass", "deepgemm")
_FP32 = get_format("fp32")
_RN32 = Rounder("fp32", "nearest_even")


def _f32(v: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return round_to(np.asarray(v, dtype=np.float64), _FP32).astype(np.float64)


def fma32(x: Any, y: Any, z: Any) -> np.ndarray:
    """``fma(x, y, z)`` of float32 values (held in float64): ``x * y + z`` rounded once to
    FP32, nearest even (float64 result). The product of two float32 values is exact in float64;
    the sum is held exactly as a two-sum pair and rounded once by the core.

    >>> fma32(np.float32(1 + 2**-23), np.float32(1 - 2**-23), np.float32(-1.0)).tolist()
    -1.4210854715202004e-14
    """
    x, y, z = (np.asarray(v, dtype=np.float64) for v in (x, y, z))
    shape = np.broadcast_shapes(x.shape, y.shape, z.shape)
    x, y, z = (np.ascontiguousarray(np.broadcast_to(v, shape)).reshape(-1) for v in (x, y, z))
    with np.errstate(all="ignore"):
        p = x * y
        s, t = two_sum(p, z)
        special = ~np.isfinite(s) | ~np.isfinite(p) | ~np.isfinite(z)
        t = np.where(special, 0.0, t)
        out = round_sum(np.where(special, 0.0, s), t, _RN32)
        if special.any():
            out = np.where(special, _f32(p + z), out)
    return out.reshape(shape)


def _is_1d(q: QuantizedBlocks) -> bool:
    return len(q.block_format.block_shape) == 1


def _tile_scales(q: QuantizedBlocks, which: str, nk: int) -> np.ndarray:
    """The scales per element row of A ((nk, M, 1)) or column of B ((nk, 1, N))."""
    s = q.scales
    bf = q.block_format
    if which == "a":  # grid (Mg, nk)
        m = q.shape[-2]
        if not _is_1d(q):
            s = np.repeat(s, bf.block_shape[0], axis=-2)[..., :m, :]
        return np.swapaxes(s, -1, -2)[..., None]  # (..., nk, M, 1)
    n = q.shape[-1]  # B: grid (nk, Ng)
    if not _is_1d(q):
        s = np.repeat(s, bf.block_shape[1], axis=-1)[..., :n]
    return s[..., :, None, :]  # (..., nk, 1, N)


def blockwise_gemm(
    a: QuantizedBlocks,
    b: QuantizedBlocks,
    c: Any = None,
    *,
    accumulator: Accumulator | None = None,
    order: str = "cublas",
    out_format: str | FloatFormat = "fp32",
    backend: str = "auto",
) -> np.ndarray:
    """``d = A @ B (+ C)`` of 1x128 / 128x128 FP8 operands, tile by tile (module docstring).

    Parameters
    ----------
    a, b:
        :class:`~precision_lab.quant.blocks.QuantizedBlocks`: ``a`` ``(M, K)`` in 1x128 tiles
        along K (``axis=-1``) or 128x128 tiles, ``b`` ``(K, N)`` in 1x128 tiles along K
        (``axis=-2``) or 128x128 tiles (:func:`~precision_lab.quant.fine_grained.deepgemm_quantize`,
        :func:`~precision_lab.quant.fine_grained.te_blockwise_quantize`, or
        :func:`~precision_lab.quantize_blocks` with ``"fp8_1x128"`` / ``"fp8_128x128"``).
        Leading batch dimensions broadcast.
    c:
        cuBLAS's ``accumulate=True``: C, added after the conversion to ``out_format``.
    accumulator:
        The matrix core that forms each tile's partial (default ``pl.tensor_core("h100",
        "e4m3")``, the H100 FP8 ``wgmma`` model); promotion fields are ignored (the tile is the
        promotion interval).
    order:
        ``"cublas"`` (TE's reference equations), ``"cutlass"`` or ``"deepgemm"``.
    out_format:
        ``"fp32"``, ``"bf16"``, ``"fp16"``: D's type.
    backend:
        As :func:`precision_lab.gemm`.

    Returns
    -------
    float32 array ``(..., M, N)`` on ``out_format``'s grid.
    """
    for q, name in ((a, "a"), (b, "b")):
        if not isinstance(q, QuantizedBlocks):
            raise TypeError(
                f"{name} must be a QuantizedBlocks (from quantize_blocks or a fine-grained "
                f"quantizer), got {type(q).__name__}"
            )
    if order not in SCALE_ORDERS:
        raise ValueError(f"order must be one of {SCALE_ORDERS}, got {order!r}")
    ka, kb = _k_block(a, "a"), _k_block(b, "b")
    if ka != kb:
        raise ValueError(
            f"a and b must have the same tile length along K, got {ka} ({a.block_format}) and "
            f"{kb} ({b.block_format})"
        )
    k = a.shape[-1]
    if b.shape[-2] != k:
        raise ValueError(f"a {a.shape} and b {b.shape} do not share K ((..., M, K), (..., K, N))")
    if accumulator is None:
        accumulator = tensor_core("h100", "e4m3")
    elif not isinstance(accumulator, Accumulator):
        raise TypeError(f"accumulator must be an Accumulator or None, got {accumulator!r}")
    acc = accumulator.replace(promote_every=None) if accumulator.promote_every else accumulator
    out = get_format(out_format, name="out_format")
    va, _, fa = _gemm_operand(a)
    vb, _, fb = _gemm_operand(b)
    nk = -(-k // ka)
    pad = nk * ka - k
    if pad:
        va = np.concatenate([va, np.zeros((*va.shape[:-1], pad))], axis=-1)
        vb = np.concatenate([vb, np.zeros((*vb.shape[:-2], pad, vb.shape[-1]))], axis=-2)
    m, n = va.shape[-2], vb.shape[-1]
    a_t = np.moveaxis(va.reshape(*va.shape[:-1], nk, ka), -2, -3)  # (..., nk, M, tile)
    b_t = vb.reshape(*vb.shape[:-2], nk, ka, n)  # (..., nk, tile, N)
    parts = np.asarray(
        gemm(
            a_t,
            b_t,
            input_format=(fa, fb),
            accumulator=acc,
            out_format="fp32",
            backend=backend,
            input_rounding="exact",
        ),
        dtype=np.float64,
    )  # (..., nk, M, N): each tile's partial, from zero
    sa = _tile_scales(a, "a", nk)
    sb = _tile_scales(b, "b", nk)
    shape = (*np.broadcast_shapes(parts.shape[:-3], sa.shape[:-3], sb.shape[:-3]), m, n)
    y = np.zeros(shape, dtype=np.float64)
    one_a, one_b = _is_1d(a), _is_1d(b)
    with np.errstate(all="ignore"):
        for t in range(nk):
            p = parts[..., t, :, :]
            s_a, s_b = sa[..., t, :, :], sb[..., t, :, :]
            if one_a and (order == "cublas" or (order == "cutlass" and one_b)):
                y = fma32(_f32(p * s_a), s_b, y)  # cuBLAS 1Dx1D, 1Dx2D; CUTLASS 1Dx1D
            elif order == "cublas" and one_b:  # cuBLAS 2Dx1D
                y = fma32(_f32(p * s_b), s_a, y)
            else:  # 2Dx2D; CUTLASS 1Dx2D, 2Dx1D; DeepGEMM always
                y = fma32(p, _f32(s_a * s_b), y)
        d = round_to(y, out)
        if c is not None:
            cc = round_to(as_float_array(c, "c").astype(np.float64), out)
            d = round_to(_f32(d.astype(np.float64) + cc), out)
    return np.asarray(d, dtype=np.float32)


def promotion_error(
    k: int = 4096,
    *,
    m: int = 64,
    n: int = 64,
    seed: int = 0,
    distribution: str = "normal",
    promote_every: int | None = 128,
    accumulator: Accumulator | None = None,
) -> dict[str, float]:
    """The accumulation error of a per-tensor FP8 GEMM with and without promotion (the
    DeepSeek-V3 report's K = 4096 example, section 3.3.2).

    Two random ``(m, k)`` and ``(k, n)`` matrices (``"normal"``: N(0, 1); ``"uniform"``:
    U[0, 1)) are rounded to E4M3 (per-tensor scale: the values are taken as they are), and
    their product is computed exactly (float64 of exact E4M3 products, error-free at these
    sizes: ``|sum| < 2**53`` quanta) and by the matrix core ``accumulator`` (default
    ``pl.tensor_core("h100", "e4m3")``) without promotion (cuBLAS fast accumulation: the
    14-bit accumulator chained over all of K) and with promotion every ``promote_every``
    products into FP32 (the split accumulator). Returns the largest relative error
    ``max |d - exact| / |exact|`` over the outputs with ``|exact| >= 1e-3 max |exact|`` and
    the normwise ``||d - exact||_F / ||exact||_F`` of both.

    >>> r = promotion_error(1024, m=8, n=8, distribution="uniform")
    >>> r["max_rel_no_promotion"] > r["max_rel_promoted"]
    True
    """
    rng = np.random.default_rng(seed)
    if distribution == "normal":
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    elif distribution == "uniform":
        a, b = rng.random((m, k)), rng.random((k, n))
    else:
        raise ValueError(f"distribution must be 'normal' or 'uniform', got {distribution!r}")
    a, b = round_to(a, "e4m3"), round_to(b, "e4m3")
    exact = a @ b  # exact: E4M3 products have 8 significant bits, far below float64's 53
    acc = accumulator if accumulator is not None else tensor_core("h100", "e4m3")
    res: dict[str, float] = {}
    big = np.abs(exact) >= 1e-3 * np.abs(exact).max()
    for tag, ac in (
        ("no_promotion", acc.replace(promote_every=None)),
        ("promoted", acc.replace(promote_every=promote_every)),
    ):
        d = np.asarray(gemm(a, b, input_format="e4m3", accumulator=ac), dtype=np.float64)
        err = np.abs(d - exact)
        res[f"max_rel_{tag}"] = float((err[big] / np.abs(exact[big])).max())
        res[f"normwise_{tag}"] = float(np.linalg.norm(d - exact) / np.linalg.norm(exact))
    return res
