"""Spec 3d (SIMD lanes and split-K) of the numpy reference against an exact oracle.

The oracle builds the summation tree of each model from the specification with its own code
(lanes dealt ``k mod L``, the tail, the lane trees, the K-splits), then evaluates it in
``fractions.Fraction`` with one rounding per addition (its own rounding function, not the core).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from referee import fr_round

import precision_lab as pl
from precision_lab.gemm.accumulator import reference_only

RNG = np.random.default_rng(20261207)


# ----- the oracle's trees: ("leaf", k) / ("add", [children]) -------------------------------------
def chain(items: list[Any]) -> Any:
    node = items[0]
    for it in items[1:]:
        node = ("add", [node, it])
    return node


def named_tree(kind: Any, items: list[Any], tail: Any = None, vector: int = 1) -> Any:
    """``tail``: lane_tail="separate_first"'s sum, joining the largest subtree that holds lane
    0 and only lanes = 0 mod ``vector``."""
    if tail is not None:
        assert not isinstance(kind, str), "the oracle takes separate_first with explicit trees"

        def lanes_of(t: Any) -> set[int]:
            return {t} if isinstance(t, int) else set().union(*(lanes_of(c) for c in t))

        def join(t: Any) -> Any:
            if all(x % vector == 0 for x in lanes_of(t)):
                return (t, "T")
            return tuple(join(c) if 0 in lanes_of(c) else c for c in t)

        kind = join(kind)
    if not isinstance(kind, str):  # an explicit tree of lane numbers (lanes >= len(items) pruned)

        def sub(t: Any) -> Any:
            if t == "T":
                return tail
            if isinstance(t, int):
                return items[t] if t < len(items) else None
            kids = [x for x in (sub(c) for c in t) if x is not None]
            return None if not kids else kids[0] if len(kids) == 1 else chain(kids)

        return sub(kind)
    if kind == "sequential":
        return chain(items)
    if kind == "pairwise":
        while len(items) > 1:
            nxt = [("add", [items[i], items[i + 1]]) for i in range(0, len(items) - 1, 2)]
            items = nxt + ([items[-1]] if len(items) % 2 else [])
        return items[0]
    assert kind == "halving"
    while len(items) > 1:
        h = (len(items) + 1) // 2
        items = [
            ("add", [items[i], items[i + h]]) if i + h < len(items) else items[i] for i in range(h)
        ]
    return items[0]


def lane_value(ks: list[int], kw: dict[str, Any]) -> Any:
    """Tree of the products ``ks`` (from 0): lanes, their tree, the tail."""
    L = kw.get("lanes")
    if L is None or len(ks) < (kw.get("small_k") or 0):
        return chain([("zero", [])] + [("leaf", k) for k in ks])
    rule = kw.get("lane_tail", "lanes")
    full = len(ks) if rule == "lanes" else len(ks) - len(ks) % (kw.get("lane_unroll") or L)
    V = kw.get("lane_vector")  # a cleanup loop of V lanes after the main one
    full2 = len(ks) - len(ks) % V if V else full
    tail = [("leaf", k) for k in ks[full2:]]
    members = [
        [("leaf", ks[i]) for i in range(lane, full, L)]
        + ([("leaf", ks[i]) for i in range(full + lane, full2, V)] if V and lane < V else [])
        for lane in range(max(min(L, full), min(V or 0, full2 - full)))
    ]
    if rule == "first":
        members = [members[0] + tail] if members else [tail]
        members += [
            [("leaf", ks[i]) for i in range(lane, full, L)] for lane in range(1, min(L, full))
        ]
    lanes = [chain([("zero", []), *m]) for m in members]
    if rule == "separate_first" and tail:
        return named_tree(kw.get("lane_combine", "sequential"), lanes,
                          chain([("zero", []), *tail]), V or 1)  # fmt: skip
    node = named_tree(kw.get("lane_combine", "sequential"), lanes) if lanes else ("zero", [])
    if rule == "first":
        return node
    if rule == "separate":
        return chain([node, chain([("zero", []), *tail])]) if tail else node
    return chain([node, *tail])


def model_tree(k: int, kw: dict[str, Any], with_c: bool) -> Any:
    """The whole tree; ``c`` is the leaf ``k``: it starts the chain of sequential K-blocks,
    else it is added last."""
    S = kw.get("split_k")
    ks = list(range(k))
    c = [("leaf", k)] if with_c else []
    how = kw.get("split_combine", "sequential")
    if S is not None and how == "sequential":
        parts, left, u = [], k, kw.get("split_balance")
        e = kw.get("split_equal")
        m = -(-k // S)  # oneDNN's AMX rule: ceil(k / S) equal blocks where they are multiples of e
        if e is not None and k % m == 0 and (k // m) % e == 0:
            return chain(c + [lane_value(ks[j : j + k // m], kw) for j in range(0, k, k // m)])
        # OpenBLAS's level-3 K-blocking as measured: a rest under 2S halved (up: its threaded
        # driver, down: level3.c), then rounded up to a multiple of u
        half = (lambda r: r // 2) if kw.get("split_half") == "floor" else (lambda r: (r + 1) // 2)
        while left:
            step = (
                S
                if u is None or left >= 2 * S
                else left
                if left <= S
                else ((half(left) + u - 1) // u) * u
            )
            step = min(step, left)
            parts.append(lane_value(ks[k - left : k - left + step], kw))
            left -= step
        return chain(c + parts)
    return chain([*c[:1], body(ks, kw, S, how)]) if with_c else body(ks, kw, S, how)


def body(ks: list[int], kw: dict[str, Any], S: int | None, how: str) -> Any:
    k = len(ks)
    if S is None:
        return lane_value(ks, kw)
    if how == "pairwise":
        return named_tree("pairwise", [lane_value(ks[j : j + S], kw) for j in range(0, k, S)])

    def halves(part: list[int]) -> Any:  # numpy's pairwise_sum
        h = len(part) // 2
        h -= h % (kw.get("lanes") or 1)
        if len(part) <= S or h < 1:
            return lane_value(part, kw)
        return ("add", [halves(part[:h]), halves(part[h:])])

    return halves(ks)


def evaluate(node: Any, ps: list[Fraction], fmt: pl.FloatFormat, mode: str) -> Fraction:
    tag, arg = node
    if tag == "leaf":
        return ps[arg]
    if tag == "zero":
        return Fraction(0)
    out = evaluate(arg[0], ps, fmt, mode)
    for ch in arg[1:]:
        out = fr_round(out + evaluate(ch, ps, fmt, mode), fmt, mode)
    return out


def oracle(
    a: np.ndarray, b: np.ndarray, c: np.ndarray | None, kw: dict[str, Any], fmt: str, mode: str
) -> np.ndarray:
    f = pl.get_format(fmt)
    m, k = a.shape
    n = b.shape[1]
    tree = model_tree(k, kw, c is not None)
    out = np.empty((m, n))
    for i in range(m):
        for j in range(n):
            ps = [Fraction(float(a[i, t])) * Fraction(float(b[t, j])) for t in range(k)]
            if c is not None:
                ps.append(Fraction(float(c[i, j])))
            out[i, j] = float(evaluate(tree, ps, f, mode))
    return out


MODELS = [
    {"lanes": 2},
    {"lanes": 4},
    {"lanes": 4, "lane_combine": "pairwise"},
    {"lanes": 8, "lane_combine": "halving"},
    {"lanes": 8, "lane_combine": ((0, 4), (1, 5)), "lane_tail": "after"}
    if False
    else {"lanes": 8, "lane_combine": (((0, 4), (1, 5)), ((2, 6), (3, 7))), "lane_tail": "after"},
    {"lanes": 16, "lane_combine": "pairwise", "small_k": 32},
    {
        "lanes": 8,
        "lane_combine": "pairwise",
        "lane_tail": "after",
        "split_k": 16,
        "split_combine": "halving",
    },
    {"lanes": 4, "split_k": 8},
    {"lanes": 4, "lane_tail": "first"},
    {"split_k": 8, "split_balance": 2},
    {"lanes": 2, "split_k": 5, "split_balance": 1},
    {"lanes": 2, "split_k": 9, "split_balance": 2, "split_half": "floor"},  # K = 13: 9, 2, 2
    {"split_k": 7, "split_balance": 1, "split_half": "floor"},  # K = 11: 7, 2, 2; 9: 4, 5
    {"lanes": 2, "split_k": 6, "split_equal": 2},  # (K = 8: 4 + 4, K = 13: 6 + 6 + 1)
    # torch.sum's shape, smaller: 2 vectors of 4 lanes, a 1-vector cleanup loop, the scalar
    # tail's sum into the first lane group
    {
        "lanes": 8,
        "lane_vector": 4,
        "lane_tail": "separate_first",
        "lane_combine": ((0, 4), (1, 5), (2, 6), (3, 7)),
    },
    {"lanes": 4, "lane_vector": 2, "lane_tail": "after"},
    {"lanes": 4, "lane_tail": "separate_first", "lane_combine": (0, (1, 2), 3)},
    {
        "lanes": 8,
        "lane_combine": (((0, 4), (1, 5)), ((2, 6), (3, 7))),
        "lane_tail": "separate",
        "lane_unroll": 32,
    },
    {
        "lanes": 2,
        "lane_tail": "after",
        "lane_unroll": 6,
        "split_k": 16,
        "split_combine": "pairwise",
    },
    {"split_k": 5, "split_combine": "pairwise"},
    {"lanes": 3, "lane_combine": "halving", "split_k": 7, "split_combine": "sequential"},
]


def _backends() -> list[str]:
    """The numpy reference, and the native per-element kernels (pl_gemm.cuh) where built."""
    from precision_lab.gemm import native_backend

    return ["numpy", "native"] if native_backend.available() else ["numpy"]


@pytest.mark.parametrize("kw", MODELS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize(
    ("fmt", "mode"), [("fp32", "nearest_even"), ("bf16", "toward_zero"), ("fp16", "down")]
)
@pytest.mark.parametrize("backend", _backends())
def test_lanes_and_splits_match_the_exact_oracle(
    kw: dict[str, Any], fmt: str, mode: str, backend: str
) -> None:
    acc = pl.Accumulator(fmt, rounding=mode, **kw)
    for k in (1, 3, 8, 13, 40):
        a = np.round(RNG.standard_normal((2, k)) * 64) / 64 * 2.0 ** RNG.integers(-6, 7, (2, k))
        b = np.round(RNG.standard_normal((k, 3)) * 64) / 64
        c = np.round(RNG.standard_normal((2, 3)) * 8) / 8 if k % 2 else None
        got = pl.gemm(
            a, b, c, input_format="fp32", accumulator=acc, out_format=fmt, backend=backend
        )
        want = oracle(a, b, c, kw, fmt, mode)
        np.testing.assert_array_equal(np.asarray(got, np.float64), want, err_msg=f"K={k}")


def test_lanes_change_the_result_and_float32_lanes_are_float32_arithmetic() -> None:
    """Four fp32 lanes with FMA per lane equal a float32 loop with four accumulators (numpy's
    float32 arithmetic as a second referee), and differ from one sequential sum somewhere."""
    k = 37
    a = RNG.standard_normal((16, k)).astype(np.float32)
    b = RNG.standard_normal((k, 16)).astype(np.float32)
    acc = pl.Accumulator("fp32", lanes=4, product_format="fp32")
    got = pl.gemm(a, b, input_format="fp32", accumulator=acc)
    lanes = np.zeros((4, 16, 16), np.float32)
    for t in range(k):
        lanes[t % 4] += a[:, t : t + 1] * b[t : t + 1, :]
    want = ((lanes[0] + lanes[1]) + lanes[2]) + lanes[3]
    np.testing.assert_array_equal(got, want)
    seq = pl.gemm(
        a, b, input_format="fp32", accumulator=pl.Accumulator("fp32", product_format="fp32")
    )
    assert (seq != got).any()


def test_numpy_pairwise_sum_as_a_model() -> None:
    """numpy's float32 ``pairwise_sum`` (8 lanes, combined pairwise, the tail after, halves
    cut at multiples of 8 above 128), written out in float32 here from numpy's C source."""

    def pairwise_sum(x: np.ndarray) -> np.float32:
        n = len(x)
        if n < 8:
            res = np.float32(0)
            for v in x:
                res = np.float32(res + v)
            return res
        if n <= 128:
            r = [np.float32(v) for v in x[:8]]
            i = 8
            while i < n - n % 8:
                r = [np.float32(r[j] + x[i + j]) for j in range(8)]
                i += 8
            res = np.float32(
                np.float32(np.float32(r[0] + r[1]) + np.float32(r[2] + r[3]))
                + np.float32(np.float32(r[4] + r[5]) + np.float32(r[6] + r[7]))
            )
            for v in x[i:]:
                res = np.float32(res + v)
            return res
        h = n // 2
        h -= h % 8
        return np.float32(pairwise_sum(x[:h]) + pairwise_sum(x[h:]))

    acc = pl.Accumulator(
        "fp32",
        lanes=8,
        lane_combine="pairwise",
        lane_tail="after",
        split_k=128,
        split_combine="halving",
    )
    for k in (5, 8, 23, 128, 129, 300, 1000):
        x = (RNG.standard_normal(k) * 2.0 ** RNG.integers(-8, 9, k)).astype(np.float32)
        got = pl.gemm(x[None, :], np.ones((k, 1), np.float32), input_format="fp32", accumulator=acc)
        assert got[0, 0] == pairwise_sum(x), k


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"lanes": 0}, "lanes must be a positive int"),
        ({"lanes": 4, "lane_combine": "zigzag"}, "lane_combine must be one of"),
        ({"lanes": 4, "lane_combine": ((0, 1), 2)}, "each lane 0..3 exactly once"),
        ({"lanes": 2, "lane_combine": ((0,), 1)}, "at least 2 children"),
        ({"lane_combine": (0, 1)}, "an explicit tree needs lanes"),
        ({"lanes": 4, "lane_tail": "before"}, "lane_tail must be one of"),
        ({"lanes": 4, "lane_tail": "after", "lane_unroll": 6}, "lane_unroll must be a multiple"),
        ({"lanes": 4, "lane_unroll": 8}, "lane_unroll must be a multiple"),
        ({"split_k": 8, "split_combine": "tree"}, "split_combine must be one of"),
        ({"small_k": 8}, "small_k needs lanes"),
        ({"split_k": 8, "split_combine": "pairwise", "split_balance": 2}, "split_balance needs"),
        ({"split_k": 8, "split_half": "floor"}, "split_half='floor' needs split_balance"),
        ({"split_k": 8, "split_balance": 2, "split_half": "round"}, "split_half must be one of"),
        (
            {"lanes": 4, "order": "block_fma", "block": 4, "align_bits": 24},
            "lanes and split_k need order",
        ),
        ({"lanes": 4, "rounding": "stochastic"}, "deterministic rounding modes only"),
    ],
)
def test_bad_lane_fields(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pl.Accumulator("fp32", **kw)


def test_lists_become_tuples_and_every_backend_computes_lanes() -> None:
    from precision_lab.gemm import native_backend

    acc = pl.Accumulator("fp32", lanes=2, lane_combine=[0, 1])
    assert acc.lane_combine == (0, 1) and hash(acc)
    assert reference_only(acc) is None
    assert reference_only(pl.Accumulator("fp32", split_k=64)) is None
    assert reference_only(pl.Accumulator("fp32", k1_product=True)) is None
    assert reference_only(pl.Accumulator("fp32", k1_product=True, rounding="stochastic")) == (
        "k1_product=True with rounding='stochastic'"
    )
    assert native_backend.covers(acc) == native_backend.available()
    assert not native_backend.covers(pl.Accumulator("fp32", lanes=65))  # (PL_LANES_MAX)
    a = RNG.standard_normal((3, 9))
    b = RNG.standard_normal((9, 2))
    for backend in ("auto", "native"):  # the per-element kernels of pl_gemm.cuh
        got = pl.gemm(a, b, input_format="fp32", accumulator=acc, backend=backend)
        np.testing.assert_array_equal(
            got, pl.gemm(a, b, input_format="fp32", accumulator=acc, backend="numpy")
        )


@pytest.mark.parametrize("backend", _backends())
def test_k1_product_on_every_backend(backend: str) -> None:
    """Spec 3f: K = 1 with no c or c = +0 gives the product itself, rounded once (a -0 product
    stays -0 where 0 + p is +0; 2**-160 underflows to +0); another c gives c + p; K = 2 is
    unchanged."""
    a = np.array([[-1.0], [2.0**-140], [3.0]])
    b = np.array([[0.0, 1.0, 2.0**-20]])
    acc = pl.Accumulator("fp32", k1_product=True)
    plain = pl.Accumulator("fp32")
    kw: dict[str, Any] = {"input_format": "fp32", "backend": backend}
    want = (a * b).astype(np.float32)
    for c in (None, np.zeros((3, 3))):
        got = pl.gemm(a, b, c, accumulator=acc, **kw)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        assert not np.signbit(pl.gemm(a, b, c, accumulator=plain, **kw)[0, 0])
    c = np.full((3, 3), -0.0)
    c[1:] = 1.0
    np.testing.assert_array_equal(
        pl.gemm(a, b, c, accumulator=acc, **kw), pl.gemm(a, b, c, accumulator=plain, **kw)
    )
    a2, b2 = np.hstack([a, a]), np.vstack([b, -b])
    np.testing.assert_array_equal(
        pl.gemm(a2, b2, accumulator=acc, **kw), pl.gemm(a2, b2, accumulator=plain, **kw)
    )


def test_a_tail_in_its_own_format_matches_the_exact_oracle() -> None:
    """Spec 3e's ``tail_format``: OpenBLAS's Haswell sdot (measured on an AMD Zen 3 through
    numpy 2.4.6's ``np.dot``): lanes of fp32 FMAs combined by a tree, the last ``K mod U``
    products rounded to fp32 and summed in a double from +0, the lanes' value added to it in
    double, the result rounded to fp32. The oracle rounds each step with ``fr_round``; an
    fp32 tail (no ``tail_format``) differs on some inputs, so the field is seen."""
    f32, f64 = pl.get_format("fp32"), pl.get_format("fp64")
    tree = ((0, 2), (1, 3))
    acc = pl.Accumulator("fp32", lanes=4, lane_combine=tree, lane_tail="separate",
                         lane_unroll=8, tail_format="fp64", tail_product_format="fp32")  # fmt: skip
    differ = 0
    for k in (1, 3, 7, 8, 9, 15, 16, 23, 40):
        a = RNG.standard_normal((3, k)).astype(np.float32).astype(np.float64)
        b = RNG.standard_normal((k, 2)).astype(np.float32).astype(np.float64)
        a[0] *= 2.0 ** RNG.integers(-20, 21, k)  # wide exponents: the double tail keeps bits
        got = np.asarray(pl.gemm(a, b, input_format="fp32", accumulator=acc), np.float64)
        plain = np.asarray(
            pl.gemm(a, b, input_format="fp32",
                    accumulator=acc.replace(tail_format=None, tail_product_format=None)),
            np.float64,
        )  # fmt: skip
        differ += int((plain != got).sum())
        for i in range(3):
            for j in range(2):
                p = [Fraction(a[i, t]) * Fraction(b[t, j]) for t in range(k)]
                full = k - k % 8
                lanes: list[Fraction | None] = [None] * 4
                for t in range(full):
                    prev = lanes[t % 4] or Fraction(0)
                    lanes[t % 4] = fr_round(prev + p[t], f32)
                value: Fraction | None = None
                if full:
                    l0, l1, l2, l3 = (x or Fraction(0) for x in lanes)
                    value = fr_round(fr_round(l0 + l2, f32) + fr_round(l1 + l3, f32), f32)
                if k > full:
                    s = Fraction(0)
                    for t in range(full, k):
                        s = fr_round(s + fr_round(p[t], f32), f64)
                    value = fr_round(s if value is None else fr_round(value + s, f64), f32)
                assert value is not None
                assert got[i, j] == float(value), f"K={k} ({i}, {j})"
    assert differ > 0
    assert reference_only(acc) == "tail_format='fp64'"
    with pytest.raises(ValueError, match="tail_format needs lanes, lane_tail='separate'"):
        pl.Accumulator("fp32", lanes=4, tail_format="fp64")
    with pytest.raises(ValueError, match="tail_product_format='fp32' needs tail_format"):
        pl.Accumulator("fp32", lanes=4, lane_tail="separate", tail_product_format="fp32")
