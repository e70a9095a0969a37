"""Run a training recipe's three GEMMs of a linear layer: :func:`apply_recipe`.

The recipe (:class:`~precision_lab.quant.recipes.Recipe`, data in :mod:`precision_lab.quant`)
says how each operand is quantized; this runs the quantized GEMMs through
:func:`~precision_lab.gemm_blocks` (block formats) or :func:`~precision_lab.gemm` (element
formats), with the tensor-core model of the role's GPU where one exists for the operands' format
and otherwise FP32 accumulation promoted per block of K.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> x, w = rng.standard_normal((32, 64)), rng.standard_normal((48, 64))
>>> dy = rng.standard_normal((32, 48))
>>> out = apply_recipe(x, w, dy, "te_nvfp4", seed=1)
>>> out.y.shape, out.dx.shape, out.dw.shape
((32, 48), (32, 64), (48, 64))
>>> exact = apply_recipe(x, w, dy, "fp32")
>>> bool(np.abs(out.y - x @ w.T).max() < 0.5 * np.abs(x @ w.T).max())
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.rounding import as_float_array
from ..quant.blocks import QuantizedBlocks
from ..quant.recipes import ROLES, GemmRole, Operand, Recipe, get_recipe, quantize_operand
from .accumulator import Accumulator
from .blocks import gemm_blocks
from .blockwise import blockwise_gemm
from .reference import gemm
from .tensor_core import tensor_core

__all__ = ["LinearGemms", "apply_recipe", "recipe_gemm"]


@dataclass(frozen=True)
class LinearGemms:
    """The three GEMM results of a linear layer under a recipe (float32 arrays):
    ``y = x @ w.T``, ``dx = dy @ w``, ``dw = dy.T @ x``."""

    y: np.ndarray
    dx: np.ndarray
    dw: np.ndarray
    recipe: Recipe


def _accumulator(gpu: str | None, operand: Operand) -> Any:
    if gpu is None:
        return None
    fmt = operand.format.split("[")[0]
    if operand.fine_grained:
        fmt = "e4m3"
    try:
        return tensor_core(gpu, fmt)
    except (ValueError, TypeError):
        return None  # no preset for this format: FP32 promotion per block


def _check_accumulator(accumulator: Any) -> None:
    """Raise TypeError unless ``accumulator`` is a :class:`~precision_lab.Accumulator` or None
    (the ``accumulator=`` option of the recipe GEMMs, which replaces a role's preset)."""
    if accumulator is not None and not isinstance(accumulator, Accumulator):
        raise TypeError(
            f"accumulator must be a precision_lab.Accumulator (pl.tensor_core(...) gives one) "
            f"or None, got {accumulator!r}"
        )


def recipe_gemm(
    a: Any,
    b: Any,
    recipe: str | Recipe,
    role: str,
    *,
    seed: int = 0,
    accumulator: Accumulator | None = None,
) -> np.ndarray:
    """``a @ b`` as one GEMM role of a recipe runs it: what :func:`apply_recipe` does per role.

    ``a`` (``(..., M, K)``) is quantized with the role's first operand along its last axis,
    ``b`` (``(..., K, N)``) with the second along axis -2 (blocks along the contraction K; 2-D
    tiles cover the last two axes; a batch shares one NVFP4 per-tensor scale); the role's random
    Hadamard rotation (size of each operand's ``hadamard``) uses the signs of ``seed`` for both
    operands, and stochastic rounding the seeds ``seed`` (``a``) and ``seed + 1`` (``b``)
    (:func:`~precision_lab.quant.recipes.quantize_operand`). Then the GEMM:
    :func:`~precision_lab.gemm_blocks` for block formats, :func:`~precision_lab.gemm` for element
    formats, under ``accumulator`` if given, else the tensor-core preset of the role's ``gpu``
    for the first operand's format where one exists, else the default (FP32 sequential,
    promoted to FP32 at every block of K). A role with a ``scale_order`` (the fine-grained FP8
    recipes ``"deepseek_v3_fp8"``, ``"te_fp8_block"``) runs
    :func:`~precision_lab.gemm.blockwise.blockwise_gemm` instead: the preset's partial per
    128-wide K tile, the tile scales in cuBLAS's, CUTLASS's or DeepGEMM's order.

    Parameters
    ----------
    a, b:
        Float arrays ``(..., M, K)`` and ``(..., K, N)`` (batch dimensions broadcast).
    recipe:
        A name of :data:`~precision_lab.quant.recipes.RECIPES` or a
        :class:`~precision_lab.quant.recipes.Recipe`.
    role:
        ``"forward"``, ``"dgrad"`` or ``"wgrad"`` (:data:`~precision_lab.quant.recipes.ROLES`).
    seed:
        As above; :func:`apply_recipe` passes ``seed + 4 r`` for role ``r``.
    accumulator:
        A :class:`~precision_lab.Accumulator` (or :func:`~precision_lab.tensor_core` preset)
        that replaces the role's: it takes precedence over the recipe's GPU.

    Returns
    -------
    The float32 result ``(..., M, N)``.

    >>> import numpy as np
    >>> a, b = np.ones((2, 32)), np.full((32, 3), 0.5)
    >>> recipe_gemm(a, b, "te_mxfp8", "forward")
    array([[16., 16., 16.],
           [16., 16., 16.]], dtype=float32)
    """
    r = get_recipe(recipe)
    gr = r.role(role)
    _check_accumulator(accumulator)
    aa, ba = as_float_array(a, "a"), as_float_array(b, "b")
    if aa.ndim < 2 or ba.ndim < 2:
        raise ValueError(
            f"a and b must be at least 2-D, (..., M, K) and (..., K, N), got shapes {aa.shape} "
            f"and {ba.shape}"
        )
    if aa.shape[-1] != ba.shape[-2]:
        raise ValueError(
            f"a and b do not share the contraction K: a {aa.shape} (..., M, K), b {ba.shape} "
            "(..., K, N)"
        )
    qa = quantize_operand(aa, gr.a, axis=-1, seed=seed, hadamard_seed=seed)
    qb = quantize_operand(ba, gr.b, axis=-2, seed=seed + 1, hadamard_seed=seed)
    return quantized_gemm(qa, qb, gr, accumulator)


def quantized_gemm(
    qa: QuantizedBlocks | np.ndarray,
    qb: QuantizedBlocks | np.ndarray,
    gr: GemmRole,
    accumulator: Accumulator | None = None,
) -> np.ndarray:
    """The GEMM of :func:`recipe_gemm` on operands already quantized as role ``gr`` quantizes
    them (:func:`~precision_lab.quant.recipes.quantize_operand`): what a caller that keeps a
    quantized operand between GEMMs runs (a weight in forward and input-gradient GEMMs)."""
    oa, ob = gr.a, gr.b
    acc = accumulator if accumulator is not None else _accumulator(gr.gpu, oa)
    if gr.scale_order is not None:  # fine-grained FP8: tile by tile, the peer's scale order
        if not (isinstance(qa, QuantizedBlocks) and isinstance(qb, QuantizedBlocks)):
            raise ValueError("scale_order needs block-scaled operands")
        return blockwise_gemm(qa, qb, accumulator=acc, order=gr.scale_order)
    if isinstance(qa, QuantizedBlocks) and isinstance(qb, QuantizedBlocks):
        return np.asarray(gemm_blocks(qa, qb, accumulator=acc))
    if isinstance(qa, QuantizedBlocks) or isinstance(qb, QuantizedBlocks):
        raise ValueError(
            f"a role needs both operands block-scaled or both element formats, got {oa.format} "
            f"and {ob.format}"
        )
    fmts = (oa.format, ob.format)
    return np.asarray(gemm(qa, qb, input_format=fmts, accumulator=acc))


def apply_recipe(x: Any, w: Any, dy: Any, recipe: str | Recipe, *, seed: int = 0) -> LinearGemms:
    """Quantize the operands of a linear layer's three GEMMs as ``recipe`` says and run them.

    Parameters
    ----------
    x, w, dy:
        Activations ``(M, K)``, weights ``(N, K)`` and output gradients ``(M, N)`` (floats).
    recipe:
        A name of :data:`~precision_lab.quant.recipes.RECIPES` or a
        :class:`~precision_lab.quant.recipes.Recipe`.
    seed:
        Role ``r`` (0 forward, 1 dgrad, 2 wgrad) uses the Hadamard signs of ``seed + 4 r`` for
        both operands, and the stochastic-rounding seeds ``seed + 4 r`` (first operand) and
        ``seed + 4 r + 1`` (second).

    Returns
    -------
    :class:`LinearGemms` with ``y = x @ w.T``, ``dx = dy @ w``, ``dw = dy.T @ x``.
    """
    r = get_recipe(recipe)
    xa = as_float_array(x, "x")
    wa = as_float_array(w, "w")
    ga = as_float_array(dy, "dy")
    if xa.ndim != 2 or wa.ndim != 2 or ga.ndim != 2:
        raise ValueError("x, w and dy must be 2-D: (M, K), (N, K) and (M, N)")
    (m, k), (n, k2), (m2, n2) = xa.shape, wa.shape, ga.shape
    if k != k2 or m != m2 or n != n2:
        raise ValueError(
            f"shapes do not match a linear layer: x {xa.shape}, w {wa.shape}, dy {ga.shape} "
            "(expected (M, K), (N, K), (M, N))"
        )
    operands = {
        "forward": (xa, wa.T),
        "dgrad": (ga, wa),
        "wgrad": (ga.T, xa),
    }
    out = {}
    for i, name in enumerate(ROLES):
        a, b = operands[name]
        out[name] = recipe_gemm(a, b, r, name, seed=seed + 4 * i)
    return LinearGemms(out["forward"], out["dgrad"], out["wgrad"], r)
