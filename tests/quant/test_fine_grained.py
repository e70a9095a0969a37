"""DeepGEMM's and Transformer Engine's fine-grained FP8 quantizers (quant.fine_grained).

Oracles: (1) the peers' arithmetic re-written here in torch (float32 tensors, torch's own
float8 casts: a different engine from the library's core), following DeepGEMM's
``deep_gemm/utils/math.py`` and TE's ``tests/pytorch/references/blockwise_quantizer_reference.py``
/ ``quantize_scale_calc.py``; (2) exact rational arithmetic (``fractions.Fraction``) for the
scale rules and the element roundings; (3) the library's exact ``"ceil"`` rule, which the
power-of-two scales equal on float32 data away from the clamps.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from referee import round_in_range as _rn

import precision_lab as pl
from precision_lab.quant.fine_grained import (
    FINE_GRAINED_FORMATS,
    ceil_to_ue8m0,
    deepgemm_fp4_quantize,
    deepgemm_quantize,
    fine_grained_quantize,
    te_blockwise_quantize,
)

torch = pytest.importorskip("torch")


def _data(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Tiles of very different magnitudes, some all-zero, some below DeepGEMM's 1e-4 clamp."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, size=(shape[0], 1)))
    x[0, :128] = 0.0
    if shape[0] > 1:
        x[1] *= 1e-7
    if shape[0] > 3 and shape[1] > 128:
        x[3, 200] = np.inf  # a tile with an infinity (scale 2**127, or FP32 inf)
    if shape[0] > 2:  # amax at an exact power-of-two boundary of amax / 448
        x[2, :128] = 0
        x[2, 5] = 448.0 * 2.0**-3
    return x.astype(np.float32)


def _hard_rows(kind: str, rows: int = 8, seed: int = 0) -> np.ndarray:
    """Rows of 128 float32 values whose scaled value lies at or next to an E4M3 midpoint, so
    that dividing instead of multiplying by the float32 reciprocal (``kind="dg"``) or rounding
    once instead of through float32 (``"te"``) changes the E4M3 element (found with ml_dtypes'
    correctly rounded casts). Element 0 of each row is its amax."""
    ml = pytest.importorskip("ml_dtypes")
    e4 = ml.float8_e4m3fn
    rng = np.random.default_rng(seed)
    grid = np.arange(256, dtype=np.uint8).view(e4).astype(np.float64)
    grid = np.unique(grid[np.isfinite(grid) & (grid > 0) & (grid < 448)])
    mids = (grid[:-1] + grid[1:]) / 2
    out = np.zeros((rows, 128), np.float32)
    r = 0
    while r < rows:
        amax = np.float32(rng.uniform(1, 2) * 2.0 ** rng.integers(-5, 5))
        sf = np.float32(amax / np.float32(448))
        scale = np.float32(np.float32(448) / amax)
        x = (mids * np.float64(sf) if kind == "dg" else mids / np.float64(scale)).astype(np.float32)
        x = np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, 0)])
        if kind == "dg":
            one = (x * np.float32(np.float32(1) / sf)).astype(e4)
            other = (x.astype(np.float64) / np.float64(sf)).astype(e4)
        else:
            one = (x * scale).astype(e4)
            other = (x.astype(np.float64) * np.float64(scale)).astype(e4)
        hard = x[one.astype(np.float32) != other.astype(np.float32)][:127]
        if hard.size:
            out[r, 0] = amax
            out[r, 1 : 1 + hard.size] = hard * np.where(rng.random(hard.size) < 0.5, -1, 1)
            r += 1
    return out


# ----- DeepGEMM -------------------------------------------------------------------------------
def _torch_deepgemm(x: np.ndarray, tile: tuple[int, int], ue8m0: bool) -> tuple[Any, Any]:
    t = torch.from_numpy(x)
    m, n = t.shape
    if tile == (1, 128):
        v = t.view(m, n // 128, 128)
        amax = v.abs().float().amax(dim=2).clamp(1e-4)
    else:
        v = t.view(m // 128, 128, n // 128, 128)
        amax = v.abs().float().amax(dim=(1, 3)).clamp(1e-4)
    sf = amax / 448.0
    if ue8m0:
        bits = sf.view(torch.int32)
        e = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
        sf = (e.clamp(1, 254) << 23).view(torch.float32)
    inv = 1.0 / sf
    g = inv[:, :, None] if tile == (1, 128) else inv[:, None, :, None]
    q = (v * g).to(torch.float8_e4m3fn).view(m, n)
    return q.view(torch.uint8).numpy(), sf.numpy()


@pytest.mark.parametrize("tile", [(1, 128), (128, 128)])
@pytest.mark.parametrize("ue8m0", [True, False])
def test_deepgemm_bits_match_torch(tile: tuple[int, int], ue8m0: bool) -> None:
    rng = np.random.default_rng(7)
    x = _data(rng, (256, 256))
    x[8:16, :128] = _hard_rows("dg")
    x[16:24, 128:] = _hard_rows("dg", seed=1)
    if tile == (128, 128):
        x[128:, :128] *= 1e-9  # a whole tile below the clamp
    q = deepgemm_quantize(x, tile=tile, ue8m0=ue8m0)
    codes, sf = _torch_deepgemm(x, tile, ue8m0)
    np.testing.assert_array_equal(q.codes, codes)
    np.testing.assert_array_equal(q.scales, sf.astype(np.float64))


def test_deepgemm_bf16_input_and_axis() -> None:
    ml = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(3)
    x = _data(rng, (4, 256)).astype(ml.bfloat16)
    q = deepgemm_quantize(x)
    codes, _ = _torch_deepgemm(x.astype(np.float32), (1, 128), True)
    np.testing.assert_array_equal(q.codes, codes)
    # a (K, N) operand blocked along K: the transpose's quantization
    qt = deepgemm_quantize(x.astype(np.float32).T, axis=-2)
    np.testing.assert_array_equal(qt.codes, q.codes.T)
    np.testing.assert_array_equal(qt.scales, q.scales.T)


def _rn32(v: Fraction) -> Fraction:
    return _rn(v, 23, -126)


def test_deepgemm_fraction_oracle() -> None:
    """Scales and elements from exact arithmetic: sf = RN32(max(amax, RN32(1e-4)) / 448),
    UE8M0 = the smallest power of two >= sf; element = RN_e4m3(RN32(x * RN32(1 / sf)))."""
    rng = np.random.default_rng(11)
    x = np.concatenate([_data(rng, (4, 128)), _hard_rows("dg", 2)])
    floor = Fraction(float(np.float32(1e-4)))
    for ue8m0 in (True, False):
        q = deepgemm_quantize(x, ue8m0=ue8m0)
        vals = q.element_values()
        for i in range(x.shape[0]):
            amax = max(max(abs(Fraction(float(v))) for v in x[i]), floor)
            sf = _rn32(amax / 448)
            if ue8m0:
                k = 0
                while Fraction(2) ** k < sf:
                    k += 1
                while Fraction(2) ** (k - 1) >= sf:
                    k -= 1
                sf = Fraction(2) ** k
            assert Fraction(float(q.scales[i, 0])) == sf
            inv = _rn32(1 / sf)
            for j in range(0, 128, 1 if i >= 4 else 7):
                want = _rn(_rn32(Fraction(float(x[i, j])) * inv), 3, -6)
                assert Fraction(float(vals[i, j])) == want, (ue8m0, i, j)


def test_deepgemm_ue8m0_is_the_exact_ceil_rule_above_the_clamp() -> None:
    """On float32 data DeepGEMM's float32 quotient never rounds across a power of two: its
    UE8M0 scales are the library's exact round-up rule wherever amax >= 1e-4. The boundary
    cases: amax = 448 * 2**k and the float32 numbers just above and below it."""
    ks = np.arange(-12, 20)
    base = 448.0 * np.exp2(ks)
    amax = np.concatenate(
        [
            base,
            np.nextafter(base.astype(np.float32), np.inf),
            np.nextafter(base.astype(np.float32), 0),
        ]
    ).astype(np.float32)
    x = np.zeros((amax.size, 128), np.float32)
    x[:, 3] = amax
    x[:, 9] = -amax / 3
    q = deepgemm_quantize(x)
    ceil = pl.get_block_format("fp8_1x128", scale_rule="ceil")
    lib = pl.quantize_blocks(x, ceil)
    np.testing.assert_array_equal(q.scales, lib.scales)
    np.testing.assert_array_equal(q.codes, lib.codes)
    # below the clamp they part: DeepGEMM keeps the scale of amax 1e-4 (2**-22)
    tiny = np.full((1, 128), 1e-6, np.float32)
    assert deepgemm_quantize(tiny).scales[0, 0] == 2.0**-22
    assert pl.quantize_blocks(tiny, ceil).scales[0, 0] < 2.0**-22


def test_ceil_to_ue8m0_bits() -> None:
    v = np.array([1.0, 1.5, 2.0**-130, 0.0, np.inf, np.nan, 3.0e38], np.float32)
    got = ceil_to_ue8m0(v)
    assert got.tolist()[:5] == [1.0, 2.0, 2.0**-126, 2.0**-126, 2.0**127]
    assert got[5] == 2.0**127 and got[6] == 2.0**127


# ----- Transformer Engine ---------------------------------------------------------------------
def _torch_te(
    x: np.ndarray, tile: tuple[int, int], pow2: bool, eps: float, dtype: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    t = torch.from_numpy(x)
    if dtype is not None:
        t = t.to(dtype)
    m, n = t.shape
    if tile == (1, 128):
        v = t.reshape(m, n // 128, 128)
        amax = v.abs().amax(dim=-1).float()
    else:
        v = t.reshape(m // 128, 128, n // 128, 128)
        amax = v.abs().amax(dim=(1, 3)).float()
    amax = torch.max(amax, torch.tensor(eps))
    scale = torch.div(448.0, amax)
    scale = torch.where(scale == torch.inf, torch.finfo(t.dtype).max, scale)
    if pow2:
        _, e = torch.frexp(scale)
        scale = torch.ldexp(torch.ones_like(scale), e - 1)
        scale = torch.where(amax == float("inf"), 0.0, scale)
    scale = torch.where(amax == 0, 1.0, scale)
    inv = torch.reciprocal(scale)
    g = scale[:, :, None] if tile == (1, 128) else scale[:, None, :, None]
    q = torch.clamp(v * g, -448.0, 448.0).to(torch.float8_e4m3fn).reshape(m, n)
    return q.view(torch.uint8).numpy(), inv.numpy()


@pytest.mark.parametrize("tile", [(1, 128), (128, 128)])
@pytest.mark.parametrize("pow2", [True, False])
@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_te_bits_match_torch(tile: tuple[int, int], pow2: bool, eps: float) -> None:
    rng = np.random.default_rng(5)
    x = _data(rng, (256, 256))
    x[8:16, :128] = _hard_rows("te")
    x[16:24, 128:] = _hard_rows("te", seed=1)
    if tile == (128, 128):
        x[:128, 128:] = 0.0  # an all-zero tile: scale 1 (eps 0)
    q = te_blockwise_quantize(x, tile=tile, pow2=pow2, eps=eps)
    codes, inv = _torch_te(x, tile, pow2, eps)
    np.testing.assert_array_equal(q.codes, codes)
    np.testing.assert_array_equal(q.scales, inv.astype(np.float64))


@pytest.mark.parametrize("pow2", [True, False])
def test_te_bf16_input(pow2: bool) -> None:
    """bf16 input: an infinite quantization scale (amax below 448 / FLT_MAX) becomes bf16's
    largest value, not float32's."""
    ml = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(8)
    x = _data(rng, (4, 256)).astype(ml.bfloat16)
    x[2, 128:] = (rng.standard_normal(128) * 1e-37).astype(ml.bfloat16)
    q = te_blockwise_quantize(x, pow2=pow2)
    codes, inv = _torch_te(x.astype(np.float32), (1, 128), pow2, 0.0, torch.bfloat16)
    np.testing.assert_array_equal(q.codes, codes)
    np.testing.assert_array_equal(q.scales, inv.astype(np.float64))
    if not pow2:
        fp32 = te_blockwise_quantize(x.astype(np.float32), pow2=False)
        assert q.scales[2, 1] != fp32.scales[2, 1]


def test_te_pow2_is_the_exact_ceil_rule_for_nonzero_tiles() -> None:
    rng = np.random.default_rng(9)
    x = _data(rng, (8, 256))
    x[0, :128] = 1.0  # replace the zero tile (TE: scale 1; the library: its smallest scale)
    x[3, 200] = 1.0  # and the infinity (TE: scale_inv inf; the library: a NaN block)
    q = te_blockwise_quantize(x)
    lib = pl.quantize_blocks(x, pl.get_block_format("fp8_1x128", scale_rule="ceil"))
    np.testing.assert_array_equal(q.scales, lib.scales)
    np.testing.assert_array_equal(q.codes, lib.codes)


def test_te_fp32_scales_double_round() -> None:
    """FP32 scales: fp32(x * scale) then E4M3 is a double rounding the exact "amax" rule of
    fp8_1x128 avoids; on Gaussian data the two differ in some elements (and the exact rule's
    scale is amax/448, TE's 1/fp32(448/amax))."""
    x = _hard_rows("te", 4)
    q = te_blockwise_quantize(x, pow2=False)
    lib = pl.quantize_blocks(x, "fp8_1x128")
    assert (q.element_values() != lib.element_values()).any()
    # every TE element is the exact RN_e4m3 of RN32(x * scale)
    sc = np.array([_rn32(448 / Fraction(float(np.abs(r).max()))) for r in x[:4]])
    for i in range(4):
        for j in range(128):
            want = _rn(_rn32(Fraction(float(x[i, j])) * sc[i]), 3, -6)
            assert Fraction(float(q.element_values()[i, j])) == want


# ----- DeepGEMM FP4 -----------------------------------------------------------------------------
def _torch_fp4(x: np.ndarray, gran: int, ue8m0: bool) -> tuple[np.ndarray, np.ndarray]:
    t = torch.from_numpy(x)
    m, n = t.shape
    v = t.view(m, -1, gran)
    amax = v.abs().float().amax(dim=2).clamp_min(1e-4)
    sf = amax / 6.0
    if ue8m0:
        bits = sf.view(torch.int32)
        e = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
        sf = (e.clamp(1, 254) << 23).view(torch.float32)
    s = (v * (1.0 / sf[:, :, None])).view(m, n)
    ax = s.abs()
    code = torch.zeros_like(s, dtype=torch.uint8)
    for bnd in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        code += (ax > bnd).to(torch.uint8)
    code = code | (((s < 0) & (code != 0)).to(torch.uint8) << 3)
    packed = (code[:, 0::2] & 0x0F) | ((code[:, 1::2] & 0x0F) << 4)
    return packed.numpy(), sf.numpy()


@pytest.mark.parametrize("ue8m0", [True, False])
def test_deepgemm_fp4_matches_torch(ue8m0: bool) -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((16, 64)) * 3).astype(np.float32)
    x[0, :4] = [0.75, -0.25, 1.25, -5.0]  # ties (scale 1 after the max below)
    x[0, 4:32] = 0.0
    x[0, 31] = 6.0
    x[1, 0] = np.nan
    x[2, 3] = -1e-3
    q = deepgemm_fp4_quantize(x, gran_k=32, ue8m0=ue8m0)
    codes, sf = _torch_fp4(x, 32, ue8m0)
    np.testing.assert_array_equal(q.codes, codes)
    np.testing.assert_array_equal(q.scales, sf.astype(np.float64))
    vals = q.element_values()
    if ue8m0:
        assert vals[0, :4].tolist() == [0.5, 0.0, 1.0, -4.0]  # ties toward zero
    assert q.element_codes()[1, 0] == 0  # NaN -> +0
    assert not np.signbit(vals[2, 3])  # no -0


def test_registry_and_errors() -> None:
    x = np.ones((128, 128), np.float32)
    for name, f in FINE_GRAINED_FORMATS.items():
        q = fine_grained_quantize(x, name)
        assert q.block_format.block_size == (128 if f.tile[0] == 1 else 128 * 128)
        np.testing.assert_array_equal(q.dequantize(), x)
    with pytest.raises(ValueError, match="tile must be"):
        deepgemm_quantize(x, tile=(1, 64))
    with pytest.raises(ValueError, match="unknown fine-grained format"):
        fine_grained_quantize(x, "deepgemm_1x32")
