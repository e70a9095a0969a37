"""probe_gemm's verdicts (issue 31, item 6): boxes the Accumulator family reproduces are
reproduced, and every other verdict says which it is: outside what the probe tries (naming what
it tried and the property that failed) or cannot measure (naming why).

Each box is ``pl.gemm`` with a hidden model; the probe's answer is checked independently of
its own confirmation: on fresh inputs of another shape and seed, the returned accumulator gives
the box's bits through ``pl.gemm``.
"""

from __future__ import annotations

import random

import ml_dtypes
import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core.pool import use_workers
from precision_lab.gemm.probe import _dtype_for

A = pl.Accumulator


def hidden(acc, fin, fout="fp32"):
    return lambda a, b: pl.gemm(a, b, input_format=fin, accumulator=acc, out_format=fout)


def probe(fn, fin, fout, max_k, **kw):
    with use_workers(1):  # many tiny GEMMs: threads cost more than they give
        return pl.probe_gemm(
            fn, input_format=fin, out_format=fout, max_k=max_k, cases=128, seed=3, **kw
        )


def fresh_check(fn, acc, fin, fout, max_k, seed=12345):
    """New shape, seed and K values: the box and pl.gemm with ``acc`` agree bit for bit."""
    rng = np.random.default_rng(seed)
    fa, fb = (pl.get_format(f) for f in (fin if isinstance(fin, tuple) else (fin, fin)))
    scale = min(4.0, fa.max / 4)
    for k in sorted({1, 2, max_k // 2 + 1, max_k}):
        a = np.asarray(pl.round_to(rng.standard_normal((5, k)) * scale, fa), dtype=np.float64)
        b = np.asarray(pl.round_to(rng.standard_normal((k, 7)), fb), dtype=np.float64)
        want = np.asarray(fn(a.astype(_dtype_for(fa)), b.astype(_dtype_for(fb))), np.float64)
        got = np.asarray(
            pl.gemm(a, b, input_format=fin, accumulator=acc, out_format=fout), dtype=np.float64
        )
        assert np.array_equal(want.view(np.int64), got.view(np.int64)), (k, want, got)


def assert_reproduced(res, fn, fin, fout, max_k):
    assert res.outcome == "reproduced" and res.failed is None, str(res)
    assert res.verdict.startswith("Reproduced:"), res.verdict
    assert res.confidence == 1.0 and res.reproduced == res.tried >= 128
    fresh_check(fn, res.accumulator, fin, fout, max_k)


# ----- boxes the probe called "no model of the family" before ------------------------------------
@pytest.mark.parametrize("fin", ["fp32", "fp16"])
def test_float64_matmul_is_reproduced(fin):
    def f64(a, b):  # the inputs widened to float64 and multiplied there (BLAS dgemm, K small)
        return a.astype(np.float64) @ b.astype(np.float64)

    res = probe(f64, fin, None, 8)
    assert_reproduced(res, f64, fin, "fp64", 8)
    assert res.accumulator.format == pl.get_format("fp64")


NAMED = [
    ("fp64", A("fp64"), "fp32", "fp64", 8),
    ("fp32", A("fp32"), "fp16", "fp32", 8),
    ("fp16", A("fp16"), "fp16", "fp16", 8),
    ("exact_block 4", A("fp32", order="exact_block", block=4), "bf16", "fp32", 10),
    (
        "exact_block 8 fp16 rtz",
        A("fp16", "toward_zero", order="exact_block", block=8),
        "fp16",
        "fp16",
        12,
    ),
    ("compensated fp16", A("fp16", order="compensated"), "fp16", "fp32", 8),
    ("compensated bf16 rtz", A("bf16", "toward_zero", order="compensated"), "bf16", "fp32", 8),
    (
        "separate",
        A("fp32", order="block_fma", block=8, align_bits=24, addend="separate", sum_bits=31),
        "fp16",
        "fp32",
        12,
    ),
    (
        "separate down",
        A(
            "fp32",
            order="block_fma",
            block=4,
            align_bits=20,
            addend="separate",
            sum_bits=31,
            align_rounding="down",
        ),
        "bf16",
        "fp32",
        9,
    ),
    ("fp16 flush", A("fp16", subnormals="flush"), "fp16", "fp16", 8),
    (
        "bf16 rtz inputs flushed",
        A("bf16", "toward_zero", input_subnormals="flush"),
        "bf16",
        "fp32",
        8,
    ),
    ("mi100 f32", pl.tensor_core("mi100", "fp32"), "fp32", "fp32", 6),
    ("mi100 f16", pl.tensor_core("mi100", "fp16"), "fp16", "fp32", 9),
    ("mi100 bf16", pl.tensor_core("mi100", "bf16"), "bf16", "fp32", 5),
    ("mi210 f16", pl.tensor_core("mi210", "fp16"), "fp16", "fp32", 9),
    ("mi210 bf16", pl.tensor_core("mi210", "bf16"), "bf16", "fp32", 9),
    (
        "mi210 bf16 (pre-1k)",
        pl.tensor_core("mi210", "bf16", instruction="mfma.bf16"),
        "bf16",
        "fp32",
        5,
    ),
    ("mi210 f64", pl.tensor_core("mi210", "fp64", out_format="fp64"), "fp64", "fp64", 6),
    ("mi300x f16", pl.tensor_core("mi300x", "fp16"), "fp16", "fp32", 10),
    ("mi300x bf16", pl.tensor_core("mi300x", "bf16"), "bf16", "fp32", 10),
    ("mi300x xf32", pl.tensor_core("mi300x", "tf32"), "tf32", "fp32", 6),
    ("mi300x fp8", pl.tensor_core("mi300x", "e4m3fnuz"), "e4m3fnuz", "fp32", 10),
    ("a100 f64", pl.tensor_core("a100", "fp64", out_format="fp64"), "fp64", "fp64", 6),
    ("b200 e2m1", pl.tensor_core("b200", "e2m1"), "e2m1", "fp32", 12),
    ("b200 e2m1 -> fp16", pl.tensor_core("b200", "e2m1", out_format="fp16"), "e2m1", "fp16", 12),
    ("b200 e3m2 -> fp16", pl.tensor_core("b200", "e3m2", out_format="fp16"), "e3m2", "fp16", 12),
    ("rtx5090 e2m3", pl.tensor_core("rtx5090", "e2m3"), "e2m3", "fp32", 12),
]


@pytest.mark.parametrize(
    ("acc", "fin", "fout", "max_k"), [n[1:] for n in NAMED], ids=[n[0] for n in NAMED]
)
def test_named_boxes_are_reproduced(acc, fin, fout, max_k):
    fn = hidden(acc, fin, fout)
    res = probe(fn, fin, fout, max_k)
    assert_reproduced(res, fn, fin, fout, max_k)


def _preset_rows():
    """Rows of pl.tensor_core.list() that pl.gemm takes (block-scaled kinds run through
    gemm_blocks): one input format, or a pair for mixed operands."""
    out = []
    for r in pl.tensor_core.list():
        fin = tuple(r["input_format"].split(" x "))
        try:
            [pl.get_format(f) for f in fin]
        except ValueError:  # a block format
            continue
        fin = fin[0] if len(fin) == 1 else fin
        gpu = r["gpus"].split()[0]
        out.append((gpu, fin, r["out_format"], f"{r['instruction']}.{r['kind']}"))
    return out


ROWS = _preset_rows()
#: a sample of the table (fixed seed: the same rows every run), on top of NAMED's families
SAMPLE = random.Random(31).sample(ROWS, 10)


@pytest.mark.parametrize(("gpu", "fin", "fout", "instruction"), SAMPLE, ids=map(str, SAMPLE))
def test_sampled_presets_are_reproduced(gpu, fin, fout, instruction):
    acc = pl.tensor_core(gpu, fin, out_format=fout, instruction=instruction)
    max_k = min(2 * (acc.block or acc.promote_every or 2) + 1, 11)
    fn = hidden(acc, fin, fout)
    res = probe(fn, fin, fout, max_k)
    assert_reproduced(res, fn, fin, fout, max_k)


def test_the_sample_covers_the_table():
    # every row but the block-scaled ones (57, and CDNA4's 25 scale_f8f6f4 rows) is a
    # candidate; the table only grows (184 rows before MMA-Sim 2.1.1's m8n8k4 fp16-C and f64
    # rows, 191 with them, 220 with CDNA4's)
    assert len(ROWS) >= 220
    assert len(ROWS) + 57 + 25 == len(pl.tensor_core.list())
    assert {r[1] for r in ROWS} >= {"fp16", "bf16", "tf32", "fp32", "fp64", "e4m3", "e2m1"}
    assert any(isinstance(r[1], tuple) for r in SAMPLE)  # mixed operands sampled too


MIXED = [
    ("ada e4m3 x e5m2", "ada", ("e4m3", "e5m2"), "fp32", "mma", 20),
    ("h100 e5m2 x e4m3 -> fp16", "h100", ("e5m2", "e4m3"), "fp16", "mma", 10),
    ("b200 e4m3 x e2m1", "b200", ("e4m3", "e2m1"), "fp32", "tcgen05", 10),
    ("rtx5090 e3m2 x e2m3 -> fp16", "rtx5090", ("e3m2", "e2m3"), "fp16", "mma", 10),
]


@pytest.mark.parametrize(
    ("gpu", "fin", "fout", "instruction", "max_k"),
    [m[1:] for m in MIXED],
    ids=[m[0] for m in MIXED],
)
def test_mixed_operand_presets_are_reproduced(gpu, fin, fout, instruction, max_k):
    acc = pl.tensor_core(gpu, fin, out_format=fout, instruction=instruction)
    fn = hidden(acc, fin, fout)
    res = probe(fn, fin, fout, max_k)
    assert_reproduced(res, fn, fin, fout, max_k)
    assert " x ".join(fin) in res.verdict


def test_input_format_pair_must_be_two():
    with pytest.raises(ValueError, match="input_format must be one format or a pair"):
        pl.probe_gemm(lambda a, b: a @ b, input_format=("fp16", "fp16", "fp16"))


# ----- verdicts that are not "reproduced" --------------------------------------------------------
def reversed_loop(a, b):
    d = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in reversed(range(a.shape[1])):
        d += a[:, k : k + 1].astype(np.float32) * b[k : k + 1, :].astype(np.float32)
    return d


def test_outside_names_what_was_tried_and_what_failed():
    res = probe(reversed_loop, "fp16", None, 6)
    assert res.accumulator is None and res.outcome == "outside"
    assert res.verdict.startswith("Outside what the probe tries")
    assert "the property that failed: summation tree" in res.verdict
    assert "summation orders of the family" in res.verdict and "named models" in res.verdict
    assert "pl.tensor_core.list()" in res.verdict


def test_fp4_range_is_named_not_the_order():
    # e2m1 products span 2**-2 .. 36: no M and unit 2**11 apart exist, so the summation order
    # cannot be measured; the verdict says so (not "an order the family cannot express")
    acc = pl.tensor_core("b200", "e2m1", out_format="fp16")
    res = probe(hidden(acc, "e2m1", "fp16"), "e2m1", "fp16", 12)
    assert res.outcome == "reproduced"
    tree = res.evidence["tree"]
    assert tree.startswith("cannot measure the summation order") and "e2m1" in tree
    assert "range is too narrow" in tree
    assert "other orders may reproduce fn too" in res.evidence["named model"]


def test_cannot_measure_says_why():
    # e2m1 inputs summed in bf16 from the last product to the first: no model the probe tries
    # has that order, and e2m1's range cannot show the order (its products span 2**-2 .. 36)
    def reversed_bf16(a, b):
        d = np.zeros((a.shape[0], b.shape[1]), ml_dtypes.bfloat16)
        for k in reversed(range(a.shape[1])):
            p = a[:, k : k + 1].astype(np.float32) * b[k : k + 1, :].astype(np.float32)
            d = (d.astype(np.float32) + p).astype(ml_dtypes.bfloat16)  # one rounding: exact sum
        return d

    res = probe(reversed_bf16, "e2m1", None, 12)
    assert res.accumulator is None and res.outcome == "cannot measure", str(res)
    assert res.verdict.startswith("Cannot measure:")
    assert "e2m1" in res.verdict and "range is too narrow" in res.verdict
    assert "Tried:" in res.verdict and "named models" in res.verdict


# ----- the command line --------------------------------------------------------------------------
def test_cli_probe_exits_1_in_one_line_when_nothing_reproduces(capsys, monkeypatch):
    from precision_lab import cli

    monkeypatch.setattr(
        cli, "_library_matmul", lambda library, fmt, op="matmul": (reversed_loop, None)
    )
    assert cli.main(["probe", "numpy", "--max-k", "6", "--cases", "64"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("precision-lab probe: no model reproduces numpy's matmul")
    assert "outside what the probe tries" in err and "summation tree" in err


def test_cli_probe_exits_0_when_reproduced(capsys, monkeypatch):
    from precision_lab import cli

    box = hidden(A("fp32"), "fp32")
    monkeypatch.setattr(cli, "_library_matmul", lambda library, fmt, op="matmul": (box, None))
    assert cli.main(["probe", "numpy", "--max-k", "6", "--cases", "64", "--json"]) == 0
    assert '"outcome": "reproduced"' in capsys.readouterr().out
