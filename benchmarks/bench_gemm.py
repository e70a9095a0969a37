"""GEMM emulation throughput: emulated multiply-adds per second of the numpy and native backends.

Each line times ``pl.gemm`` on the CPU with ``backend="numpy"`` (the reference) and
``backend="native"`` (the compiled kernels, where built), medians of ``--repeat`` runs, and numpy's
float32 matmul (BLAS) of the same shape in the same run, and prints million multiply-adds per
second (MMAC/s) and the ratios. Targets on the CPU (2 cores): issue 3 (numpy): >= 100 MMAC/s for
fp32 sequential round-to-nearest-even on E4M3 inputs, >= 30 MMAC/s for the tensor-core models;
issue 11 (native): bf16/fp16 sequential and the H100/B200 FP8 models >= 5x numpy, fp32 sequential
>= 0.5x BLAS; issue 20 (native): every tensor-core (block-FMA) model >= 5x numpy and >= 0.25x
numpy's float32 matmul (BLAS) on the same shape and cores.

The targets against BLAS are judged on alternating blocks of 20 runs (native, then
BLAS, block by block; the median of the per-block ratios of median times), so that load from
other processes affects both sides alike. Single alternating calls are not used: OpenBLAS's
threads keep spinning for about 0.1 s after each call and take the second core from the next
native call (native ran at 34-42 GMAC/s right after a BLAS call and at 71 in a run of its own
calls, on 2 cores); each block starts with 0.2 s of warm-up calls. ``--only`` runs the models
whose name contains a string.

    python benchmarks/bench_gemm.py [--repeat 5] [--quick] [--only "fp32 sequential"]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from timing import median_time

import precision_lab as pl

TARGETS = {"fp32 sequential": 1e8, "tensor-core": 3e7}
#: issue 11: native / numpy (or native / BLAS for fp32 sequential)
NATIVE_TARGETS = {
    "fp32 sequential RNE": ("blas", 0.5),
    "bf16 sequential RNE": ("numpy", 5.0),
    "fp16 sequential toward_zero": ("numpy", 5.0),
    "H100 FP8 tensor-core model": ("numpy", 5.0),
    "B200 FP8 tensor-core model": ("numpy", 5.0),
    # issue 20: the presets off the block-FMA fast path's first domain
    "B200 MXFP8 block-scaled (tcgen05)": ("numpy", 5.0),
    "B200 MXFP4 block-scaled, groups of 16": ("numpy", 5.0),
    "H100 FP64 DMMA (fp64 FMA chain)": ("numpy", 5.0),
    "MI210 fp16 (flushed inputs, pairwise)": ("numpy", 5.0),
    "MI300X fp16 (separate addend)": ("numpy", 5.0),
    "MI100 fp16 (exact blocks of 4)": ("numpy", 5.0),
}
#: issue 20: native block-FMA models (every row whose target key is "tensor-core") / BLAS
BLOCKFMA_BLAS = 0.25


def block_ratio(ours: Callable[[], object], theirs: Callable[[], object], runs: int = 20) -> float:
    """Median time of ``theirs()`` over median time of ``ours()``, each in a block of ``runs``
    consecutive calls after 0.2 s of warm-up calls (which outlast OpenBLAS's spinning threads),
    ours first."""

    def block(fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        while time.perf_counter() - start < 0.2:
            fn()
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    t_ours = block(ours)
    return block(theirs) / t_ours


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smaller shapes (smoke test)")
    parser.add_argument(
        "--numpy-repeat", type=int, default=3, help="runs of the (slow) numpy backend"
    )
    parser.add_argument("--only", default="", help="models whose name contains this string")
    args = parser.parse_args(argv)
    native = importlib.import_module("precision_lab.backends.native.kernels").available()
    rng = np.random.default_rng(0)
    s = 4 if args.quick else 1

    def inputs(m: int, k: int, n: int, fmt: str) -> tuple[np.ndarray, np.ndarray]:
        a = pl.round_to(rng.uniform(-1, 1, (m, k)).astype(np.float32), fmt)
        b = pl.round_to(rng.uniform(-1, 1, (k, n)).astype(np.float32), fmt)
        return a, b

    def mx_scales(m: int, k: int, n: int) -> dict[str, object]:
        """E8M0 block scales along K (blocks of 32): powers of two 2**-8 .. 2**8."""
        return {
            "scale_a": 2.0 ** rng.integers(-8, 9, (m, k // 32)),
            "scale_b": 2.0 ** rng.integers(-8, 9, (k // 32, n)),
            "scale_block": 32,
        }

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
        ("H100 FP8 tensor-core model, square", "tensor-core", (512 // s,) * 3, "e4m3",
         pl.tensor_core("h100", "e4m3")),
        ("A100 fp16 tensor-core model", "tensor-core", (512 // s,) * 3, "fp16",
         pl.tensor_core("a100", "fp16")),
        ("V100 fp16 tensor-core model", "tensor-core", (512 // s,) * 3, "fp16",
         pl.tensor_core("v100", "fp16")),
        ("B200 bf16 tensor-core model", "tensor-core", (512 // s,) * 3, "bf16",
         pl.tensor_core("b200", "bf16")),
        ("H100 bf16 tensor-core model", "tensor-core", (512 // s,) * 3, "bf16",
         pl.tensor_core("h100", "bf16")),
        ("B200 MXFP8 block-scaled (tcgen05)", "tensor-core", (256 // s, 1024 // s, 256 // s),
         "e4m3", pl.tensor_core("b200", "mxfp8_e4m3", instruction="tcgen05"),
         mx_scales(256 // s, 1024 // s, 256 // s)),
        ("B200 MXFP4 block-scaled, groups of 16", "tensor-core", (512 // s, 1024 // s, 512 // s),
         "e2m1", pl.tensor_core("b200", "mxfp4_e2m1", instruction="tcgen05"),
         mx_scales(512 // s, 1024 // s, 512 // s)),
        ("H100 FP64 DMMA (fp64 FMA chain)", None, (128 // s,) * 3, "fp64",
         pl.tensor_core("h100", "fp64", out_format="fp64"), {"out_format": "fp64"}),
        ("MI210 fp16 (flushed inputs, pairwise)", None, (128 // s,) * 3, "fp16",
         pl.tensor_core("mi210", "fp16")),
        ("MI300X fp16 (separate addend)", None, (256 // s, 1024 // s, 256 // s), "fp16",
         pl.tensor_core("mi300x", "fp16")),
        ("MI100 fp16 (exact blocks of 4)", None, (128 // s,) * 3, "fp16",
         pl.tensor_core("mi100", "fp16")),
    ]  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; native kernels: "
          f"{importlib.import_module('precision_lab.backends.native.kernels').isa()}")  # fmt: skip
    print(f"{'model':38s} {'M x K x N':>14s} {'numpy':>8s} {'native':>8s} {'BLAS':>9s} "
          f"{'nat/np':>7s} {'nat/BLAS':>9s}  targets (MMAC/s)")  # fmt: skip
    ok = True
    for label, target_key, (m, k, n), fmt, acc, *more in cases:
        if args.only.lower() not in label.lower():
            continue
        a, b = inputs(m, k, n, fmt)
        macs = m * k * n
        extra = more[0] if more else {}

        def run(backend: str, a=a, b=b, acc=acc, fmt=fmt, extra=extra) -> object:
            return pl.gemm(
                a, b, input_format=fmt, accumulator=acc, input_rounding="exact", backend=backend,
                **extra,
            )  # fmt: skip

        rate = macs / median_time(lambda: run("numpy"), args.numpy_repeat)
        nrate = macs / median_time(lambda: run("native"), args.repeat) if native else 0.0
        blas = macs / median_time(lambda a=a, b=b: np.matmul(a, b), args.repeat)
        target = ""
        if target_key is not None and not args.quick:
            goal = TARGETS[target_key]
            passed = rate >= goal
            ok &= passed
            target = f"numpy >= {goal / 1e6:.0f} {'ok' if passed else 'MISSED'}"
        paired = ""
        goals = []
        if label in NATIVE_TARGETS:
            goals.append(NATIVE_TARGETS[label])
        if target_key == "tensor-core":
            goals += [("numpy", 5.0)] * (label not in NATIVE_TARGETS) + [("blas", BLOCKFMA_BLAS)]
        for ref, factor in goals if native and not args.quick else []:
            got = nrate / rate
            if ref == "blas":
                got = statistics.median(
                    block_ratio(lambda: run("native"), lambda a=a, b=b: np.matmul(a, b))
                    for _ in range(max(args.repeat, 9))
                )
                paired += f"\n{'':38s} native / BLAS, median of alternating blocks: {got:.3f}"
            passed = got >= factor
            ok &= passed
            target += f"; native >= {factor}x {ref} {'ok' if passed else 'MISSED'}"
        print(
            f"{label:38s} {f'{m}x{k}x{n}':>14s} {rate / 1e6:8.1f} {nrate / 1e6:8.1f} "
            f"{blas / 1e6:9.1f} {nrate / rate:7.1f} {nrate / blas:9.4f}  {target}{paired}"
        )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
