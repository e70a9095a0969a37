"""The emulated mixed-precision training run: backward pass against an independent float64
implementation, storage formats, GEMM routing, loss scaling, replicas, configuration errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("sklearn")

import precision_lab as pl
from precision_lab.training import (
    MLP,
    RUNS,
    TrainConfig,
    load_digits_split,
    softmax_xent,
    train,
    train_seeds,
    updates,
)
from precision_lab.training import model as model_mod

TINY = {"hidden": (16, 8), "epochs": 2, "batch_size": 256, "record_every": 1}


def reference_grads(
    Ws: list[np.ndarray], bs: list[np.ndarray], x: np.ndarray, y: np.ndarray
) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
    """Loss and gradients of the mean cross-entropy in float64, written independently."""
    hs, zs = [x], []
    for i, (W, b) in enumerate(zip(Ws, bs, strict=True)):
        z = hs[-1] @ W + b
        zs.append(z)
        hs.append(np.maximum(z, 0) if i < len(Ws) - 1 else z)
    z = hs[-1] - hs[-1].max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(p[np.arange(len(y)), y]))
    d = p.copy()
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    gW, gb = [None] * len(Ws), [None] * len(Ws)
    for i in range(len(Ws) - 1, -1, -1):
        gW[i] = hs[i].T @ d
        gb[i] = d.sum(axis=0)
        if i:
            d = (d @ Ws[i].T) * (zs[i - 1] > 0)
    return float(loss), gW, gb  # type: ignore[return-value]


def test_reference_against_finite_differences() -> None:
    rng = np.random.default_rng(0)
    Ws = [rng.standard_normal((5, 4)), rng.standard_normal((4, 3))]
    bs = [rng.standard_normal(4) * 0.1, rng.standard_normal(3) * 0.1]
    x, y = rng.standard_normal((7, 5)), rng.integers(0, 3, 7)
    _, gW, _ = reference_grads(Ws, bs, x, y)
    h = 1e-6
    for li in range(2):
        for idx in [(0, 0), (2, 1), (3, 2)]:
            if idx[0] >= Ws[li].shape[0] or idx[1] >= Ws[li].shape[1]:
                continue
            Wp = [w.copy() for w in Ws]
            Wm = [w.copy() for w in Ws]
            Wp[li][idx] += h
            Wm[li][idx] -= h
            fd = (reference_grads(Wp, bs, x, y)[0] - reference_grads(Wm, bs, x, y)[0]) / (2 * h)
            assert gW[li][idx] == pytest.approx(fd, rel=1e-5, abs=1e-8)


def test_backward_matches_float64_reference() -> None:
    cfg = RUNS["fp32"].replace(hidden=(16, 8), init_std=0.3)
    net = MLP([64, 16, 8, 10], cfg, [np.random.default_rng(1)])
    d = load_digits_split(seed=0)
    x, y = d.x_train[None, :100], d.y_train[None, :100]
    logits = net.forward(x, train=True)
    loss, p = softmax_xent(logits, y)
    gW, gb, _ = net.backward(p, y, np.array([1.0]))
    ref_loss, rW, rb = reference_grads(
        [w[0].astype(np.float64) for w in net.W],
        [b[0, 0].astype(np.float64) for b in net.b],
        x[0].astype(np.float64),
        y[0],
    )
    assert loss[0] == pytest.approx(ref_loss, rel=1e-5)
    for a, r in zip([g[0] for g in gW], rW, strict=True):
        assert np.allclose(a, r, rtol=1e-4, atol=1e-7 * np.abs(r).max())
    for a, r in zip([g[0, 0] for g in gb], rb, strict=True):
        assert np.allclose(a, r, rtol=1e-4, atol=1e-7 * np.abs(r).max())


def on_grid(x: np.ndarray, fmt: str) -> bool:
    return bool(np.array_equal(pl.round_to(x, fmt), x))


@pytest.mark.parametrize("run", ["fp16_noscale", "bf16"])
def test_tensors_are_stored_in_the_low_format(run: str) -> None:
    cfg = RUNS[run].replace(hidden=(16,))
    fmt = cfg.gradient_format
    net = MLP([64, 16, 10], cfg, [np.random.default_rng(0)])
    d = load_digits_split(seed=0)
    x, y = d.x_train[None, :64], d.y_train[None, :64]
    logits = net.forward(x, train=True)
    assert on_grid(logits, cfg.activation_format)
    assert all(on_grid(z, cfg.activation_format) for z in net._cache["zs"])
    _, p = softmax_xent(logits, y)
    gW, gb, _ = net.backward(p, y, np.array([8.0]))
    assert all(on_grid(g, fmt) for g in (*gW, *gb))
    assert not on_grid(gW[0], "e4m3") or np.all(gW[0] == 0)  # the grid is fmt's, not coarser


def test_every_matmul_goes_through_the_numerics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Default accumulator: every matmul is one fixed-order sum of operands on their grids;
    an explicit accumulator sends every matmul through pl.gemm instead."""
    sums: list[tuple] = []
    real_sum = model_mod.fixed_order_sum

    def counting_sum(a, b):  # type: ignore[no-untyped-def]
        sums.append((a.shape, b.shape))
        return real_sum(a, b)

    calls: list[tuple] = []
    real = model_mod.gemm

    def counting(a, b, *args, **kw):  # type: ignore[no-untyped-def]
        f = kw["input_format"]
        calls.append((a.shape, b.shape, tuple(map(str, f)) if isinstance(f, tuple) else str(f)))
        return real(a, b, *args, **kw)

    monkeypatch.setattr(model_mod, "fixed_order_sum", counting_sum)
    monkeypatch.setattr(model_mod, "gemm", counting)
    r = train(RUNS["fp16_static"].replace(**TINY))
    n_layers = 3
    per_step = n_layers + n_layers + (n_layers - 1)  # forward, wgrad, dgrad
    evals = r.config.epochs + 1  # the test set after each epoch, the training set at the end
    assert len(sums) == r.steps * per_step + evals * n_layers and not calls
    sums.clear()
    acc = pl.Accumulator("fp32", order="blas")
    r = train(RUNS["fp16_static"].replace(accumulator=acc, **TINY))
    assert len(calls) == r.steps * per_step + evals * n_layers and not sums
    assert {c[2] for c in calls} == {"fp16"}
    calls.clear()
    train(RUNS["fp8"].replace(accumulator=acc, **TINY))
    assert {c[2] for c in calls} == {"e4m3", ("e4m3", "e5m2"), ("e5m2", "e4m3")}


def _sequential_float64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Independent oracle: Python floats (IEEE float64), k in increasing order, per element."""
    m, k = a.shape
    n = b.shape[1]
    out = np.empty((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            s = 0.0
            for t in range(k):
                s += float(a[i, t]) * float(b[t, j])
            out[i, j] = np.float32(s)
    return out


def test_matmul_fixed_order_against_an_independent_loop() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        m, k, n = (int(v) for v in rng.integers(1, 9, 3))
        scale = 2.0 ** rng.integers(-30, 30, size=(1, k))
        a = (rng.standard_normal((m, k)) * scale).astype(np.float32)
        b = (rng.standard_normal((k, n)) / scale.T).astype(np.float32)
        got = model_mod.matmul_fixed_order(a, b)
        assert got.dtype == np.float32
        assert np.array_equal(got, _sequential_float64(a, b))
    # batches broadcast like numpy.matmul; each batch entry equals its own product
    a = rng.standard_normal((3, 1, 4, 5)).astype(np.float32)
    b = rng.standard_normal((2, 5, 6)).astype(np.float32)
    got = model_mod.matmul_fixed_order(a, b)
    assert got.shape == (3, 2, 4, 6)
    assert np.array_equal(got[2, 1], _sequential_float64(a[2, 0], b[1]))
    # the exact product is kept where a float32 sum loses it
    one = np.array([[1.0, 2.0**-24, 2.0**-24]], np.float32)
    assert model_mod.matmul_fixed_order(one, np.ones((3, 1), np.float32))[0, 0] == 1 + 2.0**-23
    with pytest.raises(ValueError, match="float32"):
        model_mod.matmul_fixed_order(np.array([[0.1]]), np.ones((1, 1), np.float32))
    with pytest.raises(ValueError, match="disagree on K"):
        model_mod.matmul_fixed_order(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))


_THREADS_SCRIPT = """
import hashlib, numpy as np
from precision_lab.training import RUNS, train_seeds
from precision_lab.training.ptq import fp32_forward
h = hashlib.sha256()
for name in ("fp32", "fp8"):
    cfg = RUNS[name].replace(hidden=(16, 16), epochs=1, batch_size=128)
    for r in train_seeds(cfg, [0, 1]):
        h.update(np.array(r.batch_loss + r.test_acc).tobytes())
rng = np.random.default_rng(0)
W = [rng.standard_normal((2, 64, 64)).astype(np.float32) for _ in range(2)]
b = [np.zeros((2, 1, 64), np.float32)] * 2
h.update(fp32_forward(W, b, rng.standard_normal((2, 300, 64)).astype(np.float32)).tobytes())
print(h.hexdigest())
"""


def test_training_bits_do_not_depend_on_blas_threads() -> None:
    """The report's training and FP32 PTQ forward give the same bits with 1 and 2 BLAS/OpenMP
    threads (each in a fresh process, where the thread count is read at start-up)."""
    import os
    import subprocess
    import sys

    digests = []
    for threads in ("1", "2"):
        env = dict(os.environ)
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = threads
        out = subprocess.run(
            [sys.executable, "-c", _THREADS_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        digests.append(out.stdout.strip())
    assert len(digests[0]) == 64 and digests[0] == digests[1]


def test_power_of_two_loss_scale_changes_nothing_in_fp32() -> None:
    base = train(RUNS["fp32"].replace(**TINY))
    scaled = train(RUNS["fp32"].replace(loss_scaling="static", loss_scale=2.0**10, **TINY))
    assert scaled.test_acc == base.test_acc and scaled.batch_loss == base.batch_loss
    assert scaled.scale == [1024.0] * scaled.steps


def test_fp16_without_scaling_loses_gradients_scaling_recovers_them() -> None:
    cfg = RUNS["fp16_noscale"].replace(hidden=(32, 32), epochs=3, batch_size=512)
    lost = train(cfg)
    kept = train(cfg.replace(loss_scaling="static", loss_scale=2.0**12))
    z_lost = [rec.act_zero_fraction for rec in lost.layers]
    z_kept = [rec.act_zero_fraction for rec in kept.layers]
    assert z_lost[0] > 0.05  # the small initial weights make the first layer's gradients tiny
    assert all(a >= b for a, b in zip(z_lost, z_kept, strict=True))
    assert z_kept[0] < z_lost[0] / 100
    assert lost.layers[0].act_hist.sum() > 0 and lost.layers[0].act_hist_zero.sum() > 0
    assert lost.layers[0].act_hist_zero.sum() <= lost.layers[0].act_hist.sum()


def test_dynamic_scaler_skips_overflowing_steps() -> None:
    cfg = RUNS["fp16_dynamic"].replace(loss_scale=2.0**28, hidden=(16, 8), epochs=4)
    cfg = cfg.replace(batch_size=256)
    r = train(cfg)
    assert r.skipped[:3] == [True, True, True] and r.scale[0] == 2.0**28
    for t in range(r.steps - 1):  # halved after each skipped step, kept otherwise (interval 20)
        assert r.scale[t + 1] == r.scale[t] / (2 if r.skipped[t] else 1)
    assert 3 <= r.n_skipped < r.steps
    assert np.isfinite(r.final_loss) and r.train_acc[-1] > 0.1
    # what the first clean step's scale says: S * (largest gradient) fits in fp16
    assert r.scale[r.skipped.index(False)] <= 2.0**24


def test_replicas_equal_independent_runs() -> None:
    cfg = RUNS["fp16_dynamic"].replace(**TINY)
    both = train_seeds(cfg, [3, 4])
    alone = train(cfg.replace(seed=4))
    assert both[1].test_acc == alone.test_acc
    assert both[1].batch_loss == alone.batch_loss
    assert both[1].scale == alone.scale
    assert both[1].config.seed == 4 and both[0].config.seed == 3
    assert both[0].batch_loss != both[1].batch_loss


def test_fp8_delayed_scaling_and_samples() -> None:
    r = train_seeds(RUNS["fp8"].replace(**TINY), [0], samples_per_layer=100)[0]
    assert set(r.samples) == {"layer0", "layer1", "layer2"}
    assert all(v.dtype == np.float32 and 0 < v.size <= 100 for v in r.samples.values())
    assert np.isfinite(r.final_loss)
    assert set(r.fp8_casts) == {"x", "w", "dy"}
    assert all(0 <= v <= 1 for d in r.fp8_casts.values() for v in d.values())
    cur = train(RUNS["fp8"].replace(tensor_scaling="current", **TINY))
    # just-in-time scales: only float32 rounding of x * (448 / amax) can exceed the maximum
    assert cur.fp8_casts["x"]["saturated"] < 1e-3


def test_dataset_split() -> None:
    a, b = load_digits_split(seed=0), load_digits_split(seed=0)
    assert np.array_equal(a.x_test, b.x_test)
    c = load_digits_split(seed=1)
    assert not np.array_equal(a.y_test, c.y_test)
    assert a.x_train.shape == c.x_train.shape == (1347, 64)
    assert np.allclose(a.x_train.mean(axis=0), 0, atol=1e-5)
    assert np.bincount(a.y_test).min() >= 44  # stratified: every class in the test set
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits_split(test_fraction=1.5)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"forward_format": "int8"}, "forward_format must be a floating-point format"),
        ({"gradient_format": "fp7"}, "unknown format"),
        ({"loss_scaling": "auto"}, "loss_scaling"),
        ({"tensor_scaling": "block"}, "tensor_scaling"),
        ({"batch_size": 0}, "batch_size"),
        ({"hidden": ()}, "hidden"),
        ({"loss_scale": 0.0}, "loss_scale"),
        ({"weight_update": "fp16_rn"}, "weight_update"),
    ],
)
def test_config_errors(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kw)


def test_runs_are_the_six_of_the_report() -> None:
    assert list(RUNS) == ["fp32", "fp16_noscale", "fp16_static", "fp16_dynamic", "bf16", "fp8"]
    fp8 = RUNS["fp8"]
    assert (fp8.forward_format, fp8.backward_format, fp8.tensor_scaling) == (
        "e4m3",
        "e5m2",
        "delayed",
    )
    assert all(c.master_format == "fp32" for c in RUNS.values())


# ----- weight-update rules (Zamirai et al. 2020) ----------------------------------------------
def _repeat_updates(rule: str, n: int = 1000, k: int = 1000) -> np.ndarray:
    """``k`` updates of float32(1e-3) to ``n`` bf16 weights of 1.0 under ``rule``."""
    w = np.ones(n, np.float32)
    c = np.zeros_like(w) if rule == "bf16_kahan" else None
    d = np.full(n, 1e-3, np.float32)
    for step in range(k):
        w, c = updates.apply_update(rule, w, d, c, seed=step)
    return w


def test_update_rules_on_repeated_small_updates() -> None:
    total = 1000 * float(np.float32(1e-3))  # the exact sum of the updates, about 1.0
    rn = _repeat_updates("bf16_rn")
    assert (rn == 1.0).all()  # each update is below half an ulp of 1 (2**-8): all lost
    kahan = _repeat_updates("bf16_kahan")
    ulp2 = 2.0**-6  # bf16 ulp in [2, 4)
    assert (np.abs(kahan - (1.0 + total)) <= ulp2).all()
    sr = _repeat_updates("bf16_sr")
    # unbiased: the mean of 1000 independent weights is within a few sigma of 1 + total
    # (each step's variance is at most ulp**2 / 4, ulp <= 2**-6 on [1, 4))
    sigma = (1000 * (2.0**-6) ** 2 / 4) ** 0.5 / 1000**0.5
    assert abs(float(sr.mean()) - (1.0 + total)) < 5 * sigma
    assert sr.std() > 0  # the seeds differ per step and per weight
    for w in (rn, kahan, sr):  # results are bf16 values
        assert np.array_equal(w, w.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_bf16_add_is_a_single_rounding_of_the_exact_sum() -> None:
    # 1 + (2**-8 + 2**-40) lies just above the tie 1 + 2**-8: rounding a float32 sum first
    # (1 + 2**-8, a tie, to even) would give 1.0
    a = np.array([1.0, 1.0, -1.0])
    b = np.array([2.0**-8 + 2.0**-40, 2.0**-8, -(2.0**-8) - 2.0**-40])
    assert updates.bf16_add(a, b).tolist() == [1.0078125, 1.0, -1.0078125]
    # stochastic: one of the two neighbours, reproducible by seed
    r1 = updates.bf16_add(a, b, rounding="stochastic", seed=3)
    assert np.array_equal(r1, updates.bf16_add(a, b, rounding="stochastic", seed=3))
    assert set(np.abs(r1).tolist()) <= {1.0, 1.0078125}


def test_weight_update_rules_train_reproducibly() -> None:
    cfg = RUNS["fp32"].replace(optimizer="sgd", lr=0.01, lr_schedule="constant", **TINY)
    runs = {}
    for rule in updates.WEIGHT_UPDATES:
        both = train_seeds(cfg.replace(weight_update=rule), [3, 4])
        alone = train(cfg.replace(weight_update=rule, seed=4))
        assert both[1].batch_loss == alone.batch_loss  # replicas stay independent
        runs[rule] = both
    assert runs["fp32"][0].batch_loss == train_seeds(cfg, [3])[0].batch_loss  # default unchanged
    for rule in ("bf16_rn", "bf16_sr", "bf16_kahan"):
        assert runs[rule][0].batch_loss != runs["fp32"][0].batch_loss
        assert np.isfinite(runs[rule][0].final_loss)


def test_weights_stay_bf16_under_the_bf16_rules() -> None:
    from precision_lab.training.model import MLP

    cfg = RUNS["fp32"].replace(weight_update="bf16_sr", optimizer="sgd", **TINY)
    nets: list[MLP] = []

    def build(sizes, c, rngs):  # type: ignore[no-untyped-def]
        nets.append(MLP(sizes, c, rngs))
        return nets[-1]

    train_seeds(cfg, [0], model=build)
    for w in (*nets[0].W, *nets[0].b):
        assert np.array_equal(w, w.astype(ml_dtypes.bfloat16).astype(np.float32))
