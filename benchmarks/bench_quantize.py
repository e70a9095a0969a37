"""INT8 quantize/dequantize throughput: native kernels against the numpy path (and torch).

16M float32 values, N(0, 1) * 100, shape 4096 x 4096, per tensor and per channel (axis 0).
Prints million elements per second (medians of ``--repeat`` runs, one process, all cores), the
native/numpy ratio, torch's ``quantize_per_tensor`` / ``quantize_per_channel`` where torch is
installed (same thread count), and the peak extra memory of each call as a multiple of the
output's size (tracemalloc: numpy allocations). Target of issue 11: quantize int8 per channel
>= 1x torch.quantize_per_channel, peak extra memory <= 1.5x the output. torch is not a dependency
of the project: run this from a separate venv that has the project and a CPU build of torch
(``python -m venv .venv-bench && .venv-bench/bin/pip install -e . torch``; git-ignored).
Same computation: torch rounds ``float32(x) * float32(1 / float32(scale))`` half to even, ours
the exact quotient (they differ where that float32 product falls on the other side of a .5,
about 1 element in 10**6; ``division="torch"`` reproduces torch bit for bit).

    python benchmarks/bench_quantize.py [--repeat 5] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import os
import tracemalloc
from collections.abc import Callable

import numpy as np
from timing import median_time

import precision_lab as pl

native_kernels = importlib.import_module("precision_lab.backends.native.kernels")


def peak_bytes(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def numpy_path(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        saved = native_kernels.ext
        native_kernels.ext = None
        try:
            return fn()
        finally:
            native_kernels.ext = saved

    return run


def torch_cases(x: np.ndarray, scale: np.ndarray) -> dict[str, Callable[[], object]]:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return {}
    torch.set_num_threads(os.cpu_count() or 1)
    t = torch.from_numpy(x)
    s = torch.from_numpy(scale.astype(np.float64))
    z = torch.zeros(len(scale), dtype=torch.int64)
    s0 = float(scale.max())
    return {
        "quantize int8 per tensor": lambda: torch.quantize_per_tensor(t, s0, 0, torch.qint8),
        "quantize int8 per channel": lambda: torch.quantize_per_channel(t, s, z, 0, torch.qint8),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1M elements (smoke test)")
    args = parser.parse_args(argv)
    side = 1024 if args.quick else 4096
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((side, side)) * 100).astype(np.float32)
    scale = (np.abs(x).max(axis=1) / 127).astype(np.float32)
    q = pl.quantize(x, "int8", scale, axis=0)
    cases: dict[str, Callable[[], object]] = {
        "quantize int8 per tensor": lambda: pl.quantize(x, "int8", float(scale.max())),
        "quantize int8 per channel": lambda: pl.quantize(x, "int8", scale, axis=0),
        "quantize int8 per channel, torch division": lambda: pl.quantize(
            x, "int8", scale, axis=0, division="torch"
        ),
        "dequantize int8 per channel": lambda: pl.dequantize(q, scale, axis=0),
    }
    torch = torch_cases(x, scale)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; native kernels: "
          f"{native_kernels.isa()}; torch: {'yes' if torch else 'not installed'}")  # fmt: skip
    head = ["native", "numpy", "ratio", "torch", "nat/torch", "peak nat", "peak np"]
    widths = [8, 8, 6, 8, 9, 9, 8]
    cols = " ".join(f"{h:>{w}s}" for h, w in zip(head, widths, strict=True))
    print(f"{'operation (Melem/s; peak memory / output)':44s} {cols}")
    ok = True
    for label, fn in cases.items():
        rate = x.size / median_time(fn, args.repeat) / 1e6
        np_rate = x.size / median_time(numpy_path(fn), max(1, args.repeat // 2)) / 1e6
        out_bytes = x.size * (1 if label.startswith("quantize") else 4)
        peak = peak_bytes(fn) / out_bytes
        np_peak = peak_bytes(numpy_path(fn)) / out_bytes
        t_rate = x.size / median_time(torch[label], args.repeat) / 1e6 if label in torch else 0.0
        vs_torch = f"{rate / t_rate:9.2f}" if t_rate else f"{'-':>9s}"
        if label == "quantize int8 per channel" and native_kernels.available():
            ok &= peak <= 1.5 and (not t_rate or rate >= t_rate)
        print(
            f"{label:44s} {rate:8.1f} {np_rate:8.1f} {rate / np_rate:6.1f} {t_rate:8.1f} "
            f"{vs_torch} {peak:9.2f} {np_peak:8.2f}"
        )
    return 0 if ok or args.quick else 1


if __name__ == "__main__":
    raise SystemExit(main())
