"""Emulated execution of a real torch model under a precision policy or a training recipe:
``simulate(model, policy_or_recipe)``.

:func:`simulate` wraps an unmodified ``torch.nn.Module`` in :class:`Simulated`, whose forward runs
the model inside a ``torch.overrides.TorchFunctionMode`` that sends every GEMM through
:func:`precision_lab.gemm`:

* ``F.linear`` (``nn.Linear``), ``F.conv1d`` / ``F.conv2d`` (``nn.Conv1d`` / ``nn.Conv2d``, as
  im2col GEMMs: ``torch.nn.functional.unfold`` then one GEMM; with ``groups > 1``, and
  ``conv3d`` and the transposed convolutions, as :mod:`precision_lab.torch.ops` describes),
  ``torch.matmul`` / ``@`` / ``mm`` / ``bmm`` / ``addmm`` (attention's ``q @ k^T`` ...), the
  vector products
  ``mv`` / ``dot`` / ``vdot`` / ``inner`` / ``outer`` / ``addmv`` / ``addr``, ``einsum``,
  ``tensordot``, ``baddbmm`` / ``addbmm`` (:mod:`precision_lab.torch.ops`),
  ``F.scaled_dot_product_attention`` as its math definition (two GEMMs and a softmax; under an
  attention recipe as FP8 attention,
  :mod:`.attention`), ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``, the
  ``nn.Transformer*`` layers: torch's own body with these GEMMs emulated, :mod:`.attention`),
  and ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` and their cells (the cell equations with emulated
  gate GEMMs, :mod:`.rnn`). Operations whose GEMMs are not emulated (``F.bilinear``,
  ``multi_dot``, ``vecdot``, ``cdist``, ``conv_tbc``, sparse and backend-specific kernels,
  in-place ``addmm_`` ..., packed sequences) raise NotImplementedError naming the operation and
  the rewrite, rather than run silently in FP32 (tests/torch/test_coverage.py enumerates
  torch's GEMM functions and watches its GEMM kernels). A GEMM with no floating-point operand
  (an integer ``a @ b``) runs as torch runs it;
* forward: ``y = c + a @ b`` with ``a`` and ``b`` rounded to the layer's compute format (8-bit
  formats per-tensor scaled as the policy's ``tensor_scaling`` says: Transformer Engine's delayed
  scaling, or current scaling; the decode scales go to ``pl.gemm``'s ``scale_a`` / ``scale_b``),
  the accumulator the policy's (or ``accumulator=``: any :class:`~precision_lab.Accumulator` or
  :func:`~precision_lab.tensor_core` preset; default FP32 sequential), the bias as ``c``, and the
  FP32 result stored in the layer's activation format;
* backward (an autograd function): the incoming gradient stored in the layer's gradient format,
  then ``dA = dY @ B^T`` and ``dB = A^T @ dY`` through ``pl.gemm`` with ``dY`` in the backward
  format and ``A``, ``B`` in the compute format (the operands the forward used), each stored in
  the gradient format; the bias gradient is the sum of ``dY`` over the batch through ``pl.gemm``
  with a ones operand, pairwise in FP32 under the ``reductions`` rule (else in the gradient
  format), stored in the gradient format. (For a convolution, torch's ``fold`` then adds the
  overlapping patches of ``dA`` in float32 before the gradient-format store.)

Other operations follow the policy's FP32 rule list
(:data:`precision_lab.training.policy.KNOWN_OPS`):
``softmax`` / ``log_softmax`` (rule ``softmax``) and ``cross_entropy`` / ``nll_loss`` (rule
``cross_entropy``) run in float32 and keep a float32 result when their rule is on; otherwise the
result is stored in the activation format (its gradient in the gradient format). Normalisations
(``layer_norm``, ``group_norm``, ``batch_norm``, ``rms_norm``) run in float32 and their output
is stored in the activation format (their internal steps are not rounded separately: with
``norm_statistics`` off the result is the same). Elementwise operations (ReLU, GELU, residual
adds ...) run in float32 on their inputs, which are already on the activation grid.

**Under a training recipe** (``simulate(model, "te_nvfp4")``, any name of
:data:`~precision_lab.quant.recipes.RECIPES` or a :class:`~precision_lab.Recipe`), every
emulated GEMM is a linear layer of the recipe, run by :func:`~precision_lab.torch.recipe_matmul`:
its first operand is the layer input ``x`` (for a convolution, the im2col patches ``(N*L, K)``),
its second the transposed weight ``w^T`` (for a functional matmul, the second operand: attention's
``k^T`` and ``v``), and forward, dgrad and wgrad are the recipe's three roles, each
:func:`precision_lab.recipe_gemm` (so :func:`precision_lab.apply_recipe`) bit for bit: operand
formats with blocks along each GEMM's contraction axis, scale rules, the Hadamard rotation of
both operands, round-to-nearest or stochastic rounding, and the role's accumulator.
``accumulator=`` takes precedence over the recipe's (every role then accumulates with it).
Seeding: the ``j``-th emulated GEMM of a forward pass (0-based, in call order) at training step
``t`` runs with ``apply_recipe``'s seed ``seed + 2**32 t + 16 j`` (:meth:`Simulated.gemm_seed`):
Hadamard signs and the first operand's stochastic rounding of role ``r`` (0 forward, 1 dgrad, 2
wgrad) use ``+ 4 r``, the second operand's ``+ 4 r + 1``. ``t`` is :attr:`Simulated.step`, which
advances after each forward pass in training mode with gradients enabled (evaluation passes do
not move it), so a run is reproducible from ``seed`` alone. Biases are added to the FP32 GEMM
result in float32 (the epilogue), their gradient summed pairwise in FP32; everything else runs
as under the ``"float32"`` policy (no storage rounding).

The parameters are stored in the policy's ``variable_format`` (round to nearest even, as the
numpy training emulation stores its master weights, or ``variable_rounding=``, stochastic
rounding included): rounded when :func:`simulate` wraps the model and after every
``optimizer.step()`` of an optimizer holding them (:meth:`Simulated.store_parameters`); ``fp32``
leaves them as they are. ``optimizer_state_format=`` stores the optimizer's state (Adam's
moments, momentum) in a format after each step.

GEMM layers (Linear and conv modules, in ``model.modules()`` order) are the policy's layers for
its per-layer overrides; functional matmuls use the policy's default formats. Slow (every GEMM is
an emulated one) but exact: the values are :func:`precision_lab.gemm`'s bit for bit.

>>> import torch, precision_lab as pl, precision_lab.torch as plt
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> lin = torch.nn.Linear(8, 2, bias=False)
>>> x = torch.randn(3, 8)
>>> y = plt.simulate(lin, "mixed_bfloat16")(x)
>>> ref = pl.round_to(pl.gemm(x, lin.weight.detach().T, input_format="bf16",
...                           accumulator=pl.Accumulator()), "bf16")
>>> torch.equal(y, ref)
True
>>> sim = plt.simulate(lin, "te_mxfp8", seed=1)          # a training recipe
>>> torch.equal(sim(x), torch.from_numpy(pl.recipe_gemm(x, lin.weight.detach().T, "te_mxfp8",
...                                                     "forward", seed=1)))
True
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import TorchFunctionMode

from ..core import rounding as _rounding
from ..core.formats import FloatFormat, get_format
from ..core.rounding import check_options, is_stochastic
from ..core.rounding import round_to as _round_to
from ..gemm import Accumulator, gemm
from ..gemm.recipes import _check_accumulator
from ..gemm.reference import gemm_internal
from ..quant.recipes import RECIPES, Recipe, get_recipe
from ..scaling.fp8 import DelayedScaling, scale_from_amax
from ..training.policy import POLICIES, LayerPrecision, Policy, get_policy
from .attention import AttentionRecipe, fp8_attention, get_attention_recipe, torch_mha_body
from .casts import _as_matrices, _pairwise_column_sums, _squeezed
from .kv_cache import KVCache, KVQuant, get_kv_quant
from .ops import CONV_ND, EMULATED_OPS
from .recipes import recipe_matmul
from .rnn import RNN_OPS

__all__ = ["GemmSpec", "Simulated", "emulated_matmul", "simulate"]

_FP32: FloatFormat = get_format("fp32")  # type: ignore[assignment]
_GEMM_MODULES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
                 torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d,
                 torch.nn.RNNBase, torch.nn.RNNCellBase)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class GemmSpec:
    """How one emulated GEMM runs: operand formats (forward ``a``, ``b``; the backward format of
    the incoming gradient), the activation and gradient storage formats, the accumulator, and
    whether reductions run in FP32."""

    fa: FloatFormat
    fb: FloatFormat
    backward: FloatFormat
    activation: FloatFormat
    gradient: FloatFormat
    accumulator: Accumulator
    fp32_reductions: bool = True


#: round_to's options for the stores (round to nearest even, IEEE overflow, subnormals kept),
#: checked once
_NEAREST_EVEN = check_options("nearest_even", "ieee", "keep", None, None)


def _store(t: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """``t`` rounded to ``fmt`` (float32 tensor; fp32 keeps a float32 tensor as it is)."""
    t = t.detach()
    if t.dtype == torch.float32:
        if fmt is _FP32 or fmt == _FP32:
            return t
        if t.is_cpu and isinstance(fmt, FloatFormat):
            # round_to(t, fmt) through its backend router with the options checked once, on a
            # numpy view (no DLPack round trip): 20 to 60 us less per store, about 70 stores
            # per step of benchmarks/bench_simulate.py under mixed_bfloat16 (this Xeon)
            x = t.numpy()
            r = _rounding.route("round_to", x, fmt, _NEAREST_EVEN)
            if r is None:  # (the numpy reference serves)
                r = _round_to(x, fmt)
            return torch.from_numpy(r).to(torch.float32)
    r = _round_to(t.to(torch.float32) if t.dtype != torch.float64 else t, fmt)
    return torch.as_tensor(r).to(torch.float32)


def _pl_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    fa: FloatFormat,
    fb: FloatFormat,
    acc: Accumulator,
    c: torch.Tensor | None = None,
    sa: Any = None,
    sb: Any = None,
    store: FloatFormat | None = None,
) -> torch.Tensor:
    """``c + a @ b`` in FP32 through ``pl.gemm``; with ``store``, then stored in that format
    (``_store``'s bits; on the CPU without scales the GEMM kernel rounds as it writes)."""
    fmt: Any = fa if fa == fb else (fa, fb)
    kw: dict[str, Any] = {}
    if sa is not None:
        kw["scale_a"] = sa
    if sb is not None:
        kw["scale_b"] = sb
    a32 = a.detach().to(torch.float32)
    b32 = b.detach().to(torch.float32)
    c32 = None if c is None else c.detach().to(torch.float32)
    if not kw and a32.device.type == b32.device.type == "cpu" and (c32 is None or c32.is_cpu):
        # float32 CPU tensors as numpy views, formats and accumulator already resolved: the
        # package's internal entry (pl.gemm's bits, without its per-call checks)
        cn = None if c32 is None else c32.numpy()
        fused = store if isinstance(store, FloatFormat) else None
        r = gemm_internal(a32.numpy(), b32.numpy(), cn, fa, fb, acc, _FP32, store=fused)
        out = torch.from_numpy(r)
        return out if store is None or fused is not None else _store(out, store)
    r = gemm(a32, b32, c32, input_format=fmt, accumulator=acc, out_format="fp32", **kw)
    out = torch.as_tensor(r).to(torch.float32)
    return out if store is None else _store(out, store)


def _gemm_shape(a: torch.Tensor, b: torch.Tensor) -> torch.Size:
    """The shape of ``a @ b`` (batch dimensions broadcast; torch.broadcast_shapes took 35 us a
    call, so equal batch dimensions skip it)."""
    ba, bb = a.shape[:-2], b.shape[:-2]
    batch = ba if ba == bb else torch.broadcast_shapes(ba, bb)
    return torch.Size((*batch, a.shape[-2], b.shape[-1]))


def _sum_to_shape(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum the broadcast batch dimensions of ``g`` away (exact-order: torch's float32 sum; only
    used when an operand was broadcast over a batch)."""
    while g.dim() > len(shape):
        g = g.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdim=True)
    return g


class _Operand:
    """Per-tensor scaling of 8-bit GEMM operands (state per key: delayed scaling history)."""

    def __init__(self, policy: Policy) -> None:
        self.kind = policy.tensor_scaling.kind
        self.hist = policy.tensor_scaling.amax_history_len
        self.margin = policy.tensor_scaling.margin
        self.delayed: dict[Any, DelayedScaling] = {}

    def __call__(
        self, x: torch.Tensor, fmt: FloatFormat, key: Any, update: bool
    ) -> tuple[torch.Tensor, Any]:
        """``(operand, decode scale)``: ``x`` itself (the GEMM rounds it) or the scaled,
        saturated cast and ``1/s`` (float32) for 8-bit formats under per-tensor scaling."""
        if fmt.bits > 8 or self.kind == "none":
            return x, None
        xd = x.detach().to(torch.float32)
        amax = float(xd.abs().max()) if xd.numel() else 0.0
        if self.kind == "current":
            s = np.float32(scale_from_amax(amax, fmt))
        else:
            ds = self.delayed.get(key)
            if ds is None:
                ds = self.delayed[key] = DelayedScaling(fmt, self.hist, "max", self.margin)
            s = np.float32(ds.scale)
            if update:
                ds.update(amax)
        with np.errstate(over="ignore", invalid="ignore"):
            xs = xd * torch.tensor(float(s), dtype=torch.float32)
            q = torch.as_tensor(_round_to(xs, fmt, overflow="saturate")).to(torch.float32)
        return q, np.float32(np.float32(1.0) / s)


class _GemmFn(torch.autograd.Function):
    """``out = c + a @ b`` (a: (..., M, K), b: (..., K, N)) through ``pl.gemm``, see the module."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor | None,
        spec: GemmSpec,
        ops: _Operand | None,
        key: Any,
        update: bool,
    ) -> torch.Tensor:
        qa, sa = (a, None) if ops is None else ops(a, spec.fa, (key, "a"), update)
        qb, sb = (b, None) if ops is None else ops(b, spec.fb, (key, "b"), update)
        out = _pl_gemm(qa, qb, spec.fa, spec.fb, spec.accumulator, c, sa, sb, spec.activation)
        ctx.save_for_backward(qa.detach(), qb.detach())
        ctx.scales = (sa, sb)
        ctx.spec, ctx.ops, ctx.key = spec, ops, key
        ctx.shapes = (a.shape, b.shape, None if c is None else c.shape)
        ctx.dtypes = (a.dtype, b.dtype, None if c is None else c.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        qa, qb = ctx.saved_tensors
        sa, sb = ctx.scales
        spec: GemmSpec = ctx.spec
        gs = _store(g, spec.gradient)
        ops = ctx.ops
        qg, sg = (gs, None) if ops is None else ops(gs, spec.backward, (ctx.key, "g"), True)
        sa_shape, sb_shape, c_shape = ctx.shapes
        da = db = dc = None
        if ctx.needs_input_grad[0]:
            da = _grad_gemm(
                qg, qb.transpose(-1, -2), spec.backward, spec.fb, sg, sb, sa_shape, spec
            )
            da = da.to(ctx.dtypes[0])
        if ctx.needs_input_grad[1]:
            db = _grad_gemm(
                qa.transpose(-1, -2), qg, spec.fa, spec.backward, sa, sg, sb_shape, spec
            )
            db = db.to(ctx.dtypes[1])
        if c_shape is not None and ctx.needs_input_grad[2]:
            dc = _bias_grad(gs, c_shape, spec).to(ctx.dtypes[2])
        return da, db, dc, None, None, None, None


def _grad_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    fa: FloatFormat,
    fb: FloatFormat,
    sa: Any,
    sb: Any,
    shape: torch.Size,
    spec: GemmSpec,
) -> torch.Tensor:
    """An operand's gradient ``a @ b`` of ``shape``, stored in the gradient format: by the GEMM
    as it writes it, or after the sum over the dimensions its operand was broadcast along."""
    st = spec.gradient if _gemm_shape(a, b) == shape else None
    g = _pl_gemm(a, b, fa, fb, spec.accumulator, sa=sa, sb=sb, store=st)
    return g if st is not None else _store(_sum_to_shape(g, shape), spec.gradient)


@functools.lru_cache(maxsize=32)
def _pairwise_accumulator(fmt: FloatFormat) -> Accumulator:
    """``Accumulator(fmt, order="pairwise")``, built (and validated) once per format: a frozen
    model, shared by every bias gradient."""
    return Accumulator(fmt, order="pairwise")


def _bias_grad(gs: torch.Tensor, c_shape: torch.Size, spec: GemmSpec) -> torch.Tensor:
    """The gradient of a bias of shape ``c_shape`` (``(N,)`` or broadcastable): the sum of the
    stored gradient ``gs`` (..., M, N) over every broadcast dimension, as one ``pl.gemm`` of a
    ones row with the gradient rows, pairwise in FP32 (``reductions``) or the gradient format."""
    fmt = _FP32 if spec.fp32_reductions else spec.gradient
    acc = _pairwise_accumulator(fmt)
    m, n = gs.shape[-2], gs.shape[-1]
    if len(c_shape) == 1 and c_shape[0] == n:  # a Linear bias: sum over the rows
        rows = gs.reshape(-1, n)
        if fmt == _FP32:  # (the GEMM's bits in float32 additions, without a GEMM call)
            fast = _pairwise_column_sums(rows)
            if fast is not None:
                return _store(fast, spec.gradient)
        ones = torch.ones(1, rows.shape[0], dtype=torch.float32)
        s = _pl_gemm(ones, rows, spec.gradient, spec.gradient, acc)
        return _store(s.reshape(n), spec.gradient)
    if tuple(c_shape) == (m, 1) and gs.dim() == 2:  # a conv bias (O, 1): sum over the columns
        ones = torch.ones(n, 1, dtype=torch.float32)
        s = _pl_gemm(gs, ones, spec.gradient, spec.gradient, acc)
        return _store(s, spec.gradient)
    return _store(_sum_to_shape(gs, c_shape), spec.gradient)


def emulated_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    spec: GemmSpec,
    operands: Any = None,
    key: Any = None,
    update: bool = False,
) -> torch.Tensor:
    """``c + a @ b`` through :func:`precision_lab.gemm` with the formats of ``spec``,
    differentiable (see the module). ``a``: (..., M, K), ``b``: (..., K, N) (1-D operands as
    ``torch.matmul`` treats them); ``operands`` is the per-tensor scaling state of
    :class:`Simulated` (None: no scaling)."""
    a, b, squeeze = _as_matrices(a, b)
    out = _GemmFn.apply(a, b, c, spec, operands, key, update)
    return _squeezed(out, squeeze)


class _StoreFn(torch.autograd.Function):
    """Forward: round to the activation format; backward: round the gradient to the gradient
    format."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, act: FloatFormat, grad: FloatFormat) -> torch.Tensor:  # type: ignore[override]
        ctx.grad_fmt, ctx.in_dtype = grad, x.dtype
        return _store(x, act)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _store(g, ctx.grad_fmt).to(ctx.in_dtype), None, None


_SOFTMAX = {F.softmax, F.log_softmax, torch.softmax, torch.log_softmax,
            torch.Tensor.softmax, torch.Tensor.log_softmax}  # fmt: skip
_LOSSES = {F.cross_entropy, F.nll_loss}
_NORMS = {F.layer_norm, F.group_norm, F.batch_norm}
if hasattr(F, "rms_norm"):
    _NORMS.add(F.rms_norm)
_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
            torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.linalg.matmul}  # fmt: skip
_ADDMM = {torch.addmm, torch.Tensor.addmm}
#: operations that run GEMMs this module does not emulate: refused, never run silently in FP32
_NOT_EMULATED = {
    F.bilinear: "write it as matmuls",
    torch.conv_tbc: "write it as F.conv1d",
    torch.convolution: "call F.conv1d / F.conv2d",
    torch.linalg.multi_dot: "write it as a chain of matmuls",
    torch.chain_matmul: "write it as a chain of matmuls",
    torch.linalg.vecdot: "write it as (a * b).sum(-1) or a matmul",
    torch.cdist: "write it with matmuls",
}
_SPARSE: tuple[Any, ...] = (torch.smm, torch.sspaddmm, torch.hspmm, torch.sparse.mm,
                            torch.sparse.addmm, torch.sparse.sampled_addmm,
                            torch._sparse_sparse_matmul)  # fmt: skip
_SPARSE += tuple(getattr(torch, n) for n in ("dsmm", "hsmm", "spmm", "saddmm") if hasattr(torch, n))
_SPARSE += (torch.Tensor.smm, torch.Tensor.sspaddmm)
#: backend-specific and quantized kernels (ROCm MIOpen, fbgemm int8/fp16 linear, quantized RNN
#: cells): never emulated, refused
_BACKEND = [getattr(torch, n) for n in dir(torch)
            if n.startswith(("miopen_convolution", "miopen_depthwise", "miopen_rnn",
                             "fbgemm_linear", "quantized_lstm_cell", "quantized_gru_cell",
                             "quantized_rnn"))]  # fmt: skip
_FUSED: tuple[Any, ...] = (torch._transformer_encoder_layer_fwd,
                           torch._native_multi_head_attention, torch._addmm_activation)  # fmt: skip
_NOT_EMULATED.update(dict.fromkeys(_SPARSE, "sparse GEMMs are not emulated: use a dense matmul"))
_NOT_EMULATED.update(
    dict.fromkeys(_FUSED, "a fused GEMM: write it with nn.Linear and explicit attention")
)
_NOT_EMULATED.update(
    dict.fromkeys(_BACKEND, "a backend-specific or quantized kernel: use the float module")
)
#: in-place forms of the GEMMs (the emulated result would replace the tensor's own values)
for _name in ("addmm_", "baddbmm_", "addbmm_", "addmv_", "addr_"):
    _NOT_EMULATED[getattr(torch.Tensor, _name)] = "write it out of place (c = c + a @ b)"
#: every operation that runs a GEMM: with no floating-point tensor among its arguments (an
#: integer matmul) it runs as torch runs it, untouched
_GEMM_OPS = {F.linear, F.conv1d, F.conv2d, torch.Tensor.__rmatmul__, F.scaled_dot_product_attention,
             F.multi_head_attention_forward, *_MATMULS, *_ADDMM, *_NOT_EMULATED, *EMULATED_OPS,
             *RNN_OPS}  # fmt: skip


def _groups(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The ``groups`` argument of a convolution call (``F.convNd(input, weight, bias, stride,
    padding, dilation, groups)``)."""
    return int(kwargs.get("groups", args[6] if len(args) > 6 else 1))


def _any_float(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a floating-point (or complex) tensor is among the arguments (lists included)."""
    stack = [*args, *kwargs.values()]
    while stack:
        a = stack.pop()
        if isinstance(a, torch.Tensor):
            if a.is_floating_point() or a.is_complex():
                return True
        elif isinstance(a, list | tuple):
            stack.extend(a)
    return False


class _Mode(TorchFunctionMode):
    def __init__(self, sim: Simulated) -> None:
        super().__init__()
        self.sim = sim

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        sim = self.sim
        if func in _GEMM_OPS and not _any_float(args, kwargs):
            return func(*args, **kwargs)  # integer GEMMs are exact in torch: not emulated
        if func is F.linear:
            return sim._linear(*args, **kwargs)
        if func in EMULATED_OPS:
            return EMULATED_OPS[func](sim, *args, **kwargs)
        if func in RNN_OPS:
            return RNN_OPS[func](sim, *args, **kwargs)
        if func is F.multi_head_attention_forward:
            return sim._mha(*args, **kwargs)
        if func in (F.conv1d, F.conv2d):
            if _groups(args, kwargs) != 1:
                return CONV_ND[func](sim, *args, **kwargs)
            return sim._conv(func, *args, **kwargs)
        if func is torch.Tensor.__rmatmul__:
            return sim._matmul(args[1], args[0])
        if func in _MATMULS:
            return sim._matmul(*args, **kwargs)
        if func in _ADDMM:
            return sim._addmm(*args, **kwargs)
        if func in _NOT_EMULATED:
            name = getattr(func, "__name__", str(func))
            raise NotImplementedError(
                f"simulate: {name} runs a GEMM that is not emulated: {_NOT_EMULATED[func]}"
            )
        if func is F.scaled_dot_product_attention:
            return sim._sdpa(*args, **kwargs)
        out = func(*args, **kwargs)
        if func in _SOFTMAX:
            return sim._after("softmax", out)
        if func in _LOSSES:
            return sim._after("cross_entropy", out)
        if func in _NORMS:
            return sim._after(None, out)
        return out


#: the live simulations that store their parameters after every optimizer step
#: (``variable_format``, ``optimizer_state_format``). One global torch hook serves them all: a
#: weak set, so a collected simulation simply drops out. (A hook per simulation, removed by a
#: finalizer, broke torch: the garbage collector could run that finalizer while another
#: optimizer's step was iterating over the global hooks, "OrderedDict mutated during
#: iteration".)
_STORING: weakref.WeakSet[Simulated] = weakref.WeakSet()
_STORE_HOOK: list[Any] = []


def _store_after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for sim in list(_STORING):
        sim.store_parameters(optimizer)


def _storing_after_steps(sim: Simulated) -> None:
    """Store ``sim``'s parameters after every optimizer step from now on (until it is removed
    or collected)."""
    _STORING.add(sim)
    if not _STORE_HOOK:
        _STORE_HOOK.append(register_optimizer_step_post_hook(_store_after_step))


class Simulated(torch.nn.Module):
    """``module`` run under ``policy`` (see the module docstring); ``accumulator`` overrides the
    policy's. The wrapped model's parameters are its own (the optimizer takes
    ``simulated.parameters()`` or ``model.parameters()``, the same tensors).

    ``trace``: set to a list to record ``(kind, layer, compute format, accumulator)`` of each
    emulated GEMM in the forward pass.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        policy: str | Policy | Recipe = "float32",
        *,
        accumulator: Accumulator | None = None,
        seed: int = 0,
        attention: str | AttentionRecipe | None = None,
        variable_rounding: str = "nearest_even",
        optimizer_state_format: str | FloatFormat | None = None,
        kv_cache: str | KVQuant | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(module).__name__}")
        _check_accumulator(accumulator)
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
            raise TypeError(f"seed must be an int in [0, 2**64), got {seed!r}")
        if not 0 <= int(seed) < 1 << 64:
            raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
        self.module = module
        #: the quantization given to the KVCache arguments of forward that have none
        self.kv_cache: KVQuant | None = None if kv_cache is None else get_kv_quant(kv_cache)
        #: the recipe whose roles every GEMM follows (None: the policy's formats)
        self.recipe: Recipe | None = None
        if isinstance(policy, Recipe) or (isinstance(policy, str) and policy in RECIPES):
            self.recipe = get_recipe(policy)
            policy = "float32"
            if attention is None:  # the recipe's own attention casts, if it names them
                attention = self.recipe.attention
        elif isinstance(policy, str) and policy not in POLICIES:
            raise ValueError(
                f"policy: unknown name {policy!r}; known policies: {', '.join(POLICIES)}; "
                f"known recipes: {', '.join(RECIPES)}"
            )
        self.policy = get_policy(policy)
        #: the attention recipe of scaled_dot_product_attention and multi_head_attention_forward
        #: (None: their math definition under the policy or recipe)
        self.attention: AttentionRecipe | None = (
            None if attention is None else get_attention_recipe(attention)
        )
        #: under a recipe: the accumulator replacing every role's (None: the recipe's)
        self.recipe_accumulator = accumulator
        acc = accumulator if accumulator is not None else self.policy.accumulator
        self.accumulator = acc if acc is not None else Accumulator()
        #: the base seed of a recipe's stochastic rounding and Hadamard signs
        self.seed = int(seed)
        #: training steps taken under a recipe (forward passes in training mode with grad on)
        self.step = 0
        self._recipe_calls = 0
        self.gemm_layers = [m for m in module.modules() if isinstance(m, _GEMM_MODULES)]
        self._layer_of = {id(m): i for i, m in enumerate(self.gemm_layers)}
        self._current: list[int] = []
        self.operands = _Operand(self.policy)
        self.trace: list[tuple[str, int | None, str, str]] | None = None
        self._hooks = []
        for m in self.gemm_layers:
            self._hooks.append(m.register_forward_pre_hook(self._enter))
            self._hooks.append(m.register_forward_hook(self._leave))
        self._matmul_calls = 0
        #: the policy's variable_format: the parameters are stored in it (None: fp32, as they are)
        var = get_format(self.policy.variable_format)
        self.variable_format: FloatFormat | None = None if var == _FP32 else var  # type: ignore[assignment]
        check_options(variable_rounding, "ieee", "keep", 0, None)  # a known rounding mode
        #: the rounding of the parameters' stores to variable_format (stochastic: seeded by
        #: ``seed``, the optimizer step and the parameter's index)
        self.variable_rounding = variable_rounding
        #: the format the optimizer's floating-point state is stored in after each step (None:
        #: as the optimizer keeps it)
        self.optimizer_state_format: FloatFormat | None = None
        if optimizer_state_format is not None:
            f = get_format(optimizer_state_format, name="optimizer_state_format")
            if not isinstance(f, FloatFormat):
                raise ValueError(f"optimizer_state_format: expected a floating-point format, "
                                 f"got {optimizer_state_format!r}")  # fmt: skip
            self.optimizer_state_format = f
        self._stores = 0
        if self.variable_format is not None or self.optimizer_state_format is not None:
            self.store_parameters()
            _storing_after_steps(self)

    def store_parameters(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Round the model's floating-point parameters (those ``optimizer`` updates, if given)
        in place to the policy's ``variable_format`` with ``variable_rounding`` (default round
        to nearest even, as the numpy training emulation stores its master weights,
        ``precision_lab.training.model.Numerics.store``; ``"stochastic"`` as its ``bf16_sr``
        weight update, the random words keyed by ``seed``, the store's count and the
        parameter's index in ``model.parameters()``), and, given an optimizer and an
        ``optimizer_state_format``, its floating-point state tensors (Adam's moments, SGD's
        momentum; not the step count) to that format, round to nearest even. :func:`simulate`
        calls it at the start and after every ``optimizer.step()`` (a global optimizer step
        hook, removed by :meth:`remove`), so the weights live in ``variable_format`` as under
        Keras' variable dtype. What is rounded is the optimizer's float32 result ``fl32(w +
        delta)``, not the exact sum (the numpy path rounds the exact sum: the two differ only
        where the float32 rounding of the sum moves it across a rounding boundary of
        ``variable_format``, i.e. for round to nearest when ``fl32(w + delta)`` lands on a
        midpoint; inferred, not measured)."""
        fmt = self.variable_format
        params = list(enumerate(self.module.parameters()))
        if optimizer is not None:
            ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
            params = [(i, p) for i, p in params if id(p) in ids]
        with torch.no_grad():
            if fmt is not None:
                for i, p in params:
                    if not p.is_floating_point():
                        continue
                    seed = None
                    if is_stochastic(self.variable_rounding):
                        key = repr((self.seed, self._stores, i)).encode()
                        seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
                    x = p.detach().to(torch.float32 if p.dtype != torch.float64 else p.dtype)
                    r = _round_to(x, fmt, rounding=self.variable_rounding, seed=seed)
                    p.copy_(torch.as_tensor(r).to(device=p.device, dtype=p.dtype))
                self._stores += 1
            sf = self.optimizer_state_format
            if optimizer is not None and sf is not None:
                for _, p in params:
                    for t in optimizer.state.get(p, {}).values():
                        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim():
                            t.copy_(_store(t, sf).to(device=t.device, dtype=t.dtype))

    # ----- layer bookkeeping -------------------------------------------------------------------
    def _enter(self, m: torch.nn.Module, inputs: Any) -> None:
        self._current.append(self._layer_of[id(m)])

    def _leave(self, m: torch.nn.Module, inputs: Any, output: Any) -> None:
        self._current.pop()

    def layer_precision(self, layer: int | None) -> LayerPrecision:
        """The formats of GEMM layer ``layer`` (None: the policy's defaults)."""
        if layer is None or not self.gemm_layers:
            p = self.policy
            names = ("compute_format", "backward_format", "activation_format", "gradient_format")
            fs = [get_format(getattr(p, n)) for n in names]
            assert all(isinstance(f, FloatFormat) for f in fs)  # Policy checks its formats
            return LayerPrecision(*fs)  # type: ignore[arg-type]
        return self.policy.layer(layer, len(self.gemm_layers))

    def spec(self, layer: int | None) -> GemmSpec:
        """The :class:`GemmSpec` of GEMM layer ``layer`` (None: a functional matmul)."""
        L = self.layer_precision(layer)
        return GemmSpec(
            fa=L.compute,
            fb=L.compute,
            backward=L.backward,
            activation=L.activation,
            gradient=L.gradient,
            accumulator=self.accumulator,
            fp32_reductions=self.policy.runs_in_fp32("reductions"),
        )

    def _layer(self) -> int | None:
        return self._current[-1] if self._current else None

    def _update(self) -> bool:
        return bool(self.training and torch.is_grad_enabled())

    def _record(self, kind: str, spec: GemmSpec) -> None:
        if self.trace is not None:
            self.trace.append((kind, self._layer(), str(spec.fa), spec.accumulator.describe()))

    def gemm_seed(self, index: int, step: int | None = None) -> int:
        """Under a recipe: the seed :func:`precision_lab.apply_recipe` would take for the
        ``index``-th emulated GEMM (0-based, in call order) of a forward pass at ``step``
        (default: the current :attr:`step`): ``seed + 2**32 * step + 16 * index``. Its roles
        use ``+ 0`` (forward), ``+ 4`` (dgrad) and ``+ 8`` (wgrad), and the second operand of a
        role one more for its stochastic rounding."""
        t = self.step if step is None else step
        return self.seed + (int(t) << 32) + 16 * int(index)

    def _recipe_gemm(
        self, kind: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None
    ) -> torch.Tensor:
        """``c + a @ b`` under the recipe (``a`` the layer input, ``b`` the transposed
        weight); ``c`` a bias ``(N,)`` (the recipe GEMM's epilogue) or anything else torch adds
        in float32."""
        assert self.recipe is not None
        seed = self.gemm_seed(self._recipe_calls)
        self._recipe_calls += 1
        if self.trace is not None:
            acc = self.recipe_accumulator
            self.trace.append(
                (kind, self._layer(), self.recipe.name, "recipe" if acc is None else acc.describe())
            )
        n = b.shape[-1] if b.dim() > 1 else 1
        bias = c if c is not None and c.dim() == 1 and c.shape[0] == n and b.dim() > 1 else None
        out = recipe_matmul(a, b, self.recipe, bias=bias, seed=seed,
                            accumulator=self.recipe_accumulator)  # fmt: skip
        if c is not None and bias is None:
            out = out + c
        return out

    # ----- the emulated operations --------------------------------------------------------------
    def _linear(
        self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.recipe is not None:
            return self._recipe_gemm("linear", input, weight.t(), bias)
        layer = self._layer()
        spec = self.spec(layer)
        self._record("linear", spec)
        key = ("linear", layer if layer is not None else id(weight))
        lead = input.shape[:-1]
        x2 = input.reshape(-1, input.shape[-1]) if input.dim() != 2 else input
        out = emulated_matmul(
            x2, weight.t(), bias, spec=spec, operands=self.operands, key=key,
            update=self._update(),
        )  # fmt: skip
        return out.reshape(*lead, weight.shape[0]) if input.dim() != 2 else out

    def _matmul(
        self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, **kw: Any
    ) -> torch.Tensor:
        if kw.get("out") is not None:
            raise NotImplementedError("simulate: matmul with out= is not emulated")
        if self.recipe is not None:
            return self._recipe_gemm("matmul", a, b, c)
        spec = self.spec(self._layer())
        self._record("matmul", spec)
        # each functional matmul of a forward pass has its own per-tensor scaling state
        self._matmul_calls += 1
        key = ("matmul", self._layer(), self._matmul_calls)
        return emulated_matmul(a, b, c, spec=spec, operands=self.operands, key=key,
                               update=self._update())  # fmt: skip

    def _addmm(
        self,
        c: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        *,
        beta: float = 1,
        alpha: float = 1,
        out: Any = None,
    ) -> torch.Tensor:
        if beta != 1 or alpha != 1 or out is not None:
            raise NotImplementedError("simulate: addmm with beta, alpha or out= is not emulated")
        return self._matmul(a, b, c)

    def _conv(
        self,
        func: Callable[..., Any],
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> torch.Tensor:
        if groups != 1:
            raise NotImplementedError(f"simulate: grouped convolutions (groups={groups})")
        one_d = func is F.conv1d
        if one_d:
            input, weight = input.unsqueeze(-2), weight.unsqueeze(-2)
            stride, padding, dilation = (
                (1, _one(stride)),
                padding if isinstance(padding, str) else (0, _one(padding)),
                (1, _one(dilation)),
            )
        batched = input.dim() == 4
        if not batched:
            input = input.unsqueeze(0)
        kh, kw = weight.shape[-2:]
        st, dl = _pair(stride), _pair(dilation)
        if isinstance(padding, str):
            if padding == "valid":
                pd = (0, 0)
            elif padding == "same":
                tot = [dl[i] * (k - 1) for i, k in enumerate((kh, kw))]
                if any(t % 2 for t in tot) or st != (1, 1):
                    raise NotImplementedError("simulate: padding='same' with uneven padding")
                pd = (tot[0] // 2, tot[1] // 2)
            else:
                raise ValueError(f"padding must be 'same', 'valid' or numbers, got {padding!r}")
        else:
            pd = _pair(padding)
        n, _, h, w = input.shape
        oh = (h + 2 * pd[0] - dl[0] * (kh - 1) - 1) // st[0] + 1
        ow = (w + 2 * pd[1] - dl[1] * (kw - 1) - 1) // st[1] + 1
        cols = F.unfold(input, (kh, kw), dilation=dl, padding=pd, stride=st)  # (N, C*kh*kw, L)
        o = weight.shape[0]
        if self.recipe is not None:  # a linear layer on the patches: (N*L, K) @ (K, O)
            patches = cols.transpose(1, 2).reshape(-1, cols.shape[1])
            y = self._recipe_gemm("conv", patches, weight.reshape(o, -1).t(), bias)
            out = y.reshape(n, oh * ow, o).transpose(1, 2).reshape(n, o, oh, ow)
            if not batched:
                out = out.squeeze(0)
            return out.squeeze(-2) if one_d else out
        layer = self._layer()
        spec = self.spec(layer)
        self._record("conv", spec)
        w2 = weight.reshape(o, -1)  # (O, C*kh*kw)
        # one GEMM over the whole batch: (O, K) @ (K, N*L)
        cols2 = cols.transpose(0, 1).reshape(cols.shape[1], -1)
        c = None if bias is None else bias.reshape(-1, 1)
        out = emulated_matmul(
            w2, cols2, c, spec=spec, operands=self.operands,
            key=("conv", layer if layer is not None else id(weight)), update=self._update(),
        )  # fmt: skip
        out = out.reshape(o, n, oh, ow).transpose(0, 1)
        if not batched:
            out = out.squeeze(0)
        if one_d:
            out = out.squeeze(-2)
        return out

    def _conv_gemm(
        self, w: torch.Tensor, cols: torch.Tensor, c: torch.Tensor | None, weight: torch.Tensor
    ) -> torch.Tensor:
        """A convolution's GEMM ``c + w @ cols`` (batched over groups, see
        :mod:`precision_lab.torch.ops`) in the current layer's formats (a batch of one group is
        the 2-D GEMM)."""
        layer = self._layer()
        spec = self.spec(layer)
        self._record("conv", spec)
        one = w.dim() == 3 and w.shape[0] == 1
        if one:
            w, cols = w[0], cols[0]
            c = None if c is None else c[0]
        out = emulated_matmul(
            w, cols, c, spec=spec, operands=self.operands,
            key=("conv", layer if layer is not None else id(weight)), update=self._update(),
        )  # fmt: skip
        return out.unsqueeze(0) if one else out

    def _mha(self, *args: Any, **kwargs: Any) -> Any:
        """``F.multi_head_attention_forward``: torch's own body with its GEMMs emulated (see
        :mod:`.attention`)."""
        if self.attention is not None:
            need = kwargs.get("need_weights", args[15] if len(args) > 15 else True)
            if need:
                raise NotImplementedError(
                    "simulate: multi_head_attention_forward with need_weights=True under an "
                    "attention recipe (FP8 attention never forms the normalised weights): "
                    "call the module with need_weights=False"
                )
        with _Mode(self):
            return torch_mha_body()(*args, **kwargs)

    def _attn_matmul(
        self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, spec: GemmSpec
    ) -> torch.Tensor:
        self._record("attention", spec)
        return emulated_matmul(a, b, c, spec=spec)

    def _sdpa(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        """``F.scaled_dot_product_attention`` as its math definition: two emulated GEMMs and a
        softmax under the ``softmax`` rule."""
        if enable_gqa:  # grouped-query attention: each key/value head serves q's group of heads
            rep = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
        if self.attention is not None:
            if dropout_p > 0:
                raise NotImplementedError("simulate: attention dropout under an attention recipe")
            return fp8_attention(
                q, k, v, attn_mask, recipe=self.attention, is_causal=is_causal, scale=scale,
                accumulator=self.attention.accumulator or self.accumulator,
                matmul=self._attn_matmul,
            )  # fmt: skip
        n_q, n_k = q.shape[-2], k.shape[-2]
        sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        s = self._matmul(q, k.transpose(-2, -1)) * sc
        if is_causal:
            keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(~keep, float("-inf"))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                s = s.masked_fill(~attn_mask, float("-inf"))
            else:
                s = s + attn_mask
        p = self._after("softmax", torch.softmax(s, dim=-1))
        if dropout_p > 0:
            p = F.dropout(p, dropout_p, training=True)
        return self._matmul(p, v)

    def _after(self, rule: str | None, out: Any) -> Any:
        """The result of a non-GEMM operation: kept in float32 when ``rule`` is in the FP32
        list, else stored in the activation format (gradient: the gradient format)."""
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        if rule is not None and self.policy.runs_in_fp32(rule):
            return out
        L = self.layer_precision(None)
        return _StoreFn.apply(out, L.activation, L.gradient)

    # ----- running -----------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped model's forward, with the emulated operations."""
        self._current = []
        self._matmul_calls = 0
        self._recipe_calls = 0
        if self.kv_cache is not None:
            for a in (*args, *kwargs.values()):
                if isinstance(a, KVCache) and a.quant is None:
                    a.quant = self.kv_cache
        with _Mode(self):
            out = self.module(*args, **kwargs)
        if self.recipe is not None and self._update():
            self.step += 1
        return out

    def remove(self) -> torch.nn.Module:
        """Remove the layer hooks (and the stores after optimizer steps of ``variable_format``);
        returns the wrapped model."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        _STORING.discard(self)
        return self.module

    def extra_repr(self) -> str:
        if self.recipe is not None:
            acc = self.recipe_accumulator
            return (
                f"recipe={self.recipe.name!r}, accumulator="
                f"{'the recipe' if acc is None else acc.describe()!r}, seed={self.seed}"
            )
        extra = "" if self.attention is None else f", attention={self.attention.name!r}"
        return f"policy={self.policy.name!r}, accumulator={self.accumulator.describe()!r}{extra}"


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    t = tuple(int(i) for i in v)
    return (t[0], t[0]) if len(t) == 1 else (t[0], t[1])


def _one(v: Any) -> int:
    return int(v) if isinstance(v, int) else int(next(iter(v)))


def simulate(
    model: torch.nn.Module,
    policy: str | Policy | Recipe = "float32",
    *,
    accumulator: Accumulator | None = None,
    seed: int = 0,
    attention: str | AttentionRecipe | None = None,
    variable_rounding: str = "nearest_even",
    optimizer_state_format: str | FloatFormat | None = None,
    kv_cache: str | KVQuant | None = None,
) -> Simulated:
    """``model`` with its GEMMs emulated under ``policy``: a :class:`~precision_lab.Policy` or a
    name of :data:`~precision_lab.POLICIES`, or a training recipe, a
    :class:`~precision_lab.Recipe` or a name of :data:`~precision_lab.quant.recipes.RECIPES`
    (see the module docstring). ``accumulator`` overrides the policy's, or every role's of the
    recipe; ``seed`` (an int in [0, 2**64)) seeds a recipe's stochastic rounding and Hadamard
    signs (:meth:`Simulated.gemm_seed`) and the stochastic stores of ``variable_rounding``.
    ``attention`` (an :class:`~precision_lab.torch.attention.AttentionRecipe` or a name of
    :data:`~precision_lab.torch.attention.ATTENTION_RECIPES`, e.g. ``"fa3_fp8"``) runs
    ``scaled_dot_product_attention`` (and ``multi_head_attention_forward`` with
    ``need_weights=False``) as FP8 attention; without it, a recipe's own ``attention`` field
    does (:class:`~precision_lab.Recipe`). ``variable_rounding`` rounds the parameters' stores
    to ``variable_format``; ``optimizer_state_format`` stores the optimizer's state in a format
    after each step (:meth:`Simulated.store_parameters`); ``kv_cache`` (a
    :class:`~precision_lab.torch.kv_cache.KVQuant` or a name of
    :data:`~precision_lab.torch.kv_cache.KV_CACHE_PRESETS`) quantizes the
    :class:`~precision_lab.torch.kv_cache.KVCache` arguments of forward. Returns a
    :class:`Simulated` module sharing ``model``'s parameters."""
    if isinstance(policy, str | Policy | Recipe):
        return Simulated(
            model, policy, accumulator=accumulator, seed=seed, attention=attention,
            variable_rounding=variable_rounding, optimizer_state_format=optimizer_state_format,
            kv_cache=kv_cache,
        )  # fmt: skip
    raise TypeError(
        f"policy must be a Policy, a Recipe, or a policy or recipe name, got "
        f"{type(policy).__name__}"
    )
