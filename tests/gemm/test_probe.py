"""probe_gemm: recover the accumulation model of a black-box matmul.

Every hidden model is recovered exactly (the dataclass compares every field but the label), and
the recovered model is checked independently of the probe's own confirmation: on fresh inputs of
another shape, seed and K it reproduces the black box bit for bit. Callables outside the family
(numpy's reduction, a reversed loop) must be reported as such, with the tree they use.
"""

from __future__ import annotations

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core.pool import use_workers
from precision_lab.gemm.probe import (
    _dtype_for,
    _family_tree,
    _lca_sizes,
    _render,
    _tree_from_sizes,
)
from precision_lab.gemm.tensor_core import measured_preset

A = pl.Accumulator
#: tensor_core.NVIDIA_RULES that fp16 and FP8 inputs cannot show in an fp32 accumulator (their
#: products never reach its overflow or underflow): the probe reports the defaults there, an
#: equivalent model (fresh_check)
UNSEEN_FP16 = {"overflow": "ieee", "zero_sign": "ieee"}


def hidden(acc: pl.Accumulator, fin: str, fout: str = "fp32", with_c: bool = False):
    if with_c:
        return lambda a, b, c: pl.gemm(a, b, c, input_format=fin, accumulator=acc, out_format=fout)
    return lambda a, b: pl.gemm(a, b, input_format=fin, accumulator=acc, out_format=fout)


def probe(fn, **kw):
    with use_workers(1):  # many tiny GEMMs: threads cost more than they give
        return pl.probe_gemm(fn, cases=256, **kw)


def fresh_check(fn, acc, fin, fout, max_k, with_c=False, seed=12345):
    """Independent of the probe: new shape, seed and K values, every element bit for bit."""
    rng = np.random.default_rng(seed)
    dtype = _dtype_for(pl.get_format(fin))
    for k in sorted({1, 2, max_k // 2 + 1, max_k - 1, max_k}):
        a = np.asarray(pl.round_to(rng.standard_normal((5, k)) * 4, fin), dtype=np.float64)
        b = np.asarray(pl.round_to(rng.standard_normal((k, 7)), fin), dtype=np.float64)
        c = np.asarray(pl.round_to(rng.standard_normal((5, 7)), fout), dtype=np.float64)
        args = [a.astype(dtype), b.astype(dtype)] + ([c.astype(np.float32)] if with_c else [])
        want = np.asarray(fn(*args), dtype=np.float64)
        got = np.asarray(
            pl.gemm(
                a,
                b,
                c if with_c else None,
                input_format=fin,
                accumulator=acc,
                out_format=fout,
            ),
            dtype=np.float64,
        )
        assert np.array_equal(want.view(np.int64), got.view(np.int64)), (k, want, got)


PRESETS = [
    ("v100", "fp16", "fp32", 12),
    ("a100", "fp16", "fp32", 20),
    ("a100", "bf16", "fp32", 20),
    ("a100", "tf32", "fp32", 12),
    ("a100", "fp16", "fp16", 20),
    ("ada", "e4m3", "fp32", 20),
    ("h100", "fp16", "fp32", 20),
    ("h100", "e4m3", "fp32", 36),
    ("h100", "e4m3", "fp16", 36),
    ("b200", "e4m3", "fp32", 36),
]


SPECIAL_RULES = ("overflow", "zeros_in_anchor", "zero_exponent", "zero_sign", "nan_encoding")


def _same_arithmetic(got, acc):
    """``got`` is ``acc`` up to the special-value rules. The presets carry NVIDIA's rules
    (overflow to inf, zeros in the anchor, +0), some of which no input of a format can show
    (fp16 products never reach fp32's overflow): the probe then keeps the IEEE default, which
    reproduces every special input it tried (its evidence says which)."""
    return got.replace(**{r: getattr(acc, r) for r in SPECIAL_RULES}) == acc


@pytest.mark.parametrize(("gpu", "fin", "fout", "max_k"), PRESETS)
def test_recovers_tensor_core_presets(gpu, fin, fout, max_k):
    # the instruction each measured data set was recorded with (mma; wgmma for H100 FP8 -> fp32)
    acc = measured_preset(gpu, fin, fout)
    fn = hidden(acc, fin, fout)
    res = probe(fn, input_format=fin, out_format=fout, max_k=max_k)
    assert res.failed is None, str(res)
    got = res.accumulator
    assert _same_arithmetic(got, acc), (got, acc)
    assert (got.order, got.block, got.align_bits, got.addend, got.inner_block) == (
        acc.order,
        acc.block,
        acc.align_bits,
        acc.addend,
        acc.inner_block,
    )
    assert (got.format.exponent_bits, got.format.mantissa_bits, got.rounding) == (
        acc.format.exponent_bits,
        acc.format.mantissa_bits,
        acc.rounding,
    )
    assert res.confidence == 1.0 and res.reproduced == res.tried >= 256
    fresh_check(fn, got, fin, fout, max_k)


PLAIN = [
    ("seq fp32", A("fp32"), "fp16", 12),
    ("seq fp16 rtz", A("fp16", "toward_zero"), "fp16", 12),
    ("seq bf16", A("bf16"), "bf16", 12),
    ("seq fp16 up", A("fp16", "up"), "fp16", 12),
    ("seq fp32 down", A("fp32", "down"), "fp16", 12),
    ("seq fp16 rna", A("fp16", "nearest_away"), "fp16", 12),
    ("seq e8m9", A(pl.FloatFormat(8, 9)), "bf16", 12),
    ("pairwise fp32", A("fp32", order="pairwise"), "fp16", 12),
    ("pairwise bf16 rtz", A("bf16", "toward_zero", order="pairwise"), "bf16", 16),
    ("blocked 4", A("fp16", order="blocked", block=4), "fp16", 14),
    ("blocked 8", A("fp32", order="blocked", block=8), "fp16", 20),
    ("blocked 32", A("bf16", order="blocked", block=32), "bf16", 34),
    ("promoted", A("bf16", promote_every=4), "bf16", 14),
    ("fma in 4", A("fp16", order="block_fma", block=4, align_bits=10), "fp16", 12),
    (
        "fma after 8",
        A(
            "fp32",
            "toward_zero",
            order="block_fma",
            block=8,
            align_bits=20,
            addend="after_block",
            block_rounding="nearest_even",
        ),
        "fp16",
        20,
    ),
    ("products fp32", A("fp32", product_format="fp32"), "fp32", 12),
    ("products bf16", A("fp32", product_format="bf16"), "fp16", 12),
]


@pytest.mark.parametrize(("acc", "fin", "max_k"), [p[1:] for p in PLAIN], ids=[p[0] for p in PLAIN])
def test_recovers_plain_accumulators(acc, fin, max_k):
    fn = hidden(acc, fin)
    res = probe(fn, input_format=fin, max_k=max_k)
    assert res.failed is None, str(res)
    assert res.accumulator == acc, (res.accumulator, acc)
    assert res.confidence == 1.0
    fresh_check(fn, res.accumulator, fin, "fp32", max_k)


@pytest.mark.parametrize(
    ("acc", "fin", "max_k"),
    [
        (pl.tensor_core("a100", "fp16").replace(**UNSEEN_FP16), "fp16", 12),
        (A("fp32", order="pairwise"), "fp16", 12),
        (A("bf16", order="blocked", block=4), "bf16", 12),
        # (c enters after the block: a zero product never raises an anchor c is aligned to)
        (
            pl.tensor_core("b200", "e4m3").replace(**UNSEEN_FP16, zeros_in_anchor=False),
            "e4m3",
            34,
        ),
    ],
    ids=["a100 in block", "pairwise: c last", "blocked: c first", "b200 fp8: c after block"],
)
def test_finds_where_c_enters(acc, fin, max_k):
    fn = hidden(acc, fin, with_c=True)
    res = probe(fn, input_format=fin, max_k=max_k, with_c=True)
    assert _same_arithmetic(res.accumulator, acc), str(res)
    assert "c" in res.tree
    fresh_check(fn, res.accumulator, fin, "fp32", max_k, with_c=True)


SPECIAL = [
    (
        "a100 bf16, every rule",
        pl.tensor_core("a100", "bf16").replace(
            overflow="infinity", zeros_in_anchor=True, zero_sign="positive", nan_encoding="nvidia"
        ),
        "bf16",
        20,
        False,
    ),
    (
        "h100 bf16 infinity",
        pl.tensor_core("h100", "bf16").replace(overflow="infinity"),
        "bf16",
        20,
        False,
    ),
    (
        "h100 bf16 zeros",
        pl.tensor_core("h100", "bf16").replace(zeros_in_anchor=True),
        "bf16",
        20,
        False,
    ),
    (  # (fp16 inputs cannot show MMA-Sim's zero rule: their products lie far above e_zero)
        "h100 zeros, c",
        pl.tensor_core("h100", "bf16").replace(overflow="ieee", zero_sign="ieee"),
        "bf16",
        20,
        True,
    ),
    ("fp16 saturate", A("fp16", overflow="saturate"), "fp16", 12, False),
    ("fp32 down, +0", A("fp32", "down", zero_sign="positive"), "bf16", 12, False),
    ("fp16 rtz infinity", A("fp16", "toward_zero", overflow="infinity"), "fp16", 12, False),
]


@pytest.mark.parametrize(
    ("acc", "fin", "max_k", "with_c"), [p[1:] for p in SPECIAL], ids=[p[0] for p in SPECIAL]
)
def test_recovers_special_value_rules(acc, fin, max_k, with_c):
    fn = hidden(acc, fin, with_c=with_c)
    res = probe(fn, input_format=fin, max_k=max_k, with_c=with_c)
    assert res.accumulator == acc, str(res)
    for rule in SPECIAL_RULES:
        assert getattr(res.accumulator, rule) == getattr(acc, rule)
    assert "special inputs" in res.evidence["special values"]


def test_evidence_names_each_property():
    res = probe(hidden(pl.tensor_core("a100", "fp16"), "fp16"), input_format="fp16", max_k=20)
    ev = res.evidence
    assert "block FMA of 8 products" in ev["tree"]
    assert "up to j = 24: 24 fraction bits" in ev["alignment"]
    assert "products exact" in ev["products"]
    assert ev["rounding"].startswith("toward_zero")
    assert ev["confirmation"].startswith(f"{res.tried}/{res.tried}")
    assert "reproduced bit for bit" in res.verdict and "block FMA" in res.verdict
    # products rounded before the addition are seen as such
    res = probe(hidden(A("fp32", product_format="fp32"), "fp32"), input_format="fp32", max_k=8)
    assert "rounded before they are added" in res.evidence["products"]


def loop_fp32(a, b):
    """A plain Python/numpy loop in float32: each product rounded, then added in order."""
    d = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        d += a[:, k : k + 1] * b[k : k + 1, :]
    return d


def test_recovers_a_sequential_float32_loop():
    res = probe(loop_fp32, input_format="fp32", max_k=12)
    assert res.accumulator == A("fp32", product_format="fp32"), str(res)
    fresh_check(loop_fp32, res.accumulator, "fp32", "fp32", 12)


def numpy_sum(a, b):
    """np.sum over a contiguous float32 axis (numpy's pairwise_sum), one output at a time."""
    p = a[:, None, :] * b.T[None, :, :]
    d = np.empty(p.shape[:2], np.float32)
    for i in range(p.shape[0]):
        for j in range(p.shape[1]):
            d[i, j] = np.ascontiguousarray(p[i, j]).sum()
    return d


def numpy_pairwise_tree(n: int):
    """numpy's pairwise_sum for 8 <= n <= 128, as its source describes it: 8 partial sums
    r[j] = x[j] + x[j+8] + ..., combined ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the
    remainder added one by one."""
    full = n - n % 8
    r = []
    for j in range(8):
        node = j
        for i in range(j + 8, full, 8):
            node = (node, i)
        r.append(node)
    node = (((r[0], r[1]), (r[2], r[3])), ((r[4], r[5]), (r[6], r[7])))
    for i in range(full, n):
        node = (node, i)
    return node


def test_numpy_pairwise_sum_is_recovered_as_eight_lanes():
    # below 8 terms numpy's sum is a plain loop: recovered exactly
    res = probe(numpy_sum, input_format="fp32", max_k=7)
    assert res.accumulator == A("fp32", product_format="fp32"), str(res)
    # from 8 terms on it keeps 8 interleaved partial sums, combined pairwise, the remainder
    # added after them (spec 3e: lanes), which the probe reads off the tree
    res = probe(numpy_sum, input_format="fp32", max_k=20)
    want_acc = A("fp32", product_format="fp32", lanes=8, lane_combine="pairwise", lane_tail="after")
    assert res.accumulator == want_acc, str(res)
    want = _lca_sizes(numpy_pairwise_tree(20), 20)
    assert res.tree == _render(_tree_from_sizes(want), 20)
    assert "8 interleaved lanes" in res.evidence["tree"]
    assert "the lanes hold at every K" in res.evidence["kernels"]
    assert res.outcome == "reproduced" and res.confidence == 1.0
    fresh_check(numpy_sum, res.accumulator, "fp32", "fp32", 20)


def test_a_reversed_loop_is_not_in_the_family():
    def reversed_loop(a, b):
        d = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for k in reversed(range(a.shape[1])):
            d += a[:, k : k + 1].astype(np.float32) * b[k : k + 1, :].astype(np.float32)
        return d

    res = probe(reversed_loop, input_format="fp16", max_k=6)
    assert res.accumulator is None and res.failed == "summation tree"
    rev = (((((5, 4), 3), 2), 1), 0)
    assert res.tree == _render(_tree_from_sizes(_lca_sizes(rev, 6)), 6) == "(0 (1 (2 (3 (4 5)))))"


def test_reports_a_property_outside_the_search():
    # the family's tree, but the output rounding is not one the probe varies
    acc = A("fp32", out_rounding="toward_zero")
    res = probe(hidden(acc, "fp16", "fp16"), input_format="fp16", out_format="fp16", max_k=8)
    assert res.accumulator is None and res.failed == "format and rounding"
    assert res.closest is not None and res.confidence < 1.0
    assert "sequential" in res.evidence["tree"]


def test_family_trees_by_hand():
    seq = _family_tree({"order": "sequential"}, 4, False)
    assert _render(seq, 4) == "(((0 1) 2) 3)"
    assert _render(_family_tree({"order": "sequential"}, 3, True), 3) == "(((c 0) 1) 2)"
    assert _render(_family_tree({"order": "pairwise"}, 5, True), 5) == "(c (((0 1) (2 3)) 4))"
    spec = {"order": "block_fma", "block": 4, "addend": "in_block"}
    assert _render(_family_tree(spec, 8, True), 8) == "((c 0 1 2 3) 4 5 6 7)"
    spec = {"order": "block_fma", "block": 8, "addend": "after_block", "inner_block": 4}
    spec["inner_interleave"] = 2
    assert _render(_family_tree(spec, 8, False), 8) == "((0 1 4 5) 2 3 6 7)"
    # the LCA sizes of a tree give the tree back
    for t in (seq, _family_tree(spec, 8, False), numpy_pairwise_tree(19)):
        n = max(_lca_sizes_leaves(t)) + 1
        assert _render(_tree_from_sizes(_lca_sizes(t, n)), n) == _render(t, n)


def _lca_sizes_leaves(t):
    return [t] if not isinstance(t, tuple) else [x for ch in t for x in _lca_sizes_leaves(ch)]


# ----- bad callables and arguments ---------------------------------------------------------------
def test_wrong_shape_is_an_error_naming_fn():
    with pytest.raises(ValueError, match=r"fn returned shape \(8,\) .* expected \(8, 8\)"):
        pl.probe_gemm(lambda a, b: (a @ b)[:, 0], input_format="fp32", max_k=4)


def test_non_deterministic_fn_is_an_error():
    calls = [0]

    def noisy(a, b):  # every other call is off by an ulp (as split-K with atomics can be)
        calls[0] += 1
        return (a @ b) * np.float32(1 + (calls[0] % 2) * 2.0**-20)

    with pytest.raises(ValueError, match="fn is not deterministic"):
        pl.probe_gemm(noisy, input_format="fp32", max_k=4)


def test_fn_that_raises_or_returns_no_floats():
    def boom(a, b):
        raise KeyError("nope")

    with pytest.raises(RuntimeError, match=r"fn raised KeyError on a of shape \(8, 4\)"):
        pl.probe_gemm(boom, input_format="fp32", max_k=4)
    with pytest.raises(TypeError, match="floating-point"):
        pl.probe_gemm(lambda a, b: np.ones((8, 8), np.int32), input_format="fp32", max_k=4)
    with pytest.raises(TypeError, match="fn must be callable"):
        pl.probe_gemm(3, input_format="fp32")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_k": 1}, "max_k must be an int in 2..256"),
        ({"max_k": 4.0}, "max_k"),
        ({"cases": 0}, "cases must be a positive int"),
        ({"shape": (8,)}, "shape must be a pair"),
        ({"input_format": "int8"}, "input_format must be a floating-point format"),
        ({"input_format": "nope"}, "input_format"),
        ({"out_format": "int8"}, "out_format"),
        ({"max_calls": 0}, "max_calls"),
    ],
)
def test_bad_arguments(kw, match):
    kw = {"input_format": "fp32", **kw}
    with pytest.raises(ValueError, match=match):
        pl.probe_gemm(lambda a, b: a @ b, **kw)


def test_rarely_non_deterministic_fn_is_caught_at_the_end():
    calls = [0]

    def late(a, b):  # deterministic for 20 calls, then not
        calls[0] += 1
        return (a @ b) * np.float32(1 + (calls[0] > 20) * 2.0**-20)

    with pytest.raises(ValueError, match="fn is not deterministic"):
        pl.probe_gemm(late, input_format="fp32", max_k=6, cases=64)


def test_call_budget_is_enforced():
    with pytest.raises(RuntimeError, match="more than 5 calls of fn"):
        pl.probe_gemm(lambda a, b: a @ b, input_format="fp32", max_k=4, max_calls=5)


# ----- the command line --------------------------------------------------------------------------
def test_cli_probe_numpy_json(capsys):
    import json

    from precision_lab.cli import main

    rc = main(["probe", "numpy", "--max-k", "6", "--cases", "64", "--json"])
    info = json.loads(capsys.readouterr().out)
    assert rc == (0 if info["found"] else 1)  # exit status 1 when nothing reproduces numpy
    assert info["library"] == "numpy" and info["tried"] >= 64
    assert set(info["evidence"]) >= {"tree", "confirmation"}
    # whatever BLAS numpy links: a model is reported only when it reproduced every case
    assert (info["found"] and info["confidence"] == 1.0) or info["failed"] is not None


def test_cli_probe_missing_library(capsys):
    pytest.importorskip("numpy")
    try:
        import cupy  # noqa: F401
    except ImportError:
        from precision_lab.cli import main

        assert main(["probe", "cupy", "--max-k", "4"]) == 1
        assert "cupy" in capsys.readouterr().err
    else:  # pragma: no cover - a GPU machine
        pytest.skip("cupy is installed")
