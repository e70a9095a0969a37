"""simulate(model, recipe) and the torch recipe pieces against the numpy API, bit for bit:
every emulated GEMM's forward output, input gradient and weight gradient equal
pl.apply_recipe / pl.recipe_gemm on the same operands; plt.hadamard and plt.quantize_operand
equal pl.hadamard and the numpy recipe quantizer, and their gradients the transpose transform."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)
import torch.nn.functional as F  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import precision_lab as pl  # noqa: E402
import precision_lab.torch as plt  # noqa: E402
from precision_lab.quant import recipes as qr  # noqa: E402
from precision_lab.quant.hadamard import hadamard as np_hadamard  # noqa: E402
from precision_lab.quant.hadamard import hadamard_matrix, random_signs  # noqa: E402

ALL = list(qr.RECIPES)
#: the recipes the issue names (block formats, 2-D tiles, Hadamard, SR, NVFP4 tensor scales)
MAIN = ["te_nvfp4", "te_mxfp8", "deepseek_v3", "te_fp8_block", "fp4_all_the_way", "quartet"]


def _bits(t) -> np.ndarray:
    a = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    assert a.dtype == np.float32, a.dtype
    return np.ascontiguousarray(a).view(np.uint32)


def _same(t, a) -> bool:
    return bool(np.array_equal(_bits(t), _bits(a)))


def _operands(rng, m, k, n, scale=1.0):
    x = (rng.standard_normal((m, k)) * scale).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    dy = (rng.standard_normal((m, n)) * 1e-2).astype(np.float32)
    return x, w, dy


def _linear(w: np.ndarray, bias: np.ndarray | None = None) -> torch.nn.Linear:
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=bias is not None)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w))
        if bias is not None:
            lin.bias.copy_(torch.from_numpy(bias))
    return lin


def _run_linear(recipe, x, w, dy, *, seed, accumulator=None, bias=None):
    lin = _linear(w, bias)
    sim = plt.simulate(lin, recipe, seed=seed, accumulator=accumulator)
    xt = torch.from_numpy(x).requires_grad_(True)
    y = sim(xt)
    y.backward(torch.from_numpy(dy))
    return y, xt.grad, lin.weight.grad, lin, sim


# ----- simulate(model, recipe) == apply_recipe ----------------------------------------------------


@pytest.mark.parametrize("recipe", ALL)
def test_simulated_linear_equals_apply_recipe(recipe):
    """Forward, dgrad and wgrad of a Linear under every recipe: apply_recipe's bits, with
    contraction lengths that are not multiples of the blocks (16, 32, 128) or rotations."""
    rng = np.random.default_rng(11)
    x, w, dy = _operands(rng, 37, 72, 45, scale=3.0)
    y, dx, dw, _, sim = _run_linear(recipe, x, w, dy, seed=123)
    ref = pl.apply_recipe(x, w, dy, recipe, seed=123)
    assert _same(y, ref.y) and _same(dx, ref.dx) and _same(dw, ref.dw)
    assert sim.step == 1  # one training forward pass taken


@settings(max_examples=25, deadline=None)
@given(
    recipe=st.sampled_from(MAIN),
    m=st.integers(1, 40),
    k=st.integers(1, 70),
    n=st.integers(1, 40),
    seed=st.integers(0, 2**40),
    data_seed=st.integers(0, 2**32 - 1),
)
def test_simulated_linear_equals_apply_recipe_any_shape(recipe, m, k, n, seed, data_seed):
    x, w, dy = _operands(np.random.default_rng(data_seed), m, k, n)
    y, dx, dw, _, _ = _run_linear(recipe, x, w, dy, seed=seed)
    ref = pl.apply_recipe(x, w, dy, recipe, seed=seed)
    assert _same(y, ref.y) and _same(dx, ref.dx) and _same(dw, ref.dw)


def test_recipe_object_and_gpu_preset_follow_apply_recipe():
    """A Recipe object (not a name) whose roles name a GPU: its tensor-core preset accumulates,
    as in apply_recipe (which changes the bits against the default FP32 promotion here)."""
    base = qr.get_recipe("te_mxfp8")
    r = dataclasses.replace(
        base,
        name="mxfp8_on_b200",
        forward=dataclasses.replace(base.forward, gpu="b200"),
        dgrad=dataclasses.replace(base.dgrad, gpu="b200"),
        wgrad=dataclasses.replace(base.wgrad, gpu="b200"),
    )
    rng = np.random.default_rng(3)
    x, w, dy = _operands(rng, 24, 256, 20, scale=100.0)
    y, dx, dw, _, _ = _run_linear(r, x, w, dy, seed=5)
    ref = pl.apply_recipe(x, w, dy, r, seed=5)
    assert _same(y, ref.y) and _same(dx, ref.dx) and _same(dw, ref.dw)
    default = pl.apply_recipe(x, w, dy, base, seed=5)
    assert not np.array_equal(ref.y, default.y)  # the preset is not a no-op here


def test_accumulator_overrides_the_recipes():
    """``accumulator=`` takes precedence over every role's accumulator (the recipe's GPU preset
    or FP32 promotion): each GEMM equals pl.recipe_gemm with that accumulator."""
    acc = pl.Accumulator("bf16")
    rng = np.random.default_rng(4)
    x, w, dy = _operands(rng, 16, 96, 12)
    for recipe in ("te_mxfp8", "te_nvfp4", "bf16"):
        y, dx, dw, _, sim = _run_linear(recipe, x, w, dy, seed=9, accumulator=acc)
        want_y = pl.recipe_gemm(x, w.T, recipe, "forward", seed=9, accumulator=acc)
        want_dx = pl.recipe_gemm(dy, w, recipe, "dgrad", seed=13, accumulator=acc)
        want_dw = pl.recipe_gemm(dy.T, x, recipe, "wgrad", seed=17, accumulator=acc)
        assert _same(y, want_y) and _same(dx, want_dx) and _same(dw, want_dw)
        ref = pl.apply_recipe(x, w, dy, recipe, seed=9)
        assert not np.array_equal(ref.y, want_y)  # BF16 accumulation: other bits than FP32
        assert "recipe=" in repr(sim) and "bf16" in repr(sim)


def test_bias_is_an_fp32_epilogue_and_its_gradient_a_pairwise_fp32_sum():
    rng = np.random.default_rng(5)
    x, w, dy = _operands(rng, 33, 48, 10)
    b = rng.standard_normal(10).astype(np.float32)
    y, dx, dw, lin, _ = _run_linear("te_nvfp4", x, w, dy, seed=2, bias=b)
    ref = pl.apply_recipe(x, w, dy, "te_nvfp4", seed=2)
    assert _same(y, ref.y + b) and _same(dx, ref.dx) and _same(dw, ref.dw)
    want_db = pl.gemm(np.ones((1, 33), np.float32), dy, input_format="fp32",
                      accumulator=pl.Accumulator(order="pairwise"))[0]  # fmt: skip
    assert _same(lin.bias.grad, want_db)


def test_seeds_per_gemm_and_step():
    """GEMM j of the forward pass at step t runs apply_recipe's roles with seed
    ``seed + 2**32 t + 16 j``; the step advances after a training forward pass only."""
    rng = np.random.default_rng(6)
    x, w1, _ = _operands(rng, 8, 32, 16)
    w2 = rng.standard_normal((4, 16)).astype(np.float32)
    net = torch.nn.Sequential(_linear(w1), _linear(w2))
    sim = plt.simulate(net, "fp4_all_the_way", seed=1000)
    xt = torch.from_numpy(x)
    for step in range(2):
        assert sim.gemm_seed(1) == 1000 + (step << 32) + 16
        y = sim(xt)
        h = pl.recipe_gemm(x, w1.T, "fp4_all_the_way", "forward", seed=1000 + (step << 32))
        want = pl.recipe_gemm(h, w2.T, "fp4_all_the_way", "forward", seed=sim.gemm_seed(1, step))
        assert _same(y, want)
    assert sim.step == 2
    sim.eval()
    sim(xt)
    with torch.no_grad():
        sim.train()
        sim(xt)
    assert sim.step == 2  # evaluation passes take no step
    sim.trace = []
    sim(xt)
    assert sim.trace == [("linear", 0, "fp4_all_the_way", "recipe"),
                         ("linear", 1, "fp4_all_the_way", "recipe")]  # fmt: skip


def test_same_seed_same_bits_other_seed_other_sr():
    rng = np.random.default_rng(7)
    x, w, dy = _operands(rng, 16, 64, 16)
    a = _run_linear("fp4_all_the_way", x, w, dy, seed=1)
    b = _run_linear("fp4_all_the_way", x, w, dy, seed=1)
    c = _run_linear("fp4_all_the_way", x, w, dy, seed=2)
    assert all(_same(p, q) for p, q in zip(a[:3], b[:3], strict=True))
    assert _same(a[0], c[0])  # forward rounds to nearest: the seed does not enter
    assert not _same(a[1], c[1])  # dgrad rounds dy stochastically


def test_conv2d_under_a_recipe_is_a_linear_layer_on_the_patches():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 5, 3, padding=1)
    sim = plt.simulate(conv, "te_mxfp8", seed=3)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    y = sim(x)
    g = torch.randn_like(y)
    y.backward(g)
    cols = F.unfold(x.detach(), 3, padding=1)  # (N, K, L)
    X = cols.transpose(1, 2).reshape(-1, 27).numpy()
    W = conv.weight.detach().reshape(5, -1).numpy()
    G = g.permute(0, 2, 3, 1).reshape(-1, 5).numpy()
    ref = pl.apply_recipe(X, W, G, "te_mxfp8", seed=3)
    b = conv.bias.detach().numpy()
    want_y = (ref.y + b).reshape(2, 36, 5).transpose(0, 2, 1).reshape(2, 5, 6, 6)
    assert _same(y, want_y)
    assert _same(conv.weight.grad.reshape(5, -1), ref.dw)
    dcols = torch.from_numpy(ref.dx).reshape(2, 36, 27).transpose(1, 2)
    assert torch.equal(x.grad, F.fold(dcols, (6, 6), 3, padding=1))  # torch adds the overlaps


def test_matmul_bmm_and_sdpa_under_a_recipe():
    """Functional matmuls: the first operand is the recipe's x, the second its w^T; a batched
    GEMM is pl.recipe_gemm of the whole batch (one SR counter and NVFP4 tensor scale)."""
    rng = np.random.default_rng(8)
    A = rng.standard_normal((3, 5, 40)).astype(np.float32)
    B = rng.standard_normal((3, 40, 6)).astype(np.float32)
    G = rng.standard_normal((3, 5, 6)).astype(np.float32)

    class Bmm(torch.nn.Module):
        def forward(self, a, b):
            return torch.bmm(a, b)

    sim = plt.simulate(Bmm(), "te_nvfp4", seed=21)
    a = torch.from_numpy(A).requires_grad_(True)
    b = torch.from_numpy(B).requires_grad_(True)
    y = sim(a, b)
    y.backward(torch.from_numpy(G))
    assert _same(y, pl.recipe_gemm(A, B, "te_nvfp4", "forward", seed=21))
    assert _same(a.grad, pl.recipe_gemm(G, B.swapaxes(1, 2), "te_nvfp4", "dgrad", seed=25))
    dw = pl.recipe_gemm(G.swapaxes(1, 2), A, "te_nvfp4", "wgrad", seed=29)
    assert _same(b.grad, dw.swapaxes(1, 2))

    q, k, v = (torch.from_numpy(rng.standard_normal((2, 4, 32)).astype(np.float32)) for _ in "qkv")

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    out = plt.simulate(Attn(), "te_mxfp8", seed=0)(q, k, v)
    s = pl.recipe_gemm(q.numpy(), k.transpose(-2, -1).numpy(), "te_mxfp8", "forward", seed=0)
    p = torch.softmax(torch.from_numpy(s) * (1 / np.sqrt(32)), dim=-1)
    want = pl.recipe_gemm(p.numpy(), v.numpy(), "te_mxfp8", "forward", seed=16)
    assert _same(out, want)


def test_recipe_gemm_batches_are_the_2d_gemms_without_sr_or_tensor_scales():
    """For recipes with no stochastic rounding and no per-tensor scale, a batched recipe_gemm is
    the 2-D one per batch (2-D weight tiles included)."""
    rng = np.random.default_rng(9)
    A = rng.standard_normal((2, 7, 130)).astype(np.float32)
    B = rng.standard_normal((2, 130, 9)).astype(np.float32)
    for recipe in ("te_mxfp8", "deepseek_v3"):
        y = pl.recipe_gemm(A, B, recipe, "forward", seed=4)
        for i in range(2):
            assert _same(y[i], pl.recipe_gemm(A[i], B[i], recipe, "forward", seed=4))


def test_simulate_recipe_errors_name_the_argument():
    lin = torch.nn.Linear(4, 2)
    with pytest.raises(
        ValueError, match=r"policy: unknown name 'te_nvfp8'.*known recipes: te_nvfp4"
    ):
        plt.simulate(lin, "te_nvfp8")
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64\), got -1"):
        plt.simulate(lin, "te_nvfp4", seed=-1)
    with pytest.raises(TypeError, match=r"accumulator must be a precision_lab\.Accumulator"):
        plt.simulate(lin, "te_nvfp4", accumulator="fp32")
    with pytest.raises(ValueError, match="role must be one of"):
        pl.recipe_gemm(np.ones((2, 2)), np.ones((2, 2)), "fp32", "backward")
    with pytest.raises(ValueError, match=r"do not share the contraction K"):
        pl.recipe_gemm(np.ones((2, 3)), np.ones((2, 2)), "fp32", "forward")
    with pytest.raises(ValueError, match=r"bias must have shape \(2,\)"):
        plt.recipe_matmul(torch.ones(3, 4), torch.ones(4, 2), "fp32", bias=torch.ones(3))


# ----- hadamard --------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [4, 16, 32, 128])
@pytest.mark.parametrize("seed", [None, 5])
def test_hadamard_forward_bits_and_gradient_is_the_transpose(block, seed):
    rng = np.random.default_rng(block)
    x64 = rng.standard_normal((3, 2 * block)) * 2.0 ** rng.integers(-20, 20, (3, 2 * block))
    x = torch.tensor(x64.astype(np.float32), requires_grad=True)
    y = plt.hadamard(x, block=block, seed=seed)
    want = np_hadamard(x64.astype(np.float32), block=block, seed=seed)
    assert y.dtype == torch.float64
    assert np.array_equal(y.detach().numpy().view(np.uint64), want.view(np.uint64))
    g = rng.integers(-8, 9, (3, 2 * block)).astype(np.float64)
    y.backward(torch.from_numpy(g))
    inv = np_hadamard(g, block=block, seed=seed, inverse=True)
    assert np.array_equal(x.grad.numpy(), inv.astype(np.float32))
    # the definition: M = c H diag(s) per block; the gradient is M^T g
    s = np.ones(block) if seed is None else random_signs(block, seed)
    M = hadamard_matrix(block).astype(np.float64) * block**-0.5 * s[None, :]
    mt_g = (g.reshape(3, 2, block) @ M).reshape(3, 2 * block)  # rows g_b @ M == (M^T g_b)^T
    if block in (4, 16):  # c = 2**-k: M^T g is exact for small integers g
        assert np.array_equal(inv, mt_g)
    assert np.allclose(inv, mt_g, rtol=0, atol=1e-13 * np.abs(g).sum())


def test_hadamard_inverse_gradient_and_gradcheck_and_rounded_arithmetic():
    rng = np.random.default_rng(2)
    x = torch.tensor(rng.standard_normal((2, 64)), requires_grad=True)
    for inverse in (False, True):
        assert torch.autograd.gradcheck(
            lambda t, inv=inverse: plt.hadamard(t, block=32, seed=1, inverse=inv), (x,)
        )
    # inverse's gradient is the forward transform; arithmetic="bf16" forward bits, exact transpose
    z = torch.tensor(rng.standard_normal((4, 16)).astype(np.float32), requires_grad=True)
    y = plt.hadamard(z, block=16, seed=3, arithmetic="bf16", inverse=True)
    want = np_hadamard(z.detach().numpy(), block=16, seed=3, arithmetic="bf16", inverse=True)
    assert y.dtype == torch.float32 and _same(y, want)
    g = torch.ones(4, 16)
    y.backward(g)
    assert np.array_equal(
        z.grad.numpy(), np_hadamard(g.numpy(), block=16, seed=3).astype(np.float32)
    )
    with pytest.raises(ValueError, match="block must be a power of two"):
        plt.hadamard(z, block=12)


# ----- quantize_operand -------------------------------------------------------------------------


def _np_operand(x, recipe, role, which, axis, seed):
    op = getattr(qr.get_recipe(recipe).role(role), which)
    q = qr.quantize_operand(x, op, axis=axis, seed=seed, hadamard_seed=seed)
    return pl.dequantize_blocks(q) if isinstance(q, pl.QuantizedBlocks) else np.asarray(q), op


@pytest.mark.parametrize("recipe", [*MAIN, "bf16"])
def test_quantize_operand_equals_numpy_and_ste_gradient(recipe):
    rng = np.random.default_rng(1)
    for role, names in qr.ROLES.items():
        for which, name, axis in (("a", names[0], -1), ("b", names[1], -2)):
            x = (rng.standard_normal((20, 40)) * 4).astype(np.float32)
            xt = torch.from_numpy(x).requires_grad_(True)
            y = plt.quantize_operand(xt, recipe, role, name, seed=77)
            want, op = _np_operand(x, recipe, role, which, axis, 77)
            assert _same(y, want), (role, which)
            g = rng.standard_normal(tuple(y.shape))
            y.backward(torch.from_numpy(g).to(torch.float32))
            gg = g.astype(np.float32)
            if op.hadamard is not None:  # the rotation's transpose, then the padding dropped
                gg = np_hadamard(gg, block=op.hadamard, axis=axis, seed=77, inverse=True)
                gg = np.take(gg, np.arange(x.shape[axis]), axis=axis).astype(np.float32)
            assert _same(xt.grad, gg), (role, which)


def test_quantize_operand_clipped_and_identity():
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((16, 64)) * 10).astype(np.float32)
    xt = torch.from_numpy(x).requires_grad_(True)
    # quartet's MXFP4 (floor scales) saturates a block's largest values: those get no gradient
    y = plt.quantize_operand(xt, "quartet", "forward", "x", grad="clipped_ste")
    y.backward(torch.ones_like(y))
    rot = np_hadamard(x, block=32, seed=0).astype(np.float32).reshape(16, 2, 32)
    # OCP MX scale: 2**(floor(log2 amax) - emax(e2m1) = 2); the range ends at 6 * scale
    _, e = np.frexp(np.abs(rot).max(-1, keepdims=True))
    clipped = (np.abs(rot) > 6.0 * np.ldexp(1.0, e - 1 - 2)).reshape(16, 64)
    assert clipped.any() and not clipped.all()
    keep = torch.from_numpy((~clipped).astype(np.float32))
    want = np_hadamard(keep.numpy().astype(np.float64), block=32, seed=0, inverse=True)
    assert np.array_equal(xt.grad.numpy(), want.astype(np.float32))
    # identity: the operand's values, gradient unchanged
    x2 = torch.from_numpy(x).requires_grad_(True)
    y2 = plt.quantize_operand(x2, "te_nvfp4", "wgrad", "dy", grad="identity")
    assert torch.equal(y2, x2.detach())
    y2.backward(torch.full_like(y2, 3.0))
    assert torch.equal(x2.grad, torch.full_like(x2, 3.0))
    with pytest.raises(
        ValueError,
        match=r"operand must be 'a', 'b' or a name of role 'wgrad' \('dy', 'x'\), got 'w'",
    ):
        plt.quantize_operand(x2, "te_nvfp4", "wgrad", "w")
    with pytest.raises(ValueError, match="grad must be one of"):
        plt.quantize_operand(x2, "te_nvfp4", "wgrad", "x", grad="straight")
    with pytest.raises(ValueError, match=r"axis must be in \[-2, 2\).*got 2"):
        plt.quantize_operand(x2, "te_nvfp4", "wgrad", "x", axis=2)


def test_hadamard_with_given_signs_and_its_gradient():
    """plt.hadamard(signs=...) (TE's fixed vector): the numpy bits forward, the transpose back."""
    from precision_lab.quant.hadamard import TE_NVFP4_SIGNS

    rng = np.random.default_rng(16)
    x = torch.tensor(rng.standard_normal((2, 32)).astype(np.float32), requires_grad=True)
    y = plt.hadamard(x, block=16, signs=TE_NVFP4_SIGNS)
    want = np_hadamard(x.detach().numpy(), block=16, signs=TE_NVFP4_SIGNS)
    assert np.array_equal(y.detach().numpy(), want)
    g = rng.integers(-8, 9, (2, 32)).astype(np.float64)
    y.backward(torch.from_numpy(g))
    inv = np_hadamard(g, block=16, signs=TE_NVFP4_SIGNS, inverse=True)
    assert np.array_equal(x.grad.numpy(), inv.astype(np.float32))
    assert not np.array_equal(inv, np_hadamard(g, block=16, inverse=True))  # the signs count
