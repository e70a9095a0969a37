"""The torch operations :func:`~precision_lab.torch.simulate` emulates beyond ``linear`` /
``conv1d`` / ``conv2d`` / ``matmul`` / ``addmm`` / ``scaled_dot_product_attention``: each is
rewritten as the emulated GEMMs it runs (every GEMM through :func:`precision_lab.gemm`, or the
recipe's :func:`~precision_lab.torch.recipe_matmul` under a training recipe), so that no
floating-point GEMM runs in FP32 unannounced.

* vector products: ``mv`` / ``addmv`` (matrix-vector), ``dot`` / ``vdot`` (real tensors;
  ``vdot`` conjugates, so complex tensors raise), ``inner`` (``a.reshape(-1, K) @
  b.reshape(-1, K)^T``), ``outer`` / ``ger`` / ``addr`` (a GEMM with ``K = 1``: each element one
  rounded product);
* ``einsum``: operands contracted pairwise from left to right (torch's order without
  ``opt_einsum``), each pair as one batched GEMM ``(batch, M, K) @ (batch, K, N)`` over the
  batch, left-only, contracted and right-only subscripts; a subscript that occurs in one
  operand only and not in the output, and repeated subscripts (diagonals), are reduced first by
  torch (sums and views, not GEMMs); an operand alone runs as torch runs it (no GEMM);
* ``tensordot``: one GEMM over the flattened free and contracted dimensions;
* ``baddbmm`` / ``addbmm`` / ``addmv`` / ``addr`` / ``addmm``: ``beta * c + alpha * (a @ b)``.
  With ``alpha = beta = 1``, ``c`` is the GEMM's addend (``pl.gemm``'s ``c``, added in the
  accumulator, as ``addmm`` and a Linear bias); otherwise the emulated product (stored in the
  activation format) is scaled by ``alpha`` and ``beta * c`` added in float32, as a GEMM
  epilogue (``beta = 0`` ignores ``c``, NaN included, as torch does). ``addbmm`` (``c + sum_b
  a_b @ b_b``) is one GEMM whose contraction runs over the batches in order,
  ``(M, B*K) @ (B*K, N)`` (torch's CPU kernel adds the batch products into the result one after
  another: inferred, the same order);
* convolutions ``conv1d`` / ``conv2d`` / ``conv3d`` with any ``groups`` (and ``conv3d``, which
  ``F.unfold`` does not cover), as one im2col GEMM per group, batched over the groups:
  ``(G, O/G, C/G*k) @ (G, C/G*k, N*L)``; the patches come from ``Tensor.unfold`` on the
  zero-padded input (``padding="same"`` pads ``total // 2`` before and the rest after, as
  torch does). ``conv_transpose1d/2d/3d``: the GEMM ``W_g^T @ x_g`` (``(Cout/G*k, Cin/G) @
  (Cin/G, N*L)``, torch's own col2im formulation), then the overlapping columns added into the
  output in float32 (kernel offsets in row-major order), cropped by ``padding`` and extended by
  ``output_padding``, the bias added in float32 and the result stored in the activation format.

Under a training recipe every GEMM is a linear layer of the recipe (first operand the patches
or rows, second the transposed weight or the right operand), as for the other operations.

>>> import torch, precision_lab.torch as plt
>>> class Dot(torch.nn.Module):
...     def forward(self, a, b):
...         return torch.dot(a, b)
>>> a = torch.tensor([1.0, 2.0**-9])
>>> plt.simulate(Dot(), "float32")(a, a).item(), plt.simulate(Dot(), "mixed_bfloat16")(a, a).item()
(1.0000038146972656, 1.0)
"""

from __future__ import annotations

import itertools
import math
import string
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["EMULATED_OPS"]


# ----- helpers ----------------------------------------------------------------------------------
def _epilogue(
    sim: Any, prod: torch.Tensor, c: torch.Tensor | None, beta: Any, alpha: Any
) -> torch.Tensor:
    """``beta * c + alpha * prod`` in float32 (``beta == 0`` ignores ``c``)."""
    out = prod if alpha == 1 else prod * alpha
    if c is not None and beta != 0:
        out = out + (c if beta == 1 else c * beta)
    return out


def _gemm_add(
    sim: Any, c: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, beta: Any, alpha: Any
) -> torch.Tensor:
    """``beta * c + alpha * (a @ b)``: ``c`` in the accumulator when ``alpha = beta = 1``."""
    if alpha == 1 and beta == 1 and c is not None:
        return sim._matmul(a, b, c)  # type: ignore[no-any-return]
    return _epilogue(sim, sim._matmul(a, b), c, beta, alpha)


def _no_out(name: str, kw: dict[str, Any]) -> None:
    if kw.get("out") is not None:
        raise NotImplementedError(f"simulate: {name} with out= is not emulated")


def _real(name: str, *ts: torch.Tensor) -> None:
    if any(t.is_complex() for t in ts):
        raise NotImplementedError(f"simulate: {name} of complex tensors is not emulated")


# ----- vector products --------------------------------------------------------------------------
def _mv(sim: Any, m: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
    _no_out("mv", kw)
    if m.dim() != 2 or v.dim() != 1:
        raise RuntimeError(f"mv: expected a matrix and a vector, got {m.dim()}-D and {v.dim()}-D")
    return sim._matmul(m, v)  # type: ignore[no-any-return]


def _addmv(
    sim: Any, c: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *, beta: Any = 1, alpha: Any = 1,
    **kw: Any,
) -> torch.Tensor:  # fmt: skip
    _no_out("addmv", kw)
    cc = c.unsqueeze(-1) if c.dim() else c  # (M,) against the product's column (M, 1)
    return _gemm_add(sim, cc, m, v.unsqueeze(-1), beta, alpha).squeeze(-1)


def _dot(sim: Any, a: torch.Tensor, b: torch.Tensor, **kw: Any) -> torch.Tensor:
    _no_out("dot", kw)
    _real("dot", a, b)
    if a.dim() != 1 or b.dim() != 1:
        raise RuntimeError(f"dot: 1D tensors expected, got {a.dim()}D and {b.dim()}D tensors")
    return sim._matmul(a, b)  # type: ignore[no-any-return]


def _vdot(sim: Any, a: torch.Tensor, b: torch.Tensor, **kw: Any) -> torch.Tensor:
    _real("vdot", a, b)
    return _dot(sim, a, b, **kw)


def _inner(sim: Any, a: torch.Tensor, b: torch.Tensor, **kw: Any) -> torch.Tensor:
    _no_out("inner", kw)
    _real("inner", a, b)
    if a.dim() == 0 or b.dim() == 0:
        return a * b  # a scalar times a tensor: no GEMM
    k = a.shape[-1]
    out = sim._matmul(a.reshape(-1, k), b.reshape(-1, k).transpose(0, 1))
    return out.reshape([*a.shape[:-1], *b.shape[:-1]])  # type: ignore[no-any-return]


def _outer(sim: Any, a: torch.Tensor, b: torch.Tensor, **kw: Any) -> torch.Tensor:
    _no_out("outer", kw)
    return sim._matmul(a.reshape(-1, 1), b.reshape(1, -1))  # type: ignore[no-any-return]


def _addr(
    sim: Any, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1,
    **kw: Any,
) -> torch.Tensor:  # fmt: skip
    _no_out("addr", kw)
    return _gemm_add(sim, c, a.reshape(-1, 1), b.reshape(1, -1), beta, alpha)


# ----- batched ----------------------------------------------------------------------------------
def _addmm(
    sim: Any, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1,
    **kw: Any,
) -> torch.Tensor:  # fmt: skip
    _no_out("addmm", kw)
    return _gemm_add(sim, c, a, b, beta, alpha)


def _baddbmm(
    sim: Any, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1,
    **kw: Any,
) -> torch.Tensor:  # fmt: skip
    _no_out("baddbmm", kw)
    if a.dim() != 3 or b.dim() != 3:
        raise RuntimeError(f"baddbmm: batch1 and batch2 must be 3D, got {a.dim()}D, {b.dim()}D")
    return _gemm_add(sim, c, a, b, beta, alpha)


def _addbmm(
    sim: Any, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1,
    **kw: Any,
) -> torch.Tensor:  # fmt: skip
    _no_out("addbmm", kw)
    if a.dim() != 3 or b.dim() != 3:
        raise RuntimeError(f"addbmm: batch1 and batch2 must be 3D, got {a.dim()}D, {b.dim()}D")
    nb, m, k = a.shape
    a2 = a.permute(1, 0, 2).reshape(m, nb * k)  # (M, B*K): batch 0's K first
    b2 = b.reshape(nb * k, b.shape[-1])
    return _gemm_add(sim, c, a2, b2, beta, alpha)


# ----- tensordot and einsum ---------------------------------------------------------------------
def _tensordot(
    sim: Any, a: torch.Tensor, b: torch.Tensor, dims: Any = 2, **kw: Any
) -> torch.Tensor:
    _no_out("tensordot", kw)
    if isinstance(dims, torch.Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        da, db = list(range(a.dim() - dims, a.dim())), list(range(dims))
    else:
        da, db = list(dims[0]), list(dims[1])
        da = [da] if isinstance(da, int) else da
        db = [db] if isinstance(db, int) else db
    da = [d % a.dim() for d in da]
    db = [d % b.dim() for d in db]
    fa = [d for d in range(a.dim()) if d not in da]
    fb = [d for d in range(b.dim()) if d not in db]
    k = math.prod(a.shape[d] for d in da)
    a2 = a.permute(*fa, *da).reshape(-1, k)
    b2 = b.permute(*db, *fb).reshape(k, -1)
    out = sim._matmul(a2, b2)
    return out.reshape([*[a.shape[d] for d in fa], *[b.shape[d] for d in fb]])  # type: ignore[no-any-return]


def _parse_einsum(eq: str, shapes: list[tuple[int, ...]]) -> tuple[list[str], str]:
    """Input subscripts (ellipses replaced by upper-case letters) and the output subscripts."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(shapes):
        raise ValueError(f"einsum(): {len(ins)} subscripts for {len(shapes)} operands in {eq!r}")
    spare = [c for c in string.ascii_uppercase if c not in eq]
    n_ell = max((len(s) - (len(t) - 3) for t, s in zip(ins, shapes, strict=True) if "..." in t),
                default=0)  # fmt: skip
    ell = "".join(spare[:n_ell])
    out_ins = []
    for t, s in zip(ins, shapes, strict=True):
        if "..." in t:
            n = len(s) - (len(t) - 3)
            t = t.replace("...", ell[n_ell - n :])
        out_ins.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        letters = "".join(out_ins)
        out = ell + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell)
        )
    return out_ins, out


def _reduce_alone(t: torch.Tensor, sub: str, keep: set[str]) -> tuple[torch.Tensor, str]:
    """Diagonals of repeated subscripts and sums over subscripts not in ``keep`` (torch, no
    GEMM)."""
    target = "".join(dict.fromkeys(c for c in sub if c in keep))
    if target == sub:
        return t, sub
    with torch._C.DisableTorchFunction():
        return torch.einsum(f"{sub}->{target}", t), target


def _contract(
    sim: Any, a: torch.Tensor, sa: str, b: torch.Tensor, sb: str, keep: str
) -> tuple[torch.Tensor, str]:
    """``a`` (subscripts ``sa``) times ``b`` (``sb``) keeping the subscripts ``keep``: one
    batched emulated GEMM."""
    batch = [c for c in sa if c in sb and c in keep]
    con = [c for c in sa if c in sb and c not in keep]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]
    size: dict[str, int] = {}
    for t, s in ((a, sa), (b, sb)):
        for c, n in zip(s, t.shape, strict=True):
            size[c] = max(size.get(c, 1), n)
    pa = a.permute([sa.index(c) for c in batch + left + con])
    pb = b.permute([sb.index(c) for c in batch + con + right])
    pa = pa.expand(*[size[c] for c in batch], *pa.shape[len(batch) :])
    pb = pb.expand(*[size[c] for c in batch], *pb.shape[len(batch) :])
    nb = math.prod(size[c] for c in batch)
    m = math.prod(size[c] for c in left)
    k = math.prod(size[c] for c in con)
    n = math.prod(size[c] for c in right)
    out = sim._matmul(pa.reshape(nb, m, k), pb.reshape(nb, k, n))
    sub = "".join(batch + left + right)
    return out.reshape([size[c] for c in sub]), sub


def _einsum(sim: Any, eq: str, *operands: Any) -> torch.Tensor:
    if len(operands) == 1 and isinstance(operands[0], list | tuple):
        operands = tuple(operands[0])
    ts = list(operands)
    _real("einsum", *ts)
    subs, out = _parse_einsum(eq, [tuple(t.shape) for t in ts])
    if len(ts) == 1:
        with torch._C.DisableTorchFunction():
            return torch.einsum(f"{subs[0]}->{out}", ts[0])
    cur, cs = ts[0], subs[0]
    for i in range(1, len(ts)):
        later = set(out) | set("".join(subs[i + 1 :]))
        cur, cs = _reduce_alone(cur, cs, later | set(subs[i]))
        nxt, ns = _reduce_alone(ts[i], subs[i], later | set(cs))
        cur, cs = _contract(sim, cur, cs, nxt, ns, "".join(later))
    cur, cs = _reduce_alone(cur, cs, set(out))
    return cur.permute([cs.index(c) for c in out])


# ----- convolutions -----------------------------------------------------------------------------
def _tuple(v: Any, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    t = tuple(int(i) for i in v)
    return t * n if len(t) == 1 else t


def _patches(x: torch.Tensor, k: tuple[int, ...], st: tuple[int, ...],
             dl: tuple[int, ...]) -> torch.Tensor:  # fmt: skip
    """im2col of the padded ``x`` (N, C, *S): (N, C, *O, *k)."""
    nd = len(k)
    for i in range(nd):
        x = x.unfold(2 + i, dl[i] * (k[i] - 1) + 1, st[i])
        if dl[i] > 1:
            x = x[..., :: dl[i]]
    # unfold appends each window dimension at the end: (N, C, *O, k0, ..., k_{nd-1})
    return x


def _conv_nd(
    sim: Any, nd: int, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
) -> torch.Tensor:  # fmt: skip
    batched = input.dim() == nd + 2
    x = input if batched else input.unsqueeze(0)
    k = tuple(weight.shape[2:])
    st, dl = _tuple(stride, nd), _tuple(dilation, nd)
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nd
        elif padding == "same":
            if any(s != 1 for s in st):
                raise ValueError("padding='same' is not supported for strided convolutions")
            tot = [dl[i] * (k[i] - 1) for i in range(nd)]
            pads = [(t // 2, t - t // 2) for t in tot]
        else:
            raise ValueError(f"padding must be 'same', 'valid' or numbers, got {padding!r}")
    else:
        pads = [(p, p) for p in _tuple(padding, nd)]
    flat = [p for pr in reversed(pads) for p in pr]
    if any(flat):
        x = F.pad(x, flat)
    n, c = x.shape[:2]
    o = weight.shape[0]
    g = int(groups)
    p = _patches(x, k, st, dl)  # (N, C, *O, *k)
    outs = p.shape[2 : 2 + nd]
    kk = math.prod(k)
    # (G, C/G * k, N * L): channel-major then kernel offsets, as weight.reshape(O, -1)
    perm = [1, *range(2 + nd, 2 + 2 * nd), 0, *range(2, 2 + nd)]
    cols = p.permute(*perm).reshape(g, (c // g) * kk, -1)
    w = weight.reshape(g, o // g, (c // g) * kk)
    L = math.prod(outs)
    if sim.recipe is not None:  # a linear layer on the patches: (G, N*L, K) @ (G, K, O/G)
        y = sim._recipe_gemm("conv", cols.transpose(1, 2), w.transpose(1, 2), None)
        y = y.transpose(1, 2)  # (G, O/G, N*L)
        if bias is not None:
            y = y + bias.reshape(g, o // g, 1)
    else:
        cb = None if bias is None else bias.reshape(g, o // g, 1)
        y = sim._conv_gemm(w, cols, cb, weight)
    y = y.reshape(o, n, *outs).transpose(0, 1)
    del L
    return y if batched else y.squeeze(0)


def _conv_transpose_nd(
    sim: Any, nd: int, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    stride: Any = 1, padding: Any = 0, output_padding: Any = 0, groups: int = 1,
    dilation: Any = 1,
) -> torch.Tensor:  # fmt: skip
    batched = input.dim() == nd + 2
    x = input if batched else input.unsqueeze(0)
    if isinstance(padding, str):
        raise ValueError(f"conv_transpose: padding must be numbers, got {padding!r}")
    k = tuple(weight.shape[2:])
    st, dl = _tuple(stride, nd), _tuple(dilation, nd)
    pd, op = _tuple(padding, nd), _tuple(output_padding, nd)
    n, cin = x.shape[:2]
    ins = tuple(x.shape[2:])
    g = int(groups)
    cout_g = weight.shape[1]
    kk = math.prod(k)
    xg = (
        x.reshape(n, g, cin // g, -1).permute(1, 2, 0, 3).reshape(g, cin // g, -1)
    )  # (G, Cin/G, N*L)
    wg = weight.reshape(g, cin // g, cout_g * kk)  # (G, Cin/G, Cout/G*k)
    if sim.recipe is not None:  # a linear layer: x rows (G, N*L, Cin/G) @ (G, Cin/G, Cout/G*k)
        cols = sim._recipe_gemm("conv_transpose", xg.transpose(1, 2), wg, None).transpose(1, 2)
    else:
        cols = sim._conv_gemm(wg.transpose(1, 2), xg, None, weight)  # (G, Cout/G*k, N*L)
    cols = cols.reshape(g, cout_g, *k, n, *ins).movedim(1 + 1 + nd, 0)  # (N, G, Cout/G, *k, *ins)
    cols = cols.reshape(n, g * cout_g, *k, *ins)
    outs = [(ins[i] - 1) * st[i] - 2 * pd[i] + dl[i] * (k[i] - 1) + op[i] + 1 for i in range(nd)]
    full = [max((ins[i] - 1) * st[i] + dl[i] * (k[i] - 1) + 1, pd[i] + outs[i]) for i in range(nd)]
    buf = cols.new_zeros(n, g * cout_g, *full)
    for off in itertools.product(*[range(kd) for kd in k]):
        idx = tuple(slice(off[i] * dl[i], off[i] * dl[i] + (ins[i] - 1) * st[i] + 1, st[i])
                    for i in range(nd))  # fmt: skip
        sl = (slice(None), slice(None), *idx)
        part: tuple[Any, ...] = (slice(None), slice(None), *off)
        buf[sl] = buf[sl] + cols[part]
    crop: tuple[Any, ...] = (slice(None), slice(None))
    crop += tuple(slice(pd[i], pd[i] + outs[i]) for i in range(nd))
    y = buf[crop]
    if bias is not None:
        y = y + bias.reshape(1, -1, *([1] * nd))
    y = sim._after(None, y)
    return y if batched else y.squeeze(0)


def _conv(nd: int) -> Callable[..., torch.Tensor]:
    def run(sim: Any, *args: Any, **kw: Any) -> torch.Tensor:
        return _conv_nd(sim, nd, *args, **kw)

    return run


def _conv_t(nd: int) -> Callable[..., torch.Tensor]:
    def run(sim: Any, *args: Any, **kw: Any) -> torch.Tensor:
        return _conv_transpose_nd(sim, nd, *args, **kw)

    return run


def _linear_cross_entropy(
    sim: Any, input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor, *,
    linear_bias: torch.Tensor | None = None, options: Any = None, **kw: Any,
) -> torch.Tensor:  # fmt: skip
    """``F.linear_cross_entropy``: the emulated ``linear`` then ``cross_entropy`` (under its
    rule); the fused, chunked options raise."""
    if options is not None or linear_weight.dim() != 2:
        raise NotImplementedError(
            "simulate: linear_cross_entropy with options or a weight of more than 2 dimensions: "
            "write it as F.cross_entropy(F.linear(input, weight, bias), target)"
        )
    if kw.get("ignore_index", 0) is None:
        kw["ignore_index"] = -100  # cross_entropy's default: no class ignored
    logits = sim._linear(input, linear_weight, linear_bias)
    return sim._after("cross_entropy", F.cross_entropy(logits, target, **kw))  # type: ignore[no-any-return]


#: torch function -> ``handler(sim, *args, **kwargs)``
EMULATED_OPS: dict[Any, Callable[..., Any]] = {}
_TABLE: list[tuple[tuple[Any, ...], Callable[..., Any]]] = [
    ((torch.mv, torch.Tensor.mv), _mv),
    ((torch.addmv, torch.Tensor.addmv), _addmv),
    ((torch.dot, torch.Tensor.dot), _dot),
    ((torch.vdot, torch.Tensor.vdot), _vdot),
    ((torch.inner, torch.Tensor.inner), _inner),
    ((torch.outer, torch.Tensor.outer, torch.ger, torch.Tensor.ger), _outer),
    ((torch.addr, torch.Tensor.addr), _addr),
    ((torch.addmm, torch.Tensor.addmm), _addmm),
    ((torch.baddbmm, torch.Tensor.baddbmm), _baddbmm),
    ((torch.addbmm, torch.Tensor.addbmm), _addbmm),
]
for _fs, _h in _TABLE:
    EMULATED_OPS.update(dict.fromkeys(_fs, _h))
EMULATED_OPS[torch.tensordot] = _tensordot
EMULATED_OPS[torch.einsum] = _einsum
if hasattr(F, "linear_cross_entropy"):
    EMULATED_OPS[F.linear_cross_entropy] = _linear_cross_entropy
EMULATED_OPS[F.conv3d] = _conv(3)
EMULATED_OPS[F.conv_transpose1d] = _conv_t(1)
EMULATED_OPS[F.conv_transpose2d] = _conv_t(2)
EMULATED_OPS[F.conv_transpose3d] = _conv_t(3)
#: grouped 1-D / 2-D convolutions (groups=1 keeps simulate's F.unfold path)
CONV_ND = {F.conv1d: _conv(1), F.conv2d: _conv(2)}
