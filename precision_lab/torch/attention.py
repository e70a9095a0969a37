"""Attention under emulation: ``nn.MultiheadAttention``'s functional form, FP8 attention as
FlashAttention-3 runs it, and how much of the probability matrix ``P`` an FP8 cast loses.

**multi_head_attention_forward.** :func:`~precision_lab.torch.simulate` runs torch's own
``F.multi_head_attention_forward`` (so ``nn.MultiheadAttention`` and the ``nn.Transformer*``
layers, packed or separate projection weights, ``bias_k`` / ``bias_v``, ``add_zero_attn``, key
padding and attention masks, ``need_weights``, ``is_causal``) with its GEMMs intercepted: the
function's body is executed (:func:`torch_mha_body`: the same code object, with the
``has_torch_function`` test that would hand the call back to the mode answered False) under the
simulation's mode, so its in-projection (``F.linear``, packed or three), ``q @ k^T``
(``torch.bmm`` / ``torch.baddbmm`` with the mask as addend when ``need_weights``, else
``F.scaled_dot_product_attention``), ``softmax``, ``P @ V`` and out-projection are the emulated
operations, in the order and with the reshapes torch's implementation uses.

**FP8 attention** (:class:`AttentionRecipe`, ``simulate(model, policy, attention="fa3_fp8")``):
:func:`fp8_attention` runs ``scaled_dot_product_attention`` (and so
``multi_head_attention_forward`` with ``need_weights=False``, the ``nn.Transformer*`` layers'
call) as FlashAttention-3's FP8 forward does (published: FA3's ``hopper/softmax.h``
``scale_apply_exp2`` / ``Softmax::finalize`` and ``flash_fwd_kernel_sm90.h``, read for this
module):

1. ``Q``, ``K``, ``V`` cast to the ``q`` / ``k`` / ``v`` formats (E4M3) with per-tensor scales
   (``scaling="current"``: ``fmt.max / amax``, Transformer Engine's rule; FA3 takes the
   ``q_descale`` / ``k_descale`` / ``v_descale`` the caller computed), saturating;
2. ``S = Q K^T`` one emulated GEMM (the ``accumulator``, FP32 by default; a
   :func:`~precision_lab.tensor_core` preset such as ``("h100", "e4m3")`` models the wgmma);
3. per query row, over key blocks of ``block_n`` columns (None: one block) in FA3's order
   (``reverse=True``: the last block first), the online softmax in float32: the running row
   maximum ``m`` of the raw ``S``; ``x = S * sl2 - (m * sl2 - max_offset)`` with ``sl2 =
   softmax_scale * log2(e) * q_descale * k_descale`` (one rounding: FA3's FFMA), ``P = exp2(x)``,
   so ``P`` lies in ``(0, 2**max_offset]`` (FA3's ``Max_offset = 8`` for FP8: a static scale of
   256 on P); the running sum ``l`` adds the float32 ``P`` (before its cast); the accumulator of
   ``O`` is rescaled by ``exp2((m_old - m) * sl2)`` when the maximum grows;
4. ``P`` cast to the ``p`` format (round to nearest even, saturating), then ``O += P8 @ V8``:
   one emulated GEMM per block with the rescaled accumulator as its addend (``pl.gemm``'s ``c``);
5. ``O = acc * ((1 / l) * v_descale)`` (a row whose ``l`` is 0 gives 0), stored in ``out``.

``exp2`` is evaluated in float64 and rounded to float32 (inferred: the GPU's ``ex2.approx`` is
within 2 ulp; the emulation is FA3's algorithm, not its last bits). A boolean mask or
``is_causal`` sets masked scores to ``-inf`` (FA3's masking); a float additive mask (what
``multi_head_attention_forward`` passes) is added to ``x`` as ``mask * log2(e)`` (FA3 has none:
an extension), ``-inf`` entries masking. Backward: autograd through the same steps (casts
straight-through, the maximum a constant), the GEMMs' backward operands ``dO`` (of ``P V``)
and ``dS`` (of ``Q K^T``) in the ``do`` / ``ds`` formats, unscaled (FA3 has no FP8 backward;
None: FP32).

**P underflow** (:func:`p_underflow`, :func:`p_underflow_threshold`): with the static scale
``s = 2**max_offset`` and round to nearest even, an entry of ``P = s * exp(score - m)`` becomes 0
exactly when ``s * exp(-(m - score)) <= fmt.smallest_subnormal / 2`` (a tie goes to the even
0), i.e. when the gap ``m - score`` (natural-log units, after the softmax scale) is at least
``Delta_c = ln(s) - ln(smallest_subnormal / 2)``; for E4M3 ``ln(2**10) + ln s = 6.93 + ln s``
(12.48 for s = 256). This reproduces the closed-form threshold of Lau, "P-Cast Precision in FP8
Attention" (arXiv 2606.06521: ``Delta_c = 6.93 + ln S - delta_k``; read from its abstract: the
paper's body was not available here), whose ``delta_k`` is the expected maximum of the
``k_sink`` sink scores above the sink strength ``Delta``: with forward KV iteration the running
maximum after the sink block is about ``Delta + delta_k``, so a fraction
``Phi(Delta + delta_k - Delta_c')`` (``Delta_c' = 6.93 + ln s``) of standard-normal non-sink
scores underflows (:func:`p_collapse_prediction`); with reverse iteration the non-sink blocks
are cast against their own maximum first. tests/torch/test_attention.py measures both.

>>> import torch, precision_lab.torch as plt
>>> round(plt.attention.p_underflow_threshold("e4m3", max_offset=8), 4)
12.4766
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..core.formats import FloatFormat, get_format
from ..core.rounding import round_to as _np_round_to
from ..gemm import Accumulator
from ..scaling.fp8 import scale_from_amax
from .casts import round_to as _cast

__all__ = [
    "ATTENTION_RECIPES",
    "AttentionRecipe",
    "PUnderflow",
    "fp8_attention",
    "get_attention_recipe",
    "p_collapse_prediction",
    "p_underflow",
    "p_underflow_threshold",
    "torch_mha_body",
]

_LOG2E = 1.4426950408889634


# ----- multi_head_attention_forward ------------------------------------------------------------
_MHA_BODY: Any = None


def torch_mha_body() -> Any:
    """torch's ``F.multi_head_attention_forward`` without its ``__torch_function__`` hand-off:
    the same code object and defaults, with ``has_torch_function`` answering False, so that
    under a ``TorchFunctionMode`` its inner operations (linear, bmm, baddbmm, softmax,
    scaled_dot_product_attention) reach the mode one by one."""
    global _MHA_BODY
    if _MHA_BODY is None:
        f = F.multi_head_attention_forward
        if "has_torch_function" not in f.__code__.co_names:  # pragma: no cover - torch changed
            raise NotImplementedError(
                "simulate: this torch's multi_head_attention_forward has no has_torch_function "
                "test to bypass; it cannot be emulated"
            )
        g = dict(f.__globals__)
        g["has_torch_function"] = lambda *_: False
        body = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
        body.__kwdefaults__ = f.__kwdefaults__
        _MHA_BODY = body
    return _MHA_BODY


# ----- recipes ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AttentionRecipe:
    """Where attention casts, as GEMM roles: ``q``, ``k``, ``v`` (the operands of ``Q K^T`` and
    ``P V``), ``p`` (the probabilities, cast with the static scale ``2**max_offset``), ``do`` and
    ``ds`` (the backward operands ``dO`` and ``dS``; None: FP32), ``out`` (the stored output);
    ``scaling`` of ``q``/``k``/``v`` (``"current"``: per-tensor ``fmt.max / amax``; ``"none"``:
    cast unscaled), the ``accumulator`` of both GEMMs (None: the simulation's), the key block
    ``block_n`` of the online softmax (None: one block) and its iteration order ``reverse``.

    >>> get_attention_recipe("fa3_fp8").p, get_attention_recipe("fa3_fp8").max_offset
    ('e4m3', 8)
    """

    name: str
    q: str = "e4m3"
    k: str = "e4m3"
    v: str = "e4m3"
    p: str = "e4m3"
    do: str | None = None
    ds: str | None = None
    out: str = "bf16"
    max_offset: int = 8
    scaling: str = "current"
    accumulator: Accumulator | None = None
    block_n: int | None = None
    reverse: bool = True
    source: str = ""

    def __post_init__(self) -> None:
        for role in ("q", "k", "v", "p", "out", "do", "ds"):
            v = getattr(self, role)
            if v is None and role in ("do", "ds"):
                continue
            f = get_format(v, name=role) if isinstance(v, str) else None
            if not isinstance(f, FloatFormat):
                raise ValueError(f"{role}: expected a floating-point format name, got {v!r}")
        if self.scaling not in ("current", "none"):
            raise ValueError(f"scaling must be 'current' or 'none', got {self.scaling!r}")
        if isinstance(self.max_offset, bool) or not isinstance(self.max_offset, int):
            raise TypeError(f"max_offset must be an int, got {self.max_offset!r}")
        if self.block_n is not None and (
            isinstance(self.block_n, bool) or not isinstance(self.block_n, int) or self.block_n < 1
        ):
            raise ValueError(f"block_n must be a positive int or None, got {self.block_n!r}")
        if self.accumulator is not None and not isinstance(self.accumulator, Accumulator):
            raise TypeError(f"accumulator must be a precision_lab.Accumulator or None, got "
                            f"{self.accumulator!r}")  # fmt: skip


#: named attention recipes
ATTENTION_RECIPES: dict[str, AttentionRecipe] = {
    "fa3_fp8": AttentionRecipe(
        "fa3_fp8",
        source="FlashAttention-3 FP8 forward (Dao-AILab/flash-attention hopper/: Max_offset=8, "
        "descales folded into softmax_scale_log2, row sum of the FP32 P, reverse KV order)",
    ),
    "fa3_fp8_forward_order": AttentionRecipe(
        "fa3_fp8_forward_order",
        reverse=False,
        source="fa3_fp8 iterating the key blocks first to last (arXiv 2606.06521's 'forward')",
    ),
    "fp8_p_unscaled": AttentionRecipe(
        "fp8_p_unscaled",
        max_offset=0,
        source="fa3_fp8 with P cast unscaled (S = 1: P in (0, 1])",
    ),
}


def get_attention_recipe(recipe: str | AttentionRecipe) -> AttentionRecipe:
    """A recipe by name (:data:`ATTENTION_RECIPES`) or the recipe itself."""
    if isinstance(recipe, AttentionRecipe):
        return recipe
    if isinstance(recipe, str) and recipe in ATTENTION_RECIPES:
        return ATTENTION_RECIPES[recipe]
    raise ValueError(f"attention: unknown recipe {recipe!r}; known: {', '.join(ATTENTION_RECIPES)}")


# ----- FP8 attention ---------------------------------------------------------------------------
def _scaled_cast(x: torch.Tensor, fmt: FloatFormat, scaling: str) -> tuple[torch.Tensor, float]:
    """``(x * s cast to fmt, 1/s)`` (straight-through gradient)."""
    if scaling == "none":
        return _cast(x.to(torch.float32), fmt, overflow="saturate"), 1.0
    amax = float(x.detach().abs().max()) if x.numel() else 0.0
    s = np.float32(scale_from_amax(amax, fmt))
    q = _cast(x.to(torch.float32) * float(s), fmt, overflow="saturate")
    return q, float(np.float32(1.0) / s)


def _ffma_exp2(s: torch.Tensor, sl2: float, max_scaled: torch.Tensor) -> torch.Tensor:
    """``exp2(fl32(s * sl2 - max_scaled))`` in float32 (the product exact in float64)."""
    x = (s.to(torch.float64) * sl2 - max_scaled.to(torch.float64)).to(torch.float32)
    return torch.exp2(x.to(torch.float64)).to(torch.float32)


def fp8_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    recipe: str | AttentionRecipe = "fa3_fp8",
    is_causal: bool = False,
    scale: float | None = None,
    accumulator: Accumulator | None = None,
    matmul: Any = None,
) -> torch.Tensor:
    """``scaled_dot_product_attention(q, k, v, attn_mask, is_causal=, scale=)`` as
    FlashAttention-3's FP8 forward computes it under ``recipe`` (see the module): ``q``
    ``(..., Lq, D)``, ``k`` ``(..., Lk, D)``, ``v`` ``(..., Lk, Dv)``; float32 result on the
    ``out`` grid, differentiable. ``accumulator`` (default the recipe's, else FP32) accumulates
    both GEMMs; ``matmul(a, b, c, spec)`` replaces the emulated GEMM (simulate passes its own).

    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(2, 5, 8, generator=g) for _ in range(3))
    >>> o = fp8_attention(q, k, v)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    >>> bool((o - ref).abs().max() < 0.1), bool((o - ref).abs().max() > 0)
    (True, True)
    """
    from .simulate import GemmSpec, emulated_matmul

    r = get_attention_recipe(recipe)
    fq, fk, fv, fp, fo = (get_format(getattr(r, n)) for n in ("q", "k", "v", "p", "out"))
    f32 = get_format("fp32")
    acc = accumulator or r.accumulator or Accumulator()
    fds = get_format(r.ds) if r.ds else f32
    fdo = get_format(r.do) if r.do else f32
    spec_qk = GemmSpec(fq, fk, fds, f32, f32, acc)  # type: ignore[arg-type]
    spec_pv = GemmSpec(fp, fv, fdo, f32, f32, acc)  # type: ignore[arg-type]
    mm = matmul or (lambda a, b, c, spec: emulated_matmul(a, b, c, spec=spec))

    qq, dq = _scaled_cast(q, fq, r.scaling)  # type: ignore[arg-type]
    kq, dk = _scaled_cast(k, fk, r.scaling)  # type: ignore[arg-type]
    vq, dv = _scaled_cast(v, fv, r.scaling)  # type: ignore[arg-type]
    s = mm(qq, kq.transpose(-2, -1), None, spec_qk)  # raw S, float32
    n_q, n_k = s.shape[-2], s.shape[-1]
    # FA3's default softmax_scale: 1.0 / sqrtf(d) (float sqrt, double quotient, stored in a float)
    sm = 1.0 / float(np.float32(math.sqrt(q.shape[-1]))) if scale is None else float(scale)
    f32n = np.float32
    # FA3: float softmax_scale_log2 = softmax_scale * M_LOG2E (a double product stored in a
    # float), then *= q_descale * k_descale in float32
    sl2 = float(f32n(f32n(float(f32n(sm)) * _LOG2E) * f32n(f32n(dq) * f32n(dk))))
    bias = None
    if is_causal:
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = s.masked_fill(attn_mask == float("-inf"), float("-inf"))
            bias = torch.where(torch.isfinite(attn_mask), attn_mask, torch.zeros_like(attn_mask))
            bias = (bias.to(torch.float32) * _LOG2E).expand(s.shape)
    blocks = [
        (j, min(j + (r.block_n or n_k), n_k)) for j in range(0, n_k, r.block_n or max(n_k, 1))
    ]
    if r.reverse:
        blocks = blocks[::-1]
    lead = s.shape[:-1]
    m = torch.full(lead, float("-inf"), dtype=torch.float32)
    row_sum = torch.zeros(lead, dtype=torch.float32)
    o: torch.Tensor | None = None
    offset = float(r.max_offset)
    for j0, j1 in blocks:
        sj = s[..., j0:j1]
        m_new = torch.maximum(m, sj.detach().amax(dim=-1)) if j1 > j0 else m
        ms = torch.where(m_new == float("-inf"), torch.zeros_like(m_new),
                         (m_new * sl2).to(torch.float32) - offset)  # fmt: skip
        if bias is None:
            pj = _ffma_exp2(sj, sl2, ms.unsqueeze(-1))
        else:
            x = (sj.to(torch.float64) * sl2 - ms.unsqueeze(-1).to(torch.float64)).to(torch.float32)
            x = x + bias[..., j0:j1]
            pj = torch.exp2(x.to(torch.float64)).to(torch.float32)
        cur = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        grow = torch.exp2(((m - cur) * sl2).to(torch.float64)).to(torch.float32)
        alpha = torch.where(m == float("-inf"), torch.ones_like(m), grow)
        row_sum = row_sum * alpha + pj.sum(-1)
        p8 = _cast(pj, fp, overflow="saturate")  # type: ignore[arg-type]
        c = None if o is None else o * alpha.unsqueeze(-1)
        o = mm(p8, vq[..., j0:j1, :], c, spec_pv)
        m = m_new
    assert o is not None
    ok = (row_sum != 0) & ~torch.isnan(row_sum)
    inv = torch.where(ok, 1.0 / torch.where(ok, row_sum, torch.ones_like(row_sum)),
                      torch.zeros_like(row_sum))  # fmt: skip
    out = o * (inv * float(dv)).unsqueeze(-1)
    from .simulate import _StoreFn

    return _StoreFn.apply(out, fo, f32)  # type: ignore[no-any-return]


# ----- P underflow -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PUnderflow:
    """What an FP8 cast of ``P`` loses: ``fraction`` (of the entries whose exact ``P`` is not
    0, the share cast to 0), ``zeros`` and ``count`` (those numbers), ``subnormal_fraction``
    (cast to a subnormal), and the gap ``threshold`` (:func:`p_underflow_threshold`)."""

    fraction: float
    zeros: int
    count: int
    subnormal_fraction: float
    threshold: float


def p_underflow_threshold(fmt: str | FloatFormat = "e4m3", *, max_offset: float = 8) -> float:
    """The score gap ``m - score`` (natural-log units) from which ``P = 2**max_offset *
    exp(score - m)`` rounds to 0 in ``fmt`` (round to nearest even): ``max_offset * ln 2 -
    ln(smallest_subnormal / 2)``. E4M3: ``6.93 + ln(2**max_offset)``.

    >>> round(p_underflow_threshold("e4m3", max_offset=0), 4)   # 10 ln 2
    6.9315
    """
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise ValueError(f"fmt must be a floating-point format, got {fmt!r}")
    return float(max_offset) * math.log(2.0) - math.log(f.smallest_subnormal / 2)


def p_underflow(
    scores: Any,
    *,
    fmt: str | FloatFormat = "e4m3",
    max_offset: int = 8,
    block_n: int | None = None,
    reverse: bool = True,
    mask: Any = None,
    count: Any = None,
) -> PUnderflow:
    """Cast ``P`` of softmax ``scores`` (``(..., Lk)``, natural-log units: the softmax scale
    applied) to ``fmt`` as :func:`fp8_attention` does (static scale ``2**max_offset``, the
    running row maximum over key blocks of ``block_n`` in ``reverse`` or forward order) and
    count what becomes 0. ``mask`` (bool, True = keep) masks scores out (as attention masks
    do); ``count`` (bool) restricts the counting to some entries (e.g. the non-sink ones: the
    sink still sets the maximum). ``P`` is computed as
    FA3 does in float32 (``exp2`` of one FFMA rounding), so entries within float32 rounding of
    the threshold may fall either way.

    >>> import numpy as np
    >>> r = p_underflow(np.array([[0.0, -12.0, -13.0]]), max_offset=8)
    >>> r.zeros, r.count   # -13 is past 12.48, -12 is not
    (1, 3)
    """
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise ValueError(f"fmt must be a floating-point format, got {fmt!r}")
    sc = np.asarray(scores, dtype=np.float32)
    keep = (
        np.ones(sc.shape, bool)
        if mask is None
        else np.broadcast_to(np.asarray(mask, bool), sc.shape)
    )
    sc = np.where(keep, sc, np.float32(-np.inf))
    if count is not None:
        keep = keep & np.broadcast_to(np.asarray(count, bool), sc.shape)
    n = sc.shape[-1]
    sl2 = np.float32(_LOG2E)
    bn = block_n or max(n, 1)
    blocks = [(j, min(j + bn, n)) for j in range(0, n, bn)]
    if reverse:
        blocks = blocks[::-1]
    m = np.full(sc.shape[:-1], -np.inf, np.float32)
    zeros = sub = 0
    for j0, j1 in blocks:
        sj = sc[..., j0:j1]
        with np.errstate(invalid="ignore"):
            m = np.maximum(m, sj.max(axis=-1))
            ms = np.where(np.isinf(m) & (m < 0), np.float32(0), (m * sl2).astype(np.float32)
                          - np.float32(max_offset))  # fmt: skip
            x = (sj.astype(np.float64) * np.float64(sl2) - ms[..., None]).astype(np.float32)
            p = np.exp2(x.astype(np.float64)).astype(np.float32)
        q = np.asarray(_np_round_to(p, f, overflow="saturate"))
        k = keep[..., j0:j1]
        zeros += int(np.count_nonzero((q == 0) & k))
        sub += int(np.count_nonzero((q != 0) & (np.abs(q) < f.smallest_normal) & k))
    total = int(np.count_nonzero(keep))
    return PUnderflow(
        fraction=zeros / total if total else 0.0,
        zeros=zeros,
        count=total,
        subnormal_fraction=sub / total if total else 0.0,
        threshold=p_underflow_threshold(f, max_offset=max_offset),
    )


def p_collapse_prediction(
    delta: float,
    *,
    k_sink: int = 4,
    fmt: str | FloatFormat = "e4m3",
    max_offset: int = 8,
    exact: bool = False,
) -> float:
    """The leading-order fraction of non-sink ``P`` entries that underflow under forward KV
    iteration (arXiv 2606.06521's ``Phi(Delta + delta_k - 6.93 - ln S)``): non-sink scores
    standard normal, ``k_sink`` sink scores ``Delta +`` standard normal in the first block, the
    running maximum replaced by its expectation ``Delta + delta_k`` (``delta_k``: the expected
    maximum of ``k_sink`` standard normals, by numerical integration). ``exact=True`` averages
    ``Phi(M - Delta_c')`` over the distribution of the sink maximum ``M = Delta + max of k_sink
    standard normals`` instead (no leading-order step: the measured fractions follow it more
    closely where ``Phi`` is steep; it still ignores later blocks whose own maximum exceeds
    ``M``).

    >>> round(p_collapse_prediction(6.0, max_offset=0), 3), round(p_collapse_prediction(6.0), 3)
    (0.539, 0.0)
    """
    t = p_underflow_threshold(fmt, max_offset=max_offset)
    x, pdf_max = _max_normal_pdf(k_sink)
    if not exact:
        dk = float(np.trapezoid(x * pdf_max, x))
        return 0.5 * math.erfc(-(delta + dk - t) / math.sqrt(2.0))
    phi = 0.5 * np.vectorize(math.erfc)(-(delta + x - t) / math.sqrt(2.0))
    return float(np.trapezoid(phi * pdf_max, x))


def _max_normal_pdf(k: int) -> tuple[np.ndarray, np.ndarray]:
    """The density of the maximum of ``k`` standard normals on [-10, 10] (step 1e-3)."""
    x = np.linspace(-10.0, 10.0, 20001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = 0.5 * np.vectorize(math.erfc)(-x / math.sqrt(2.0))
    return x, k * phi * cdf ** (k - 1)
