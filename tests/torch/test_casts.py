"""Autograd casts: forward values equal the numpy API's bit for bit (every float16 pattern for
round_to; hypothesis elsewhere), and each backward estimator is its definition exactly."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402

import precision_lab as pl  # noqa: E402
import precision_lab.torch as plt  # noqa: E402
from precision_lab.training.qat import fake_quant, ste_grad  # noqa: E402

ALL_FP16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    ints = {4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return bool(np.array_equal(a.view(ints), b.view(ints)))


@pytest.mark.parametrize("fmt", ["bf16", "e4m3", "e5m2", "e3m2", "e2m1", "e4m3fnuz", "fp16"])
@pytest.mark.parametrize(
    ("rounding", "overflow", "subnormals"),
    [
        ("nearest_even", "ieee", "keep"),
        ("nearest_even", "saturate", "keep"),
        ("toward_zero", "ieee", "flush"),
        ("up", "ieee", "keep"),
        ("stochastic", "ieee", "keep"),
    ],
)
def test_round_to_every_fp16_pattern(fmt: str, rounding: str, overflow: str, subnormals: str):
    opts = {"rounding": rounding, "overflow": overflow, "subnormals": subnormals}
    if rounding == "stochastic":
        opts["seed"] = 7
    want = pl.round_to(ALL_FP16, fmt, **opts)
    x = torch.from_numpy(ALL_FP16.copy())
    got = plt.round_to(x, fmt, **opts)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert _same_bits(got.numpy(), want)
    # float32 and float64 copies of the same values give the same bits as the numpy API too
    for dt in (np.float32, np.float64):
        v = ALL_FP16.astype(dt)
        assert _same_bits(plt.round_to(torch.from_numpy(v), fmt, **opts).numpy(),
                          pl.round_to(v, fmt, **opts))  # fmt: skip


def test_round_to_bfloat16_tensor_matches_numpy_of_its_values():
    x = torch.from_numpy(ALL_FP16.astype(np.float32)).to(torch.bfloat16)
    want = pl.round_to(x.to(torch.float32).numpy(), "e4m3")
    assert _same_bits(plt.round_to(x, "e4m3").numpy(), want)


finite32 = arrays(
    np.float32,
    st.integers(1, 40),
    elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=True),
)


@settings(max_examples=60, deadline=None)
@given(x=finite32, g=finite32, fmt=st.sampled_from(["fp16", "e4m3", "e5m2", "e2m1", "bf16"]))
def test_round_to_gradients_are_the_estimators(x, g, fmt):
    n = min(x.size, g.size)
    x, g = x[:n], g[:n]
    f = pl.get_format(fmt)
    for mode, want in (
        ("ste", g),
        ("clipped_ste", np.where(np.abs(x) <= f.max, g, np.float32(0))),
        ("identity", g),
    ):
        t = torch.from_numpy(x.copy()).requires_grad_(True)
        y = plt.round_to(t, fmt, grad=mode)
        y.backward(torch.from_numpy(g.copy()))
        assert _same_bits(t.grad.numpy(), want), mode
        if mode == "identity":
            assert _same_bits(y.detach().numpy(), x)
        else:
            assert _same_bits(y.detach().numpy(), pl.round_to(x, fmt))


def test_gradient_of_float16_input_comes_back_in_float16():
    t = torch.tensor([1.0, 70000.0], dtype=torch.float32).to(torch.float16).requires_grad_(True)
    y = plt.round_to(t, "e4m3", grad="clipped_ste")
    y.backward(torch.tensor([3.0, 5.0]))
    assert t.grad.dtype == torch.float16
    assert t.grad.tolist() == [3.0, 0.0]  # fp16 70000 is inf: outside e4m3's range


def test_nan_gets_no_gradient_under_clipped_ste():
    t = torch.tensor([float("nan"), 1.0], requires_grad=True)
    plt.round_to(t, "fp16", grad="clipped_ste").backward(torch.ones(2))
    assert t.grad.tolist() == [0.0, 1.0]


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="grad must be one of ste, clipped_ste, identity"):
        plt.round_to(torch.ones(2), "fp16", grad="straight")
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        plt.round_to(np.ones(2), "fp16")
    with pytest.raises(TypeError, match="floating-point"):
        plt.round_to(torch.ones(2, dtype=torch.int32), "fp16")


@settings(max_examples=40, deadline=None)
@given(
    x=arrays(np.float32, st.integers(1, 30), elements=st.floats(-300, 300, width=32)),
    g=arrays(np.float32, 30, elements=st.floats(-10, 10, width=32)),
    scale=st.sampled_from([0.01, 0.5, 1.0, 2.0**-7]),
    zp=st.integers(-5, 5),
    fmt=st.sampled_from(["int8", "uint8", "int4"]),
    narrow=st.booleans(),
)
def test_fake_quantize_is_qat_fake_quant_and_its_ste(x, g, scale, zp, fmt, narrow):
    f = pl.get_format(fmt)
    if not f.min <= zp <= f.max:
        zp = 0 if f.min <= 0 else int(f.min)
    g = g[: x.size]
    cal = pl.Calibration(
        scale=np.asarray(np.float32(scale)),
        zero_point=np.asarray(np.int32(zp)),
        amax=np.asarray(0.0),
        format=f,
        method="max",
        axis=None,
        symmetric=zp == 0,
        narrow_range=narrow,
    )
    want, inside = fake_quant(x, cal)
    t = torch.from_numpy(x.copy()).requires_grad_(True)
    y = plt.fake_quantize(t, fmt, np.float32(scale), zp, narrow_range=narrow, grad="clipped_ste")
    assert _same_bits(y.detach().numpy(), want)
    y.backward(torch.from_numpy(g.copy()))
    assert _same_bits(t.grad.numpy(), ste_grad(g, inside))
    # the codes and the round trip of the two separate pieces are the numpy API's too
    q = plt.quantize(t, fmt, np.float32(scale), zp, narrow_range=narrow)
    codes = pl.quantize(x, fmt, np.float32(scale), zp, narrow_range=narrow)
    assert np.array_equal(q.detach().numpy(), codes.astype(np.float32))
    d = plt.dequantize(q, np.float32(scale), zp)
    assert _same_bits(d.detach().numpy(), pl.dequantize(codes, np.float32(scale), zp))


def test_quantize_dequantize_gradients():
    s = np.float32(0.1)
    t = torch.tensor([0.3, -20.0, 5.0], requires_grad=True)
    q = plt.quantize(t, "int8", s, grad="clipped_ste")
    d = plt.dequantize(q, s)
    d.backward(torch.ones(3))
    # quantize: g / s (float64, rounded to float32), 0 where clipped; dequantize: g * s
    inv = np.float32(1.0 / np.float64(s))
    back = np.float32(np.float64(inv) * np.float64(s))
    assert t.grad.tolist() == [float(back), 0.0, float(back)]
    ints = plt.dequantize(torch.tensor([3, -4], dtype=torch.int8), s)
    assert ints.tolist() == pl.dequantize(np.int8([3, -4]), s).tolist()
    with pytest.raises(ValueError, match="integer codes"):
        plt.dequantize(torch.tensor([0.5]), s)


def test_per_channel_quantize_matches_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    scale = np.float32([0.01, 0.02, 0.05, 0.1])
    got = plt.fake_quantize(torch.from_numpy(x), "int8", torch.from_numpy(scale), axis=0)
    want = pl.dequantize(pl.quantize(x, "int8", scale, axis=0), scale, axis=0)
    assert _same_bits(got.numpy(), want)


@settings(max_examples=30, deadline=None)
@given(
    x=arrays(np.float32, (3, 32), elements=st.floats(-1e4, 1e4, width=32)),
    bf=st.sampled_from(["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4", "mxfp6_e3m2"]),
    rounding=st.sampled_from(["nearest_even", "stochastic"]),
)
def test_round_to_blocks_matches_numpy_and_its_estimators(x, bf, rounding):
    opts = {"rounding": rounding, "seed": 11 if rounding == "stochastic" else None}
    want = pl.round_to_blocks(x, bf, **opts)
    t = torch.from_numpy(x.copy()).requires_grad_(True)
    y = plt.round_to_blocks(t, bf, grad="clipped_ste", **opts)
    assert _same_bits(y.detach().numpy(), want)
    y.backward(torch.ones_like(t))
    # clipped: 0 exactly where the element saturated (its element value is +-max and |x| > |y|)
    q = pl.quantize_blocks(x, bf, **opts)
    b = pl.get_block_format(bf)
    ev = pl.decode(q.element_codes(), b.element).reshape(x.shape)
    sat = (np.abs(ev) == b.element.max) & (np.abs(x) > np.abs(want))
    assert np.array_equal(t.grad.numpy(), np.where(sat, 0.0, 1.0).astype(np.float32))
    t2 = torch.from_numpy(x.copy()).requires_grad_(True)
    plt.round_to_blocks(t2, bf, **opts).sum().backward()
    assert bool((t2.grad == 1).all())
