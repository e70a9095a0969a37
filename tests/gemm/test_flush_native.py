"""Spec 3c (``input_subnormals="flush"``, AMD CDNA2 fp16/bf16 MFMA) on the native kernels: the
inputs are put on their grids and flushed in numpy, then the model runs natively with the inputs
kept; bit for bit the numpy reference, on inputs and c that are subnormal in their formats, and
it must run (a spy on the native entry point)."""

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


@pytest.mark.parametrize(("gpu", "fmt"), [("mi210", "fp16"), ("mi210", "bf16"), ("mi250", "fp16")])
def test_flushed_inputs_on_the_native_kernels(gpu, fmt, monkeypatch):
    acc = pl.tensor_core(gpu, fmt)
    assert acc.input_subnormals == "flush"
    calls = []
    run = nbk.gemm
    monkeypatch.setattr(nbk, "gemm", lambda *a, **k: calls.append(k["accumulator"]) or run(*a, **k))
    rng = np.random.default_rng(1)
    small = pl.get_format(fmt).smallest_normal
    a = rng.uniform(-1, 1, (9, 40)) * np.where(rng.random((9, 40)) < 0.5, 4 * small, 1.0)
    b = rng.uniform(-1, 1, (40, 7))
    c = rng.uniform(-4, 4, (9, 7)) * 2.0**-126  # half of them fp32 subnormals
    for rounding in ("nearest_even", "toward_zero"):
        kw = {"input_format": fmt, "accumulator": acc, "input_rounding": rounding}
        want = pl.gemm(a, b, c, backend="numpy", **kw)
        got = pl.gemm(a, b, c, backend="native", **kw)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # (reference.gemm calls it with the model, and it calls itself with the inputs kept)
    assert [x.input_subnormals for x in calls] == ["flush", "keep"] * 2
    # (the flush changes these results: the test would not pass with the inputs kept)
    keep = acc.replace(input_subnormals="keep")
    kept = pl.gemm(a, b, c, input_format=fmt, accumulator=keep, backend="numpy")
    assert not np.array_equal(kept, want)
