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
from ..quant.recipes import ROLES, Operand, Recipe, get_recipe, quantize_operand
from .blocks import gemm_blocks
from .reference import gemm
from .tensor_core import tensor_core

__all__ = ["LinearGemms", "apply_recipe"]


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
    try:
        return tensor_core(gpu, operand.format.split("[")[0])
    except (ValueError, TypeError):
        return None  # no preset for this format: FP32 promotion per block


def _run(
    a: np.ndarray, b: np.ndarray, oa: Operand, ob: Operand, gpu: str | None, seed: int
) -> np.ndarray:
    """``a @ b`` with a quantized along its last axis and b along its first."""
    qa = quantize_operand(a, oa, axis=-1, seed=seed, hadamard_seed=seed)
    qb = quantize_operand(b, ob, axis=0, seed=seed + 1, hadamard_seed=seed)
    acc = _accumulator(gpu, oa)
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
        role = r.role(name)
        a, b = operands[name]
        out[name] = _run(a, b, role.a, role.b, role.gpu, seed + 4 * i)
    return LinearGemms(out["forward"], out["dgrad"], out["wgrad"], r)
