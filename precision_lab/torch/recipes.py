"""FP4-era recipe pieces as torch autograd functions: Hadamard rotations, recipe operands, GEMMs.

* :func:`hadamard`: :func:`precision_lab.hadamard` (the blockwise, optionally random-signed,
  orthonormal Walsh-Hadamard transform) of a tensor, bit for bit. Its backward is the *exact
  transpose* of the linear map the forward computes: for the forward ``y = c H_n (s * x)`` per
  block that is ``s * (c H_n g)``, which is :func:`precision_lab.hadamard` with
  ``inverse=True`` (and for ``inverse=True`` the forward transform). For ``n = 4**k`` (16, 64,
  256) ``c = 2**-k`` and the map is exactly orthonormal, so the transpose *is* the inverse; for
  ``n = 2 * 4**k`` (32, 128) ``c`` is float64's ``2**-k * fl(2**-0.5)`` and the backward is the
  transpose with that same constant (the inverse to within one float64 rounding). The gradient is
  computed with ``arithmetic="exact"`` whatever the forward's ``arithmetic`` (a rounded forward
  is then straight-through for its roundings).
* :func:`quantize_operand`: one GEMM operand as a recipe's role quantizes it (the random
  Hadamard rotation, zero padding to the rotation's size, then the block or element format with
  the role's scale rule and rounding): the values of
  :func:`precision_lab.quant.recipes.quantize_operand` (dequantized:
  :func:`~precision_lab.dequantize_blocks` of its blocks) bit for bit, differentiable by
  ``grad`` as the casts of :mod:`.casts` (``"ste"``, ``"clipped_ste"``, ``"identity"``), the
  rotation's exact transpose applied to the gradient after the estimator.
* :func:`recipe_matmul`: ``a @ b (+ bias)`` as a recipe's linear layer runs its three GEMMs,
  forward (role ``forward``), input gradient (``dgrad``) and weight gradient (``wgrad``), each
  :func:`precision_lab.recipe_gemm` bit for bit, so the same as :func:`precision_lab.apply_recipe`
  on the same operands; :func:`~precision_lab.torch.simulate` with a recipe runs every GEMM of a
  model through it.

>>> import torch, precision_lab.torch as plt
>>> x = torch.arange(16.0, requires_grad=True)
>>> y = plt.hadamard(x, block=16)
>>> y[:3].tolist()
[30.0, -2.0, -4.0]
>>> y[0].backward()
>>> x.grad[:4].tolist()  # row 0 of the transform: every entry 1/4
[0.25, 0.25, 0.25, 0.25]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core.codec import decode
from ..core.formats import FloatFormat
from ..core.rounding import is_stochastic
from ..gemm import Accumulator, gemm
from ..gemm.recipes import _check_accumulator, quantized_gemm, recipe_gemm
from ..quant.block_formats import BlockFormat
from ..quant.blocks import QuantizedBlocks, _transposed_tiles, dequantize_blocks
from ..quant.hadamard import _rotation32
from ..quant.hadamard import hadamard as _np_hadamard
from ..quant.recipes import ROLES, Operand, Recipe, _resolve, get_recipe
from ..quant.recipes import quantize_operand as _quantize_operand
from .casts import _as_matrices, _check_grad, _check_tensor, _pairwise_column_sums, _squeezed

__all__ = ["hadamard", "quantize_operand", "recipe_matmul"]


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy: float64 stays float64, every other float dtype becomes float32
    (exact for float16 and bfloat16)."""
    d = t.detach()
    d = d.to(torch.float64 if d.dtype == torch.float64 else torch.float32)
    return np.asarray(d.cpu().numpy())


def _tensor(a: Any, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(like.device)


# ----------------------------------------------------------------------------------------------
# Hadamard
# ----------------------------------------------------------------------------------------------


class _HadamardFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, opts: dict[str, Any]) -> torch.Tensor:  # type: ignore[override]
        ctx.opts, ctx.in_dtype = opts, x.dtype
        y = _np_hadamard(_numpy(x), **opts)
        return _tensor(y, x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None]:  # type: ignore[override]
        o = ctx.opts
        gx = _transpose(_numpy(g), o["block"], o["axis"], o["seed"], o["inverse"], o["signs"])
        return _tensor(gx, g).to(ctx.in_dtype), None


def _transpose(
    g: np.ndarray, block: int, axis: int, seed: int | None, inverse: bool, signs: Any = None
) -> Any:
    """The exact transpose of the (inverse) random Hadamard map applied to ``g`` (float64)."""
    return _np_hadamard(g, block=block, axis=axis, seed=seed, inverse=not inverse, signs=signs)


def hadamard(
    x: torch.Tensor,
    *,
    block: int = 16,
    axis: int = -1,
    seed: int | None = None,
    inverse: bool = False,
    arithmetic: str | FloatFormat = "exact",
    rounding: str = "nearest_even",
    rounding_seed: int | None = None,
    random_bits: int | None = None,
    signs: Any = None,
) -> torch.Tensor:
    """:func:`precision_lab.hadamard` of a tensor, differentiable: the options and the result
    (float64 for ``arithmetic="exact"``, as the numpy function) are that function's; the
    gradient is the exact transpose of the transform (see the module), the inverse transform for
    ``block`` a power of 4.

    >>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], requires_grad=True)
    >>> y = hadamard(x, block=4, seed=3)
    >>> y.tolist()
    [[2.0, 0.0, -5.0, 1.0]]
    >>> y.backward(torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)); x.grad.tolist()
    [[-0.5, -0.5, 0.5, 0.5]]
    """
    _check_tensor(x)
    opts: dict[str, Any] = {
        "block": block,
        "axis": axis,
        "seed": seed,
        "inverse": bool(inverse),
        "arithmetic": arithmetic,
        "rounding": rounding,
        "rounding_seed": rounding_seed,
        "random_bits": random_bits,
        "signs": signs,
    }
    return _HadamardFn.apply(x, opts)  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------------------------
# recipe operands
# ----------------------------------------------------------------------------------------------


def _operand(recipe: str | Recipe, role: str, operand: str) -> tuple[Operand, int]:
    """The :class:`Operand` named ``operand`` (``"a"``/``"b"`` or its name in :data:`ROLES`) of
    ``role``, and its position (0: first, contracted along its last axis; 1: second)."""
    r = get_recipe(recipe)
    gr = r.role(role)
    names = ROLES[role]
    if operand in ("a", names[0]):
        return gr.a, 0
    if operand in ("b", names[1]):
        return gr.b, 1
    raise ValueError(
        f"operand must be 'a', 'b' or a name of role {role!r} ({names[0]!r}, {names[1]!r}), "
        f"got {operand!r}"
    )


class _OperandFn(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        op: Operand,
        axis: int,
        seed: int,
        hseed: int,
        grad: str,
    ) -> torch.Tensor:
        a = _numpy(x)
        ctx.in_dtype, ctx.grad, ctx.op, ctx.axis, ctx.hseed = x.dtype, grad, op, axis, hseed
        ctx.length = a.shape[axis]
        if grad == "identity":
            ctx.save_for_backward(torch.empty(0))
            return _tensor(a.copy(), x)
        q = _quantize_operand(a, op, axis=axis, seed=seed, hadamard_seed=hseed)
        y = dequantize_blocks(q) if isinstance(q, QuantizedBlocks) else np.asarray(q)
        mask = torch.empty(0)
        if grad == "clipped_ste":
            mask = _tensor(_inside(a, q, y, op, axis, hseed), x)
        ctx.save_for_backward(mask)
        return _tensor(y, x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        none = (None,) * 5
        if ctx.grad == "identity":
            return (g.to(ctx.in_dtype), *none)
        (mask,) = ctx.saved_tensors
        if ctx.grad == "clipped_ste":
            g = torch.where(mask, g, torch.zeros((), dtype=g.dtype, device=g.device))
        op: Operand = ctx.op
        if op.hadamard is None:
            return (g.to(ctx.in_dtype), *none)
        gx = _transpose(_numpy(g), op.hadamard, ctx.axis, ctx.hseed, False)
        gx = np.take(gx, np.arange(ctx.length), axis=ctx.axis)  # drop the padding
        return (_tensor(gx, g).to(ctx.in_dtype), *none)


def _rotated(a: np.ndarray, op: Operand, axis: int, hseed: int) -> np.ndarray:
    """The operand after its rotation (as :func:`~precision_lab.quant.recipes.quantize_operand`
    rotates it: padded, exact, float32), or ``a`` itself without one."""
    if op.hadamard is None:
        return a
    return _rotation32(a, op.hadamard, axis, hseed)


def _inside(a: np.ndarray, q: Any, y: np.ndarray, op: Operand, axis: int, hseed: int) -> np.ndarray:
    """The clipped estimator's mask (bool, ``y``'s shape): the (rotated) values that were not
    clipped: for a block format, not saturated at the element format's maximum (as
    :func:`~precision_lab.torch.round_to_blocks`); for an element format, ``|v| <= fmt.max``."""
    v = _rotated(a, op, axis, hseed)
    if isinstance(q, QuantizedBlocks):
        bf = q.block_format
        ev = np.asarray(decode(q.element_codes(), bf.element), dtype=np.float64)
        ev = ev.reshape(v.shape) if ev.size == v.size else ev[tuple(slice(n) for n in v.shape)]
        sat = (np.abs(ev) == float(bf.element.max)) & (
            np.abs(v.astype(np.float64)) > np.abs(y.astype(np.float64))
        )
        return np.asarray(~sat & ~np.isnan(v))
    fmt = _resolve(op.format)
    return np.asarray(np.abs(v) <= fmt.max)


def quantize_operand(
    x: torch.Tensor,
    recipe: str | Recipe,
    role: str,
    operand: str,
    *,
    axis: int | None = None,
    seed: int = 0,
    hadamard_seed: int | None = None,
    grad: str = "ste",
) -> torch.Tensor:
    """One GEMM operand of ``recipe``'s ``role`` quantized (and dequantized) as
    :func:`precision_lab.recipe_gemm` quantizes it, differentiable.

    Parameters
    ----------
    x:
        A float tensor (float64 kept, other dtypes taken as float32, exactly).
    recipe, role:
        A recipe (name or :class:`~precision_lab.Recipe`) and one of its roles (``"forward"``,
        ``"dgrad"``, ``"wgrad"``).
    operand:
        ``"a"`` / ``"b"`` (the role's first or second operand) or the operand's name in
        :data:`~precision_lab.quant.recipes.ROLES` (``"x"``, ``"w"``, ``"dy"``).
    axis:
        The contraction axis, along which the blocks and the rotation run (default: the GEMM's,
        -1 for the first operand ``(..., M, K)``, -2 for the second ``(..., K, N)``).
    seed, hadamard_seed:
        The seed of stochastic rounding and (default ``seed``) of the Hadamard signs, as
        :func:`precision_lab.quant.recipes.quantize_operand`.
    grad:
        ``"ste"``, ``"clipped_ste"`` (the gradient passes where the rotated value was not
        clipped: not saturated at the element format's maximum) or ``"identity"`` (the
        quantization and rotation switched off: ``x``'s values, float32 or float64); the
        gradient then goes through the rotation's exact transpose and loses the padding.

    Returns
    -------
    The dequantized values in the numpy function's dtype (float32 for float32, float16 and
    bfloat16 input; float64 input stays float64 unless a rotation, which returns float32, comes
    first), longer along ``axis`` where the rotation padded it.

    >>> x = torch.tensor([[0.3, -1.7] * 16], requires_grad=True)
    >>> y = quantize_operand(x, "te_mxfp8", "forward", "x")
    >>> y[0, :2].tolist()
    [0.3125, -1.75]
    """
    _check_tensor(x)
    g = _check_grad(grad)
    op, pos = _operand(recipe, role, operand)
    ax = (-1 if pos == 0 else -2) if axis is None else axis
    if isinstance(ax, bool) or not isinstance(ax, int):
        raise TypeError(f"axis must be an int or None, got {axis!r}")
    if not -x.ndim <= ax < x.ndim:
        raise ValueError(f"axis must be in [-{x.ndim}, {x.ndim}) for x of shape "
                         f"{tuple(x.shape)}, got {axis}")  # fmt: skip
    ax = ax % x.ndim
    hs = seed if hadamard_seed is None else hadamard_seed
    return _OperandFn.apply(x, op, ax, seed, hs, g)  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------------------------
# the three GEMMs of a linear layer
# ----------------------------------------------------------------------------------------------

_BIAS_ACC = Accumulator("fp32", order="pairwise")


def _shares_weight(recipe: Recipe) -> bool:
    """Whether the forward GEMM's second operand, quantized, serves the input-gradient GEMM
    transposed: both roles quantize it alike, in square 2-D tiles (TE's NVFP4 16 x 16 weight
    tiles), with a deterministic rounding and no rotation (then the quantization of ``w`` is
    the transpose of that of ``w.T``: quant.blocks._transposed_tiles, bit for bit). One 2-D
    quantization less per linear layer and step."""
    op = recipe.forward.b
    if op != recipe.dgrad.b or op.hadamard is not None or not op.blocked:
        return False
    if is_stochastic(op.rounding):
        return False
    bf = _resolve(op.format)
    square = isinstance(bf, BlockFormat) and len(bf.block_shape) == 2
    return square and bf.block_shape[0] == bf.block_shape[1]


class _RecipeGemmFn(torch.autograd.Function):
    """``a @ b`` (same batch dimensions) under a recipe: forward, dgrad and wgrad roles."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        a: torch.Tensor,
        b: torch.Tensor,
        recipe: Recipe,
        seed: int,
        acc: Accumulator | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(a.detach(), b.detach())
        ctx.recipe, ctx.seed, ctx.acc, ctx.qb = recipe, seed, acc, None
        an, bn = _numpy(a), _numpy(b)
        if not _shares_weight(recipe):
            y = recipe_gemm(an, bn, recipe, "forward", seed=seed, accumulator=acc)
            return _tensor(y, a)
        # quantized once for the forward and the input gradient (recipe_gemm's operands)
        gr = recipe.forward
        qa = _quantize_operand(an, gr.a, axis=-1, seed=seed, hadamard_seed=seed)
        ctx.qb = _quantize_operand(bn, gr.b, axis=-2, seed=seed + 1, hadamard_seed=seed)
        return _tensor(quantized_gemm(qa, ctx.qb, gr, acc), a)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        gn = _numpy(g)
        r, s, acc = ctx.recipe, ctx.seed, ctx.acc
        da = db = None
        if ctx.needs_input_grad[0]:  # dx = dy @ w, with w = b^T
            if ctx.qb is not None:  # the forward's quantized b, transposed (_shares_weight)
                gr = r.dgrad
                qa = _quantize_operand(gn, gr.a, axis=-1, seed=s + 4, hadamard_seed=s + 4)
                d = quantized_gemm(qa, _transposed_tiles(ctx.qb), gr, acc)
            else:
                bt = np.swapaxes(_numpy(b), -1, -2)
                d = recipe_gemm(gn, bt, r, "dgrad", seed=s + 4, accumulator=acc)
            da = _tensor(d, a).to(a.dtype)
        if ctx.needs_input_grad[1]:  # dw = dy^T @ x, and db = dw^T
            gt = np.swapaxes(gn, -1, -2)
            dw = recipe_gemm(gt, _numpy(a), r, "wgrad", seed=s + 8, accumulator=acc)
            db = _tensor(np.swapaxes(dw, -1, -2), b).to(b.dtype)
        return da, db, None, None, None


class _BiasFn(torch.autograd.Function):
    """``y + bias`` in float32 (the GEMM's epilogue); the bias gradient is the column sums of
    the incoming gradient, one :func:`precision_lab.gemm` of a ones row, pairwise in FP32."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.bias_dtype = bias.dtype
        return y + bias.detach().to(y.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        fast = _pairwise_column_sums(g.reshape(-1, g.shape[-1]))
        if fast is not None:  # (the GEMM's bits, see _pairwise_column_sums)
            return g, fast.to(g.device).to(ctx.bias_dtype)
        rows = _numpy(g).reshape(-1, g.shape[-1]).astype(np.float32)
        ones = np.ones((1, rows.shape[0]), dtype=np.float32)
        s = gemm(ones, rows, input_format="fp32", accumulator=_BIAS_ACC, out_format="fp32")
        db = _tensor(np.asarray(s).reshape(g.shape[-1]), g).to(ctx.bias_dtype)
        return g, db


def recipe_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    recipe: str | Recipe,
    *,
    bias: torch.Tensor | None = None,
    seed: int = 0,
    accumulator: Accumulator | None = None,
) -> torch.Tensor:
    """``a @ b (+ bias)`` as ``recipe``'s linear layer, differentiable: ``a`` is the layer's
    input ``x`` and ``b`` the transposed weight ``w^T``.

    The forward is :func:`precision_lab.recipe_gemm` of role ``forward`` with ``seed``; the
    backward computes ``da`` (role ``dgrad``, seed ``seed + 4``: ``g @ b^T``) and ``db``
    (role ``wgrad``, seed ``seed + 8``: ``(g^T @ a)^T``), so for 2-D ``a`` ``(M, K)`` and ``b``
    ``(K, N)`` the output, ``a.grad`` and ``b.grad`` are :func:`precision_lab.apply_recipe`'s
    ``y``, ``dx`` and ``dw.T`` for ``x = a``, ``w = b^T``, ``dy`` = the incoming gradient, bit for
    bit. Every GEMM's result is float32 (the operands' gradients are cast to their dtypes).

    Shapes: ``a`` ``(..., M, K)``; a 2-D ``b`` ``(K, N)`` makes the leading dimensions of ``a``
    rows of one GEMM (as a Linear layer: the weight gradient contracts over all of them); a
    batched ``b`` ``(..., K, N)`` is a batched GEMM whose batch dimensions broadcast (torch sums
    the gradient of a broadcast operand in float32). ``bias`` (``(N,)``) is added to the float32
    result in float32, as a GEMM epilogue; its gradient is the sum of the incoming gradient's
    rows, pairwise in FP32. ``accumulator`` replaces every role's accumulator (the recipe's GPU
    preset or FP32 promoted per block of K).

    >>> import torch, precision_lab as pl
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> x, w = torch.randn(4, 32, requires_grad=True), torch.randn(8, 32, requires_grad=True)
    >>> y = recipe_matmul(x, w.T, "te_mxfp8", seed=1)
    >>> dy = torch.randn(4, 8)
    >>> y.backward(dy)
    >>> ref = pl.apply_recipe(x.detach(), w.detach(), dy, "te_mxfp8", seed=1)
    >>> torch.equal(y, torch.from_numpy(ref.y)), torch.equal(x.grad, torch.from_numpy(ref.dx))
    (True, True)
    >>> torch.equal(w.grad, torch.from_numpy(ref.dw))
    True
    """
    _check_tensor(a, "a")
    _check_tensor(b, "b")
    r = get_recipe(recipe)
    _check_accumulator(accumulator)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 127:
        raise ValueError(f"seed must be an int in [0, 2**127), got {seed!r}")
    a, b, squeeze = _as_matrices(a, b)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"a and b do not share the contraction K: a {tuple(a.shape)} (..., M, K), "
            f"b {tuple(b.shape)} (..., K, N)"
        )
    if b.dim() == 2:
        lead = a.shape[:-1]
        out = _RecipeGemmFn.apply(a.reshape(-1, a.shape[-1]), b, r, seed, accumulator)
        out = out.reshape(*lead, b.shape[-1])
    else:
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a = a.expand(*batch, *a.shape[-2:])
        b = b.expand(*batch, *b.shape[-2:])
        out = _RecipeGemmFn.apply(a, b, r, seed, accumulator)
    if bias is not None:
        _check_tensor(bias, "bias")
        if tuple(bias.shape) != (out.shape[-1],):
            raise ValueError(
                f"bias must have shape ({out.shape[-1]},) (N of b), got {tuple(bias.shape)}"
            )
        out = _BiasFn.apply(out, bias)
    return _squeezed(out, squeeze)
