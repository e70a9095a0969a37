"""``order="exact_block"`` (AMD CDNA1 fp16/bf16 MFMA, MMA-Sim's E-FDPA: each block of products
and the accumulator summed exactly, rounded once to fp32) on the native kernel: bit for bit the
numpy reference on inputs with wide exponents, exact cancellations, subnormals, sums near ties
and overflow, and it must run (a spy). The presets against an exact-fraction oracle:
tests/gemm/test_tensor_core_presets.py (test_cdna1_*)."""

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
KINDS = ("uniform", "wide", "cancel", "subnormal", "big", "ties")


def _inputs(kind: str, fmt: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    f = pl.get_format(fmt)
    m, k, n = 9, 23, 7
    a, b = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
    c = rng.standard_normal((m, n))
    if kind == "wide":
        a *= 2.0 ** rng.integers(-14, 14, (m, k))
        b *= 2.0 ** rng.integers(-14, 14, (k, n))
        c *= 2.0 ** rng.integers(-40, 40, (m, n))
    elif kind == "cancel":
        a = rng.choice([-1.0, 1.0], (m, k)) * 2.0 ** rng.integers(-3, 4, (m, k))
        b = rng.choice([-1.0, 1.0], (k, n))
        c = np.round(c * 4) / 4
    elif kind == "subnormal":
        a *= 4 * f.smallest_normal
        c *= 2.0**-130
    elif kind == "big":  # (bf16: sums beyond float32: inf, which then stays)
        a = rng.uniform(0.5, 1, (m, k)) * f.max
        b = rng.uniform(0.5, 1, (k, n)) * f.max * rng.choice([-1.0, 1.0], (k, n))
        c *= 1e38
    elif kind == "ties":  # c + a product 2**-24 below it: halfway cases of float32
        a[:, 0], b[0, :], c = 2.0**-12, 2.0**-12, np.ones((m, n))
    return a, b, c


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_native_equals_the_reference(fmt, monkeypatch):
    calls = []
    run = nbk.gemm_exact_block
    monkeypatch.setattr(nbk, "gemm_exact_block", lambda *a, **k: calls.append(1) or run(*a, **k))
    acc = pl.tensor_core("mi100", fmt)
    rng = np.random.default_rng(len(fmt))
    overflowed = False
    for kind in KINDS:
        a, b, c = _inputs(kind, fmt, rng)
        for cc in (c, None):
            kw = {"input_format": fmt, "accumulator": acc}
            want = pl.gemm(a, b, cc, backend="numpy", **kw)
            got = pl.gemm(a, b, cc, backend="native", **kw)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), kind)
            overflowed |= bool(np.isinf(want).any())
    assert len(calls) == 2 * len(KINDS)
    assert overflowed == (fmt == "bf16")  # (bf16's "big" class overflows float32)
