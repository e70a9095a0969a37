"""probe_gemm on hidden CPU-style models (spec 3e/3f): each is recovered exactly, then checked
on fresh inputs of other K, independently of the probe's own confirmation."""

from __future__ import annotations

import json

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core.pool import use_workers
from precision_lab.gemm.probe import _family_tree, _lca_row0, _lca_sizes

A = pl.Accumulator


def hidden(acc: pl.Accumulator, fin: str = "fp32", fout: str = "fp32"):
    return lambda a, b: pl.gemm(a, b, input_format=fin, accumulator=acc, out_format=fout)


def fresh_same(fn, acc: pl.Accumulator, ks, fin: str = "fp32") -> bool:
    rng = np.random.default_rng(7)
    for k in ks:
        a = np.asarray(pl.round_to(rng.standard_normal((4, k)), fin), np.float64)
        b = np.asarray(pl.round_to(rng.standard_normal((k, 5)), fin), np.float64)
        want = np.asarray(fn(a.astype(np.float32), b.astype(np.float32)), np.float64)
        got = np.asarray(pl.gemm(a, b, input_format=fin, accumulator=acc), np.float64)
        if not np.array_equal(want.view(np.int64), got.view(np.int64)):
            return False
    return True


@pytest.mark.parametrize(
    "acc",
    [
        A("fp32", lanes=4),  # torch bf16's lanes, tail in its lane
        A("fp32", lanes=4, lane_tail="first"),  # torch bf16 as measured
        A("fp32", lanes=8, lane_combine="pairwise", lane_tail="after", product_format="fp32"),
        A("fp32", lanes=8, lane_combine="halving"),
        A("fp32", lanes=4, lane_combine=((0, 2), (1, 3)), lane_tail="separate", lane_unroll=8),
        A("fp32", lanes=4, lane_combine="pairwise", small_k=12),  # numpy 8x8's kind (16, 32)
        A("fp32", lanes=2, order="blocked", block=2),
    ],
    ids=lambda acc: acc.describe()[:60],
)
def test_hidden_lane_models_are_recovered(acc: pl.Accumulator) -> None:
    fn = hidden(acc)
    with use_workers(1):
        res = pl.probe_gemm(fn, input_format="fp32", max_k=20, cases=128)
    assert res.outcome == "reproduced", str(res)
    assert res.accumulator is not None and res.confidence == 1.0
    assert f"{acc.lanes} interleaved lanes" in res.evidence["tree"]
    if acc.small_k is not None:
        assert res.accumulator.small_k == acc.small_k, str(res)
        assert "the kernel changes with K" in res.evidence["kernels"]
    assert fresh_same(fn, res.accumulator, (1, 3, 11, 12, 17, 33, 41, 97))


def test_long_k_finds_openblas_k_blocking() -> None:
    acc = A("fp32", split_k=96, split_balance=1)
    fn = hidden(acc)
    with use_workers(1):
        short = pl.probe_gemm(fn, input_format="fp32", max_k=16, cases=128)
        res = pl.probe_gemm(fn, input_format="fp32", max_k=16, cases=128, long_k=250)
    assert short.accumulator is not None and res.accumulator is not None
    # below the block length: a plain chain (the split's c + V_0 turns a -0 sum into +0, as
    # zero_sign "positive" does: an equivalent model at K <= max_k)
    assert short.accumulator.replace(zero_sign="ieee") == A("fp32"), str(short)
    assert res.accumulator.replace(zero_sign="ieee") == acc, str(res)
    assert "depart from the model's at product 96" in res.evidence["long K"]
    assert fresh_same(fn, res.accumulator, (95, 96, 97, 191, 193, 250, 300))


def test_long_k_finds_openblas_single_thread_k_blocking() -> None:
    """OpenBLAS's level3.c (measured: numpy 2.4.6 float32 8x8 on an AMD Zen 3, blocks of 320,
    u = 8): a rest under 2S is halved rounded down, then up to a multiple of u; the lanes put
    the first departure at product 1, so the block length is read off that pair's count."""
    acc = A("fp32", lanes=2, split_k=80, split_balance=8, split_half="floor")
    fn = hidden(acc)
    with use_workers(1):
        res = pl.probe_gemm(fn, input_format="fp32", max_k=16, cases=128, long_k=300)
    assert res.accumulator is not None, str(res)
    assert res.accumulator.replace(zero_sign="ieee") == acc, str(res)
    assert "halved (floor) then rounded up to a multiple of 8" in res.evidence["long K"]
    assert fresh_same(fn, res.accumulator, (81, 97, 159, 161, 163, 175, 250, 301, 333))


def test_output_places_summed_in_different_orders_are_named() -> None:
    """A BLAS whose edge tiles run another kernel (numpy's OpenBLAS float32 on an AMD Zen 3):
    rows 5.. of the output sum sequentially, rows 0-4 in two lanes. One order per element is
    all the family has, so the verdict is 'outside', naming the places."""
    lanes, chain = A("fp32", lanes=2), A("fp32")

    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        top = pl.gemm(a[:5], b, input_format="fp32", accumulator=lanes)
        rest = pl.gemm(a[5:], b, input_format="fp32", accumulator=chain)
        return np.concatenate([np.asarray(top), np.asarray(rest)]).astype(np.float32)

    with use_workers(1):
        res = pl.probe_gemm(fn, input_format="fp32", max_k=16, cases=128)
    assert res.outcome == "outside" and res.failed == "places", str(res)
    assert res.accumulator is None
    assert "(rows 5-7, columns 0-7)" in res.evidence["places"], res.evidence["places"]
    # the cases went to the places that sum as (0, 0) does: its order was recovered
    assert "2 interleaved lanes" in res.evidence["tree"], str(res)
    with use_workers(1):  # a function with one order everywhere is not flagged
        plain = pl.probe_gemm(hidden(lanes), input_format="fp32", max_k=16, cases=128)
    assert "places" not in plain.evidence and plain.outcome == "reproduced"


def test_long_k_reports_a_split_it_cannot_express() -> None:
    def odd_blocks(a, b):  # chunks of 50, then the rest in chunks of 7: no split the family has
        acc1 = A("fp32")
        out = pl.gemm(a[:, :50], b[:50], input_format="fp32", accumulator=acc1)
        for j in range(50, a.shape[1], 7):
            part = pl.gemm(a[:, j : j + 7], b[j : j + 7], input_format="fp32", accumulator=acc1)
            out = (out + part).astype(np.float32)
        return out

    with use_workers(1):
        res = pl.probe_gemm(odd_blocks, input_format="fp32", max_k=16, cases=128, long_k=120)
    # the tree at long K is known wrong: the verdict names it, whatever random inputs say
    assert res.accumulator is None and res.failed == "long K", str(res)
    assert "no split the probe tries gives them" in res.evidence["long K"]


def test_k1_product_keeps_a_negative_zero() -> None:
    a = np.array([[-0.0]], np.float32)
    b = np.array([[1.0]], np.float32)
    plain = pl.gemm(a, b, input_format="fp32", accumulator=A("fp32"))
    k1 = pl.gemm(a, b, input_format="fp32", accumulator=A("fp32", k1_product=True))
    assert not np.signbit(plain[0, 0]) and np.signbit(k1[0, 0])
    # with a c, or with K = 2, nothing changes
    c = np.array([[0.0]], np.float32)
    a2, b2 = np.array([[-0.0, -0.0]], np.float32), np.array([[1.0], [1.0]], np.float32)
    for args in ((a, b, -c), (a2, b2, None)):
        x = pl.gemm(*args, input_format="fp32", accumulator=A("fp32"))
        y = pl.gemm(*args, input_format="fp32", accumulator=A("fp32", k1_product=True))
        assert x.tobytes() == y.tobytes()


def test_row_of_leaf_zero_matches_the_full_matrix() -> None:
    for spec in (
        {"order": "sequential", "lanes": 4, "lane_tail": "first"},
        {"order": "sequential", "split_k": 8, "split_combine": "halving", "lanes": 2},
        {"order": "blocked", "block": 3},
    ):
        tree = _family_tree(spec, 37, False)
        assert np.array_equal(_lca_row0(tree, 37), _lca_sizes(tree, 37)[0])


def test_cli_probe_sum_finds_lanes(capsys) -> None:
    from precision_lab.cli import main

    rc = main(["probe", "numpy", "--op", "sum", "--max-k", "12", "--cases", "64", "--json"])
    info = json.loads(capsys.readouterr().out)
    # whatever numpy does here: a model only when it reproduced every case
    assert rc == (0 if info["found"] else 1)
    assert (info["found"] and info["confidence"] == 1.0) or info["failed"] is not None


def test_accumulator_round_trips_through_a_policy_dict() -> None:
    from precision_lab.training.policy import accumulator_from_dict, accumulator_to_dict

    acc = A("fp32", lanes=4, lane_combine=((0, 2), (1, 3)), split_k=64, split_balance=2,
            split_half="floor")  # fmt: skip
    d = json.loads(json.dumps(accumulator_to_dict(acc)))
    assert accumulator_from_dict(d) == acc


def test_long_k_finds_the_size_of_a_balanced_split_by_bisection() -> None:
    """K = 300 shows a cut at 150 (halves): blocks of 150 and a balanced split of any block
    size 150..299 give those pairs; the probe measures more K and finds 200 (torch 2.13's
    float32 matmul on an Intel Xeon with AVX-512: 384)."""
    acc = A("fp32", split_k=200, split_balance=1)
    fn = hidden(acc)
    with use_workers(1):
        res = pl.probe_gemm(fn, input_format="fp32", max_k=16, cases=128, long_k=300)
    assert res.accumulator is not None, str(res)
    assert res.accumulator.replace(zero_sign="ieee") == acc, str(res)
    assert "the least K cut in two is 201" in res.evidence["long K"]
    assert fresh_same(fn, res.accumulator, (150, 199, 200, 201, 250, 399, 401, 700))


def test_kernels_that_change_with_k_are_recovered() -> None:
    """Spec 3g: lanes up to K = 40, then a chain in K-blocks of 96 up to K = 192, then blocks
    of 192 (the shape of torch 2.13's float16 matmul on an Intel Xeon with AVX512-FP16, at
    other sizes); the probe finds both switches by bisection on K."""
    longest = A("fp32", split_k=192)
    acc = A("fp32", lanes=4, lane_tail="first", switch_k=40,
            long_kernel=A("fp32", split_k=96, switch_k=192, long_kernel=longest))  # fmt: skip
    fn = hidden(acc)
    with use_workers(1):
        res = pl.probe_gemm(fn, input_format="fp32", max_k=16, cases=128, long_k=400)
    assert res.outcome == "reproduced", str(res)
    got = res.accumulator
    assert got is not None
    assert got.switch_k == 40 and got.long_kernel is not None, str(res)
    assert got.long_kernel.switch_k == 192 and got.long_kernel.split_k == 96, str(res)
    assert got.long_kernel.long_kernel is not None and got.long_kernel.long_kernel.split_k == 192
    assert "the kernel changes with K" in res.evidence["long K"]
    assert fresh_same(fn, got, (3, 39, 40, 41, 95, 97, 192, 193, 384, 385, 500))

    # a kernel the family lacks past the switch: an honest "long K"
    def odd(a, b):  # lanes to K = 40, then pairs of products rounded and summed: no family kernel
        if a.shape[1] <= 40:
            return fn(a, b)
        p = (a[:, :, None].astype(np.float32) * b[None, :, :].astype(np.float32)).astype(np.float32)
        return np.add.reduce(p[:, ::-1, :], axis=1, dtype=np.float32)

    with use_workers(1):
        bad = pl.probe_gemm(odd, input_format="fp32", max_k=16, cases=128, long_k=400)
    assert bad.outcome == "outside" and bad.failed == "long K", str(bad)


def test_switch_k_is_the_long_kernel_past_it_on_every_cpu_backend() -> None:
    long = A("fp32", split_k=8, product_format="fp32")
    acc = A("fp32", lanes=4, lane_tail="first", switch_k=12, long_kernel=long)
    rng = np.random.default_rng(11)
    for k in (1, 5, 12, 13, 30):
        a = np.asarray(pl.round_to(rng.standard_normal((3, k)) * 2.0 ** rng.integers(-9, 9, (3, k)),
                                   "bf16"), np.float64)  # fmt: skip
        b = np.asarray(pl.round_to(rng.standard_normal((k, 4)), "bf16"), np.float64)
        kernel = acc.for_k(k)
        assert kernel is (acc if k <= 12 else long)
        want = pl.gemm(a, b, input_format="bf16", accumulator=kernel, backend="numpy")
        for backend in ("numpy", "native", "auto"):
            got = pl.gemm(a, b, input_format="bf16", accumulator=acc, backend=backend)
            assert np.array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32)), (
                k,
                backend,
            )
    # the two kernels do differ on these inputs (the test can fail)
    k = 30
    a = np.asarray(pl.round_to(rng.standard_normal((3, k)) * 2.0 ** rng.integers(-9, 9, (3, k)),
                               "bf16"), np.float64)  # fmt: skip
    b = np.asarray(pl.round_to(rng.standard_normal((k, 4)), "bf16"), np.float64)
    short = acc.replace(switch_k=None, long_kernel=None)
    assert not np.array_equal(pl.gemm(a, b, input_format="bf16", accumulator=short),
                              pl.gemm(a, b, input_format="bf16", accumulator=acc))  # fmt: skip


def test_switch_k_round_trips_and_is_checked() -> None:
    from precision_lab.cli import _as_code
    from precision_lab.training.policy import accumulator_from_dict, accumulator_to_dict

    acc = A("fp32", lanes=4, switch_k=64, long_kernel=A("fp32", split_k=512))
    assert accumulator_from_dict(json.loads(json.dumps(accumulator_to_dict(acc)))) == acc
    assert eval(_as_code(acc), {"Accumulator": A}) == acc
    assert "from K = 65: " in acc.describe()
    with pytest.raises(ValueError, match="switch_k and long_kernel go together"):
        A("fp32", switch_k=4)
    with pytest.raises(TypeError, match="long_kernel must be an Accumulator"):
        A("fp32", switch_k=4, long_kernel="fp32")
    with pytest.raises(ValueError, match="switch_k"):
        A("fp32", switch_k=0, long_kernel=A("fp32"))


def _by_hand_equal_split(a: np.ndarray, b: np.ndarray, lane: pl.Accumulator) -> np.ndarray:
    """oneDNN's AMX K-blocking, written out: ceil(K / 32) equal even blocks where they fit,
    else blocks of 32; each block from 0 by ``lane``, added in turn in float32."""
    k = a.shape[1]
    m = -(-k // 32)
    size = k // m if k % m == 0 and (k // m) % 2 == 0 else 32
    t = None
    for j in range(0, k, size):
        v = pl.gemm(a[:, j : j + size], b[j : j + size], input_format="bf16", accumulator=lane)
        t = v if t is None else (np.float32(t) + np.float32(v)).astype(np.float64)
    assert t is not None
    return t


def test_split_equal_is_onednns_amx_k_blocking_on_every_cpu_backend() -> None:
    lane = A("fp32", lanes=2)
    acc = A("fp32", lanes=2, split_k=32, split_equal=2)
    rng = np.random.default_rng(12)
    differ = 0
    for k in (2, 31, 33, 65, 66, 68, 72, 90, 93, 100, 104, 240):
        a = np.asarray(pl.round_to(rng.standard_normal((3, k)) * 2.0 ** rng.integers(-9, 9, (3, k)),
                                   "bf16"), np.float64)  # fmt: skip
        b = np.asarray(pl.round_to(rng.standard_normal((k, 4)), "bf16"), np.float64)
        want = _by_hand_equal_split(a, b, lane)
        for backend in ("numpy", "native"):
            got = pl.gemm(a, b, input_format="bf16", accumulator=acc, backend=backend)
            assert np.array_equal(np.asarray(got, np.float64), want), (k, backend)
        plain = pl.gemm(a, b, input_format="bf16", accumulator=acc.replace(split_equal=None))
        differ += int(not np.array_equal(plain, want))
    assert differ >= 3  # 66, 72, 90, 104, 240 are cut otherwise without split_equal
    with pytest.raises(ValueError, match="split_equal needs split_k"):
        A("fp32", split_equal=2)


def test_a_cpu_instruction_as_the_long_k_kernel_is_recovered() -> None:
    """torch 2.13's bfloat16 matmul on an Intel Xeon with AMX-BF16, as measured: 4 lanes up
    to K = 64, then TDPBF16PS tiles in oneDNN's K-blocks (the preset with split_equal=2)."""
    amx = pl.tensor_core("x86", "bf16", instruction="tdpbf16ps").replace(split_equal=2)
    acc = A("fp32", lanes=4, lane_tail="first", switch_k=64, long_kernel=amx)
    fn = hidden(acc, "bf16", "bf16")
    with use_workers(1):
        res = pl.probe_gemm(fn, input_format="bf16", out_format="bf16", max_k=24, cases=64,
                            long_k=400)  # fmt: skip
    assert res.outcome == "reproduced", str(res)
    got = res.accumulator
    assert got is not None and got.switch_k == 64, str(res)
    assert got.long_kernel == amx, str(res)
    assert "three equal blocks of 30" in res.evidence["long K"]


def test_a_narrow_output_does_not_hide_a_long_k_change() -> None:
    """bf16 output counts units only to K = 254: past it the probe checks +M and -M among a
    few units against the model, so a kernel change at K = 300 is an honest "long K"."""
    short = A("fp32", lanes=4, lane_tail="first")
    acc = short.replace(switch_k=300, long_kernel=A("fp32", split_k=128))
    with use_workers(1):
        res = pl.probe_gemm(hidden(acc, "bf16", "bf16"), input_format="bf16", out_format="bf16",
                            max_k=24, cases=64, long_k=700)  # fmt: skip
        same = pl.probe_gemm(hidden(short, "bf16", "bf16"), input_format="bf16",
                             out_format="bf16", max_k=24, cases=64, long_k=700)  # fmt: skip
    assert res.outcome == "outside" and res.failed == "long K", str(res)
    assert "is not the model's" in res.evidence["long K"]
    assert same.outcome == "reproduced", str(same)
    assert "agree with the model up to K = 700" in same.evidence["long K"]


def test_a_vector_cleanup_loop_a_joined_tail_and_a_small_k_kernel_are_recovered() -> None:
    """torch.sum's shape (ATen's float32 sum, measured on an Intel Xeon: 4 lanes below K = 8,
    then four 8-wide accumulators, a one-vector cleanup loop, the scalar tail's sum joining
    lane 0 before the horizontal sum, each lane in blocks of 16), at half size: 2 lanes below
    K = 4, then 4 x 4 lanes in blocks of 4."""
    groups = tuple(tuple(lane + 4 * g for g in range(4)) for lane in range(4))
    main = A("fp32", lanes=16, lane_vector=4, lane_tail="separate_first", lane_combine=groups,
             order="blocked", block=4)  # fmt: skip
    acc = A("fp32", lanes=2, lane_tail="first", switch_k=3, long_kernel=main)
    fn = hidden(acc)
    with use_workers(1):
        res = pl.probe_gemm(fn, input_format="fp32", max_k=32, cases=128, long_k=200)
    assert res.outcome == "reproduced", str(res)
    got = res.accumulator
    assert got is not None and got.switch_k == 3 and got.lanes == 2, str(res)
    assert got.long_kernel is not None and got.long_kernel.lane_vector == 4, str(res)
    assert got.long_kernel.lane_tail == "separate_first" and got.long_kernel.block == 4, str(res)
    assert fresh_same(fn, got, (1, 2, 3, 4, 5, 7, 9, 17, 21, 33, 63, 64, 65, 100, 131, 257))


def test_lanes_too_wide_for_max_k_are_named_with_the_max_k_that_reads_them() -> None:
    fn = hidden(A("fp32", lanes=16, lane_combine="pairwise"))
    with use_workers(1):
        res = pl.probe_gemm(fn, input_format="fp32", max_k=20, cases=64)
    assert res.failed == "summation tree", str(res)
    assert "16 lanes, which the probe reads with max_k >= 32" in res.evidence["tree"]
