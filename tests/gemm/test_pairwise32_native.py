"""AMD CDNA2's fp16/bf16 MFMA model (pairwise sums of products rounded to fp32, promoted every 2
or 4 products into fp32, subnormal inputs and results flushed) on the native float32 pairwise
kernel: bit for bit the numpy reference, zero signs included, on inputs near fp32's underflow,
with exact cancellations, a c that is subnormal (kept with input_subnormals="keep", then met by
a flushing sum), and K not a multiple of the segment; and it must run (a spy). The presets
against an exact oracle: tests/gemm/test_tensor_core_presets.py (test_cdna2_*)."""

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
KINDS = ("uniform", "tiny", "cancel", "zeros")
PRESETS = [("mi210", "fp16", None), ("mi250", "bf16", None), ("mi250", "bf16", "mfma.bf16")]


def _inputs(kind: str, fmt: str, rng: np.random.Generator, k: int) -> tuple[np.ndarray, ...]:
    m, n = 7, 9
    a, b = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
    c = rng.uniform(-1, 1, (m, n))
    if kind == "tiny":  # products and sums around fp32's smallest normal (bf16) or tiny (fp16)
        s = 2.0**-63 if fmt == "bf16" else 2.0**-7
        a *= s
        b *= s
        c = rng.uniform(-4, 4, (m, n)) * 2.0**-128  # (subnormal in fp32)
    elif kind == "cancel":
        a = rng.choice([-1.0, 1.0], (m, k)) * 2.0 ** rng.integers(-3, 3, (m, k))
        b = rng.choice([-1.0, 1.0], (k, n))
        c = np.zeros((m, n))
    elif kind == "zeros":  # signed zeros: the sign rules of the sums
        a = rng.choice([-0.0, 0.0, 1.0], (m, k))
        b = rng.choice([-0.0, 0.0], (k, n))
        c = rng.choice([-0.0, 0.0], (m, n))
    return a, b, c


@pytest.mark.parametrize(("gpu", "fmt", "ins"), PRESETS)
@pytest.mark.parametrize("inputs", ["flush", "keep"])
def test_native_equals_the_reference(gpu, fmt, ins, inputs, monkeypatch):
    calls = []
    run = nbk._pairwise32_gemm
    monkeypatch.setattr(nbk, "_pairwise32_gemm", lambda *a, **k: calls.append(1) or run(*a, **k))
    acc = pl.tensor_core(gpu, fmt, instruction=ins)
    if inputs == "keep":
        acc = acc.replace(input_subnormals="keep")
    assert acc.subnormals == "flush" and acc.promote_every in (2, 4)
    rng = np.random.default_rng(len(gpu + fmt + str(ins)))
    for kind in KINDS:
        for k in (16, 13, 1):
            a, b, c = _inputs(kind, fmt, rng, k)
            for cc in (c, None):
                kw = {"input_format": fmt, "accumulator": acc}
                want = pl.gemm(a, b, cc, backend="numpy", **kw)
                got = pl.gemm(a, b, cc, backend="native", **kw)
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), kind)
    assert len(calls) == 2 * 3 * len(KINDS)


def test_overflow_goes_to_the_general_kernels():
    acc = pl.tensor_core("mi250", "bf16")
    a = np.full((2, 8), 2.0**100)
    b = np.full((8, 3), 2.0**60)
    want = pl.gemm(a, b, input_format="bf16", accumulator=acc, backend="numpy")
    got = pl.gemm(a, b, input_format="bf16", accumulator=acc, backend="native")
    assert np.isinf(want).all() and got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
