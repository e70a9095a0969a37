"""Issue 34, attention: nn.MultiheadAttention / nn.Transformer* under simulate (their GEMMs
emulated bit for bit against an independent decomposition with pl.gemm), FP8 attention as
FlashAttention-3 runs it (against a numpy re-implementation, and the online softmax against
torch's sdpa in FP32), and the P-underflow measurement (against mpmath, and arXiv 2606.06521's
threshold)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)
import torch.nn.functional as F  # noqa: E402

import precision_lab as pl  # noqa: E402
import precision_lab.torch as plt  # noqa: E402
from precision_lab.torch.attention import (  # noqa: E402
    AttentionRecipe,
    fp8_attention,
    p_collapse_prediction,
    p_underflow,
    p_underflow_threshold,
)

ACC = pl.tensor_core("a100", "bf16")


def _gemm_bf16(a, b, c=None) -> np.ndarray:
    r = pl.gemm(np.asarray(a, np.float32), np.asarray(b, np.float32), c, input_format="bf16",
                accumulator=ACC)  # fmt: skip
    return np.asarray(pl.round_to(np.asarray(r, np.float32), "bf16"), np.float32)


def test_multihead_attention_with_weights_is_torchs_decomposition_bit_for_bit():
    torch.manual_seed(0)
    E, H, L, N = 8, 2, 4, 3
    mha = torch.nn.MultiheadAttention(E, H)
    x = torch.randn(L, N, E)
    pad = torch.tensor([[False] * L, [False, False, True, True], [False, True, True, True]])
    causal = torch.triu(torch.full((L, L), float("-inf")), 1)
    sim = plt.simulate(mha, "mixed_bfloat16", accumulator=ACC)
    out, w = sim(x, x, x, key_padding_mask=pad, attn_mask=causal)
    # the reference: torch's need_weights path, every GEMM by pl.gemm
    X = x.numpy().reshape(L * N, E)
    qkv = _gemm_bf16(X, mha.in_proj_weight.detach().numpy().T, mha.in_proj_bias.detach().numpy())
    q, k, v = (t.reshape(L, N * H, E // H).transpose(1, 0, 2) for t in np.split(qkv, 3, -1))
    q = q * np.float32(math.sqrt(1.0 / (E // H)))
    kp = np.where(pad, np.float32(-np.inf), np.float32(0))  # (N, L)
    mask = causal.numpy()[None] + np.repeat(kp, H, 0)[:, None, :]  # (N*H, L, L)
    s = _gemm_bf16(q, k.transpose(0, 2, 1), mask)  # baddbmm: the mask in the accumulator
    p = torch.softmax(torch.from_numpy(s), -1).numpy()  # the softmax rule: float32
    o = _gemm_bf16(p, v).transpose(1, 0, 2).reshape(L * N, E)
    y = _gemm_bf16(o, mha.out_proj.weight.detach().numpy().T, mha.out_proj.bias.detach().numpy())
    assert torch.equal(out, torch.from_numpy(y.reshape(L, N, E)))
    assert torch.equal(w, torch.from_numpy(p.reshape(N, H, L, L)).mean(1))
    ref, _ = mha(x, x, x, key_padding_mask=pad, attn_mask=causal)
    assert 0 < float((out - ref).detach().abs().max()) < 0.05


def test_transformer_layers_run_unmodified():
    torch.manual_seed(1)
    tr = torch.nn.Transformer(8, 2, 1, 1, 16, dropout=0.0).eval()
    src, tgt = torch.randn(5, 2, 8), torch.randn(4, 2, 8)
    m = tr.generate_square_subsequent_mask(4)
    sim = plt.simulate(tr, "float32")
    sim.trace = []
    got = sim(src, tgt, tgt_mask=m)
    assert torch.allclose(got, tr(src, tgt, tgt_mask=m), rtol=1e-5, atol=1e-5)
    kinds = [t[0] for t in sim.trace]
    assert kinds.count("matmul") == 6  # q k^T and P V of 3 attention blocks, through sdpa
    # an encoder layer in training mode, packed projections, gradients flow
    enc = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 8, requires_grad=True)
    plt.simulate(enc, "mixed_bfloat16")(x).sum().backward()
    assert x.grad is not None and enc.self_attn.in_proj_weight.grad is not None


def _fa3_reference(q, k, v, *, block_n=None, reverse=True, offset=8, causal=False):
    """FA3's FP8 forward in numpy, written from its description (module docstring)."""
    f32 = np.float32
    sc = []
    for t in (q, k, v):
        s = f32(pl.scaling.scale_from_amax(float(np.abs(t).max()), "e4m3"))
        sc.append((np.asarray(pl.round_to(t * s, "e4m3", overflow="saturate"), f32), f32(1) / s))
    (qq, dq), (kq, dk), (vq, dv) = sc
    S = np.asarray(pl.gemm(qq, kq.swapaxes(-1, -2), input_format="e4m3",
                           accumulator=pl.Accumulator()), f32)  # fmt: skip
    n = S.shape[-1]
    if causal:
        S = np.where(np.tril(np.ones((S.shape[-2], n), bool)), S, -np.inf)
    sl2 = f32(
        f32(float(f32(1 / float(f32(math.sqrt(q.shape[-1]))))) * 1.4426950408889634) * f32(dq * dk)
    )
    bn = block_n or n
    blocks = [(j, min(j + bn, n)) for j in range(0, n, bn)][:: -1 if reverse else 1]
    m = np.full(S.shape[:-1], -np.inf, f32)
    lsum = np.zeros(S.shape[:-1], f32)
    o = None
    for j0, j1 in blocks:
        mn = np.maximum(m, S[..., j0:j1].max(-1))
        ms = np.where(np.isneginf(mn), f32(0), (mn * sl2).astype(f32) - f32(offset))
        x = (S[..., j0:j1].astype(np.float64) * float(sl2) - ms[..., None]).astype(f32)
        p = np.exp2(x.astype(np.float64)).astype(f32)
        cur = np.where(np.isneginf(mn), f32(0), mn)
        with np.errstate(invalid="ignore"):
            grow = np.exp2(((m - cur) * sl2).astype(f32).astype(np.float64)).astype(f32)
            alpha = np.where(np.isneginf(m), f32(1), grow)
        lsum = lsum * alpha + torch.from_numpy(p).sum(-1).numpy()
        p8 = np.asarray(pl.round_to(p, "e4m3", overflow="saturate"), f32)
        c = None if o is None else o * alpha[..., None]
        o = np.asarray(pl.gemm(p8, vq[..., j0:j1, :], c, input_format="e4m3",
                               accumulator=pl.Accumulator()), f32)  # fmt: skip
        m = mn
    inv = np.where(lsum != 0, f32(1) / np.where(lsum != 0, lsum, f32(1)), f32(0))
    return np.asarray(pl.round_to(o * (inv * dv)[..., None], "bf16"), f32)


@pytest.mark.parametrize(
    ("block_n", "reverse", "causal"),
    [(None, True, False), (4, True, True), (4, False, False), (3, False, True)],
)
def test_fp8_attention_is_fa3s_algorithm(block_n, reverse, causal):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g) * 3 for _ in range(3))
    r = AttentionRecipe("t", block_n=block_n, reverse=reverse)
    got = fp8_attention(q, k, v, recipe=r, is_causal=causal)
    want = _fa3_reference(q.numpy(), k.numpy(), v.numpy(), block_n=block_n, reverse=reverse,
                          causal=causal)  # fmt: skip
    assert np.array_equal(got.numpy(), want)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert 0 < float((got - ref).abs().max()) < 0.25 * float(ref.abs().max())


@pytest.mark.parametrize("block_n", [None, 2, 5])
def test_online_softmax_in_fp32_is_sdpa(block_n):
    """With every role FP32, no scaling and no P offset, the blockwise online softmax (either
    order) is attention itself, to float32 rounding."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 7, 4, generator=g) for _ in range(3))
    mask = torch.rand(7, 7, generator=g) > 0.3
    mask[:, 0] = True
    for rev in (True, False):
        r = AttentionRecipe("f32", q="fp32", k="fp32", v="fp32", p="fp32", out="fp32",
                            scaling="none", max_offset=0, block_n=block_n, reverse=rev)  # fmt: skip
        got = fp8_attention(q, k, v, mask, recipe=r)
        ref = F.scaled_dot_product_attention(q, k, v, mask)
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_attention_recipe_in_simulate():
    torch.manual_seed(4)
    enc = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 6, 16)
    sim = plt.simulate(enc, "float32", attention="fa3_fp8")
    sim.trace = []
    y = sim(x)
    assert [t[0] for t in sim.trace].count("attention") == 2  # Q K^T and P V
    assert [t[2] for t in sim.trace if t[0] == "attention"] == ["e4m3", "e4m3"]
    assert 0 < float((y - enc(x)).detach().abs().max()) < 0.5
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    simm = plt.simulate(mha, "float32", attention="fa3_fp8")
    with pytest.raises(NotImplementedError, match="need_weights=False"):
        simm(x, x, x)
    a = simm(x, x, x, need_weights=False)[0]
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, -1)
    heads = [t.reshape(2, 6, 2, 8).transpose(1, 2) for t in (q, k, v)]
    o = fp8_attention(*heads).transpose(1, 2).reshape(2, 6, 16)
    assert torch.allclose(a, F.linear(o, mha.out_proj.weight, mha.out_proj.bias), atol=1e-5)


def test_a_recipe_names_its_attention_casts():
    torch.manual_seed(5)
    enc = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 6, 16)
    recipe = dataclasses.replace(pl.get_recipe("te_mxfp8"), attention="fa3_fp8")
    sim = plt.simulate(enc, recipe)
    sim.trace = []
    y = sim(x)
    assert [t[2] for t in sim.trace if t[0] == "attention"] == ["e4m3", "e4m3"]
    explicit = plt.simulate(enc, "te_mxfp8", attention="fa3_fp8")(x)
    assert torch.equal(y, explicit)  # the field is the keyword
    plain = plt.simulate(enc, "te_mxfp8")(x)
    assert not torch.equal(y, plain)  # and without it attention is not FP8 attention
    # the keyword overrides the recipe's field
    override = plt.simulate(enc, recipe, attention="fp8_p_unscaled")
    assert override.attention is not None and override.attention.name == "fp8_p_unscaled"


# ----- P underflow -------------------------------------------------------------------------------
def test_p_underflow_against_exact_arithmetic():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    rng = np.random.default_rng(5)
    s = (rng.standard_normal((40, 64)) * 4).astype(np.float32)
    for off in (0, 4, 8):
        r = p_underflow(s, max_offset=off)
        zeros = 0
        half = mpmath.mpf(2) ** -10  # half the smallest E4M3 subnormal: ties go to the even 0
        for row in s:
            m = mpmath.mpf(float(row.max()))
            zeros += sum(1 for x in row if 2**off * mpmath.exp(mpmath.mpf(float(x)) - m) <= half)
        assert r.zeros == zeros and r.count == s.size
        assert r.threshold == pytest.approx(10 * math.log(2) + off * math.log(2))
    assert p_underflow_threshold("e4m3", max_offset=8) == pytest.approx(
        6.93 + math.log(256), abs=2e-3
    )


def test_sink_collapse_reproduces_the_closed_form_threshold():
    """arXiv 2606.06521: forward KV iteration with an attention sink of strength Delta makes a
    fraction ~Phi(Delta + delta_k - 6.93 - ln S) of non-sink P underflow; reverse iteration with
    S = 256 removes it."""
    rng = np.random.default_rng(6)
    rows, n, bn = 300, 384, 128
    later = np.ones((rows, n), bool)
    later[:, :bn] = False  # the non-sink entries of the blocks after the sink's
    for off in (0, 8):
        for delta in (4.0, 6.0, 8.0, 10.0, 12.0):
            s = rng.standard_normal((rows, n)).astype(np.float32)
            s[:, :4] += delta
            fwd = p_underflow(s, max_offset=off, block_n=bn, reverse=False, count=later).fraction
            assert abs(fwd - p_collapse_prediction(delta, max_offset=off, exact=True)) < 0.03
            assert abs(fwd - p_collapse_prediction(delta, max_offset=off)) < 0.08
            rev = p_underflow(s, max_offset=off, block_n=bn, reverse=True, count=later)
            if off == 8:
                assert rev.zeros == 0
    assert p_collapse_prediction(12.0, max_offset=0) > 0.99  # S = 1 collapses


def test_gqa_and_the_backward_roles():
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 4, 5, 8, generator=g)
    k, v = torch.randn(1, 2, 5, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g)

    class Gqa(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    got = plt.simulate(Gqa(), "float32")(q, k, v)
    assert torch.allclose(got, Gqa()(q, k, v), rtol=1e-5, atol=1e-6)
    # dO and dS in E5M2 change the gradients (FP32 backward operands by default)
    grads = []
    for do in (None, "e5m2"):
        qq = q[:, :2].clone().requires_grad_(True)
        r = AttentionRecipe("b", do=do, ds=do)
        fp8_attention(qq, k, v, recipe=r).square().sum().backward()
        grads.append(qq.grad)
    assert not torch.equal(grads[0], grads[1])
    # unscaled E5M2 dS underflows: the gradient of the raw S carries the 1/l normalisation
    assert int((grads[1] == 0).sum()) > int((grads[0] == 0).sum())


def test_multihead_attention_separate_projections_bias_kv_and_zero_attn():
    torch.manual_seed(10)
    mha = torch.nn.MultiheadAttention(8, 2, kdim=6, vdim=5, add_bias_kv=True, add_zero_attn=True,
                                      batch_first=True)  # fmt: skip
    q, k, v = torch.randn(2, 3, 8), torch.randn(2, 4, 6), torch.randn(2, 4, 5)
    sim = plt.simulate(mha, "float32")
    sim.trace = []
    out, w = sim(q, k, v, average_attn_weights=False)
    ref, wref = mha(q, k, v, average_attn_weights=False)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6) and w.shape == wref.shape == (2, 2, 3, 6)
    assert torch.allclose(w, wref, rtol=1e-5, atol=1e-6)
    # three in-projections (q, k, v weights apart), q k^T, P V, the out-projection
    assert [t[0] for t in sim.trace] == ["linear"] * 3 + ["matmul"] * 2 + ["linear"]
