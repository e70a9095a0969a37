"""FP4-recipe pieces: speed of the Hadamard rotation before NVFP4 quantization.

A 4096x4096 float32 tensor (standard normal, seed 0). Issue 21's target:

  hadamard(x, block=16, seed=..., arithmetic="fp32") + round_to_blocks(., "nvfp4")
      within 3x of round_to_blocks(x, "nvfp4") on the native backend

Runs interleave (plain, rotated, plain, rotated, ...) so load from other processes hits both
alike; printed are the medians and the median of the per-round ratios. Also timed: the 128-point
rotation (Quartet II) and the exact (float64) transform.

Usage: python benchmarks/bench_recipes.py [--rows 4096] [--cols 4096] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import precision_lab as pl


def _once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal((args.rows, args.cols)).astype(np.float32)
    print(f"backend: {pl.backend_info().get('round_to_blocks', pl.backend_info())}")

    def plain() -> object:
        return pl.round_to_blocks(x, "nvfp4")

    def rotated(block: int) -> Callable[[], object]:
        def run() -> object:
            y = pl.hadamard(x, block=block, seed=1, arithmetic="fp32")
            return pl.round_to_blocks(y, "nvfp4")

        return run

    def exact() -> object:
        return pl.hadamard(x, block=16, seed=1)

    contenders = {"rht16+nvfp4": rotated(16), "rht128+nvfp4": rotated(128), "exact16": exact}
    for fn in (plain, *contenders.values()):
        fn()  # warm up
    base: list[float] = []
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            base.append(_once(plain))
            times[name].append(_once(fn))
    pb = statistics.median(base)
    print(f"{x.shape} float32; medians of {args.rounds} interleaved rounds")
    print(f"  nvfp4 alone       {pb * 1e3:8.1f} ms")
    for name, ts in times.items():
        k = len(contenders)
        ratios = [t / b for t, b in zip(ts, base[list(contenders).index(name) :: k], strict=True)]
        print(
            f"  {name:<17} {statistics.median(ts) * 1e3:8.1f} ms   "
            f"ratio {statistics.median(ratios):5.2f}x"
            + ("   (target <= 3x)" if name == "rht16+nvfp4" else "")
        )


if __name__ == "__main__":
    main()
