"""INT8 PTQ and QAT: max calibration never clips, the integer GEMM is exact, the
straight-through estimator passes the FP32 gradient inside the clipping range and zero outside,
and the experiment runners produce the report's tables."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("sklearn")

import precision_lab as pl
from precision_lab.studies.policy import markdown, run_study, selection_guide, split_data
from precision_lab.training import TrainConfig, load_digits_split
from precision_lab.training.policy_model import PolicyMLP
from precision_lab.training.ptq import (
    calibrate_activations,
    fp32_forward,
    layer_inputs,
    ptq,
    quantize_weights,
)
from precision_lab.training.qat import QATMLP, fake_quant, qat_finetune, ste_grad


def _net(R: int = 2, sizes: tuple[int, ...] = (64, 24, 16, 10), seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    W = [
        (rng.standard_normal((R, m, n)) * np.sqrt(2 / m)).astype(np.float32)
        for m, n in itertools.pairwise(sizes)
    ]
    b = [(0.1 * rng.standard_normal((R, 1, n))).astype(np.float32) for n in sizes[1:]]
    return W, b


def _x(R: int = 2, n: int = 120) -> tuple[np.ndarray, np.ndarray]:
    d = load_digits_split(seed=0)
    return np.stack([d.x_train[r * n : (r + 1) * n] for r in range(R)]), np.stack(
        [d.y_train[r * n : (r + 1) * n] for r in range(R)]
    )


# ----- fake quantization and the straight-through estimator ------------------------------------
def test_ste_mask_at_the_clipping_bounds() -> None:
    amax = 127 * 2.0**-5  # scale 2**-5 exactly: the clipping bounds are float32 values
    cal = pl.calibrate(np.array([-amax, 1.0, 0.5]), "int8", method="max")
    assert float(cal.scale) == 2.0**-5 and float(cal.clip_max) == amax
    hi, lo = np.float32(amax), np.float32(float(cal.clip_min))
    x = np.array(
        [lo, hi, np.nextafter(hi, np.float32(9)), np.nextafter(lo, np.float32(-9)), 0.0, 1.0],
        dtype=np.float32,
    )
    xq, inside = fake_quant(x, cal)
    assert inside.tolist() == [True, True, False, False, True, True]  # bounds are inside
    g = np.arange(1, 7, dtype=np.float32)
    out = ste_grad(g, inside)
    assert out.tolist() == [1.0, 2.0, 0.0, 0.0, 5.0, 6.0]
    # forward: the core's quantize/dequantize; clipped values sit at the ends of the grid
    assert np.array_equal(xq, cal.dequantize(cal.quantize(x)))
    assert xq[2] == hi and xq[3] == np.float32(-128 * 2.0**-5)


def _reference(
    W: list[np.ndarray], b: list[np.ndarray], x: np.ndarray, y: np.ndarray, act: list, wts: str
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Weight gradients of the QAT network in float64, written independently: fake-quantized
    inputs and weights forward; backward through the STE masks (|h| within the activation
    clipping range; weights never clip under max calibration)."""
    hs, hqs, zs, masks = [x.astype(np.float64)], [], [], []
    Wq = []
    for i in range(len(W)):
        q, s, _ = quantize_weights(W[i], wts)
        Wq.append(q[0].astype(np.float64) * s[0].astype(np.float64))
    for i in range(len(W)):
        cal = act[i]
        s = float(cal.scale[0])
        h = hs[-1]
        hq = np.clip(np.round(h / s), -128, 127) * s  # independent fake quant (no ties here)
        masks.append(np.abs(h) <= float(cal.clip_max[0]))
        hqs.append(hq)
        z = hq @ Wq[i] + b[i][0, 0].astype(np.float64)
        zs.append(z)
        hs.append(np.maximum(z, 0) if i < len(W) - 1 else z)
    z = hs[-1] - hs[-1].max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    d = p.copy()
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    gW, dhs = [np.empty(0)] * len(W), [np.empty(0)] * len(W)
    for i in range(len(W) - 1, -1, -1):
        gW[i] = hqs[i].T @ d
        if i:
            dhq = d @ Wq[i].T
            dhs[i] = dhq
            d = np.where(masks[i], dhq, 0.0) * (zs[i - 1] > 0)
    return gW, masks


def test_qat_gradient_is_the_fp32_gradient_inside_and_zero_outside() -> None:
    W, b = _net(R=1, sizes=(64, 32, 10), seed=2)
    b[0][..., 0] += 50.0  # hidden unit 0 is large for every example: clipped by the calibration
    x, y = _x(R=1, n=100)
    act = calibrate_activations(W, b, x, method="percentile", percentile=90.0)  # clips 10%
    cfg = TrainConfig.from_policy("float32", hidden=(32,))
    net = QATMLP([64, 32, 10], cfg, [np.random.default_rng(0)], act=act).load(W, b)
    logits = net.forward(x, train=True)
    _, p = net.loss(logits, y)
    gW, _, _ = net.backward(p, y, np.array([1.0]))
    rW, masks = _reference(W, b, x[0], y[0], act, "per_channel")
    clipped = ~masks[1]
    assert clipped.any() and masks[1].any()  # the test exercises both sides
    for a, r in zip(gW, rW, strict=True):
        assert np.allclose(a[0], r, rtol=1e-4, atol=1e-6 * np.abs(r).max())
    # a hidden unit clipped for every example receives no gradient through layer 1 ...
    h1 = layer_inputs(W, b, x)[1][0]
    always = np.flatnonzero(clipped.all(axis=0) & (h1 > 0).all(axis=0))
    fp32 = PolicyMLP([64, 32, 10], cfg, [np.random.default_rng(0)])
    fp32.W, fp32.b = [w.copy() for w in W], [v.copy() for v in b]
    lf = fp32.forward(x, train=True)
    _, pf = fp32.loss(lf, y)
    gf, _, _ = fp32.backward(pf, y, np.array([1.0]))
    assert 0 in always
    assert np.all(gW[0][0][:, always] == 0) and np.all(np.any(gf[0][0][:, always] != 0, axis=0))
    # ... and with a calibration that clips nothing, the STE gradient is the FP32 gradient of
    # the network evaluated at the fake-quantized tensors
    act_max = [  # twice the FP32 range: the fake-quantized forward stays inside it
        pl.calibrate(2 * h.reshape(1, -1), "int8", axis=0) for h in layer_inputs(W, b, x)
    ]
    rW2, masks2 = _reference(W, b, x[0], y[0], act_max, "per_channel")
    assert all(m.all() for m in masks2)
    net2 = QATMLP([64, 32, 10], cfg, [np.random.default_rng(0)], act=act_max).load(W, b)
    _, p2 = net2.loss(net2.forward(x, train=True), y)
    g2, _, _ = net2.backward(p2, y, np.array([1.0]))
    for a, r in zip(g2, rW2, strict=True):
        assert np.allclose(a[0], r, rtol=1e-4, atol=1e-6 * np.abs(r).max())


def test_qat_weight_mask_passes_everything_under_max_calibration() -> None:
    W, b = _net(R=2)
    x, _ = _x(R=2)
    act = calibrate_activations(W, b, x, method="max")
    cfg = TrainConfig.from_policy("float32", hidden=(24, 16))
    net = QATMLP([64, 24, 16, 10], cfg, [np.random.default_rng(0)] * 2, act=act).load(W, b)
    for i, w in enumerate(net.W):
        wq, inside = net._quant_weight(i, w)
        assert inside is not None and inside.all()
        codes, scales, _ = quantize_weights(w, "per_channel")
        assert np.array_equal(wq, pl.dequantize(codes, 1.0) * scales)  # exact: power-free check
    with pytest.raises(ValueError, match="act must hold one calibration per layer"):
        QATMLP([64, 24, 16, 10], cfg, [np.random.default_rng(0)] * 2, act=act[:2])


# ----- PTQ -------------------------------------------------------------------------------------
def test_ptq_max_calibration_never_clips_the_calibration_set() -> None:
    W, b = _net(R=2)
    x, _ = _x(R=2)
    act = calibrate_activations(W, b, x, method="max")
    for h, cal in zip(layer_inputs(W, b, x), act, strict=True):
        for r in range(h.shape[0]):
            s = Fraction(float(cal.scale[r]))
            top = max(Fraction(float(v)) for v in np.abs(h[r]).ravel())
            assert top / s <= 127  # exact: the largest magnitude fits without clipping
            q = pl.quantize(h[r], "int8", cal.scale[r])
            assert q.min() >= -127 and q.max() <= 127
            err = np.abs(pl.dequantize(q, cal.scale[r]).astype(np.float64) - h[r])
            assert err.max() <= float(cal.scale[r]) / 2 * (1 + 1e-6)  # rounding error only
    # the contrast: a clipping method clips some of the same data
    pct = calibrate_activations(W, b, x, method="percentile", percentile=99.0)
    h0 = layer_inputs(W, b, x)[0]
    assert np.any(np.abs(h0[0]) > float(pct[0].clip_max[0]))


def test_weight_quantization() -> None:
    W, _ = _net(R=2)
    w = W[0]
    for gran, shape in (("per_tensor", (2, 1, 1)), ("per_channel", (2, 1, 24))):
        codes, scales, _ = quantize_weights(w, gran)
        assert codes.dtype == np.int8 and codes.shape == w.shape and scales.shape == shape
        deq = codes.astype(np.float64) * scales.astype(np.float64)
        assert np.all(np.abs(deq - w) <= scales.astype(np.float64) / 2 * (1 + 1e-6))
        assert np.all(np.abs(w) <= 127 * scales.astype(np.float64))  # max: nothing clipped
    _, st, _ = quantize_weights(w, "per_tensor")
    _, sc, _ = quantize_weights(w, "per_channel")
    assert np.all(sc <= st)  # per-channel steps are never coarser
    with pytest.raises(ValueError, match="weights must be one of per_tensor, per_channel"):
        quantize_weights(w, "per_row")
    with pytest.raises(ValueError, match="method must be one of max"):
        ptq(W, _net(R=2)[1], _x(R=2)[0], method="kl")


def test_int8_forward_is_the_exact_integer_pipeline() -> None:
    W, b = _net(R=2)
    x, y = _x(R=2)
    for method, gran in (("max", "per_tensor"), ("entropy", "per_channel")):
        q = ptq(W, b, x, method=method, weights=gran)
        h = x.astype(np.float32)
        for i in range(len(W)):  # independent: int64 matmul, float64 scaling
            qx = pl.quantize(h.reshape(2, -1), "int8", q.act[i].scale, axis=0).reshape(h.shape)
            acc = np.matmul(qx.astype(np.int64), q.w_codes[i].astype(np.int64))
            z = acc * (q.act[i].scale.astype(np.float64)[:, None, None] * q.w_scales[i])
            z = (z + b[i]).astype(np.float32)
            h = np.maximum(z, 0) if i < len(W) - 1 else z
        got = q.forward(x)
        assert np.allclose(got, h, rtol=2e-6, atol=1e-5)
        assert got.dtype == np.float32 and q.accuracy(x, y).shape == (2,)
        # QAT's fake-quant forward is the same network up to float32 rounding
        cfg = TrainConfig.from_policy("float32", hidden=(24, 16))
        net = QATMLP([64, 24, 16, 10], cfg, [np.random.default_rng(0)] * 2, act=q.act, weights=gran)
        fq = net.load(W, b).forward(x)
        assert np.allclose(fq, got, rtol=1e-4, atol=1e-4)
        assert np.mean(np.argmax(fq, -1) == np.argmax(got, -1)) > 0.99
    ref = fp32_forward(W, b, x)
    assert np.mean(np.argmax(ref, -1) == q.predict(x)) > 0.9  # INT8 close to FP32
    assert 1.0 < q.bytes_per_parameter() < 1.2


def test_qat_finetune_end_to_end() -> None:
    seeds = (0,)
    data, xc, _ = split_data(seeds, 60)
    W, b = _net(R=1)
    act = calibrate_activations(W, b, xc, method="mse")
    cfg = TrainConfig.from_policy("float32", hidden=(24, 16), epochs=1, batch_size=256, lr=1e-3)
    q, results, net = qat_finetune(W, b, act, cfg, seeds, data)
    assert len(results) == 1 and results[0].steps == len(data[0].y_train) // 256
    assert not np.array_equal(net.W[0], W[0])  # it trained
    assert q.accuracy(data[0].x_test[None], data[0].y_test[None]).shape == (1,)
    assert all(c is a for c, a in zip(q.act, act, strict=True))
    with pytest.raises(ValueError, match="QAT fine-tunes in FP32"):
        qat_finetune(W, b, act, TrainConfig.from_policy("mixed_float16"), seeds, data)


def test_study_runners_and_report() -> None:
    s = run_study(seeds=(0, 1), epochs=2, qat_epochs=1, calib_size=64, parts=("int8",))
    assert set(s.policies) == {"float32"} and len(s.ptq) == 8
    assert s.qat_method in pl.quantization.CALIBRATION_METHODS
    assert set(s.qat) == {"qat", "fp32_finetune_ptq"}
    rows = selection_guide(s)
    assert rows[0]["option"] == "`float32`" and any("QAT" in r["option"] for r in rows)
    text = markdown(s)
    assert "INT8 post-training quantization" in text and "Selection guide" in text
    for v in s.ptq.values():
        assert v.acc.shape == (2,) and np.all((v.acc >= 0) & (v.acc <= 1))
    data, xc, _ = split_data((0,), 64)
    assert xc.shape == (1, 64, 64) and len(data[0].y_train) == 1347 - 64
    full = load_digits_split(seed=0)
    train_rows = {r.tobytes() for r in data[0].x_train}
    assert not any(r.tobytes() in train_rows for r in xc[0])  # held out from training
    assert len(train_rows | {r.tobytes() for r in xc[0]}) <= len(full.x_train)
    with pytest.raises(ValueError, match="parts: unknown"):
        run_study(parts=("plots",))
