"""Smoke test of an installed precision_lab (a wheel in a clean environment): the compiled
backend loads and gives ml_dtypes' bits.

Run with ``PRECISION_LAB_REQUIRE_NATIVE=1`` (cibuildwheel sets it; see ``[tool.cibuildwheel]`` in
pyproject.toml) so that a wheel whose extensions did not build or do not load fails here instead
of quietly running on numpy. Checks every float16 bit pattern cast to e4m3, e5m2 and bf16 by the
native backend against ml_dtypes, one native GEMM against the numpy reference, and prints one line.
Exits non-zero on any difference.
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

import precision_lab as pl


def main() -> int:
    info = pl.backend_info()
    if info["round_to"] != "native" or not info["gemm"].startswith("native"):
        print(f"wheel_smoke: the compiled backend is not in use: {info}", file=sys.stderr)
        return 1
    x = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    for name, dt in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2),
                     ("bf16", ml_dtypes.bfloat16)):  # fmt: skip
        ours = pl.encode(x, name)
        with np.errstate(invalid="ignore", over="ignore"):  # e4m3 has no inf: NaN
            want = x.astype(dt).view(ours.dtype)
        nan = np.isnan(x)
        if not np.array_equal(ours[~nan], want[~nan]):
            print(f"wheel_smoke: {name} codes differ from ml_dtypes", file=sys.stderr)
            return 1
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 64)), rng.standard_normal((64, 8))
    acc = pl.tensor_core("h100", "e4m3")
    native = pl.gemm(a, b, input_format="e4m3", accumulator=acc, backend="native")
    with pl.use_backend("numpy"):
        ref = pl.gemm(a, b, input_format="e4m3", accumulator=acc, backend="numpy")
    if not np.array_equal(native.view(np.uint32), ref.view(np.uint32)):
        print("wheel_smoke: native GEMM differs from the numpy reference", file=sys.stderr)
        return 1
    print(f"wheel_smoke: precision_lab {pl.__version__} OK ({info['gemm']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
