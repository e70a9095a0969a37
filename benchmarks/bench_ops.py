"""Emulated arithmetic throughput: precision_lab.ops against ml_dtypes, and an Emulated LU.

* ``pl.ops.add`` / ``pl.ops.mul`` on 16M bf16 values (ml_dtypes bfloat16 arrays in, float32
  values out: each result the exact sum or product rounded once by the core; on the compiled
  extension where it is built, :func:`precision_lab.backends.native.elementwise`) against numpy's
  ``np.add`` / ``np.multiply`` on ml_dtypes bfloat16 arrays (target >= 1x);
* Gaussian elimination (no pivoting) on a 256 x 256 matrix written with numpy operators, run on
  a ``pl.emulate(A, "bf16")`` array against the same code on a float64 numpy array (target:
  within 50x).

Prints the ratios measured in the same run and the load average (the machine may be shared).

Usage: python benchmarks/bench_ops.py [--n 16000000] [--lu 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os

import ml_dtypes
import numpy as np
from timing import median_time

import precision_lab as pl


def lu_textbook(A):  # type: ignore[no-untyped-def]
    A = A.copy()
    n = A.shape[0]
    for k in range(n - 1):
        A[k + 1 :, k] = A[k + 1 :, k] / A[k, k]
        A[k + 1 :, k + 1 :] -= np.outer(A[k + 1 :, k], A[k, k + 1 :])
    return A


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16_000_000)
    p.add_argument("--lu", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.n).astype(ml_dtypes.bfloat16)
    y = rng.standard_normal(args.n).astype(ml_dtypes.bfloat16)
    print(f"load average before: {os.getloadavg()}, cpus: {os.cpu_count()}")
    served = "numpy" if pl.native.ext is None else pl.native.choice()[0]
    print(f"ops.add/mul backend: {served} (auto = the extension where built)")
    for name, ours, theirs in (
        ("add", lambda: pl.ops.add(x, y, "bf16"), lambda: np.add(x, y)),
        ("mul", lambda: pl.ops.mul(x, y, "bf16"), lambda: np.multiply(x, y)),
    ):
        t_ours = median_time(ours, args.repeat)
        t_ml = median_time(theirs, args.repeat)
        same = np.array_equal(np.asarray(ours()), theirs().astype(np.float32))
        print(
            f"{name}: pl.ops {args.n / t_ours / 1e6:8.1f} Melem/s, ml_dtypes "
            f"{args.n / t_ml / 1e6:8.1f} Melem/s, ratio {t_ml / t_ours:.2f}x (target >= 1x); "
            f"identical results: {same}"
        )
    n = args.lu
    A = rng.uniform(-1, 1, (n, n)) + n * np.eye(n)
    t64 = median_time(lambda: lu_textbook(A), args.repeat)
    t_em = median_time(lambda: lu_textbook(pl.emulate(A, "bf16")), max(1, args.repeat // 2))
    print(
        f"LU {n}x{n}: float64 numpy {t64 * 1e3:.1f} ms, Emulated bf16 {t_em * 1e3:.1f} ms, "
        f"slowdown {t_em / t64:.1f}x (target within 50x)"
    )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
