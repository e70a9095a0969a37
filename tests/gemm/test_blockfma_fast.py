"""The native block-FMA fast path (backends/native/blockfma_fast.inc) against the numpy reference
and the general native kernels: bit for bit on every tensor-core preset, on random and adversarial
inputs, with and without the spec's special-value rules; and it must actually run (a spy counts
the calls it answers), so that a silent fall-back cannot pass for the fast path."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.backends.native import kernels as native_kernels
from precision_lab.gemm.accumulator import reference_only

nbk = importlib.import_module("precision_lab.gemm.native_backend")
tc = importlib.import_module("precision_lab.gemm.tensor_core")

pytestmark = pytest.mark.skipif(
    not native_kernels.available(), reason="precision_lab.backends._native_kernels is not built"
)


def _block_fma_presets() -> list[tuple[str, str, str]]:
    """Every (gpu, input format, output) whose default preset is a block FMA of one format
    (the fast path's domain; FMA chains, AMD's orders and fp64 are not)."""
    out = []
    for gpu in tc.GPUS:
        for fmt in tc.tensor_core_formats(gpu):
            for fout in ("fp32", "fp16"):
                try:
                    acc = pl.tensor_core(gpu, fmt, out_format=fout)
                except ValueError:
                    continue
                if (
                    acc.order == "block_fma"
                    and reference_only(acc) is None  # AMD CDNA3's separate addend: numpy only
                    and fmt in ("fp16", "bf16", "tf32", "e4m3", "e5m2")
                ):
                    out.append((gpu, fmt, fout))
    return out


PRESETS = _block_fma_presets()
KINDS = ("uniform", "wide", "cancel", "subnormal", "zero_blocks", "big")


def inputs(rng: np.random.Generator, kind: str, shape: tuple[int, ...], fmt: str) -> np.ndarray:
    f = pl.get_format(fmt)
    if kind == "uniform":
        x = rng.uniform(-1, 1, shape)
    elif kind == "wide":  # exponents spread over 60 binades (bf16/tf32: beyond the fast path's)
        x = rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)
    elif kind == "cancel":  # few values of both signs: exact cancellations in the blocks
        x = rng.choice([-1.0, 1.0], shape) * 2.0 ** rng.integers(-3, 4, shape)
    elif kind == "subnormal":
        x = rng.uniform(-4, 4, shape) * f.smallest_normal
    elif kind == "zero_blocks":  # whole runs of zeros along K
        x = rng.uniform(-1, 1, shape)
        x[..., rng.random(shape[-2]) < 0.5, :] = 0.0
    else:  # "big": near the format's max, so that block sums overflow int32 or the format
        x = rng.uniform(0.5, 1, shape) * f.max * rng.choice([-1.0, 1.0], shape)
    return pl.round_to(np.clip(x, -f.max, f.max).astype(np.float32), f)


@pytest.fixture
def fast_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the calls the fast path answers (and those it hands back)."""
    calls = {"fast": 0, "back": 0}
    run = nbk._blockfma_gemm

    def spy(*args: object, **kwargs: object) -> object:
        out = run(*args, **kwargs)
        calls["fast" if out is not None else "back"] += 1
        return out

    monkeypatch.setattr(nbk, "_blockfma_gemm", spy)
    return calls


def same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


@pytest.mark.parametrize(("gpu", "fmt", "out"), PRESETS)
def test_every_preset_equals_the_reference_and_the_general_kernels(
    gpu: str, fmt: str, out: str, fast_calls: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(abs(hash((gpu, fmt, out))) % 2**32)
    acc = pl.tensor_core(gpu, fmt, out_format=out)
    results = []
    for kind in KINDS:
        k = int(rng.integers(1, 3)) * (acc.block or 1) + int(rng.integers(0, 7))  # K ragged
        batch = (2,) if kind == "cancel" else ()
        a = inputs(rng, kind, (*batch, 7, k), fmt)
        b = inputs(rng, kind, (*batch, k, 37), fmt)
        c = (
            None
            if kind in ("uniform", "zero_blocks")
            else pl.round_to(rng.standard_normal((7, 37)).astype(np.float32), out)
        )
        kw = dict(input_format=fmt, accumulator=acc, out_format=out)
        fast = pl.gemm(a, b, c, backend="native", **kw)
        ref = pl.gemm(a, b, c, backend="numpy", **kw)
        assert same_bits(fast, ref), (kind, np.argwhere(fast != ref)[:3])
        results.append((a, b, c, kw, fast))
    # (bf16/tf32 "wide" inputs may go back: spread too wide; AMD CDNA3's bf16/tf32 "big" too:
    # products of 2**128 are inf there, which the per-element kernels compute)
    overflow = acc.addend == "separate" and fmt in ("bf16", "tf32")
    assert fast_calls["fast"] >= 5 - overflow
    monkeypatch.setattr(nbk, "blockfma_applies", lambda *args: False)  # the general kernels
    for a, b, c, kw, fast in results:
        assert same_bits(fast, pl.gemm(a, b, c, backend="native", **kw))


RULES = [
    {"zeros_in_anchor": True},
    {"zeros_in_anchor": True, "overflow": "infinity", "zero_sign": "positive"},
    {"overflow": "saturate"},
    {"zero_sign": "positive", "promote_every": 64},
    {"zero_sign": "ieee", "promote_every": 32},  # (float32 promotion: -0 + -0 stays -0)
]


@pytest.mark.parametrize("rules", RULES, ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items()))
@pytest.mark.parametrize(
    ("gpu", "fmt"), [("v100", "fp16"), ("a100", "bf16"), ("h100", "e4m3"), ("b200", "e5m2")]
)
def test_special_value_rules_equal_the_reference(
    gpu: str, fmt: str, rules: dict[str, object], fast_calls: dict[str, int]
) -> None:
    rng = np.random.default_rng(7)
    acc = dataclasses.replace(pl.tensor_core(gpu, fmt), **rules)
    for kind in ("uniform", "zero_blocks", "subnormal", "big"):
        a = inputs(rng, kind, (5, 150), fmt)
        b = inputs(rng, kind, (150, 33), fmt)
        c = pl.round_to((rng.standard_normal((5, 33)) * 1e-38).astype(np.float32), "fp32")
        fast = pl.gemm(a, b, c, input_format=fmt, accumulator=acc, backend="native")
        ref = pl.gemm(a, b, c, input_format=fmt, accumulator=acc, backend="numpy")
        assert same_bits(fast, ref), (kind, np.argwhere(fast != ref)[:3])
    assert fast_calls["fast"] == 4


def test_zeros_in_anchor_case_of_the_spec(fast_calls: dict[str, int]) -> None:
    """Hopper bf16, c = 0 (accumulator.py, section 3): the zero c aligns at zero_exponent =
    -133 (MMA-Sim 2.1.1's e_zero): two products near 2**-145 give 0x37 (MMA-Sim's); at -126
    they gave 0x38. The fast path computes it."""
    acc = pl.tensor_core("h100", "bf16", instruction="mma")
    a = np.zeros((1, 16), np.float32)
    b = np.zeros((16, 1), np.float32)
    a[0, :2] = [1.5021599923962983e-21, 2.2540671692070004e-23]
    b[:2, 0] = [5.459392042849983e-23, -1.5881867761018131e-22]
    d = pl.gemm(a, b, input_format="bf16", accumulator=acc, backend="native")
    assert hex(int(d.view(np.uint32)[0, 0])) == "0x37"
    old = acc.replace(zero_exponent=-126)
    d = pl.gemm(a, b, input_format="bf16", accumulator=old, backend="native")
    assert hex(int(d.view(np.uint32)[0, 0])) == "0x38"
    assert fast_calls["fast"] == 2


def test_hands_back_what_it_does_not_compute(fast_calls: dict[str, int]) -> None:
    """Infinities, and bf16 exponents spread beyond float32's range within a block, go back to
    the general path; the result is still the reference's."""
    acc = pl.tensor_core("a100", "bf16")
    a = np.ones((3, 16), np.float32)
    a[0, 0] = 2.0**100
    a[0, 1] = 2.0**-100
    b = np.ones((16, 5), np.float32)
    b[1, :] = 2.0**100
    b[0, :] = 2.0**-100
    for x in (a, np.where(np.arange(16) == 3, np.inf, a).astype(np.float32)):
        fast = pl.gemm(x, b, input_format="bf16", accumulator=acc, backend="native")
        ref = pl.gemm(x, b, input_format="bf16", accumulator=acc, backend="numpy")
        assert same_bits(fast, ref)
    assert fast_calls == {"fast": 0, "back": 2}


def _structured(kind: str, m: int, k: int, n: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs whose anchors take each route of the fused unit (blockfma_fast.inc, anchor planes):
    "apart": every row's largest a and every column's largest b sit at different positions of a
    block, so the anchor is below the sum of the two maxima (the max-plus loop, scaled terms);
    "partial": only some rows and columns meet; "zero_rows": rows and columns of zeros (and
    padding) next to ones that meet (the unscaled products)."""
    kk = np.arange(k)
    if kind == "apart":
        a = np.where(kk % 2 == 0, 1.0, 0.375)[None, :] * np.ones((m, 1))
        b = np.where(kk % 2 == 1, -1.5, 0.3125)[:, None] * np.ones((1, n))
    elif kind == "partial":
        a = np.where((kk + np.arange(m)[:, None]) % 3 == 0, 1.0, 0.4375)
        b = np.where((kk[:, None] + np.arange(n)) % 4 == 0, 1.75, -0.28125)
    else:
        rng = np.random.default_rng(3)
        a = rng.uniform(-1, 1, (m, k))
        b = rng.uniform(-1, 1, (k, n))
        a[::3] = 0.0
        b[:, 1::4] = 0.0
        a[1, : block // 2] = 0.0  # a block of a row without a non-zero input
    return a.astype(np.float32), b.astype(np.float32)


@pytest.mark.parametrize("kind", ["apart", "partial", "zero_rows"])
@pytest.mark.parametrize(
    ("gpu", "fmt", "rules"),
    [
        ("h100", "e4m3", {}),
        ("v100", "fp16", {}),
        ("a100", "bf16", {"zeros_in_anchor": False}),
        ("b200", "bf16", {"block": 64}),  # a block of more than 32 products: no position masks
    ],
)
def test_anchor_routes_equal_the_reference(
    kind: str, gpu: str, fmt: str, rules: dict[str, object], fast_calls: dict[str, int]
) -> None:
    acc = dataclasses.replace(pl.tensor_core(gpu, fmt), **rules)
    a, b = _structured(kind, 13, 3 * (acc.block or 1) + 5, 45, acc.block or 1)
    a, b = pl.round_to(a, fmt), pl.round_to(b, fmt)
    c = pl.round_to(np.linspace(-3, 3, 13 * 45).reshape(13, 45).astype(np.float32), "fp32")
    for cc in (None, c):
        kw = dict(input_format=fmt, accumulator=acc)
        fast = pl.gemm(a, b, cc, backend="native", **kw)
        ref = pl.gemm(a, b, cc, backend="numpy", **kw)
        assert same_bits(fast, ref), (kind, np.argwhere(fast != ref)[:3])
    assert fast_calls["fast"] == 2
