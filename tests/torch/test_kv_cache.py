"""Issue 34: KV-cache quantization (FP8 / NVFP4 with a constant or calibrated per-tensor amax),
applied when a model is called with a cache, under simulate."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)
import torch.nn.functional as F  # noqa: E402

import precision_lab as pl  # noqa: E402
import precision_lab.torch as plt  # noqa: E402
from precision_lab.torch.kv_cache import KVCache, KVQuant, quantize_kv  # noqa: E402


def _bits(a, b) -> bool:
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nvfp4_with_the_datas_amax_is_quantize_blocks(seed):
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((2, 3, 40)).astype(np.float32))
    x[0, 0, 0] = 37.0
    got = quantize_kv(x, KVQuant("nvfp4", float(x.abs().max())))
    want = pl.dequantize_blocks(pl.quantize_blocks(x.numpy(), "nvfp4", pad=True))
    assert _bits(got.numpy(), want)
    # another constant amax (not a power-of-two multiple): another tensor scale, other values
    assert not torch.equal(quantize_kv(x, KVQuant("nvfp4", 3.3 * 37.0)), got)


def test_fp8_cast_is_a_saturating_cast_and_calibration_sets_the_scale():
    x = torch.tensor([[[0.3, 1000.0, -(2.0**-12)]]])
    got = quantize_kv(x, "fp8_cast")
    assert _bits(got.numpy(), pl.round_to(x.numpy(), "e4m3", overflow="saturate"))
    s = np.float32(448.0) / np.float32(1000.0)
    want = pl.round_to(x.numpy() * s, "e4m3") * (np.float32(1) / s)
    assert _bits(quantize_kv(x, KVQuant("e4m3", amax=1000.0)).numpy(), want)
    with pytest.raises(ValueError, match="amax"):
        quantize_kv(x, "fp8")
    with pytest.raises(ValueError, match="unknown quantization 'int3'"):
        KVCache("int3")


class _Decoder(torch.nn.Module):
    """One attention layer that reads its keys and values through a cache."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24, bias=False)

    def forward(self, x, cache):
        q, k, v = self.qkv(x).chunk(3, -1)
        k, v = cache.update(k[:, None], v[:, None], 0)
        return F.scaled_dot_product_attention(q[:, None], k, v)[:, 0]


def test_simulate_quantizes_the_cache_it_is_called_with():
    torch.manual_seed(0)
    dec = _Decoder()
    x = torch.randn(1, 5, 8) * 3
    sim = plt.simulate(dec, "float32", kv_cache="fp8")
    cache = KVCache()
    with cache.calibrating():  # calibrated amax: the largest |K|, |V| of the calibration pass
        sim(x, cache)
    amax_k, amax_v = cache.amax[0]
    q, k, v = plt.simulate(dec.qkv, "float32")(x).detach().chunk(3, -1)  # the emulated GEMM
    assert amax_k == float(k.abs().max()) and amax_v == float(v.abs().max())
    outs = [sim(x[:, t : t + 1], cache) for t in range(5)]  # token by token
    assert cache.quant == KVQuant("e4m3", None) and cache.get_seq_length() == 5
    kq = quantize_kv(k, KVQuant("e4m3", amax_k))
    vq = quantize_kv(v, KVQuant("e4m3", amax_v))
    assert torch.equal(cache.keys[0][:, 0], kq) and torch.equal(cache.values[0][:, 0], vq)
    for t, o in enumerate(outs):  # each step attends to the quantized cache
        want = plt.simulate(_Call(), "float32")(q[:, t : t + 1], kq[:, : t + 1], vq[:, : t + 1])
        assert torch.equal(o, want)
    assert not torch.equal(kq, k)
    # without a calibration a calibrated quantization cannot store
    with pytest.raises(ValueError, match="no calibrated amax"):
        plt.simulate(dec, "float32", kv_cache="nvfp4")(x, KVCache())


class _Call(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)
