"""The CUDA rounding core (precision_lab/backends/cuda/pl_round.cuh), compiled as plain C++,
against numpy.

The header's __host__ __device__ functions are built with the system C++ compiler into a shared
library (tests/backends/cuda_harness/host_round.cpp, once per session, cached under
tests/backends/_build/) and called through ctypes. The harness runs the same per-group functions as
the GPU kernels, so this checks the GPU arithmetic bit for bit on a machine without a GPU:

- round_to and encode for every format of at most 16 bits, every deterministic rounding mode, both
  overflow modes and both subnormal modes, over all 65536 float16 and all 65536 bfloat16 bit
  patterns (as float32 inputs), and over float64 edge values (grid points, midpoints and their
  float64 neighbours) and random float64 bit patterns;
- wider formats (fp32, tf32, fp64, custom) on random float32/float64 inputs;
- stochastic rounding with several seeds (up to 2**128 - 1) and random_bits values;
- decode of every code of every format of at most 16 bits, random codes of wider formats;
- the Philox4x64-10 words against precision_lab.core.random_words.

The oracle is the numpy core itself (precision_lab.core.rounding / precision_lab.core.codec), plus
ml_dtypes for the formats it has, and hand-derived values for zero, NaN and e8m0.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
from pathlib import Path

import cuda_host
import ml_dtypes
import numpy as np
import pytest
from cuda_host import BUILD
from cuda_host import compiler as _compiler
from cuda_host import emu_gemm as _emu_gemm
from cuda_host import ptr as _ptr

from precision_lab import (
    FORMATS,
    FloatFormat,
    IntFormat,
    decode,
    encode,
    get_format,
    round_to,
    use_backend,
)
from precision_lab.backends.gpu import CUDA_DIR, format_args
from precision_lab.core.random_words import philox4x64, random_words
from precision_lab.core.rounding import (
    CORE_ONLY_MODES,
    ROUNDING_MODES,
    SR_VARIANT_MODES,
    sr_mode,
    word_bits,
    working_dtype,
)

ROOT = Path(__file__).resolve().parent
HARNESS = ROOT / "cuda_harness" / "host_round.cpp"
gemm_lib = cuda_host.gemm_lib  # the GEMM harness (a session fixture, shared)
CXXFLAGS = ["-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC"]

# casting the signalling NaNs among the float16/bfloat16 patterns raises numpy's "invalid" flag
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")

DETERMINISTIC = [m for m in ROUNDING_MODES if not m.startswith("stochastic")]
M64 = (1 << 64) - 1

P3109_SAMPLE = ["p3109_k8p3se", "p3109_k8p1ue", "p3109_k4p4se", "p3109_k3p2sf", "p3109_k8p8uf"]
P3109_SAMPLE += ["p3109_k6p3ue", "p3109_k3p3sf"]

#: formats of at most 16 bits: the registry's and custom ones exercising every option
SMALL_FLOATS: dict[str, FloatFormat] = {
    name: f for name, f in FORMATS.items() if isinstance(f, FloatFormat) and f.bits <= 16
}
SMALL_FLOATS.update(
    {
        "e3m2_nosub": FloatFormat(3, 2, nan="none", has_inf=False, has_subnormals=False),
        "e4m3_unsigned": FloatFormat(4, 3, nan="fn", has_inf=False, signed=False),
        "e5m4": FloatFormat(5, 4),
        "e2m1_bias3": FloatFormat(2, 1, bias=3, nan="none", has_inf=False),
        "e6m9_fnuz": FloatFormat(6, 9, nan="fnuz", has_inf=False),
        "e5m0_fn_nosub": FloatFormat(5, 0, nan="fn", has_inf=False, has_subnormals=False),
        "e5m0_bias16": FloatFormat(5, 0, bias=16, nan="fn", has_inf=False, has_subnormals=False),
        "e4m2_unsigned_finite": FloatFormat(4, 2, nan="none", has_inf=False, signed=False),
        "e4m0_scale": FloatFormat(
            4, 0, nan="fn", has_inf=False, has_subnormals=False, has_zero=False, signed=False
        ),
        # a quantum above 1 below the normal range (tiny inputs underflow when scaled)
        "e2m1_bias-4_unsigned": FloatFormat(2, 1, bias=-4, has_subnormals=False, signed=False),
        "e8m0_bias130_finite": FloatFormat(
            8,
            0,
            bias=130,
            nan="none",
            has_inf=False,
            has_subnormals=False,
            has_zero=False,
            signed=False,
        ),
        # P3109: inf next to the NaN code, no exponent bits, p = 1, unsigned
        **{name: get_format(name) for name in P3109_SAMPLE},
        # P3109's layout of inf and NaN with another bias: not P3109 (IEEE-style overflow; the
        # header's pl_is_p3109 and rounding.follows_p3109 must agree)
        "e4m3_bias7_fnuz_inf": FloatFormat(4, 3, bias=7, nan="fnuz", has_inf=True),
        "e3m3_bias3_fn_inf_unsigned": FloatFormat(
            3, 3, bias=3, nan="fn", has_inf=True, signed=False
        ),
    }
)
WIDE_FLOATS: dict[str, FloatFormat] = {
    "fp32": FORMATS["fp32"],  # type: ignore[dict-item]
    "tf32": FORMATS["tf32"],  # type: ignore[dict-item]
    "fp64": FORMATS["fp64"],  # type: ignore[dict-item]
    "e8m16": FloatFormat(8, 16),
    "e11m20_fn": FloatFormat(11, 20, bias=1024, nan="fn", has_inf=False),
    "e8m23_nosub": FloatFormat(8, 23, nan="none", has_inf=False, has_subnormals=False),
    "e9m10": FloatFormat(9, 10),  # wider range than float32: float64 working type
}
INTS = [
    IntFormat(8),
    IntFormat(8, False),
    IntFormat(4),
    IntFormat(4, False),
    IntFormat(16),
    IntFormat(32),
    IntFormat(32, False),
]


# ----- building and calling the harness ------------------------------------------------------
@pytest.fixture(scope="session")
def lib() -> ctypes.CDLL:
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler found (g++, c++, clang++ or $CXX): cannot build the harness")
    header = CUDA_DIR / "pl_round.cuh"
    digest = hashlib.sha256(
        HARNESS.read_bytes() + header.read_bytes() + " ".join([cxx, *CXXFLAGS]).encode()
    ).hexdigest()[:16]
    out = BUILD / f"host_round_{digest}.so"
    if not out.exists():
        BUILD.mkdir(exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [cxx, *CXXFLAGS, f"-I{CUDA_DIR}", str(HARNESS), "-o", str(tmp)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0 and "ucontext" in res.stderr:  # (POSIX fibers: not on Windows)
            pytest.skip(f"the C library lacks ucontext (fibers): {res.stderr[:300]}")
        assert res.returncode == 0, f"compiling the harness failed:\n{' '.join(cmd)}\n{res.stderr}"
        os.replace(tmp, out)
    return ctypes.CDLL(str(out))


def _fmt_array(fmt: FloatFormat) -> np.ndarray:
    return np.array(format_args(fmt), dtype=np.int32)


def _sr(
    seed: int, random_bits: int | None, rounding: str
) -> tuple[ctypes.c_uint64, ctypes.c_uint64, int]:
    """The header's key: the SR variants' words carry their marker (rounding.word_bits)."""
    bits = word_bits(sr_mode(rounding, random_bits or 64), random_bits or 64)
    return ctypes.c_uint64(seed & M64), ctypes.c_uint64(seed >> 64), bits


def c_round(
    lib,
    x,
    fmt,
    *,
    rounding="nearest_even",
    overflow="ieee",
    subnormals="keep",
    seed=0,
    random_bits=None,
):
    """The header's round_to: same dtype rules as the core."""
    x = np.asarray(x)
    wdt = working_dtype(x.dtype, fmt)
    with np.errstate(all="ignore"):
        src = np.ascontiguousarray(x, dtype=wdt).reshape(-1)
    out = np.empty_like(src)
    sfx = "f32" if wdt == np.float32 else "f64"
    mode = ROUNDING_MODES.index(sr_mode(rounding, random_bits or 64))
    if isinstance(fmt, IntFormat):
        fn = getattr(lib, f"plh_round_int_{sfx}")
        fn(
            _ptr(src),
            _ptr(out),
            ctypes.c_uint64(src.size),
            fmt.bits,
            int(fmt.signed),
            mode,
            *_sr(seed, random_bits, rounding),
        )
    else:
        fa = _fmt_array(fmt)
        fn = getattr(lib, f"plh_round_{sfx}")
        fn(
            _ptr(src),
            _ptr(out),
            ctypes.c_uint64(src.size),
            _ptr(fa),
            mode,
            int(overflow == "saturate"),
            int(subnormals == "flush"),
            *_sr(seed, random_bits, rounding),
        )
    return out.reshape(x.shape)


def c_encode(
    lib,
    x,
    fmt,
    *,
    rounding="nearest_even",
    overflow="ieee",
    subnormals="keep",
    seed=0,
    random_bits=None,
):
    """The header's encode: (codes as the format's code dtype, NaN-error flag)."""
    x = np.asarray(x)
    wdt = working_dtype(x.dtype, fmt)
    with np.errstate(all="ignore"):
        src = np.ascontiguousarray(x, dtype=wdt).reshape(-1)
    out = np.empty(src.size, dtype=np.uint64)
    sfx = "f32" if wdt == np.float32 else "f64"
    mode = ROUNDING_MODES.index(sr_mode(rounding, random_bits or 64))
    if isinstance(fmt, IntFormat):
        fn = getattr(lib, f"plh_encode_int_{sfx}")
        err = fn(
            _ptr(src),
            _ptr(out),
            ctypes.c_uint64(src.size),
            fmt.bits,
            int(fmt.signed),
            mode,
            *_sr(seed, random_bits, rounding),
        )
    else:
        fa = _fmt_array(fmt)
        fn = getattr(lib, f"plh_encode_{sfx}")
        err = fn(
            _ptr(src),
            _ptr(out),
            ctypes.c_uint64(src.size),
            _ptr(fa),
            mode,
            int(overflow == "saturate"),
            int(subnormals == "flush"),
            *_sr(seed, random_bits, rounding),
        )
    return out.astype(fmt.code_dtype).reshape(x.shape), err


def c_decode(lib, codes, fmt):
    c = np.ascontiguousarray(codes, dtype=np.uint64).reshape(-1)
    if isinstance(fmt, IntFormat):
        out = np.empty(c.size, dtype=np.float64)
        lib.plh_decode_int(_ptr(c), _ptr(out), ctypes.c_uint64(c.size), fmt.bits, int(fmt.signed))
        return out.astype(working_dtype(np.dtype(np.float32), fmt))
    to_f32 = working_dtype(np.dtype(np.float32), fmt) == np.float32
    out = np.empty(c.size, dtype=np.float32 if to_f32 else np.float64)
    fa = _fmt_array(fmt)
    lib.plh_decode(_ptr(c), _ptr(out), ctypes.c_uint64(c.size), _ptr(fa), int(to_f32))
    return out


# ----- the oracle: the numpy core ---------------------------------------------------------------
def _expected_round(x: np.ndarray, fmt, **kw) -> np.ndarray:
    with use_backend("numpy"):
        return round_to(x, fmt, **kw)


def _expected_encode(x: np.ndarray, fmt, **kw) -> np.ndarray:
    with use_backend("numpy"):
        return encode(x, fmt, **kw)


def _same_gemm(got: np.ndarray, want: np.ndarray, what: str, x: np.ndarray) -> None:
    """Bit for bit, except the sign of NaN: numpy's own NaN propagation picks either operand's
    NaN depending on array lengths (its SIMD loops), so the reference's NaN signs are not
    reproducible even on the CPU. NaN positions must match."""
    got, want = np.array(got), np.array(want)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{what}: NaN positions")
    got[nan] = want[nan] = 0
    _same_bits(got, want, what, x)


def _same_bits(got: np.ndarray, want: np.ndarray, what: str, x: np.ndarray) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape
    ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}
    g = got.view(ut[got.itemsize]) if got.dtype.kind == "f" else got
    w = want.view(ut[want.itemsize]) if want.dtype.kind == "f" else want
    bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
    if bad.size:
        i = bad[:5]
        xs = np.asarray(x).reshape(-1)[i]
        raise AssertionError(
            f"{what}: {bad.size} of {g.size} differ; x={xs.tolist()} "
            f"got={got.reshape(-1)[i].tolist()} want={want.reshape(-1)[i].tolist()} "
            f"(bits got={[hex(int(v)) for v in g.reshape(-1)[i]]} "
            f"want={[hex(int(v)) for v in w.reshape(-1)[i]]})"
        )


# ----- inputs ----------------------------------------------------------------------------------
def _all_half_patterns() -> np.ndarray:
    """All 65536 float16 and all 65536 bfloat16 bit patterns, as float32 (exactly)."""
    codes = np.arange(1 << 16, dtype=np.uint32)
    f16 = codes.astype(np.uint16).view(np.float16).astype(np.float32)
    bf16 = (codes << np.uint32(16)).view(np.float32)
    return np.concatenate([f16, bf16])


X32 = _all_half_patterns()


def _edges64(fmt: FloatFormat) -> np.ndarray:
    """float64 grid values, midpoints, their float64 neighbours and values beyond the range."""
    v = fmt.values()
    v = v[v >= 0]
    top = fmt.max + float(fmt.ulp(fmt.max))
    pts = np.concatenate([v, (v[:-1] + v[1:]) / 2, [(fmt.max + top) / 2, top, 2 * top]])
    pts = np.concatenate([pts, np.nextafter(pts, np.inf), np.nextafter(pts, -np.inf)])
    pts = np.concatenate([pts, pts / 2, [0.0, 5e-324, 1e-300, 1e300, np.inf, np.nan]])
    pts = np.abs(pts)
    return np.concatenate([pts, -pts])


def _random64(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1 << 63, size=n, dtype=np.int64).view(np.uint64) << np.uint64(1)
    raw |= rng.integers(0, 2, size=n, dtype=np.uint64)
    return raw.view(np.float64)


def _random_near(n: int, lo_exp: int, hi_exp: int, seed: int, dtype) -> np.ndarray:
    """Random significands times random powers of two in [lo_exp, hi_exp], random signs."""
    rng = np.random.default_rng(seed)
    sig = 1.0 + rng.random(n)
    if dtype == np.float32:
        sig = sig.astype(np.float32).astype(np.float64)
    x = np.ldexp(sig, rng.integers(lo_exp, hi_exp + 1, size=n)) * rng.choice([-1.0, 1.0], n)
    with np.errstate(over="ignore"):
        return x.astype(dtype)


# ----- tests -------------------------------------------------------------------------------------
def test_philox_words_match_the_core(lib) -> None:
    for seed in (0, 1, 12345, (1 << 64) + 7, (1 << 128) - 1):
        for start in (0, 1, 6, (1 << 40) + 3):
            for rbits in (64, 13, 1):
                out = np.empty(37, dtype=np.uint64)
                lib.plh_random_words(
                    ctypes.c_uint64(seed & M64),
                    ctypes.c_uint64(seed >> 64),
                    rbits,
                    ctypes.c_uint64(start),
                    ctypes.c_uint64(37),
                    _ptr(out),
                )
                want = random_words(seed, 37, start)
                want &= np.uint64(M64 ^ ((1 << (64 - rbits)) - 1))
                assert out.tolist() == want.tolist(), (seed, start, rbits)
    # and the plain-Python reference of the algorithm itself
    out = np.empty(4, dtype=np.uint64)
    lib.plh_random_words(
        ctypes.c_uint64(5),
        ctypes.c_uint64(7),
        64,
        ctypes.c_uint64(0),
        ctypes.c_uint64(4),
        _ptr(out),
    )
    assert out.tolist() == philox4x64((0, 0, 0, 0), (5, 7))


@pytest.mark.parametrize("name", [*SMALL_FLOATS, *WIDE_FLOATS])
def test_format_properties(lib, name: str) -> None:
    fmt = {**SMALL_FLOATS, **WIDE_FLOATS}[name]
    out = np.empty(7, dtype=np.float64)
    lib.plh_format_info(_ptr(_fmt_array(fmt)), _ptr(out))
    assert out.tolist() == [
        fmt.max,
        fmt.smallest_normal,
        fmt.smallest_subnormal,
        fmt.emin,
        float(fmt.max_code_magnitude),
        fmt.bits,
        float(working_dtype(np.dtype(np.float32), fmt) == np.float32),
    ]


@pytest.mark.parametrize("name", list(SMALL_FLOATS))
def test_round_and_encode_all_half_patterns(lib, name: str) -> None:
    """Every fp16 and bf16 bit pattern, every deterministic mode, overflow and subnormal mode."""
    fmt = SMALL_FLOATS[name]
    for rounding in DETERMINISTIC:
        for overflow, subnormals in (("ieee", "keep"), ("saturate", "keep"), ("ieee", "flush")):
            kw = {"rounding": rounding, "overflow": overflow, "subnormals": subnormals}
            what = f"{name} {kw}"
            _same_bits(c_round(lib, X32, fmt, **kw), _expected_round(X32, fmt, **kw), what, X32)
            codes, err = c_encode(lib, X32, fmt, **kw)
            if fmt.has_nan:
                _same_bits(codes, _expected_encode(X32, fmt, **kw), "encode " + what, X32)
                assert err == 0
            else:  # the core refuses NaN here; the harness raises its flag
                assert err == 1
                ok = ~np.isnan(X32)
                _same_bits(codes[ok], _expected_encode(X32[ok], fmt, **kw), "encode " + what, X32)


@pytest.mark.parametrize("name", list(SMALL_FLOATS))
def test_round_float64_edges_and_random(lib, name: str) -> None:
    """float64 input is rounded once from its exact value: edges, midpoints, random patterns."""
    fmt = SMALL_FLOATS[name]
    x = np.concatenate([_edges64(fmt), _random64(4000, 1), _random_near(4000, -30, 30, 2, float)])
    for rounding in DETERMINISTIC:
        for overflow, subnormals in (("ieee", "keep"), ("saturate", "flush")):
            kw = {"rounding": rounding, "overflow": overflow, "subnormals": subnormals}
            what = f"{name} float64 {kw}"
            _same_bits(c_round(lib, x, fmt, **kw), _expected_round(x, fmt, **kw), what, x)
            ok = ~np.isnan(x) if not fmt.has_nan else np.ones(x.shape, dtype=bool)
            codes, _ = c_encode(lib, x[ok], fmt, **kw)
            _same_bits(codes, _expected_encode(x[ok], fmt, **kw), "encode " + what, x[ok])


@pytest.mark.parametrize("name", list(WIDE_FLOATS))
def test_wide_formats_random(lib, name: str) -> None:
    fmt = WIDE_FLOATS[name]
    lo, hi = fmt.emin - fmt.mantissa_bits - 3, fmt.emax + 2
    x32 = _random_near(20000, max(lo, -150), min(hi, 128), 3, np.float32)
    x32 = np.concatenate([x32, X32])
    x64 = np.concatenate(
        [_random_near(20000, max(lo, -1075), min(hi, 1023), 4, float), _random64(5000, 5)]
    )
    for rounding in DETERMINISTIC:
        for overflow, subnormals in (("ieee", "keep"), ("saturate", "flush")):
            kw = {"rounding": rounding, "overflow": overflow, "subnormals": subnormals}
            for x in (x32, x64):
                what = f"{name} {x.dtype} {kw}"
                _same_bits(c_round(lib, x, fmt, **kw), _expected_round(x, fmt, **kw), what, x)
                ok = ~np.isnan(x) if not fmt.has_nan else np.ones(x.shape, dtype=bool)
                codes, _ = c_encode(lib, x[ok], fmt, **kw)
                _same_bits(codes, _expected_encode(x[ok], fmt, **kw), "encode " + what, x[ok])


SR_CASES = [(0, None), (12345, None), ((1 << 64) + 99, 3), ((1 << 128) - 1, 1), (7, 13), (8, 52)]


@pytest.mark.parametrize(
    ("mode", "seed", "random_bits"),
    [("stochastic", *c) for c in SR_CASES]
    + [("stochastic_equal", *c) for c in SR_CASES[::2]]
    # (CORE_ONLY_MODES have no mode number in the header: the numpy reference alone computes them)
    + [(m, *c) for m in SR_VARIANT_MODES if m not in CORE_ONLY_MODES for c in SR_CASES],
)
def test_stochastic_rounding_same_bits(lib, mode: str, seed: int, random_bits: int | None) -> None:
    """The same random words and the same up/down rule: identical results, element by element."""
    kw = {"rounding": mode, "seed": seed, "random_bits": random_bits}
    x64 = np.concatenate(
        [_random_near(9999, -26, 18, seed % 1000, float), _edges64(SMALL_FLOATS["e4m3"])]
    )
    for name in ("e4m3", "e5m2", "bf16", "fp16", "e2m1", "e8m0", "e4m3fnuz", "e3m2_nosub"):
        fmt = SMALL_FLOATS[name]
        for overflow in ("ieee", "saturate"):
            for x in (X32, x64):
                what = f"{name} {x.dtype} {overflow} {kw}"
                got = c_round(lib, x, fmt, overflow=overflow, **kw)
                _same_bits(got, _expected_round(x, fmt, overflow=overflow, **kw), what, x)
                ok = ~np.isnan(x) if not fmt.has_nan else np.ones(x.shape, dtype=bool)
                codes, _ = c_encode(lib, x[ok], fmt, overflow=overflow, **kw)
                want = _expected_encode(x[ok], fmt, overflow=overflow, **kw)
                _same_bits(codes, want, "encode " + what, x[ok])
    for name in ("tf32", "e9m10", "fp32"):
        fmt = WIDE_FLOATS[name]
        x = _random_near(9999, -140, 120, 9, float)
        _same_bits(c_round(lib, x, fmt, **kw), _expected_round(x, fmt, **kw), name, x)


def test_stochastic_rounding_is_random(lib) -> None:
    """Sanity of the harness itself: 0.25 of the way up rounds up about 1/4 of the time."""
    x = np.full(40000, 1.0 + 0.25 * 2.0**-3, dtype=np.float32)  # e4m3 spacing at 1 is 2**-3
    r = c_round(lib, x, get_format("e4m3"), rounding="stochastic", seed=3)
    frac_up = float(np.mean(r > 1.0))
    assert set(np.unique(r).tolist()) == {1.0, 1.125}
    assert abs(frac_up - 0.25) < 0.01


@pytest.mark.parametrize("fmt", INTS, ids=str)
def test_integer_formats(lib, fmt: IntFormat) -> None:
    x32 = np.concatenate([X32, np.arange(-300, 300, 0.25, dtype=np.float32)])
    x64 = np.concatenate([x32.astype(np.float64), _random_near(5000, -3, 40, 6, float)])
    for rounding in ROUNDING_MODES:
        kw = {"rounding": rounding, "seed": 77}
        for x in (x32, x64):
            what = f"{fmt} {x.dtype} {rounding}"
            _same_bits(c_round(lib, x, fmt, **kw), _expected_round(x, fmt, **kw), what, x)
            assert c_encode(lib, x, fmt, **kw)[1] == 1  # X32 holds NaN: the core raises
            ok = ~np.isnan(x)
            codes, err = c_encode(lib, x[ok], fmt, **kw)
            assert err == 0
            _same_bits(codes, _expected_encode(x[ok], fmt, **kw), "encode " + what, x[ok])


@pytest.mark.parametrize("fmt", [*SMALL_FLOATS.values(), *INTS[:4]], ids=str)
def test_decode_every_code(lib, fmt) -> None:
    codes = np.arange(1 << fmt.bits, dtype=np.uint64).astype(fmt.code_dtype)
    with use_backend("numpy"):
        want = decode(codes, fmt)
    _same_bits(c_decode(lib, codes, fmt), want, f"decode {fmt}", codes)


@pytest.mark.parametrize("name", list(WIDE_FLOATS))
def test_decode_wide_formats(lib, name: str) -> None:
    fmt = WIDE_FLOATS[name]
    rng = np.random.default_rng(8)
    codes = rng.integers(0, 1 << fmt.bits, size=20000, dtype=np.uint64).astype(fmt.code_dtype)
    with use_backend("numpy"):
        want = decode(codes, fmt)
    got = c_decode(lib, codes, fmt)
    if name in ("fp32", "fp64"):
        # the core views the codes (NaN payloads kept), the GPU backend too; the header's
        # arithmetic decode gives canonical NaNs: compare values and NaN positions
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        _same_bits(got[ok], want[ok], f"decode {name}", codes[ok])
    else:
        _same_bits(got, want, f"decode {name}", codes)


ML = {
    "fp16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz,
    "e3m4": ml_dtypes.float8_e3m4,
    "e4m3ieee": ml_dtypes.float8_e4m3,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
}


@pytest.mark.parametrize("name", list(ML))
def test_encode_matches_ml_dtypes(lib, name: str) -> None:
    """An oracle independent of the numpy core: ml_dtypes' round-to-nearest-even casts."""
    fmt = get_format(name)
    x = X32 if fmt.has_nan else X32[~np.isnan(X32)]
    if not fmt.has_nan and not fmt.has_inf:  # ml_dtypes saturates the FP6/FP4 formats
        kw = {"overflow": "saturate"}
    else:
        kw = {}
    codes, _ = c_encode(lib, x, fmt, **kw)
    with np.errstate(all="ignore"):
        want = x.astype(ML[name]).view(np.uint8 if fmt.bits <= 8 else np.uint16)
    got_vals, want_vals = c_decode(lib, codes, fmt), want.view(ML[name]).astype(np.float32)
    nan = np.isnan(want_vals)
    np.testing.assert_array_equal(np.isnan(got_vals), nan)
    # NaN codes differ in payload between libraries; every other code must be identical
    _same_bits(codes[~nan], want[~nan].astype(codes.dtype), f"ml_dtypes {name}", x[~nan])


def test_hand_derived_cases(lib) -> None:
    """Zero codes, unsigned formats and e8m0 (zero and negatives are NaN in every mode)."""
    x = np.array([0.0, -0.0, 1e-9, -1e-9], dtype=np.float32)
    codes, _ = c_encode(lib, x, get_format("fp16"))
    assert codes.tolist() == [0x0000, 0x8000, 0x0000, 0x8000]
    codes, _ = c_encode(lib, x, get_format("e4m3"))
    assert codes.tolist() == [0x00, 0x80, 0x00, 0x80]
    codes, _ = c_encode(lib, x, get_format("e4m3fnuz"))  # no negative zero in fnuz
    assert codes.tolist() == [0, 0, 0, 0]
    e8m0 = get_format("e8m0")
    for rounding in DETERMINISTIC:
        for overflow in ("ieee", "saturate"):
            r = c_round(
                lib,
                np.array([0.0, -0.0, -1.0], np.float32),
                e8m0,
                rounding=rounding,
                overflow=overflow,
            )
            assert np.isnan(r).all(), (rounding, overflow, r)
            codes, _ = c_encode(lib, x[:2], e8m0, rounding=rounding, overflow=overflow)
            assert codes.tolist() == [0xFF, 0xFF]
    # e8m0 ties go to the even code under nearest_even: 192 -> 128, 1.5 * 2**-127 -> 2**-127
    r = c_round(lib, np.array([192.0, 1.5 * 2.0**-127, 3 * 2.0**-127], np.float32), e8m0)
    assert r.tolist() == [128.0, 2.0**-127, 2.0**-125]
    r = c_round(lib, np.array([192.0], np.float32), e8m0, rounding="nearest_away")
    assert r.tolist() == [256.0]
    # an unsigned format with a zero: -0.0 is +0.0, negative numbers are NaN
    u = SMALL_FLOATS["e4m3_unsigned"]
    r = c_round(lib, np.array([-0.0, -1e-9, -1.0, 1.0], np.float32), u)
    assert np.signbit(r[0]) == False and r[0] == 0  # noqa: E712
    assert np.isnan(r[1:3]).all() and r[3] == 1.0
    # e4m3: 464 is a tie between 448 and 480 (480 is NaN's code): even is 448; 464.0001 is NaN
    r = c_round(lib, np.array([464.0, 464.0001, -500.0], np.float32), get_format("e4m3"))
    assert r[0] == 448.0 and np.isnan(r[1]) and np.isnan(r[2]) and np.signbit(r[2])
    # P3109 (issue 19): round to odd overflows like round to nearest (unbounded exponent, then
    # OvfInf): K8P4 extended 224.1, ±232, 240 -> ±inf (224, code 0x7E, is even); K4P2 unsigned
    # 6.5 -> 6 (max code 13 is odd), 8 -> inf; K8P4 finite (= e4m3fnuz) 256 -> NaN; IEEE-style
    # e4m3 keeps 448, and the not-P3109 look-alike with inf keeps its max
    x = np.array([224.1, 232.0, -232.0, 240.0, 224.0], np.float32)
    r = c_round(lib, x, get_format("p3109_k8p4se"), rounding="odd")
    assert r.tolist() == [np.inf, np.inf, -np.inf, np.inf, 224.0]
    codes, _ = c_encode(lib, x, get_format("p3109_k8p4se"), rounding="odd")
    assert codes.tolist() == [0x7F, 0x7F, 0xFF, 0x7F, 0x7E]
    r = c_round(lib, np.array([6.5, 8.0], np.float32), get_format("p3109_k4p2ue"), rounding="odd")
    assert r.tolist() == [6.0, np.inf]
    r = c_round(lib, np.array([241.0, 256.0], np.float32), get_format("e4m3fnuz"), rounding="odd")
    assert r[0] == 240.0 and np.isnan(r[1])
    r = c_round(lib, np.array([1e4], np.float32), get_format("e4m3"), rounding="odd")
    assert r.tolist() == [448.0]
    fake = SMALL_FLOATS["e4m3_bias7_fnuz_inf"]
    r = c_round(lib, np.array([1e4], np.float32), fake, rounding="odd")
    assert r.tolist() == [fake.max]


# ===== the GEMM kernels, run on the CPU (tests/backends/cuda_harness/cuda_emul.h; built and
# launched by tests/cuda_host.py) =========================
def _gemm_inputs(seed: int, batch=(2,), m=19, n=21, k=67, scale=1.0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((*batch, m, k)) * scale
    b = rng.standard_normal((*batch, k, n)) * scale
    c = rng.standard_normal((*batch, m, n)) * scale
    return a, b, c


def _gemm_cases():
    import precision_lab as pl

    A = pl.Accumulator
    e8m13 = FloatFormat(8, 13)
    cases = [
        ("fp32 rne e4m3 (fma)", "e4m3", A(), "fp32", {}),
        ("fp32 rne fp32 inputs (fma)", "fp32", A(), "fp32", {}),
        ("fp32 rtz (fma)", "bf16", A(rounding="rtz"), "fp32", {}),
        ("fp32 up (fma)", "fp16", A(rounding="up"), "fp32", {}),
        ("fp32 down", "fp16", A(rounding="down"), "fp32", {}),
        ("fp32 rne out bf16", "e4m3", A(out_rounding="rtz"), "bf16", {}),
        ("fp32 rne out fp64", "e5m2", A(), "fp64", {}),
        ("bf16 rne", "e4m3", A("bf16"), "fp32", {}),
        ("bf16 rtz", "e4m3", A("bf16", "rtz"), "fp32", {}),
        ("bf16 rna", "e4m3", A("bf16", "rna"), "fp32", {}),
        ("bf16 rto", "e4m3", A("bf16", "rto"), "fp32", {}),
        ("bf16 rnz", "e4m3", A("bf16", "rnz", out_rounding="rnz"), "bf16", {}),
        ("bf16 sr", "e4m3", A("bf16", "sr", seed=5), "fp32", {}),
        ("fp16 sr 3 bits", "e5m2", A("fp16", "sr", seed=2**70 + 3, random_bits=3), "fp16", {}),
        ("fp16 promote 16", "e4m3", A("fp16", promote_every=16), "fp32", {}),
        (
            "bf16 sr promote sr",
            "e4m3",
            A("bf16", "sr", promote_every=8, promote_rounding="sr", out_rounding="sr", seed=9),
            "bf16",
            {},
        ),
        ("e8m13 pairwise", "e4m3", A(e8m13, order="pairwise"), "fp32", {}),
        ("bf16 pairwise sr", "e4m3", A("bf16", "sr", order="pairwise", seed=1), "fp32", {}),
        (
            "fp16 pairwise promote 20",
            "e4m3",
            A("fp16", order="pairwise", promote_every=20),
            "fp32",
            {},
        ),
        ("bf16 blocked 8", "e4m3", A("bf16", order="blocked", block=8), "fp32", {}),
        (
            "fp16 blocked 5 sr promote 12",
            "e4m3",
            A("fp16", "sr", order="blocked", block=5, promote_every=12, seed=4),
            "fp32",
            {},
        ),
        ("products bf16 rtz", "fp16", A(product_format="bf16", product_rounding="rtz"), "fp32", {}),
        (
            "products e4m3 sr",
            "bf16",
            A("bf16", product_format="e4m3", product_rounding="sr", seed=3),
            "fp32",
            {},
        ),
        # stochastic_equal (issue 19): every rounding of the model, and overflow beyond max
        ("bf16 sre", "e4m3", A("bf16", "sre", seed=5), "fp32", {}),
        (
            "fp16 pairwise sre promote sre out sre",
            "e4m3",
            A(
                "fp16",
                "sre",
                order="pairwise",
                promote_every=8,
                promote_rounding="sre",
                out_rounding="sre",
                seed=9,
            ),
            "bf16",
            {},
        ),
        (
            "products e4m3 sre",
            "bf16",
            A("bf16", product_format="e4m3", product_rounding="sre", seed=3),
            "fp32",
            {},
        ),
        ("fp16 sre 3 bits", "e5m2", A("fp16", "sre", seed=2**70 + 3, random_bits=3), "fp16", {}),
        ("fp16 sre overflow", "fp16", A("fp16", "sre", seed=2), "fp32", {"scale": 300.0}),
        ("fp16 sr overflow", "fp16", A("fp16", "sr", seed=2), "fp32", {"scale": 300.0}),
        (
            "v100 sre after-block",
            "fp16",
            pl.tensor_core("v100", "fp16").replace(
                addend="after_block", block_rounding="sre", rounding="sre", seed=6
            ),
            "fp32",
            {},
        ),
        ("fp16 saturate", "fp16", A("fp16", overflow="saturate"), "fp32", {"scale": 300.0}),
        ("fp16 ieee overflow", "fp16", A("fp16"), "fp32", {"scale": 300.0}),
        ("bf16 flush", "bf16", A("bf16", subnormals="flush"), "fp32", {"scale": 1e-19}),
        (
            "block-scaled e4m3",
            "e4m3",
            A(e8m13, "rtz", order="block_fma", block=32, align_bits=13),
            "fp32",
            {"scales": True},
        ),
        ("per-row scales", "e4m3", A(), "fp32", {"row_scales": True}),
    ]
    # every tensor-core preset, once per architecture (GPUs of one architecture share them)
    from precision_lab.gemm.tensor_core import ARCHITECTURES, GPUS

    small = {"batch": (), "m": 12, "n": 14, "k": 100}
    for arch, table in ARCHITECTURES.items():
        gpu = next(g for g, a in GPUS.items() if a == arch)
        for fmt in table:
            outs = ["fp32", "fp16"] if fmt in ("fp16", "e4m3", "e5m2") else ["fp32"]
            for out in outs:
                try:
                    pl.tensor_core(gpu, fmt, out_format=out)
                except ValueError:  # (AMD's matrix cores output fp32 only)
                    continue
                acc = pl.tensor_core(gpu, fmt, out_format=out).replace(
                    overflow="ieee", zeros_in_anchor=False, zero_sign="ieee", nan_encoding="quiet"
                )  # the header's rules (the presets' NVIDIA special values: numpy for now)
                cases.append((f"tensor_core {gpu} {fmt} -> {out}", fmt, acc, out, small))
    return cases


GEMM_CASES = _gemm_cases()


@pytest.mark.parametrize("case", GEMM_CASES, ids=[c[0] for c in GEMM_CASES])
def test_gemm_kernels_match_reference(gemm_lib, case) -> None:
    import precision_lab as pl

    name, fmt, acc, out, opts = case
    shape = {key: opts[key] for key in ("batch", "m", "n", "k") if key in opts}
    a, b, c = _gemm_inputs(len(name), scale=opts.get("scale", 1.0), **shape)
    kw = {"input_format": fmt, "accumulator": acc, "out_format": out}
    if opts.get("scales"):
        rng = np.random.default_rng(1)
        kw["scale_a"] = np.exp2(rng.integers(-3, 4, (2, 19, 3))).astype(np.float64)
        kw["scale_b"] = np.exp2(rng.integers(-3, 4, (2, 3, 21))) * 1.5
        kw["scale_block"] = 32
        a, b = a[..., :96], b[..., :96, :]
    if opts.get("row_scales"):
        kw["scale_a"] = np.linspace(0.5, 2.0, 19).reshape(19, 1)
        kw["scale_b"] = 0.75
    want = pl.gemm(a, b, c, backend="numpy", **kw)
    got, launched = _emu_gemm(gemm_lib, a, b, c, **kw)
    _same_gemm(got, want, f"gemm {name} via {launched}", a)


def _block_scaled_case(rng, kind: str, m: int, k: int, n: int):
    """Operands, E8M0 scales (blocks of 32 along K) and c of one input class."""
    nk = -(-k // 32)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    ea, eb = rng.integers(-8, 9, (m, nk)), rng.integers(-8, 9, (nk, n))
    c = rng.standard_normal((m, n))
    if kind == "wide":  # scales 2**-127 .. 2**127: results overflow and underflow float32
        ea, eb = rng.integers(-127, 128, (m, nk)), rng.integers(-127, 128, (nk, n))
    elif kind == "zeros":  # zeros align at -126 unscaled (zeros_in_anchor), next to huge scales
        a *= rng.random(a.shape) < 0.4
        b *= rng.random(b.shape) < 0.4
        ea += 60
    elif kind == "apart":  # no product is non-zero: the zeros' exponents (their partner's plus
        # -126; a zero's own scale, 2**100 in the first block, is not added) meet c
        a[:, :32], b[32:, :] = 0.0, 0.0
        ea[:, 0] += 100
        c *= 2.0**-100
    elif kind == "specials":  # inf and NaN products among scaled ones
        a[0, 3], b[5, 1], a[1, 40 % k] = np.inf, -np.inf, np.nan
    return a, b, c, 2.0**ea, 2.0**eb


@pytest.mark.parametrize(
    ("gpu", "ins", "fmt"),
    [("b200", "tcgen05", f) for f in ("e4m3", "e5m2", "e2m3", "e3m2")]
    + [("rtx5090", "mma", f) for f in ("e4m3", "e2m1", ("e5m2", "e2m1"))]
    + [("mi355x", "mfma", f) for f in ("e4m3", ("e2m3", "e2m1"))],  # (addend="separate")
    ids=str,
)
def test_gemm_block_scaled_in_block(gemm_lib, gpu, ins, fmt) -> None:
    """Block-scaled MMA without groups (tcgen05 kind::mxf8f6f4, sm_120 mma.block_scale): the E8M0
    scales enter the block FMAs of pl_gemm.cuh, bit for bit the numpy reference (whose values an
    exact oracle checks in tests/gemm/test_tensor_core_presets.py)."""
    import precision_lab as pl

    mx = {"e4m3": "mxfp8_e4m3", "e5m2": "mxfp8_e5m2", "e2m3": "mxfp6_e2m3",
          "e3m2": "mxfp6_e3m2", "e2m1": "mxfp4_e2m1"}  # fmt: skip
    block = tuple(mx[f] for f in fmt) if isinstance(fmt, tuple) else mx[fmt]
    kind = "scale_f8f6f4" if ins == "mfma" else "kind::mxf8f6f4"
    acc = pl.tensor_core(gpu, block, instruction=f"{ins}.{kind}")
    assert acc.scales == "in_block" and acc.group is None
    rng = np.random.default_rng(len(str(fmt)) + len(gpu))
    for kind, k in (("normal", 96), ("wide", 64), ("zeros", 80), ("apart", 64), ("specials", 45)):
        a, b, c, sa, sb = _block_scaled_case(rng, kind, 6, k, 5)
        kw = {"input_format": fmt, "accumulator": acc, "out_format": "fp32", "scale_a": sa,
              "scale_b": sb, "scale_block": 32}  # fmt: skip
        for cc in (c, None):
            want = pl.gemm(a, b, cc, backend="numpy", **kw)
            got, launched = _emu_gemm(gemm_lib, a, b, cc, **kw)
            assert launched == ["pl_gemm_generic_f32"]
            _same_gemm(got, want, f"{gpu} {fmt} {kind}", a)
    with pytest.raises(ValueError, match="power-of-two scales"):
        _emu_gemm(gemm_lib, a, b, **{**kw, "scale_a": sa * 1.5})


def _table_presets(pick):
    """(gpu, input format(s), accumulator, output format) of the tensor-core table's rows whose
    accumulator ``pick`` accepts."""
    import precision_lab as pl

    out = []
    for row in pl.tensor_core.list():
        fa, _, fb = row["input_format"].partition(" x ")
        fmt = (fa, fb) if fb else fa
        gpu = row["gpus"].split()[0]
        acc = pl.tensor_core(gpu, fmt, out_format=row["out_format"], instruction=row["instruction"])
        if pick(acc):
            out.append((gpu, fmt, acc, row["out_format"]))
    return out


@pytest.mark.parametrize(
    ("gpu", "fmt", "acc", "out"),
    _table_presets(lambda acc: acc.input_subnormals == "flush"),
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_gemm_flushed_inputs(gemm_lib, gpu, fmt, acc, out) -> None:
    """AMD CDNA2 (input_subnormals="flush": subnormal a, b and c become +0, then the model):
    the CUDA kernels' path (cupy_backend.run) = the numpy reference, on inputs of which about
    half are subnormal in their format, and products and sums near float32's subnormals."""
    import precision_lab as pl

    f = pl.get_format(fmt)
    rng = np.random.default_rng(len(acc.name))
    for scale in (f.smallest_normal, 2.0**-60, 1.0):
        a, b, c = _gemm_inputs(int(scale < 1) + 3, batch=(), m=7, n=9, k=50, scale=scale)
        b *= 0.25 / scale**2 if scale == f.smallest_normal else 1.0  # products near 1
        c *= 2.0**-126
        a[rng.random(a.shape) < 0.2] = 0.0
        kw = {"input_format": fmt, "accumulator": acc, "out_format": out}
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got, launched = _emu_gemm(gemm_lib, a, b, c, **kw)
        assert launched == ["pl_gemm_generic_f32"]
        _same_gemm(got, want, f"{acc.name} scale {scale}", a)
        if scale == f.smallest_normal:  # (the flush must show: the kept model differs)
            keep = acc.replace(input_subnormals="keep")
            kept = pl.gemm(a, b, c, backend="numpy", **{**kw, "accumulator": keep})
            assert (kept != want).mean() > 0.5


@pytest.mark.parametrize("gpu", ["a100", "h100", "mi250", "mi300x"])
def test_gemm_fp64_fma_chain(gemm_lib, gpu) -> None:
    """FP64 DMMA and AMD f64 MFMA (fp64 inputs: s = fma(a_k, b_k, s) in k order) in the CUDA
    kernels' header = the numpy reference (which tests/gemm/test_fma64.py checks against an
    exact-rational IEEE fusedMultiplyAdd), on the classes where a plain multiply-add differs."""
    import precision_lab as pl

    acc = pl.tensor_core(gpu, "fp64", out_format="fp64")
    kw = {"input_format": "fp64", "accumulator": acc, "out_format": "fp64"}
    rng = np.random.default_rng(len(gpu))
    m, k, n = 5, 23, 6
    for kind in ("normal", "wide", "tiny", "huge", "cancel", "special"):
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        c = rng.standard_normal((m, n))
        if kind == "wide":
            a *= 2.0 ** rng.integers(-300, 300, (m, k))
            b *= 2.0 ** rng.integers(-300, 300, (k, n))
        elif kind == "tiny":  # products that underflow alone, subnormal sums
            a *= 2.0 ** rng.integers(-540, -480, (m, k))
            b *= 2.0 ** rng.integers(-560, -500, (k, n))
            c *= 2.0**-1040
        elif kind == "huge":  # products beyond float64 alone
            a *= 2.0 ** rng.integers(500, 520, (m, k))
            b *= 2.0 ** rng.integers(500, 515, (k, n))
            c *= 2.0**1020
        elif kind == "cancel":  # the low half of a*b decides: 1 - (1 + 2**-30)**2 ...
            a[:, 0], b[0, :], c[:] = 1 + 2.0**-30, 1 + 2.0**-30, -1.0
            a[:, 1:], b[1:, :] = a[:, 1:] * 2.0**-60, b[1:, :] * 2.0**-60
        elif kind == "special":
            a[0, 2], a[1, 3], b[4, 1], c[2, 2] = np.inf, np.nan, -np.inf, np.inf
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got, launched = _emu_gemm(gemm_lib, a, b, c, **kw)
        assert launched == ["pl_gemm_generic_f64"]
        _same_gemm(got, want, f"{gpu} fp64 {kind}", a)
    with pytest.raises(ValueError, match="at most 26 significant bits"):
        _emu_gemm(gemm_lib, a, b, input_format="fp64", accumulator=pl.Accumulator("fp32"),
                  out_format="fp32")  # fmt: skip


def _exact_block_cases():
    import precision_lab as pl

    A = pl.Accumulator
    return [
        ("mi100 fp16", "fp16", pl.tensor_core("mi100", "fp16")),
        ("mi100 bf16", "bf16", pl.tensor_core("mi100", "bf16")),
        ("fp32 toward_zero, 8", "fp16", A("fp32", "toward_zero", order="exact_block", block=8)),
        ("fp32 down, 3", "bf16", A("fp32", "down", order="exact_block", block=3)),
        ("bf16 up, 4", "e4m3", A("bf16", "up", order="exact_block", block=4)),
        ("fp16 nearest, 32, saturate", "fp16",
         A("fp16", order="exact_block", block=32, overflow="saturate")),
    ]  # fmt: skip


@pytest.mark.parametrize("case", _exact_block_cases(), ids=lambda c: c[0])
def test_gemm_exact_block(gemm_lib, case) -> None:
    """order="exact_block" (AMD CDNA1, MMA-Sim's E-FDPA: each block of products and the running
    value summed exactly, rounded once) in the CUDA kernels' header = the numpy reference, in
    every direction of rounding, where the residual's sign decides (cancellation), across wide
    exponents, with inf/NaN, and the native per-element kernels (what its fp32 kernel does not
    take) too."""
    import precision_lab as pl
    from precision_lab.gemm import native_backend

    label, fmt, acc = case
    rng = np.random.default_rng(len(label))
    m, k, n = 6, 45, 7
    for kind in ("normal", "wide", "cancel", "special"):
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        c = rng.standard_normal((m, n)) * 4
        if kind == "wide" and fmt == "bf16":
            a *= 2.0 ** rng.integers(-60, 60, (m, k))
            b *= 2.0 ** rng.integers(-60, 60, (k, n))
        elif kind == "wide":
            a *= 2.0 ** rng.integers(-12, 12, (m, k))
        elif kind == "cancel":  # big products that cancel, small ones that decide the rounding
            a[:, 0::2], a[:, 1::2] = 1024.0, -1024.0
            b[1::2, :] = b[0::2, :][: b[1::2, :].shape[0]]
            b[:, :] += rng.choice([0.0, 2.0**-10, -(2.0**-11)], b.shape)
        elif kind == "special":
            a[0, 2], a[1, 3], b[4, 1], c[2, 2] = np.inf, np.nan, -np.inf, np.inf
        kw = {"input_format": fmt, "accumulator": acc, "out_format": "fp32"}
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got, launched = _emu_gemm(gemm_lib, a, b, c, **kw)
        assert launched == ["pl_gemm_generic_f32"]
        _same_gemm(got, want, f"exact_block {label} {kind}", a)
        if native_backend.available():
            nat = pl.gemm(a, b, c, backend="native", **kw)
            _same_gemm(nat, want, f"native exact_block {label} {kind}", a)
    with pytest.raises(ValueError, match="exact_block with block <= 32"):
        _emu_gemm(gemm_lib, a, b, **{**kw, "accumulator": acc.replace(block=64)})


@pytest.mark.parametrize(
    ("gpu", "fmt", "acc", "out"),
    _table_presets(lambda acc: acc.addend == "separate" and acc.scales != "in_block"),
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_gemm_separate_addend(gemm_lib, gpu, fmt, acc, out) -> None:
    """AMD CDNA3 (addend="separate": MMA-Sim's TR-FDPA / GTR-FDPA; cuts down or toward zero,
    fp8's two inner blocks) in the CUDA kernels' header = the numpy reference (whose values an
    exact oracle checks in tests/gemm/test_tensor_core_presets.py) and = the native
    per-element kernels (what its fast path hands back: inf/NaN), on the presets as they are."""
    import precision_lab as pl
    from precision_lab.gemm import native_backend

    rng = np.random.default_rng(len(acc.name))
    m, k, n = 6, 40, 7
    fa, fb = (pl.get_format(f) for f in (fmt if isinstance(fmt, tuple) else (fmt, fmt)))
    for kind in ("normal", "wide", "c_dominates", "cancel", "special"):
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        c = rng.standard_normal((m, n))
        if kind == "wide":  # products over the formats' whole range: inner anchors differ
            a *= 2.0 ** rng.integers(fa.emin, min(fa.emax, 60), (m, k))
            b *= 2.0 ** rng.integers(fb.emin, min(fb.emax, 60), (k, n))
        elif kind == "c_dominates":  # r's anchor wins: the block sum cut at E - sum_bits
            c *= 2.0**20
        elif kind == "cancel":  # negative sums: floor and truncation differ
            a = -np.abs(a)
            c = -np.abs(c) * 2.0**-30
        elif kind == "special":
            a[0, 2], a[1, 3], b[4, 1], c[2, 2] = np.inf, np.nan, -np.inf, np.inf
        kw = {"input_format": fmt, "accumulator": acc, "out_format": out}
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got, launched = _emu_gemm(gemm_lib, a, b, c, **kw)
        assert launched == ["pl_gemm_generic_f32"]
        _same_gemm(got, want, f"{acc.name} {kind}", a)
        if native_backend.available():
            _same_gemm(pl.gemm(a, b, c, backend="native", **kw), want, f"native {kind}", a)


def _amd_oracle_module():
    """tests/gemm/test_mmasim_amd.py (its AMD families and six input classes need no mmasim)."""
    import importlib.util

    path = ROOT.parent / "gemm" / "test_mmasim_amd.py"
    spec = importlib.util.spec_from_file_location("_amd_oracle_classes", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_AMD = _amd_oracle_module()


@pytest.mark.parametrize(
    "family", _AMD.FAMILIES, ids=[f[0].replace(" ", "-") for f in _AMD.FAMILIES]
)
def test_gemm_amd_oracle_classes(gemm_lib, family) -> None:
    """Every AMD preset (CDNA1-3) in the CUDA kernels' header = the numpy reference (which
    tests/gemm/test_mmasim_amd.py holds to MMA-Sim 2.1.1) and = the native backend, on the six
    input classes of that oracle test (uniform, random bit patterns, wide exponents,
    near-cancellation, subnormals, specials and zeros beside huge operands)."""
    import precision_lab as pl
    from precision_lab.gemm import native_backend

    label, gpu, ins, pair, out = family
    acc = pl.tensor_core(gpu, pair, out_format=out, instruction=ins)
    for cls in _AMD.CLASSES:
        a, b, c = _AMD.case(family, cls, seed=1)
        kw = {
            "input_format": pair,
            "accumulator": acc,
            "out_format": out,
            "input_rounding": "exact",
        }
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got, _ = _emu_gemm(gemm_lib, a, b, c, **kw)
        _same_gemm(got, want, f"{label} {cls}", a)
        if native_backend.available():
            _same_gemm(pl.gemm(a, b, c, backend="native", **kw), want, f"native {label} {cls}", a)


def test_gemm_special_values_and_shapes(gemm_lib) -> None:
    import precision_lab as pl

    a, b, c = _gemm_inputs(7, batch=(), m=9, n=10, k=37)
    a[1, 3], a[2, 5], b[4, 7], c[5, 5] = np.inf, np.nan, -np.inf, np.inf
    b[6, 2] = 0.0
    a[3, 6] = np.inf  # inf * 0
    for acc in (pl.Accumulator(), pl.Accumulator("bf16", "sr"), pl.tensor_core("h100", "e4m3")):
        for fmt in ("e5m2", "fp16"):
            kw = {"input_format": fmt, "accumulator": acc, "out_format": "fp32"}
            want = pl.gemm(a, b, c, backend="numpy", **kw)
            got, launched = _emu_gemm(gemm_lib, a, b, c, **kw)
            _same_gemm(got, want, f"special values {acc.describe()} {fmt} {launched}", a)
    # batch broadcasting, c broadcasting, K = 0, no c
    a, b, c = _gemm_inputs(8, batch=(3,), m=5, n=6, k=40)
    for acc in (pl.Accumulator(), pl.Accumulator("fp16", order="pairwise")):
        kw = {"input_format": "bf16", "accumulator": acc, "out_format": "fp32"}
        for args in ((a, b[0], c[0, 0]), (a[0], b, None), (a[:, :, :0], b[:, :0, :], c)):
            want = pl.gemm(*args, backend="numpy", **kw)
            got, _ = _emu_gemm(gemm_lib, *args, **kw)
            _same_gemm(got, want, f"shapes {acc.describe()}", args[0])


def test_gemm_round_down_zero_sums_and_saturation(gemm_lib) -> None:
    """Issue 19 item 7: an exact zero sum is -0 under round-down (IEEE 754 6.3) in the header's
    accumulator as in the numpy reference; infinities saturate in the output alike."""
    import precision_lab as pl

    a = np.array([[1.0, -1.0, 2.0, -2.0], [0.0, 0.0, 0.0, 0.0], [-0.0, 0.0, -0.0, 0.0]])
    a = np.vstack([a, [[np.inf, 1.0, 0.0, 0.0]]])
    b = np.ones((4, 3))
    for order in ("sequential", "pairwise", "blocked"):  # (compensated has no CUDA kernel)
        kw_acc = {"block": 2} if order == "blocked" else {}
        for mode, overflow in (("down", "ieee"), ("nearest_even", "saturate"), ("up", "ieee")):
            acc = pl.Accumulator("fp16", rounding=mode, order=order, overflow=overflow, **kw_acc)
            kw = {"input_format": "fp16", "accumulator": acc, "out_format": "fp16"}
            want = pl.gemm(a, b, backend="numpy", **kw)
            got, launched = _emu_gemm(gemm_lib, a, b, None, **kw)
            _same_gemm(got, want, f"zero sums {order} {mode} {launched}", a)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
            assert np.signbit(want[0, 0]) == (mode == "down")


# ===== precision_lab.backends.gpu and the cupy backend, end to end, over an emulated CuPy
# =================
class _FakeArray(np.ndarray):
    """A numpy array that says it is a CuPy array (the core dispatches on the type's module)."""

    def get(self) -> np.ndarray:
        return np.array(self)


_FakeArray.__module__ = "cupy"


def _fake_cupy(lib: ctypes.CDLL):
    import types

    def wrap(fn):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            return out.view(_FakeArray) if isinstance(out, np.ndarray) else out

        return call

    def convert(arg):
        if isinstance(arg, np.ndarray):
            assert arg.flags.c_contiguous
            return _ptr(arg)
        ctype = {np.int32: ctypes.c_int32, np.uint64: ctypes.c_uint64, np.int64: ctypes.c_int64}
        return ctype[type(arg)](arg)

    class RawModule:
        def __init__(self, code: str, options: tuple[str, ...]) -> None:
            assert '#include "' not in code  # local headers inlined: one self-contained source
            assert "-ftz=false" in options
            self.code = code

        def get_function(self, name: str):
            assert hasattr(lib, f"emu_{name}" if name.startswith("pl_gemm") else name), name

            def launch(grid, block, args):
                if name.startswith("pl_gemm"):
                    dims = [ctypes.c_uint(v) for v in (*grid, *block)]
                    getattr(lib, f"emu_{name}")(*dims, *[convert(a) for a in args])
                else:
                    lib.emu_single_thread()
                    getattr(lib, name)(*[convert(a) for a in args])

            return launch

    fake = types.ModuleType("cupy")
    for name in ("asarray", "ascontiguousarray", "empty", "zeros", "ones", "broadcast_to",
                 "isfinite", "isnan", "argwhere", "matmul"):  # fmt: skip
        setattr(fake, name, wrap(getattr(np, name)))
    for name in ("int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                 "float64"):  # fmt: skip
        setattr(fake, name, getattr(np, name))
    fake.ndarray = _FakeArray  # type: ignore[attr-defined]
    fake.RawModule = RawModule  # type: ignore[attr-defined]
    fake.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1)
    )
    return fake


@pytest.fixture()
def fake_cp(gemm_lib, monkeypatch):
    import sys

    from precision_lab.backends import gpu

    fake = _fake_cupy(gemm_lib)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    gpu.module.cache_clear()
    yield fake
    gpu.module.cache_clear()


def test_gpu_module_end_to_end_emulated(fake_cp) -> None:
    """tests/backends/test_gpu.py's checks of round_to/encode/decode, run through
    precision_lab.backends.gpu with CuPy replaced by numpy and the kernels of pl_round.cu compiled
    for the CPU."""
    import test_gpu as tg

    assert pl_available_fake(fake_cp)
    for fmt in (FORMATS["e4m3"], FORMATS["bf16"], FORMATS["e8m0"], FORMATS["fp64"],
                SMALL_FLOATS["e4m3_unsigned"], WIDE_FLOATS["e9m10"]):  # fmt: skip
        tg.test_round_to_and_encode_match_cpu(fake_cp, fmt)
        tg.test_decode_matches_cpu(fake_cp, fmt)
    tg.test_stochastic_rounding_matches_cpu(fake_cp, 2**64 + 5, 3)
    for fmt in tg.INTS:
        tg.test_integer_formats_match_cpu(fake_cp, fmt)
    tg.test_dtype_rules_shapes_and_inputs_kept(fake_cp)
    tg.test_errors(fake_cp)


def pl_available_fake(fake) -> bool:
    from precision_lab.backends import gpu

    return gpu.available()


def test_gemm_backend_end_to_end_emulated(fake_cp) -> None:
    """pl.gemm on (emulated) CuPy arrays: dispatch, cupy_backend, kernel names and arguments."""
    import precision_lab as pl

    a, b, c = _gemm_inputs(11, batch=(2,), m=20, n=18, k=70)
    ca, cb, cc = (fake_cp.asarray(v) for v in (a, b, c))
    for fmt, acc, out in (
        ("e4m3", pl.Accumulator(), "fp32"),
        ("bf16", pl.Accumulator("bf16", "sr", seed=3), "bf16"),
        ("e4m3", pl.tensor_core("h100", "e4m3"), "fp32"),
        ("fp16", pl.Accumulator(order="blas"), "fp32"),
        ("e4m3", pl.tensor_core("b200", "mxfp8_e4m3", instruction="tcgen05"), "fp32"),
    ):
        kw: dict = {"input_format": fmt, "accumulator": acc, "out_format": out}
        if acc.scales == "in_block":  # block-scaled MMA: E8M0 scales on blocks of 32
            sa = 2.0 ** (np.arange(60).reshape(20, 3) % 7 - 3)  # (rows, K-blocks)
            kw.update(scale_a=sa, scale_b=0.5, scale_block=32)
        got = pl.gemm(ca, cb, cc, **kw)
        assert type(got).__module__ == "cupy"
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        if acc.order == "blas":  # float32 BLAS: not bit-reproducible, compare loosely
            np.testing.assert_allclose(got.get(), want, rtol=1e-5, atol=1e-5)
        else:
            _same_gemm(got.get(), want, f"gemm {acc.describe()}", a)
    with pytest.raises(ValueError, match="shape mismatch"):
        pl.gemm(ca, cb[:, :5], input_format="e4m3", accumulator=pl.Accumulator())
    import test_gpu as tg  # the GPU suite's block-scaled test, on the emulated CuPy

    for cfg in tg.block_scaled_configs():
        tg.test_gemm_block_scaled_matches_cpu(fake_cp, cfg)
    for cfg in tg.GROUPED_CONFIGS:
        tg.test_gemm_block_scaled_groups_matches_cpu(fake_cp, cfg)
    with pytest.raises(ValueError, match="not on the e4m3 grid"):
        pl.gemm(ca, cb, input_format="e4m3", accumulator=pl.Accumulator(), input_rounding="exact")


def test_gemm_fma_kernel_several_tiles(gemm_lib) -> None:
    """The FMA kernel over 2 x 2 output tiles of 128 and a K tail; -0 sums stay -0."""
    import precision_lab as pl

    a, b, c = _gemm_inputs(12, batch=(), m=130, n=140, k=21)
    a[3, :], c[3, 5] = -0.0, -0.0  # row 3: products +-0, c = -0: the sum is -0 only if never padded
    b[:, 5] = 0.0
    for acc in (pl.Accumulator(), pl.Accumulator(rounding="rtz"), pl.Accumulator(rounding="up")):
        kw = {"input_format": "bf16", "accumulator": acc, "out_format": "fp32"}
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got, launched = _emu_gemm(gemm_lib, a, b, c, **kw)
        assert launched[0].startswith("pl_gemm_fma_"), launched
        _same_bits(got, want, f"fma tiles {acc.rounding}", a)


def test_gpu_check_gemm_section_emulated(fake_cp, monkeypatch, tmp_path) -> None:
    """benchmarks/gpu_check.py's gemm section (every preset, block-scaled MMA) on the emulated
    CuPy: the one script a GPU machine runs finds the kernels bit-exact before it gets there."""
    import importlib
    import sys

    monkeypatch.setenv("PL_GPU_CHECK_SMALL", "1")
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", str(tmp_path / "report.json")])
    monkeypatch.syspath_prepend(str(ROOT.parents[1] / "benchmarks"))
    monkeypatch.delitem(sys.modules, "gpu_check", raising=False)
    gpu_check = importlib.import_module("gpu_check")
    gpu_check.gemm_agreement()
    report = gpu_check.REPORT["gemm"]
    assert report.get("bit_exact") is True, report.get("failures") or report.get("error")
    assert any(label.startswith("block-scaled") for label in report["per_config"])
    assert report["checks"] >= 3 * len(gpu_check._gemm_configs())


def _measured_cases():
    from precision_lab.gemm.validation import load_subset

    sets = load_subset(ROOT.parent / "gemm" / "data" / "tensor_core" / "measurements_500.npz")
    return [(s, o) for s in sets for o in sorted(s.d)]


@pytest.mark.parametrize(("s", "out"), _measured_cases(), ids=lambda v: getattr(v, "name", v))
def test_measured_tensor_core_sets_on_the_header(gemm_lib, s, out) -> None:
    """The GPU measurements (Khattak & Mikaitis's model_validation sets: 19 sets, 30 with their
    outputs; the 500 cases of each that ship with the tests, a block of CUDA threads per case)
    reproduced bit for bit by the CUDA kernels' header on the host, as by numpy and native
    (tests/gemm/test_tensor_core.py; all 5000: benchmarks/verify_tensor_cores.py)."""
    from precision_lab.gemm.tensor_core import measured_preset

    gpu, fmt, n = s.gpu.lower(), s.fmt.lower(), len(s.c)
    acc = measured_preset(gpu, fmt, out)
    c = s.c[:n]
    if gpu in ("h100", "h200") and fmt in ("e4m3", "e5m2") and out == "fp32":
        c = np.zeros_like(c)  # (validation.check_set: wgmma ran with a zero accumulator)
    d, _ = _emu_gemm(gemm_lib, s.a[:n, None, :], s.b[:n, :, None], c[:, None, None],
                     input_format=fmt, accumulator=acc, out_format=out,
                     input_rounding="exact")  # fmt: skip
    got = np.asarray(d)[:, 0, 0].astype(np.float32)
    ref = s.d[out][:n]
    same = got.view(np.uint32) == ref.view(np.uint32)
    assert same.all(), f"{s.name} -> {out}: {int(same.sum())}/{len(ref)}"


def test_gemm_header_limits_fall_back_on_the_cpu(gemm_lib) -> None:
    """Models beyond the GPU kernels' per-thread arrays (exact_block blocks over 32, more than
    16 scale groups or separate inner blocks per block) raise on CuPy, and on the CPU the
    native backend leaves them to its fast kernels or the numpy reference."""
    import precision_lab as pl
    from precision_lab.gemm import native_backend

    A = pl.Accumulator
    too_big = [
        A("fp32", order="exact_block", block=64),
        A(order="block_fma", block=64, inner_block=2, align_bits=24, addend="separate",
          sum_bits=31, align_rounding="down"),
    ]  # fmt: skip
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((3, 70)), rng.standard_normal((70, 4))
    a[1, 5] = np.nan  # (the native fast kernels hand such calls back)
    for acc in too_big:
        kw = {"input_format": "fp16", "accumulator": acc, "out_format": "fp32"}
        with pytest.raises(ValueError, match="the cupy backend runs"):
            _emu_gemm(gemm_lib, a, b, **kw)
        assert not native_backend.covers(acc)
        want = pl.gemm(a, b, backend="numpy", **kw)
        _same_gemm(pl.gemm(a, b, backend="native", **kw), want, acc.describe(), a)


@pytest.mark.parametrize("gpu", ["b200", "rtx5090"])
def test_gemm_nvfp4_scale_exponents_clamp_at_ue4m3_emin(gemm_lib, gpu) -> None:
    """NVFP4's UE4M3 scales align at max(floor(log2 s), -6) (GST-FDPA): two groups that cancel,
    with subnormal scales 2**-9, put the anchor at -6 - 6 = -12 (not -18), so c = 2**-30 (1 +
    2**-23) loses its last bit at 35 fraction bits (2**-47): the result is 2**-30 exactly."""
    import precision_lab as pl

    acc = pl.tensor_core(gpu, "nvfp4", instruction="tcgen05" if gpu == "b200" else "mma")
    a, b = np.zeros((1, 32)), np.zeros((32, 1))
    a[0, 0], b[0, 0], a[0, 16], b[16, 0] = 0.5, 0.5, -0.5, 0.5  # groups: +0.25, -0.25
    c = np.array([[2.0**-30 * (1 + 2.0**-23)]])
    kw = {"input_format": "e2m1", "accumulator": acc, "out_format": "fp32",
          "scale_a": np.full((1, 2), 2.0**-9), "scale_b": np.full((2, 1), 2.0**-9),
          "scale_block": 16}  # fmt: skip
    want = pl.gemm(a, b, c, backend="numpy", **kw)
    assert want[0, 0] == 2.0**-30
    got, _ = _emu_gemm(gemm_lib, a, b, c, **kw)
    _same_gemm(got, want, f"{gpu} nvfp4 clamp", a)
    from precision_lab.gemm import native_backend

    if native_backend.available():  # (its float64 kernel of group sums)
        _same_gemm(pl.gemm(a, b, c, backend="native", **kw), want, "native nvfp4 clamp", a)
