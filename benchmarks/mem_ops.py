"""Peak extra memory of pl.ops on the numpy general path (issue 19 item 9), as a multiple of the
output's size: tracemalloc's peak during one call (numpy reports its buffers to tracemalloc).

    PRECISION_LAB_BACKEND=numpy python benchmarks/mem_ops.py [log2 elements, default 24]
"""

from __future__ import annotations

import sys
import tracemalloc

import numpy as np

import precision_lab as pl


def peak(fn, *args, **kw) -> tuple[float, int]:
    tracemalloc.start()
    tracemalloc.reset_peak()
    r = fn(*args, **kw)
    _, p = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return p / max(np.asarray(r).nbytes, 1), np.asarray(r).nbytes


def main() -> None:
    n = 1 << int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 24
    rng = np.random.default_rng(0)
    x32 = pl.round_to(rng.standard_normal(n).astype(np.float32), "bf16").astype(np.float32)
    y32 = pl.round_to(rng.standard_normal(n).astype(np.float32) + 3, "bf16").astype(np.float32)
    cases = {
        "div bf16": (pl.ops.div, (x32, y32, "bf16")),
        "sqrt bf16": (pl.ops.sqrt, (np.abs(x32), "bf16")),
        "mul float64 operands bf16": (pl.ops.mul, (x32.astype(np.float64), y32, "bf16")),
        "mul fp64": (pl.ops.mul, (x32.astype(np.float64), y32.astype(np.float64), "fp64")),
        "exp bf16": (pl.ops.exp, (x32, "bf16")),
        "add bf16 (float32 path)": (pl.ops.add, (x32, y32, "bf16")),
    }
    for name, (fn, args) in cases.items():
        ratio, nbytes = peak(fn, *args)
        print(f"{name:28s} peak extra {ratio:5.1f}x the output ({nbytes >> 20} MiB)")
    m = int(np.sqrt(n))
    a = x32[: m * m].reshape(m, m)
    ratio, _ = peak(pl.ops.sum, a, axis=1, accumulator="fp32")
    print(f"{'sum axis=1 fp32':28s} peak extra {ratio * m / (m * m) * 1:5.1f}x the input")


if __name__ == "__main__":
    main()
