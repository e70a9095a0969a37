"""Casts as torch autograd functions: the numpy API's values forward, straight-through backward.

Each function here computes its forward result with the numpy API of the same name
(:func:`precision_lab.round_to`, :func:`precision_lab.quantize`, ...; a torch tensor goes in and
comes back through DLPack, so the values are those functions' bit for bit, on the CPU, and
through CuPy for CUDA tensors where a GPU and CuPy are present), and its backward by the
estimator ``grad`` names:

* ``"ste"`` (default): the straight-through estimator (Bengio et al. 2013): the rounding is the
  identity in the backward pass, the incoming gradient passes unchanged everywhere;
* ``"clipped_ste"``: the incoming gradient where the input lay inside the cast's range and 0
  where the cast clipped it (pytorch-quantization's ``fake_tensor_quant``, and
  :func:`precision_lab.training.qat.fake_quant` / :func:`~precision_lab.training.qat.ste_grad`):
  ``|x| <= fmt.max`` for :func:`round_to`; ``clip_min <= x <= clip_max`` (bounds included) for
  :func:`quantize` / :func:`fake_quantize`; for :func:`round_to_blocks`, the elements that did
  not saturate at the element format's maximum. NaN inputs get 0;
* ``"identity"``: the cast is switched off: the forward returns ``x`` unchanged (same tensor
  values, a float32 copy for float16/bfloat16 input, as the casts return) and the gradient
  passes unchanged (a baseline with the same code path).

The result dtype is the numpy API's: float32 for float16/bfloat16/float32 input, float64 for
float64 input. The gradient comes back in the input's dtype (a float32 gradient cast to
float16/bfloat16 by torch's rules: exact for ``"ste"`` of a float16 input's own gradient).

>>> import torch
>>> x = torch.tensor([1.0, 3.0e-8, 70000.0], requires_grad=True)
>>> y = round_to(x, "fp16", grad="clipped_ste")
>>> y.tolist()
[1.0, 0.0, inf]
>>> y.backward(torch.ones(3)); x.grad.tolist()
[1.0, 1.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..core.codec import decode
from ..core.formats import FloatFormat, get_format
from ..quant import blocks as _blocks
from ..quant import integer as _integer

__all__ = [
    "GRAD_MODES",
    "dequantize",
    "fake_quantize",
    "quantize",
    "round_to",
    "round_to_blocks",
]

#: The backward estimators every cast here takes as ``grad``.
GRAD_MODES = ("ste", "clipped_ste", "identity")


def _check_grad(grad: Any) -> str:
    if grad not in GRAD_MODES:
        raise ValueError(f"grad must be one of {', '.join(GRAD_MODES)}, got {grad!r}")
    return str(grad)


def _check_tensor(x: Any, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must hold floating-point numbers, got a tensor of {x.dtype}")
    return x


def _as_matrices(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``a`` and ``b`` with 1-D operands promoted as ``torch.matmul`` promotes them (a vector ``a``
    a row, a vector ``b`` a column), and the dimensions to squeeze from the product after."""
    squeeze = []
    if a.dim() == 1:
        a = a.unsqueeze(0)
        squeeze.append(-2)
    if b.dim() == 1:
        b = b.unsqueeze(-1)
        squeeze.append(-1)
    return a, b, squeeze


def _squeezed(out: torch.Tensor, squeeze: list[int]) -> torch.Tensor:
    """The product of :func:`_as_matrices`'s operands with the promoted dimensions removed."""
    for d in sorted(squeeze):
        out = out.squeeze(d)
    return out


def _pairwise_column_sums(rows: torch.Tensor) -> torch.Tensor | None:
    """The column sums of float32 ``rows`` (M, N) as :func:`precision_lab.gemm` computes
    ``ones(1, M) @ rows`` with ``Accumulator("fp32", order="pairwise")``: the products are
    the values themselves (exact), each level of the tree adds adjacent pairs (an odd one out
    moves up a level) with one float32 addition, which is the model's round-to-nearest-even of
    the exact sum, and the tree's top is added to the accumulator's start, ``c = +0`` (so a
    -0 sum is +0). Returns an (N,) float32 tensor, or None
    where an input or the result is not finite (the GEMM then follows its special-value
    rules), so the bits are the GEMM's (tests/torch/test_simulate.py compares them). The
    inputs are not checked on their own: every input of a column takes part in its sum, and a
    float32 addition with an infinite or NaN operand gives inf or NaN, so a non-finite input
    leaves its column's sum non-finite (the one check of the N sums replaced a check of all
    M x N inputs, 0.15 ms of a 512 x 128 bias gradient, measured on this Xeon).

    >>> _pairwise_column_sums(torch.tensor([[1.0, -0.0], [2.0**-24, -0.0], [3.0, -0.0]])).tolist()
    [4.0, 0.0]
    """
    x = rows.detach().to(torch.float32)
    if x.shape[0] == 0:
        return torch.zeros(x.shape[1], dtype=torch.float32)
    while x.shape[0] > 1:
        h = x.shape[0] // 2
        pairs = x[0 : 2 * h : 2] + x[1 : 2 * h : 2]
        x = torch.cat([pairs, x[2 * h :]]) if x.shape[0] % 2 else pairs
    out = x[0] + 0.0  # (c = +0)
    return out if bool(torch.isfinite(out).all()) else None


def _result_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _as_tensor(r: Any, like: torch.Tensor) -> torch.Tensor:
    """A result of the numpy API (a tensor through DLPack, or a numpy array) as a tensor on
    ``like``'s device."""
    if isinstance(r, torch.Tensor):
        return r.to(like.device)
    return torch.from_numpy(np.ascontiguousarray(r)).to(like.device)


class _Cast(torch.autograd.Function):
    """``y = f(x)``; backward: ``grad`` where ``mask`` (all of it when no mask), else 0."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]],
    ) -> torch.Tensor:
        y, mask = fn(x.detach())
        ctx.in_dtype = x.dtype
        ctx.save_for_backward(mask if mask is not None else torch.empty(0))
        ctx.has_mask = mask is not None
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None]:  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        if ctx.has_mask:
            g = torch.where(mask, g, torch.zeros((), dtype=g.dtype, device=g.device))
        return g.to(ctx.in_dtype), None


def _apply(x: torch.Tensor, grad: str, fn: Callable[..., Any], clip: Callable[..., Any]) -> Any:
    """Run the cast ``fn`` (tensor -> tensor) with the estimator ``grad``; ``clip(x, y)`` is the
    clipped estimator's mask (bool tensor: where the gradient passes)."""
    g = _check_grad(grad)
    if g == "identity":
        return _Cast.apply(x, lambda t: (t.to(_result_dtype(t), copy=True), None))

    def run(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        y = _as_tensor(fn(t), t).to(_result_dtype(t))
        return y, (clip(t, y) if g == "clipped_ste" else None)

    return _Cast.apply(x, run)


# ----------------------------------------------------------------------------------------------
# element formats
# ----------------------------------------------------------------------------------------------


def round_to(
    x: torch.Tensor,
    fmt: str | FloatFormat,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
    random_bits: int | None = None,
    grad: str = "ste",
) -> torch.Tensor:
    """:func:`precision_lab.round_to` of a tensor, differentiable (``grad``: see the module).

    The clipped estimator passes the gradient where ``|x| <= fmt.max``.

    >>> x = torch.tensor([0.3, -2.0**-30], dtype=torch.float64, requires_grad=True)
    >>> round_to(x, "bf16").tolist()
    [0.30078125, -9.313225746154785e-10]
    """
    _check_tensor(x)
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise ValueError(f"fmt must be a floating-point format, got {f}")
    from ..core.rounding import round_to as _round_to

    opts: dict[str, Any] = {"rounding": rounding, "overflow": overflow, "subnormals": subnormals}
    if seed is not None:
        opts["seed"] = seed
    if random_bits is not None:
        opts["random_bits"] = random_bits

    def clip(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return t.abs() <= f.max

    return _apply(x, grad, lambda t: _round_to(t, f, **opts), clip)  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------------------------
# integer quantization
# ----------------------------------------------------------------------------------------------


def _np(v: Any) -> Any:
    """A scale or zero point as numpy (tensors converted; the rest as given)."""
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().numpy()
    return v


def _clip_bounds(
    fmt: Any, scale: Any, zero_point: Any, axis: int | None, narrow_range: bool, ndim: int
) -> tuple[np.ndarray, np.ndarray]:
    """``clip_min``, ``clip_max`` (float64) shaped to broadcast against an ``ndim`` tensor, as
    :class:`~precision_lab.Calibration` computes them."""
    qmin, qmax = _integer.qrange(fmt, narrow_range)
    s = np.asarray(_np(scale), dtype=np.float32).astype(np.float64)
    z = np.asarray(_np(zero_point)).astype(np.int64)
    lo, hi = (qmin - z) * s, (qmax - z) * s
    if axis is not None and (lo.ndim or hi.ndim):
        shape = [1] * ndim
        shape[axis] = -1
        lo = np.broadcast_to(lo, np.broadcast_shapes(lo.shape, hi.shape)).reshape(shape)
        hi = np.broadcast_to(hi, np.broadcast_shapes(lo.shape, hi.shape)).reshape(shape)
    return lo, hi


def _inside(t: torch.Tensor, lo: np.ndarray, hi: np.ndarray) -> torch.Tensor:
    a = t.detach().to(torch.float64)
    lo_t = torch.as_tensor(lo, dtype=torch.float64, device=t.device)
    hi_t = torch.as_tensor(hi, dtype=torch.float64, device=t.device)
    return (a >= lo_t) & (a <= hi_t)


def quantize(
    x: torch.Tensor,
    fmt: Any,
    scale: Any,
    zero_point: Any = 0,
    *,
    axis: int | None = None,
    rounding: str = "nearest_even",
    narrow_range: bool = False,
    seed: int | None = None,
    grad: str = "ste",
) -> torch.Tensor:
    """:func:`precision_lab.quantize`'s integer codes as a float32 tensor (float64 for float64
    input; integer values, equal to the numpy codes), differentiable: the backward of
    ``x / scale + zero_point`` with the rounding treated by ``grad``, ``g / scale`` (one float64
    division rounded to the result dtype; the clipped estimator also zeroes the clipped
    values). For a gradient that is exactly the STE of the round trip use :func:`fake_quantize`.

    >>> quantize(torch.tensor([0.3, -1.0, 2.5]), "int8", 0.01).tolist()
    [30.0, -100.0, 127.0]
    """
    _check_tensor(x)
    g = _check_grad(grad)
    opts: dict[str, Any] = {"axis": axis, "rounding": rounding, "narrow_range": narrow_range}
    if seed is not None:
        opts["seed"] = seed
    lo, hi = _clip_bounds(fmt, scale, zero_point, axis, narrow_range, x.ndim)
    s64 = np.asarray(_np(scale), dtype=np.float32).astype(np.float64)
    if axis is not None and s64.ndim:
        shape = [1] * x.ndim
        shape[axis] = -1
        s64 = s64.reshape(shape)
    inv = torch.as_tensor(1.0 / s64, dtype=torch.float64, device=x.device)
    return _QuantizeFn.apply(x, fmt, _np(scale), _np(zero_point), opts, g, lo, hi, inv)  # type: ignore[no-any-return]


class _QuantizeFn(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        fmt: Any,
        scale: Any,
        zero_point: Any,
        opts: dict[str, Any],
        g: str,
        lo: np.ndarray,
        hi: np.ndarray,
        inv: torch.Tensor,
    ) -> torch.Tensor:
        t = x.detach()
        dt = _result_dtype(t)
        ctx.in_dtype, ctx.mode = x.dtype, g
        if g == "identity":
            y = t.to(dt, copy=True)
            ctx.save_for_backward(torch.empty(0), inv)
            return y
        q = _integer.quantize(t.cpu().numpy(), fmt, scale, zero_point, **opts)
        y = torch.from_numpy(np.asarray(q).astype(np.float64)).to(dt).to(t.device)
        mask = _inside(t, lo, hi) if g == "clipped_ste" else torch.empty(0)
        ctx.save_for_backward(mask, inv)
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        mask, inv = ctx.saved_tensors
        if ctx.mode == "identity":
            return (gy.to(ctx.in_dtype), *([None] * 8))
        gx = (gy.to(torch.float64) * inv).to(gy.dtype)
        if ctx.mode == "clipped_ste":
            gx = torch.where(mask, gx, torch.zeros((), dtype=gx.dtype, device=gx.device))
        return (gx.to(ctx.in_dtype), *([None] * 8))


def dequantize(
    q: torch.Tensor,
    scale: Any,
    zero_point: Any = 0,
    *,
    axis: int | None = None,
) -> torch.Tensor:
    """:func:`precision_lab.dequantize` of integer codes (an integer tensor, or the float tensor
    of integer values :func:`quantize` returns), differentiable in ``q``: the gradient is
    ``g * scale`` (one float64 product rounded to the gradient's dtype).

    >>> dequantize(torch.tensor([30.0, -100.0, 127.0]), 0.01).tolist()
    [0.30000001192092896, -1.0, 1.2699999809265137]
    """
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    return _DequantizeFn.apply(q, _np(scale), _np(zero_point), axis)  # type: ignore[no-any-return]


class _DequantizeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, scale: Any, zero_point: Any, axis: Any) -> torch.Tensor:  # type: ignore[override]
        t = q.detach()
        if t.is_floating_point():
            c = t.cpu().numpy()
            if not np.array_equal(c, np.round(c)) or not np.all(np.isfinite(c)):
                raise ValueError("q must hold integer codes (from quantize)")
            ci = c.astype(np.int64)
        else:
            ci = t.cpu().numpy()
        r = np.asarray(_integer.dequantize(ci, scale, zero_point, axis=axis))
        s64 = np.asarray(scale, dtype=np.float32).astype(np.float64)
        if axis is not None and s64.ndim:
            shape = [1] * t.ndim
            shape[axis] = -1
            s64 = s64.reshape(shape)
        ctx.save_for_backward(torch.as_tensor(s64, dtype=torch.float64, device=t.device))
        ctx.in_dtype = q.dtype
        return torch.from_numpy(np.ascontiguousarray(r)).to(t.device)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        (s,) = ctx.saved_tensors
        if not ctx.in_dtype.is_floating_point:
            return None, None, None, None
        return (g.to(torch.float64) * s).to(ctx.in_dtype), None, None, None


def fake_quantize(
    x: torch.Tensor,
    fmt: Any,
    scale: Any,
    zero_point: Any = 0,
    *,
    axis: int | None = None,
    rounding: str = "nearest_even",
    narrow_range: bool = False,
    seed: int | None = None,
    grad: str = "ste",
) -> torch.Tensor:
    """``dequantize(quantize(x))`` as one differentiable step: the values of
    :func:`precision_lab.quantize` then :func:`precision_lab.dequantize` (float32; the values of
    :func:`precision_lab.training.qat.fake_quant`), the gradient exactly the straight-through
    estimator's (``"clipped_ste"``: :func:`~precision_lab.training.qat.ste_grad` with QAT's mask,
    ``clip_min <= x <= clip_max``, bounds included).

    >>> x = torch.tensor([0.3, -1.0, 2.5], requires_grad=True)
    >>> y = fake_quantize(x, "int8", 0.01, grad="clipped_ste")
    >>> y.sum().backward(); x.grad.tolist()
    [1.0, 1.0, 0.0]
    """
    _check_tensor(x)
    opts: dict[str, Any] = {"axis": axis, "rounding": rounding, "narrow_range": narrow_range}
    if seed is not None:
        opts["seed"] = seed
    s, z = _np(scale), _np(zero_point)
    lo, hi = _clip_bounds(fmt, s, z, axis, narrow_range, x.ndim)

    def fn(t: torch.Tensor) -> Any:
        a = t.cpu().numpy()
        q = _integer.quantize(a, fmt, s, z, **opts)
        dt = np.float64 if a.dtype == np.float64 else np.float32
        return _integer.dequantize(q, s, z, axis=axis, dtype=dt)

    return _apply(x, grad, fn, lambda t, y: _inside(t, lo, hi))  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------------------------
# block-scaled formats
# ----------------------------------------------------------------------------------------------


def round_to_blocks(
    x: torch.Tensor,
    block_format: Any,
    *,
    axis: int = -1,
    rounding: str = "nearest_even",
    seed: int | None = None,
    random_bits: int | None = None,
    pad: bool = False,
    grad: str = "ste",
) -> torch.Tensor:
    """:func:`precision_lab.round_to_blocks` of a tensor (MX, NVFP4 ... fake quantization),
    differentiable. The clipped estimator passes the gradient where the element did not
    saturate: not (its element value is ``±element.max`` and ``|x|`` is larger than the result).

    >>> x = torch.tensor([[0.3, -1.7] * 16])
    >>> round_to_blocks(x, "mxfp4_e2m1")[0, :2].tolist()
    [0.25, -1.5]
    """
    _check_tensor(x)
    opts: dict[str, Any] = {"axis": axis, "rounding": rounding, "pad": pad}
    if seed is not None:
        opts["seed"] = seed
    if random_bits is not None:
        opts["random_bits"] = random_bits
    bf = _blocks.get_block_format(block_format)

    def fn(t: torch.Tensor) -> Any:
        return _blocks.round_to_blocks(t, bf, **opts)

    def clip(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = t.cpu().numpy()
        q = _blocks.quantize_blocks(a, bf, **opts)
        ev = np.asarray(decode(q.element_codes(), bf.element), dtype=np.float64)
        ev = ev.reshape(a.shape) if ev.size == a.size else ev[tuple(slice(n) for n in a.shape)]
        emax = float(bf.element.max)
        sat = (np.abs(ev) == emax) & (np.abs(a.astype(np.float64)) > np.abs(y.cpu().numpy()))
        return torch.from_numpy(~sat & ~np.isnan(a)).to(t.device)

    return _apply(x, grad, fn, clip)  # type: ignore[no-any-return]
