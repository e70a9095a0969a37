"""quant_error (relative quadratic error, QSNR, effective bits) against exact Fractions."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from precision_lab.analysis import quant_error


def exact_rqe(a, r) -> Fraction:
    num = sum((Fraction(float(p)) - Fraction(float(q))) ** 2 for p, q in zip(a, r, strict=True))
    den = sum(Fraction(float(q)) ** 2 for q in r)
    return num / den


@pytest.mark.parametrize("scale", [1.0, 2.0**-600, 2.0**600])
def test_tensor_measures_match_exact_arithmetic(scale: float) -> None:
    rng = np.random.default_rng(1)
    r = rng.standard_normal(1000) * scale
    a = r + rng.standard_normal(1000) * 1e-3 * scale
    e = quant_error(a, r)
    want = exact_rqe(a, r)
    assert math.isclose(e.rqe, float(want), rel_tol=1e-12)
    assert math.isclose(e.qsnr_db, -10 * math.log10(want), rel_tol=1e-12)
    assert math.isclose(e.effective_bits, -0.5 * math.log2(want), rel_tol=1e-12)


def test_per_block_and_axis() -> None:
    rng = np.random.default_rng(2)
    r = rng.standard_normal((3, 64)).astype(np.float32)
    a = (r * np.float32(1.01)).astype(np.float32)
    e = quant_error(a, r, block=16)
    assert e.rqe.shape == (3, 4)
    for i in range(3):
        for b in range(4):
            want = exact_rqe(a[i, 16 * b : 16 * b + 16], r[i, 16 * b : 16 * b + 16])
            assert math.isclose(e.rqe[i, b], float(want), rel_tol=1e-12)
    e0 = quant_error(a.T, r.T, block=16, axis=0)
    assert np.array_equal(e0.rqe, e.rqe.T)
    assert np.allclose(e.effective_bits, -0.5 * np.log2(e.rqe))


def test_special_cases_and_errors() -> None:
    x = np.array([1.0, 2.0])
    e = quant_error(x, x)
    assert e.rqe == 0 and e.qsnr_db == math.inf and e.effective_bits == math.inf
    z = np.zeros(2)
    assert math.isnan(quant_error(z, z).rqe) and quant_error(x, z).rqe == math.inf
    assert math.isnan(quant_error([np.nan, 1.0], x).rqe)
    with pytest.raises(ValueError, match="same shape"):
        quant_error(x, np.ones(3))
    with pytest.raises(ValueError, match="multiple of block=3"):
        quant_error(np.ones(4), np.ones(4), block=3)
    with pytest.raises(ValueError, match="positive int"):
        quant_error(np.ones(4), np.ones(4), block=0)
