"""GPU kernels launched through CuPy, compared bit for bit with the numpy reference.

Every test here is marked ``gpu`` and skips, saying why, where CuPy is not importable or no CUDA
device is visible (CI never has one). ``benchmarks/gpu_check.py`` runs them on a GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest

import precision_lab as pl
from precision_lab import FORMATS, FloatFormat, IntFormat
from precision_lab.core.rounding import ROUNDING_MODES, STOCHASTIC_MODES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning"),
]


@pytest.fixture(scope="module")
def cp():
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        pytest.skip(f"needs CuPy and a CUDA GPU: CuPy is not importable ({type(exc).__name__})")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        pytest.skip(f"needs CuPy and a CUDA GPU: no CUDA device visible ({type(exc).__name__})")
    if n == 0:
        pytest.skip("needs CuPy and a CUDA GPU: no CUDA device visible (device count 0)")
    return cupy


DETERMINISTIC = [m for m in ROUNDING_MODES if m not in STOCHASTIC_MODES]
SMALL = [f for f in FORMATS.values() if isinstance(f, FloatFormat) and f.bits <= 16]
SMALL += [
    FloatFormat(3, 2, nan="none", has_inf=False, has_subnormals=False),
    FloatFormat(4, 3, nan="fn", has_inf=False, signed=False),
    FloatFormat(6, 9, nan="fnuz", has_inf=False),
]
WIDE = [FORMATS["fp32"], FORMATS["tf32"], FORMATS["fp64"], FloatFormat(9, 10), FloatFormat(8, 16)]
INTS = [IntFormat(8), IntFormat(8, False), IntFormat(4), IntFormat(32)]


def _half_patterns() -> np.ndarray:
    codes = np.arange(1 << 16, dtype=np.uint32)
    f16 = codes.astype(np.uint16).view(np.float16).astype(np.float32)
    return np.concatenate([f16, (codes << np.uint32(16)).view(np.float32)])


X32 = _half_patterns()


def _random64(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.ldexp(1.0 + rng.random(n), rng.integers(-40, 40, n)) * rng.choice([-1.0, 1.0], n)
    raw = rng.integers(0, 2**63, size=n // 4, dtype=np.int64).view(np.float64)
    return np.concatenate([x, raw, [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 1e308]])


X64 = _random64(20000, 1)


def _host_result(got, want: np.ndarray, what: str) -> np.ndarray:
    assert type(got).__module__.split(".")[0] == "cupy", f"{what}: result is not a CuPy array"
    g = got.get()
    assert g.dtype == want.dtype and g.shape == want.shape, (what, g.dtype, want.dtype)
    return g


def _assert_bits(g: np.ndarray, want: np.ndarray, what: str) -> None:
    ut = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
    gb, wb = g.view(ut[g.itemsize]), want.view(ut[want.itemsize])
    bad = np.flatnonzero(gb.reshape(-1) != wb.reshape(-1))
    assert bad.size == 0, f"{what}: {bad.size} of {g.size} differ, first at {bad[:5].tolist()}"


def _same(got, want: np.ndarray, what: str) -> None:
    """A CuPy result, bit for bit the numpy one."""
    _assert_bits(_host_result(got, want, what), want, what)


def _same_gemm(got, want: np.ndarray, what: str) -> None:
    """Bit for bit except NaN signs, which numpy itself does not fix (its SIMD loops propagate
    either operand's NaN depending on array lengths); NaN positions must match."""
    g = _host_result(got, want, what).copy()
    w = want.copy()
    nan = np.isnan(w)
    assert (np.isnan(g) == nan).all(), f"{what}: NaN positions differ"
    g[nan] = w[nan] = 0
    _assert_bits(g, w, what)


@pytest.mark.parametrize("fmt", SMALL + WIDE, ids=str)
def test_round_to_and_encode_match_cpu(cp, fmt: FloatFormat) -> None:
    for x in (X32, X64):
        xd = cp.asarray(x)
        for rounding in DETERMINISTIC:
            for overflow, subnormals in (("ieee", "keep"), ("saturate", "flush")):
                kw = {"rounding": rounding, "overflow": overflow, "subnormals": subnormals}
                what = f"{fmt} {x.dtype} {kw}"
                _same(pl.round_to(xd, fmt, **kw), pl.round_to(x, fmt, **kw), what)
                xs = x if fmt.has_nan else x[~np.isnan(x)]
                _same(pl.encode(cp.asarray(xs), fmt, **kw), pl.encode(xs, fmt, **kw), what)


@pytest.mark.parametrize("seed, random_bits", [(0, None), (2**64 + 5, 3), (2**128 - 1, 13)])
def test_stochastic_rounding_matches_cpu(cp, seed: int, random_bits: int | None) -> None:
    for fmt in (FORMATS["e4m3"], FORMATS["bf16"], FORMATS["e2m1"], FORMATS["e8m0"]):
        for x, mode in ((X32, "stochastic"), (X64, "stochastic"), (X32, "stochastic_equal")):
            kw = {"rounding": mode, "seed": seed, "random_bits": random_bits}
            _same(pl.round_to(cp.asarray(x), fmt, **kw), pl.round_to(x, fmt, **kw), str(fmt))
            xs = x if fmt.has_nan else x[~np.isnan(x)]
            _same(pl.encode(cp.asarray(xs), fmt, **kw), pl.encode(xs, fmt, **kw), str(fmt))


@pytest.mark.parametrize("fmt", INTS, ids=str)
def test_integer_formats_match_cpu(cp, fmt: IntFormat) -> None:
    x = X64[np.isfinite(X64)]
    for rounding in ROUNDING_MODES:
        kw = {"rounding": rounding, "seed": 5}
        _same(pl.round_to(cp.asarray(x), fmt, **kw), pl.round_to(x, fmt, **kw), str(fmt))
        _same(pl.encode(cp.asarray(x), fmt, **kw), pl.encode(x, fmt, **kw), str(fmt))
    codes = np.arange(1 << min(fmt.bits, 16), dtype=np.uint64).astype(fmt.code_dtype)
    _same(pl.decode(cp.asarray(codes), fmt), pl.decode(codes, fmt), f"decode {fmt}")


@pytest.mark.parametrize("fmt", SMALL + WIDE, ids=str)
def test_decode_matches_cpu(cp, fmt: FloatFormat) -> None:
    if fmt.bits <= 16:
        codes = np.arange(1 << fmt.bits, dtype=np.uint64).astype(fmt.code_dtype)
    else:
        rng = np.random.default_rng(3)
        codes = rng.integers(0, 1 << fmt.bits, 50000, dtype=np.uint64).astype(fmt.code_dtype)
    _same(pl.decode(cp.asarray(codes), fmt), pl.decode(codes, fmt), f"decode {fmt}")
    if fmt.bits < 64:  # other integer dtypes of codes are accepted too
        _same(pl.decode(cp.asarray(codes.astype(np.int64)), fmt), pl.decode(codes, fmt), str(fmt))


def test_dtype_rules_shapes_and_inputs_kept(cp) -> None:
    x16 = cp.asarray(np.array([[0.1, -2.5], [60000.0, 1e-7]], dtype=np.float16))
    r = pl.round_to(x16, "e4m3")
    assert r.dtype == np.float32 and r.shape == (2, 2)
    x64 = cp.asarray(np.linspace(-3, 3, 12).reshape(3, 4))
    before = x64.copy()
    r = pl.round_to(x64[:, ::2], "bf16")  # non-contiguous
    assert r.dtype == np.float64 and r.shape == (3, 2)
    _same(r, pl.round_to(before.get()[:, ::2], "bf16"), "non-contiguous")
    assert bool((x64 == before).all())
    assert pl.round_to(cp.asarray(np.float32(1.3)), "e4m3").shape == ()
    assert pl.round_to(cp.zeros((0, 3), dtype=cp.float32), "e4m3").shape == (0, 3)
    assert pl.encode(cp.asarray([1.0, 2.0]), "e4m3").dtype == np.uint8
    assert pl.encode(cp.asarray([1.0, 2.0]), "fp16").dtype == np.uint16
    assert pl.decode(cp.asarray(np.array([56], np.uint8)), "e4m3").dtype == np.float32
    assert pl.decode(cp.asarray(np.array([1], np.uint64)), "fp64").dtype == np.float64


def test_errors(cp) -> None:
    with pytest.raises(ValueError, match="NaN"):
        pl.encode(cp.asarray([1.0, np.nan]), "e2m1")
    with pytest.raises(ValueError, match="NaN"):
        pl.encode(cp.asarray([np.nan]), "int8")
    with pytest.raises(ValueError, match=r"0\.\.15"):
        pl.decode(cp.asarray(np.array([16], np.uint8)), "e2m1")
    with pytest.raises(ValueError, match="non-negative"):
        pl.decode(cp.asarray(np.array([-1], np.int32)), "e4m3")
    with pytest.raises(TypeError, match="floating-point"):
        pl.round_to(cp.asarray([1, 2]), "e4m3")
    with pytest.raises(TypeError, match="integer"):
        pl.decode(cp.asarray([1.0]), "e4m3")


# ----- GEMM ---------------------------------------------------------------------------------
def gemm_configs() -> list[tuple[str, str, pl.Accumulator, str]]:
    """(label, input format, accumulator, output format): every kind of model and every preset."""
    from precision_lab.gemm.tensor_core import ARCHITECTURES, GPUS

    A = pl.Accumulator
    e8m13 = FloatFormat(8, 13)
    out = [
        ("fp32 rne (fma)", "e4m3", A(), "fp32"),
        ("fp32 rne fp32 inputs (fma)", "fp32", A(), "fp32"),
        ("fp32 rtz (fma)", "bf16", A(rounding="rtz"), "fp32"),
        ("fp32 up (fma)", "fp16", A(rounding="up"), "fp32"),
        ("fp32 down", "fp16", A(rounding="down"), "fp32"),
        ("fp32 out fp64", "e5m2", A(), "fp64"),
        ("bf16 rne", "e4m3", A("bf16"), "fp32"),
        ("bf16 rtz", "e4m3", A("bf16", "rtz"), "fp32"),
        ("bf16 sr", "e4m3", A("bf16", "sr", seed=5), "fp32"),
        ("fp16 sr 3 bits", "e5m2", A("fp16", "sr", seed=2**70 + 3, random_bits=3), "fp16"),
        ("fp16 promote 128", "e4m3", A("fp16", promote_every=128), "fp32"),
        ("bf16 sr everywhere", "e4m3",
         A("bf16", "sr", promote_every=64, promote_rounding="sr", out_rounding="sr", seed=9),
         "bf16"),
        ("e8m13 pairwise", "e4m3", A(e8m13, order="pairwise"), "fp32"),
        ("bf16 pairwise sr", "e4m3", A("bf16", "sr", order="pairwise", seed=1), "fp32"),
        ("bf16 blocked 32", "e4m3", A("bf16", order="blocked", block=32), "fp32"),
        ("products bf16 rtz", "fp16", A(product_format="bf16", product_rounding="rtz"), "fp32"),
        ("fp16 saturate", "fp16", A("fp16", overflow="saturate"), "fp32"),
        ("bf16 flush", "bf16", A("bf16", subnormals="flush"), "fp32"),
        # AMD CDNA2: subnormal inputs flushed, pairwise fp32 sums promoted every 4 products
        ("mi210 fp16 (flushed inputs)", "fp16", pl.tensor_core("mi210", "fp16"), "fp32"),
        ("mi210 bf16 (flushed inputs)", "bf16", pl.tensor_core("mi210", "bf16"), "fp32"),
        # AMD CDNA1: exact sums of blocks of 4 (fp16) and 2 (bf16) products, rounded once
        ("mi100 fp16 (exact blocks)", "fp16", pl.tensor_core("mi100", "fp16"), "fp32"),
        ("mi100 bf16 (exact blocks)", "bf16", pl.tensor_core("mi100", "bf16"), "fp32"),
        ("fp16 exact blocks of 8, up", "e5m2", A("fp16", "up", order="exact_block", block=8),
         "fp32"),
        # FP64 DMMA: fp64 inputs in a chain of fused multiply-adds
        ("h100 fp64 (fma chain)", "fp64", pl.tensor_core("h100", "fp64", out_format="fp64"),
         "fp64"),
    ]  # fmt: skip
    for arch, table in ARCHITECTURES.items():
        gpu = next(g for g, a in GPUS.items() if a == arch)
        for fmt in table:
            for o in ["fp32", "fp16"] if fmt in ("fp16", "e4m3", "e5m2") else ["fp32"]:
                try:
                    acc = pl.tensor_core(gpu, fmt, out_format=o)
                except ValueError:  # (AMD's matrix cores output fp32 only)
                    continue
                out.append((f"{gpu} {fmt}->{o}", fmt, acc, o))
    return out


GEMM_CONFIGS = gemm_configs()


def _gemm_inputs(seed: int, shape=(2, 70, 150, 300), special: bool = False):
    nb, m, n, k = shape
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((nb, m, k))
    b = rng.standard_normal((nb, k, n))
    c = rng.standard_normal((nb, m, n))
    if special:
        a[0, 1, 3], a[0, 2, 5], b[1, 4, 7], c[0, 5, 5], a[1, 3, 6] = (
            np.inf, np.nan, -np.inf, np.inf, np.inf)  # fmt: skip
    return a, b, c


@pytest.mark.parametrize("cfg", GEMM_CONFIGS, ids=[c[0] for c in GEMM_CONFIGS])
def test_gemm_matches_cpu(cp, cfg) -> None:
    label, fmt, acc, out = cfg
    for special in (False, True):
        a, b, c = _gemm_inputs(len(label), special=special)
        kw = {"input_format": fmt, "accumulator": acc, "out_format": out}
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got = pl.gemm(cp.asarray(a), cp.asarray(b), cp.asarray(c), **kw)
        _same_gemm(got, want, f"gemm {label} special={special}")


def block_scaled_configs() -> list[tuple[str, str | tuple[str, str], pl.Accumulator]]:
    """(label, element format(s), accumulator): block-scaled MMA without groups (tcgen05
    kind::mxf8f6f4, sm_120 mma.block_scale), E8M0 scales on blocks of 32 entering the block FMAs."""
    return [
        ("b200 mxfp8_e4m3", "e4m3", pl.tensor_core("b200", "mxfp8_e4m3", instruction="tcgen05")),
        ("b200 mxfp6_e2m3 x mxfp8_e5m2", ("e2m3", "e5m2"),
         pl.tensor_core("b200", ("mxfp6_e2m3", "mxfp8_e5m2"), instruction="tcgen05")),
        ("rtx5090 mxfp4_e2m1 (mxf8f6f4)", "e2m1",
         pl.tensor_core("rtx5090", "mxfp4_e2m1", instruction="mma.kind::mxf8f6f4")),
    ]  # fmt: skip


def block_scaled_inputs(seed: int, shape=(2, 40, 50, 256), wide: bool = False):
    """Operands, c and E8M0 scales (blocks of 32 along K; 2**-127 .. 2**127 with ``wide``)."""
    nb, m, n, k = shape
    a, b, c = _gemm_inputs(seed, shape)
    rng = np.random.default_rng(seed)
    lim = 127 if wide else 9
    sa = np.exp2(rng.integers(-lim, lim + 1, (nb, m, -(-k // 32))))
    sb = np.exp2(rng.integers(-lim, lim + 1, (nb, -(-k // 32), n)))
    a[:, 0, :32] = 0.0  # a zero block: its zeros align at -126, unscaled
    return a, b, c, sa, sb


@pytest.mark.parametrize("cfg", block_scaled_configs(), ids=lambda c: c[0])
def test_gemm_block_scaled_matches_cpu(cp, cfg) -> None:
    label, fmt, acc = cfg
    for wide in (False, True):
        a, b, c, sa, sb = block_scaled_inputs(len(label), wide=wide)
        kw = {"input_format": fmt, "accumulator": acc, "out_format": "fp32", "scale_a": sa,
              "scale_b": sb, "scale_block": 32}  # fmt: skip
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got = pl.gemm(cp.asarray(a), cp.asarray(b), cp.asarray(c), **kw)
        _same_gemm(got, want, f"block-scaled {label} wide={wide}")


GROUPED_CONFIGS = [("b200", "tcgen05", f) for f in ("nvfp4", "mxfp4_e2m1", "mxfp4_e2m1_b16")] + [
    ("rtx5090", "mma", f) for f in ("nvfp4", "nvfp4_b32", "mxfp4_e2m1")
]


@pytest.mark.parametrize("cfg", GROUPED_CONFIGS, ids=str)
def test_gemm_block_scaled_groups_matches_cpu(cp, cfg) -> None:
    """Block-scaled MMA with groups (kind::mxf4nvf4: NVFP4, MXFP4; MMA-Sim's GST-FDPA: exact sums
    of 16 FP4 products times their scales, aligned at the scales' exponents with c, 35 bits)
    through pl.gemm_blocks on CuPy = the numpy reference (whose values an exact oracle checks in
    tests/gemm/test_tensor_core_presets.py): scales far apart, UE4M3 subnormal ones, zero
    groups and blocks."""
    gpu, ins, fmt = cfg
    acc = pl.tensor_core(gpu, fmt, instruction=ins)
    assert acc.group == 16
    rng = np.random.default_rng(len(fmt) + len(gpu))
    for kind in ("normal", "tiny", "spread", "zeros"):
        x, w = rng.standard_normal((5, 160)), rng.standard_normal((160, 6))
        if kind == "tiny":  # NVFP4: row 1's block scales are UE4M3 subnormals
            x[1] *= 2.0**-17
        elif kind == "spread":  # scales far apart between blocks
            x *= 2.0 ** rng.integers(-30, 30, (5, 10)).repeat(16, axis=1)
            w *= 2.0 ** rng.integers(-30, 30, (10, 6)).repeat(16, axis=0)
        elif kind == "zeros":  # zero groups and blocks: their terms take the zero exponent
            x[:, 16:48] = 0.0
            w[100:, 2] = 0.0
        qa, qb = pl.quantize_blocks(x, fmt), pl.quantize_blocks(w, fmt, axis=0)
        for c in (None, rng.standard_normal((5, 6)) * 2.0**-10):
            if c is not None and qa.tensor_scale != 1:
                continue  # (NVFP4's per-tensor scales: no c, as cuBLAS's alpha)
            want = pl.gemm_blocks(qa, qb, c, accumulator=acc, backend="numpy")
            got = pl.gemm_blocks(qa, qb, c, accumulator=acc, backend="cupy")
            _same_gemm(got, want, f"groups {gpu} {fmt} {kind}")


def test_gemm_scales_and_broadcasting(cp) -> None:
    a, b, c = _gemm_inputs(3, shape=(2, 33, 40, 256))
    rng = np.random.default_rng(4)
    sa = np.exp2(rng.integers(-3, 4, (2, 33, 2)))
    sb = np.exp2(rng.integers(-3, 4, (2, 2, 40))) * 1.5
    for acc in (pl.Accumulator(), pl.tensor_core("h100", "e4m3")):
        kw = {"input_format": "e4m3", "accumulator": acc, "out_format": "bf16"}
        want = pl.gemm(a, b, c, backend="numpy", scale_a=sa, scale_b=sb, **kw)
        got = pl.gemm(cp.asarray(a), cp.asarray(b), cp.asarray(c), scale_a=sa, scale_b=sb, **kw)
        _same_gemm(got, want, f"scales {acc.describe()}")
        want = pl.gemm(a, b[0], c[0, 0], backend="numpy", **kw)
        got = pl.gemm(cp.asarray(a), cp.asarray(b[0]), cp.asarray(c[0, 0]), **kw)
        _same_gemm(got, want, f"broadcast {acc.describe()}")
