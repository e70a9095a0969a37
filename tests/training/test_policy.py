"""Precision policies: named policies, dict/JSON round trips, clear errors, and the training
emulation honouring a policy (the FP32 rule list, layer norm, per-layer overrides)."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("sklearn")

import precision_lab as pl
from precision_lab.training import RUNS, TrainConfig, load_digits_split, softmax_xent, train_seeds
from precision_lab.training import model as model_mod
from precision_lab.training import policy_model as pm
from precision_lab.training.policy import (
    FP32_OPS,
    POLICIES,
    LayerOverride,
    LossScaleSpec,
    Policy,
    TensorScaleSpec,
    get_policy,
)
from precision_lab.training.policy_model import PolicyMLP

TINY = {"hidden": (16, 8), "epochs": 2, "batch_size": 256, "record_every": 1}


def on_grid(x: np.ndarray, fmt: str) -> bool:
    return bool(np.array_equal(pl.round_to(x, fmt), x))


# ----- named policies --------------------------------------------------------------------------
def test_named_policies_match_keras_and_transformer_engine() -> None:
    assert list(POLICIES) == ["float32", "mixed_float16", "mixed_bfloat16", "fp8_hybrid"]
    f32 = get_policy("float32")
    assert {f32.compute_format, f32.activation_format, f32.variable_format} == {"fp32"}
    mf16 = get_policy("mixed_float16")
    assert (mf16.compute_format, mf16.variable_format) == ("fp16", "fp32")  # Keras' dtypes
    scaler = mf16.loss_scaling.make()  # Keras LossScaleOptimizer: 2**15, growth every 2000
    assert scaler.scale == 2.0**15 and scaler.growth_interval == 2000
    bf16 = get_policy("mixed_bfloat16")
    assert (bf16.compute_format, bf16.loss_scaling.kind) == ("bf16", "none")
    fp8 = get_policy("fp8_hybrid")  # TE Format.HYBRID, DelayedScaling() defaults
    assert (fp8.compute_format, fp8.backward_format) == ("e4m3", "e5m2")
    assert fp8.tensor_scaling == TensorScaleSpec("delayed", amax_history_len=1024, margin=0)
    assert all(p.fp32_ops == FP32_OPS for p in POLICIES.values())
    assert set(FP32_OPS) == {"softmax", "cross_entropy", "norm_statistics", "reductions"}


def test_aliases_normalise_to_registry_names() -> None:
    p = Policy("x", compute_format="bfloat16", variable_format="float32")
    assert (p.compute_format, p.gradient_format, p.variable_format) == ("bf16", "bf16", "fp32")
    assert p == Policy("x", compute_format="bf16")


def test_bytes_per_parameter() -> None:
    assert get_policy("float32").bytes_per_parameter()["total"] == 4 + 4 + 8
    assert get_policy("mixed_float16").bytes_per_parameter()["total"] == 4 + 2 + 2 + 8
    fp8 = get_policy("fp8_hybrid").bytes_per_parameter()
    assert (fp8["working_copy"], fp8["gradient"], fp8["inference"]) == (1.0, 2.0, 1.0)
    assert get_policy("float32").bytes_per_parameter(optimizer="sgd")["total"] == 12


# ----- policies are data -----------------------------------------------------------------------
def _custom() -> Policy:
    odd = pl.FloatFormat(5, 4)  # an unnamed format
    return Policy(
        "custom",
        compute_format="fp16",
        gradient_format="bf16",
        variable_format="fp32",
        accumulator=pl.Accumulator(odd, rounding="toward_zero", promote_every=32),
        loss_scaling=LossScaleSpec("dynamic", 2.0**10, "deepspeed", (("hysteresis", 3),)),
        fp32_ops=("softmax", "reductions"),
        overrides=(LayerOverride(0, compute_format="bf16"), LayerOverride(-1, "fp32")),
    )


@pytest.mark.parametrize("name", [*POLICIES, "custom", "static"])
def test_round_trip_dict_and_json(name: str) -> None:
    if name == "custom":
        p = _custom()
    elif name == "static":
        p = Policy("s", compute_format="fp16", loss_scaling=LossScaleSpec("static", 4096.0))
    else:
        p = get_policy(name)
    d = p.to_dict()
    assert json.loads(json.dumps(d)) == d  # plain data
    assert Policy.from_dict(d) == p
    assert Policy.from_json(p.to_json()) == p
    assert Policy.from_json(p.to_json(indent=2, sort_keys=True)) == p
    assert Policy.from_dict(json.loads(p.to_json())).to_dict() == d


def test_round_trip_keeps_the_unnamed_format_exactly() -> None:
    p = Policy.from_json(_custom().to_json())
    assert p.accumulator is not None
    assert p.accumulator.format == pl.FloatFormat(5, 4)
    assert p.accumulator.promote_every == 32 and p.loss_scaling.options == (("hysteresis", 3),)
    assert p.layer(-1, 3).compute.name == "fp32" and p.layer(0, 3).compute.name == "bf16"


def test_unknown_names_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown name 'mixed_float32'; known: float32"):
        get_policy("mixed_float32")
    with pytest.raises(TypeError, match="policy"):
        get_policy(16)  # type: ignore[arg-type]
    d = get_policy("mixed_float16").to_dict()
    with pytest.raises(ValueError, match=r"policy: unknown field\(s\) \['compute_dtype'\]"):
        Policy.from_dict({**d, "compute_dtype": "float16"})
    with pytest.raises(ValueError, match="loss_scaling: unknown field"):
        Policy.from_dict({**d, "loss_scaling": {"kind": "dynamic", "scale": 2.0}})
    with pytest.raises(ValueError, match="accumulator: unknown field"):
        Policy.from_dict({**d, "accumulator": {"fmt": "fp16"}})
    with pytest.raises(ValueError, match="'name' is missing"):
        Policy.from_dict({"compute_format": "fp16"})
    with pytest.raises(ValueError, match="compute_format: unknown format"):
        Policy.from_dict({**d, "compute_format": "fp7"})


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"compute_format": "int8"}, ValueError, "compute_format: must be a floating-point"),
        ({"compute_format": "e4m3"}, ValueError, "compute_format: the 8-bit format e4m3 needs"),
        ({"backward_format": "e5m2"}, ValueError, "backward_format: the 8-bit format e5m2"),
        (
            {"compute_format": "fp16", "tensor_scaling": TensorScaleSpec("delayed")},
            ValueError,
            "tensor_scaling: kind='delayed' scales 8-bit",
        ),
        ({"variable_format": "e4m3"}, ValueError, "variable_format: master weights need"),
        (
            {"compute_format": "fp16", "variable_format": "bf16"},
            ValueError,
            "variable_format: bf16 .* cannot hold the weights of compute_format fp16",
        ),
        ({"fp32_ops": ("softmax", "layernorm")}, ValueError, "fp32_ops: unknown operation"),
        ({"fp32_ops": ("softmax", "softmax")}, ValueError, "fp32_ops: names repeat"),
        ({"fp32_ops": "softmax"}, TypeError, "fp32_ops: expected a tuple"),
        ({"accumulator": "fp16"}, TypeError, "accumulator: expected a precision_lab.Accum"),
        ({"name": ""}, ValueError, "name: expected a non-empty string"),
        (
            {"overrides": (LayerOverride(1, "bf16"), LayerOverride(1, "fp16"))},
            ValueError,
            r"overrides: layer\(s\) \[1\] overridden more than once",
        ),
        (
            {"overrides": (LayerOverride(0, compute_format="e4m3"),)},
            ValueError,
            r"overrides\[layer=0\].compute_format: the 8-bit format e4m3 needs",
        ),
        ({"loss_scaling": LossScaleSpec}, TypeError, "loss_scaling: expected a LossScaleSpec"),
    ],
)
def test_invalid_combinations_name_the_field(kw: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        Policy(**{"name": "p", **kw})


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"kind": "auto"}, "loss_scaling.kind: expected one of none, static, dynamic"),
        ({"kind": "none", "init_scale": 8.0}, "kind='none' takes no init_scale"),
        ({"kind": "static"}, "loss_scaling.init_scale: kind='static' needs a scale"),
        ({"kind": "static", "init_scale": -1.0}, "finite scale > 0"),
        ({"kind": "dynamic", "preset": "jax"}, "loss_scaling.preset: unknown preset 'jax'"),
        ({"kind": "dynamic", "options": (("growth_interval", 0),)}, "loss_scaling.options"),
        ({"kind": "dynamic", "options": (("bogus", 1),)}, "loss_scaling.options"),
    ],
)
def test_loss_scale_spec_errors(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LossScaleSpec(**kw)


def test_tensor_scale_spec_and_layer_errors() -> None:
    with pytest.raises(ValueError, match=r"tensor_scaling\.kind"):
        TensorScaleSpec("block")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tensor_scaling\.amax_history_len"):
        TensorScaleSpec("delayed", amax_history_len=0)
    with pytest.raises(ValueError, match=r"overrides\[layer=2\]: sets no format"):
        LayerOverride(2)
    p = Policy("p", overrides=(LayerOverride(5, "bf16"),))
    with pytest.raises(ValueError, match="overrides: layer 5 out of range for a network of 3"):
        p.layer(0, 3)
    with pytest.raises(ValueError, match="op: unknown operation"):
        p.runs_in_fp32("matmul")


def test_without_fp32() -> None:
    p = get_policy("mixed_float16").without_fp32("softmax", "cross_entropy")
    assert p.fp32_ops == ("norm_statistics", "reductions")
    assert not p.runs_in_fp32("softmax") and p.runs_in_fp32("reductions")
    with pytest.raises(ValueError, match="unknown operation 'logits'"):
        p.without_fp32("logits")


# ----- the training emulation takes a policy ---------------------------------------------------
def test_config_from_policy() -> None:
    cfg = TrainConfig.from_policy("fp8_hybrid", epochs=3)
    assert (cfg.forward_format, cfg.backward_format, cfg.activation_format) == (
        "e4m3",
        "e5m2",
        "bf16",
    )
    assert (cfg.tensor_scaling, cfg.amax_history_len, cfg.epochs) == ("delayed", 1024, 3)
    assert cfg.policy == get_policy("fp8_hybrid") and cfg.name == "fp8_hybrid"
    mf16 = TrainConfig.from_policy("mixed_float16")
    assert (mf16.loss_scaling, mf16.loss_scale, mf16.scaler_preset) == ("dynamic", 2.0**15, "keras")
    with pytest.raises(ValueError, match="forward_format: set by the policy"):
        TrainConfig.from_policy("float32", forward_format="fp16")
    bad = mf16.replace(gradient_format="bf16")
    with pytest.raises(ValueError, match="gradient_format: the config has 'bf16' but its policy"):
        PolicyMLP([4, 3, 2], bad, [np.random.default_rng(0)])
    with pytest.raises(ValueError, match=r"cfg\.policy: PolicyMLP needs a policy"):
        PolicyMLP([4, 3, 2], RUNS["fp32"], [np.random.default_rng(0)])


def test_float32_policy_reproduces_the_plain_run() -> None:
    plain = train_seeds(RUNS["fp32"].replace(**TINY), [0, 1])
    pol = train_seeds(TrainConfig.from_policy("float32", **TINY), [0, 1])
    for a, b in zip(plain, pol, strict=True):
        assert a.batch_loss == b.batch_loss and a.test_acc == b.test_acc


def _batch(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    d = load_digits_split(seed=0)
    return d.x_train[None, :n], d.y_train[None, :n]


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[int, ...], str]]:
    """Instrument the rounding of the policy network: (shape, format) of every round_to call."""
    calls: list[tuple[tuple[int, ...], str]] = []
    real = pm.round_to

    def spy(x, fmt, *a, **k):  # type: ignore[no-untyped-def]
        calls.append((np.shape(x), str(pl.get_format(fmt).name)))
        return real(x, fmt, *a, **k)

    monkeypatch.setattr(pm, "round_to", spy)
    return calls


def test_fp32_head_under_mixed_float16(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head's input (the logits) is rounded to FP32, never to FP16, under mixed_float16;
    the hidden activations are FP16. With the rule removed, the logits are FP16."""
    x, y = _batch()
    cfg = TrainConfig.from_policy("mixed_float16", hidden=(32, 16))
    net = PolicyMLP([64, 32, 16, 10], cfg, [np.random.default_rng(3)])
    net.W = [w * 50 for w in net.W]  # logits of size ~1, not all on the FP16 grid
    calls = _recording(monkeypatch)
    net.trace = []
    logits = net.forward(x, train=True)
    assert net.trace[-1] == ("layer2.logits", "fp32")
    assert [f for t, f in net.trace[:-1]] == ["fp16"] * 3
    assert (logits.shape, "fp16") not in calls  # no FP16 rounding of the head's input
    assert ((1, 64, 32), "fp16") in calls and ((1, 64, 16), "fp16") in calls
    assert not on_grid(logits, "fp16") and logits.dtype == np.float32
    assert all(on_grid(z, "fp16") for z in net._cache["ys"])
    loss, p = net.loss(logits, y)
    ref_loss, ref_p = softmax_xent(logits, y)  # the FP32 head is the plain FP32 softmax
    assert np.array_equal(p, ref_p) and np.array_equal(loss, ref_loss)
    assert not on_grid(p, "fp16")

    low = TrainConfig.from_policy(
        get_policy("mixed_float16").without_fp32("softmax", "cross_entropy"), hidden=(32, 16)
    )
    net16 = PolicyMLP([64, 32, 16, 10], low, [np.random.default_rng(3)])
    net16.W = [w.copy() for w in net.W]
    calls.clear()
    logits16 = net16.forward(x, train=True)
    assert (logits16.shape, "fp16") in calls
    assert on_grid(logits16, "fp16")
    assert np.array_equal(logits16, pl.round_to(logits, "fp16"))  # same GEMM, rounded once
    _, p16 = net16.loss(logits16, y)
    assert on_grid(p16, "fp16")
    assert np.abs(p16 - ref_p).max() <= 2.0**-11  # FP16 rounding of the same probabilities
    gW, _, _ = net16.backward(p16, y, np.array([2.0**15]))
    assert all(np.isfinite(g).all() for g in gW)


def _ln_reference(
    Ws: list[np.ndarray], bs: list[np.ndarray], x: np.ndarray, y: np.ndarray
) -> tuple[float, list[np.ndarray]]:
    """Loss and weight gradients of the layer-norm MLP in float64, written independently."""
    eps = 1e-5
    hs, cache = [x], []
    for i, (W, b) in enumerate(zip(Ws, bs, strict=True)):
        z = hs[-1] @ W + b
        if i == len(Ws) - 1:
            hs.append(z)
            break
        mu = z.mean(axis=1, keepdims=True)
        var = ((z - mu) ** 2).mean(axis=1, keepdims=True)
        yhat = (z - mu) / np.sqrt(var + eps)
        cache.append((yhat, 1 / np.sqrt(var + eps)))
        hs.append(np.maximum(yhat, 0))
    z = hs[-1] - hs[-1].max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    loss = float(-np.mean(np.log(p[np.arange(len(y)), y])))
    d = p.copy()
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    gW: list[np.ndarray] = [np.empty(0)] * len(Ws)
    for i in range(len(Ws) - 1, -1, -1):
        gW[i] = hs[i].T @ d
        if i:
            dy = (d @ Ws[i].T) * (hs[i] > 0)
            yhat, r = cache[i - 1]
            D = dy.shape[1]
            d = r * (
                dy - dy.sum(1, keepdims=True) / D - yhat * (dy * yhat).sum(1, keepdims=True) / D
            )
    return loss, gW


def test_layer_norm_gradients_against_float64_and_finite_differences() -> None:
    x, y = _batch(40)
    cfg = TrainConfig.from_policy("float32", hidden=(12, 8), init_std=0.3)
    net = PolicyMLP([64, 12, 8, 10], cfg, [np.random.default_rng(5)], norm=True)
    net.b = [b + 0.1 * np.arange(b.shape[-1], dtype=np.float32) for b in net.b]
    logits = net.forward(x, train=True)
    loss, p = net.loss(logits, y)
    gW, _, _ = net.backward(p, y, np.array([1.0]))
    Ws = [w[0].astype(np.float64) for w in net.W]
    bs = [b[0, 0].astype(np.float64) for b in net.b]
    x64 = x[0].astype(np.float64)
    ref_loss, rW = _ln_reference(Ws, bs, x64, y[0])
    assert loss[0] == pytest.approx(ref_loss, rel=1e-5)
    for a, r in zip(gW, rW, strict=True):
        assert np.allclose(a[0], r, rtol=1e-3, atol=1e-6 * np.abs(r).max())
    h = 1e-6  # and the float64 reference against finite differences
    for li, idx in [(0, (3, 2)), (1, (5, 4)), (2, (1, 7))]:
        Wp = [w.copy() for w in Ws]
        Wm = [w.copy() for w in Ws]
        Wp[li][idx] += h
        Wm[li][idx] -= h
        fd = (_ln_reference(Wp, bs, x64, y[0])[0] - _ln_reference(Wm, bs, x64, y[0])[0]) / (2 * h)
        assert rW[li][idx] == pytest.approx(fd, rel=1e-4, abs=1e-9)


def test_norm_statistics_rule() -> None:
    x, _ = _batch()
    mf16 = get_policy("mixed_float16")
    for policy, want in ((mf16, "fp32"), (mf16.without_fp32("norm_statistics"), "fp16")):
        cfg = TrainConfig.from_policy(policy, hidden=(32,))
        net = PolicyMLP([64, 32, 10], cfg, [np.random.default_rng(1)], norm=True)
        net.trace = []
        net.forward(x, train=True)
        assert ("layer0.norm_statistics", want) in net.trace
        assert ("layer0.norm", "fp16") in net.trace  # the output is stored in FP16 either way
        z = net.norm_inputs[0]
        _, rstd = net.norm_forward(z, net.layers[0], 0)
        assert on_grid(rstd, want) and (want == "fp32" or not on_grid(rstd, "bf16"))


def test_reductions_rule_accumulates_in_the_low_format() -> None:
    """A hand-derived case: [2048, 1, 1, 1] sums to 2051 in FP32; pairwise in FP16,
    2048 + 1 ties to 2048 (even), 1 + 1 = 2, 2048 + 2 = 2050."""
    x = np.array([[[2048.0], [1.0], [1.0], [1.0]]], dtype=np.float32)  # (R=1, B=4, N=1)
    fp16 = pl.get_format("fp16")
    for policy, want in (
        (get_policy("mixed_float16"), 2051.0),
        (get_policy("mixed_float16").without_fp32("reductions"), 2050.0),
    ):
        net = PolicyMLP(
            [1, 1], TrainConfig.from_policy(policy, hidden=(1,)), [np.random.default_rng(0)]
        )
        assert float(net._sum(x, -2, fp16)[0, 0, 0]) == want
        assert float(net._sum(np.swapaxes(x, 1, 2), -1, fp16)[0, 0, 0]) == want
    assert Fraction(2048) + 3 == 2051  # the exact sum


def test_per_layer_override_in_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8_hybrid with the first layer in BF16 (no scaling there): the GEMMs get those formats."""
    calls: list[object] = []
    real_gemm = model_mod.gemm  # Numerics.mm of the parent network calls model.gemm

    def counting(a, b, *args, **kw):  # type: ignore[no-untyped-def]
        f = kw["input_format"]
        calls.append(tuple(map(str, f)) if isinstance(f, tuple) else str(f))
        if str(f) == "bf16":
            assert kw["scale_a"] is None and kw["scale_b"] is None
        return real_gemm(a, b, *args, **kw)

    monkeypatch.setattr(model_mod, "gemm", counting)
    p = get_policy("fp8_hybrid").replace(
        overrides=(LayerOverride(0, compute_format="bf16", backward_format="bf16"),),
        accumulator=pl.Accumulator("fp32", order="blas"),  # through pl.gemm (default: not)
    )
    r = train_seeds(TrainConfig.from_policy(p, **TINY), [0])[0]
    assert {"bf16", "e4m3", ("e4m3", "e5m2"), ("e5m2", "e4m3")} <= set(calls)
    assert np.isfinite(r.final_loss)
