"""``addend="separate"`` (AMD CDNA3 MFMA: the block's products aligned to their own anchor, then
the block sum and the accumulator aligned and rounded) on the native block-FMA units: bit for
bit the numpy reference on every CDNA3 preset, on inputs that move the anchors (wide exponents,
cancellation, subnormals, zeros, sums that overflow, a c far above or below the products), and
it must run (a spy counts the calls it answers). The presets against an exact oracle of the
published model: tests/gemm/test_tensor_core_presets.py (test_cdna3_*)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.backends.native import kernels as native_kernels

nbk = importlib.import_module("precision_lab.gemm.native_backend")

pytestmark = pytest.mark.skipif(
    not native_kernels.available(), reason="precision_lab.backends._native_kernels is not built"
)

FORMATS = ["fp16", "bf16", "tf32", "e4m3fnuz", "e5m2fnuz", ("e4m3fnuz", "e5m2fnuz")]
KINDS = ("uniform", "wide", "cancel", "subnormal", "zeros", "big", "far_c")


def _operand(rng: np.random.Generator, kind: str, shape: tuple[int, int], fmt: str) -> np.ndarray:
    f = pl.get_format(fmt)
    x = rng.uniform(-1, 1, shape)
    if kind == "wide":
        x *= 2.0 ** rng.integers(-20, 20, shape)
    elif kind == "cancel":
        x = rng.choice([-1.0, 1.0], shape) * 2.0 ** rng.integers(-3, 4, shape)
    elif kind == "subnormal":
        x *= 4 * f.smallest_normal
    elif kind == "zeros":
        x *= rng.random(shape) < 0.3
    elif kind == "big":
        x = rng.uniform(0.5, 1, shape) * f.max * rng.choice([-1.0, 1.0], shape)
    return pl.round_to(np.clip(x, -f.max, f.max), f).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_native_equals_the_reference(fmt, monkeypatch):
    calls = {"native": 0, "back": 0}
    run = nbk.gemm_separate

    def spy(*args: object, **kwargs: object) -> object:
        out = run(*args, **kwargs)
        calls["native" if out is not None else "back"] += 1
        return out

    monkeypatch.setattr(nbk, "gemm_separate", spy)
    acc = pl.tensor_core("mi300x", fmt)
    assert acc.addend == "separate"
    fa, fb = fmt if isinstance(fmt, tuple) else (fmt, fmt)
    rng = np.random.default_rng(len(str(fmt)))
    for i, kind in enumerate(KINDS):
        m, n = int(rng.integers(1, 20)), int(rng.integers(1, 40))
        k = (64, 48, 33, 5, 96, 16, 40)[i]  # (33, 5: a shorter last block)
        a, b = _operand(rng, kind, (m, k), fa), _operand(rng, kind, (k, n), fb)
        c = rng.standard_normal((m, n)) * 2.0 ** rng.integers(-60, 60, (m, n))
        if kind != "far_c":
            c = None if i % 2 else rng.uniform(-4, 4, (m, n))
        kw = {"input_format": (fa, fb), "accumulator": acc, "input_rounding": "exact"}
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got = pl.gemm(a, b, c, backend="native", **kw)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=kind)
    # (bf16 and tf32 "big": products reach 2**128, infinite by the model, which the
    # per-element kernels compute: the fast path hands them back)
    back = int(fa in ("bf16", "tf32"))
    assert calls == {"native": len(KINDS) - back, "back": back}
