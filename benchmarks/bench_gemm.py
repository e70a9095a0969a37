"""GEMM emulation throughput: emulated multiply-adds per second of the numpy reference.

Each line times ``pl.gemm`` on the CPU (median of ``--repeat`` runs) and numpy's float32 matmul
(BLAS) of the same shape in the same run, and prints million multiply-adds per second (MMAC/s)
and the ratio. Targets of issue 3 on the CPU (2 cores): >= 100 MMAC/s for fp32 sequential
round-to-nearest-even on E4M3 inputs, >= 30 MMAC/s for the tensor-core models.

    python benchmarks/bench_gemm.py [--repeat 5] [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np
from timing import median_time

import precision_lab as pl

TARGETS = {"fp32 sequential": 1e8, "tensor-core": 3e7}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smaller shapes (smoke test)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    s = 4 if args.quick else 1

    def inputs(m: int, k: int, n: int, fmt: str) -> tuple[np.ndarray, np.ndarray]:
        a = pl.round_to(rng.uniform(-1, 1, (m, k)).astype(np.float32), fmt)
        b = pl.round_to(rng.uniform(-1, 1, (k, n)).astype(np.float32), fmt)
        return a, b

    cases = [
        ("fp32 sequential RNE", "fp32 sequential", (512 // s, 512 // s, 512 // s), "e4m3",
         pl.Accumulator("fp32")),
        ("bf16 sequential RNE", None, (512 // s, 512 // s, 512 // s), "e4m3",
         pl.Accumulator("bf16")),
        ("bf16 accumulator, promote every 128", None, (512 // s, 512 // s, 512 // s), "e4m3",
         pl.Accumulator("bf16", promote_every=128)),
        ("fp16 sequential toward_zero", None, (512 // s, 512 // s, 512 // s), "e4m3",
         pl.Accumulator("fp16", rounding="toward_zero")),
        ("H100 FP8 tensor-core model", "tensor-core", (256 // s, 4096 // s, 256 // s), "e4m3",
         pl.tensor_core("h100", "e4m3")),
        ("H100 FP8 model + promotion every 128", "tensor-core", (256 // s, 4096 // s, 256 // s),
         "e4m3", pl.tensor_core("h100", "e4m3").replace(promote_every=128)),
        ("B200 FP8 tensor-core model", "tensor-core", (256 // s, 4096 // s, 256 // s), "e4m3",
         pl.tensor_core("b200", "e4m3")),
        ("A100 bf16 tensor-core model", "tensor-core", (256 // s, 4096 // s, 256 // s), "bf16",
         pl.tensor_core("a100", "bf16")),
    ]  # fmt: skip
    print(f"{'model':40s} {'M x K x N':>16s} {'MMAC/s':>9s} {'BLAS MMAC/s':>12s} {'ratio':>8s}"
          "  target")  # fmt: skip
    ok = True
    for label, target_key, (m, k, n), fmt, acc in cases:
        a, b = inputs(m, k, n, fmt)
        macs = m * k * n
        t = median_time(
            lambda a=a, b=b, acc=acc, fmt=fmt: pl.gemm(
                a, b, input_format=fmt, accumulator=acc, input_rounding="exact"
            ),
            args.repeat,
        )
        tb = median_time(lambda a=a, b=b: np.matmul(a, b), args.repeat)
        rate, blas = macs / t, macs / tb
        target = ""
        if target_key is not None and not args.quick:
            goal = TARGETS[target_key]
            passed = rate >= goal
            ok &= passed
            target = f">= {goal / 1e6:.0f} MMAC/s {'ok' if passed else 'MISSED'}"
        print(
            f"{label:40s} {f'{m}x{k}x{n}':>16s} {rate / 1e6:9.1f} {blas / 1e6:12.1f} "
            f"{rate / blas:8.4f}  {target}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
