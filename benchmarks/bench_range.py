"""Cast throughput outside the normal range: gradient-like data that underflows or overflows.

Gradients cast to fp16/e5m2/e4m3 are mostly subnormal or underflow to zero; activations scaled up
overflow. This bench times round_to (and encode) on one thread for such data next to data within
the normal range, in the same run, and prints the ratio (target: outside/in-range >= 0.5, i.e.
within 2x of the in-range speed, for every deterministic mode and both switches):

  in range   N(0,1) * 100 (e4m3, e5m2) or N(0,1) (fp16): almost every element is normal
  tiny       N(0,1) * 1e-6: below every 8/16-bit format's smallest normal (subnormal or zero)
  huge       N(0,1) * 1e4 (e4m3) or N(0,1) * 1e6 (e5m2, fp16): mostly above the format's max

The share of elements below the smallest normal / above the max is printed beside each case, and
the load average before and after the run (benchmarks on a loaded machine are noisy: compare the
ratios, which are measured in the same run).

Usage: python benchmarks/bench_range.py [--n 4000000] [--repeat 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from timing import rate

import precision_lab as pl
from precision_lab.core import pool as _parallel

#: (format, scale of the in-range data, scale of the overflowing data)
FORMATS = (("e5m2", 100.0, 1e6), ("e4m3", 100.0, 1e4), ("fp16", 1.0, 1e6))
MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd", "nearest_zero")


def shares(x: np.ndarray, fmt: pl.FloatFormat) -> str:
    """The fraction of |x| below the format's smallest normal and above its max, as text."""
    a = np.abs(x.astype(np.float64))
    return f"{np.mean(a < fmt.smallest_normal):4.0%} low {np.mean(a > fmt.max):4.0%} over"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=4_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    n, rep = args.n, args.repeat
    load0 = os.getloadavg()
    print(
        f"{n / 1e6:g}M float32 values, median of {rep}, {args.threads} thread(s), "
        f"{os.cpu_count()} cores, load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} "
        f"before the run; backend {pl.backend_info()['round_to']}"
    )
    z = np.random.default_rng(0).standard_normal(n)
    rows: list[tuple[str, str, float, float]] = []  # (case, shares, Melem/s, ratio to in range)
    with _parallel.use_workers(args.threads):
        for name, scale_in, scale_over in FORMATS:
            fmt = pl.get_format(name)
            inside = (z * scale_in).astype(np.float32)
            tiny = (z * 1e-6).astype(np.float32)
            huge = (z * scale_over).astype(np.float32)

            def r(x: np.ndarray, op=pl.round_to, fmt=fmt, **kw) -> float:
                return rate(lambda: op(x, fmt, **kw), n, rep)

            base = r(inside)
            base_enc = r(inside, op=pl.encode)
            rows.append((f"{name} in range", shares(inside, fmt), base, 1.0))
            cases: list[tuple[str, np.ndarray, dict, float]] = [
                ("tiny", tiny, {}, base),
                ("tiny flush", tiny, {"subnormals": "flush"}, base),
                ("huge", huge, {}, base),
                ("huge saturate", huge, {"overflow": "saturate"}, base),
            ]
            if name == "e5m2":
                cases += [(f"tiny {m}", tiny, {"rounding": m}, base) for m in MODES[1:]]
                cases += [(f"huge {m}", huge, {"rounding": m}, base) for m in MODES[1:]]
                for dt in (np.float64, np.float16):  # against in-range data of the same dtype
                    ref = r(inside.astype(dt))
                    label = f"{name} in range {dt.__name__} input"
                    rows.append((label, shares(inside, fmt), ref, 1.0))
                    cases.append((f"tiny {dt.__name__} input", tiny.astype(dt), {}, ref))
            for case, x, kw, ref in cases:
                v = r(x, **kw)
                rows.append((f"{name} {case}", shares(x, fmt), v, v / ref))
            rows.append((f"{name} encode in range", shares(inside, fmt), base_enc, 1.0))
            for case, x in (("tiny", tiny), ("huge", huge)):
                v = r(x, op=pl.encode)
                rows.append((f"{name} encode {case}", shares(x, fmt), v, v / base_enc))
    width = max(len(c) for c, *_ in rows)
    print(f"\n{'round_to (encode) float32 unless said':{width}s}  {'elements':>17s}  Melem/s  "
          "/ in range")  # fmt: skip
    for case, share, v, ratio in rows:
        print(f"{case:{width}s}  {share:>17s}  {v:7.0f}  {ratio:9.2f}")
    worst = min(ratio for *_, ratio in rows)
    load1 = os.getloadavg()
    print(
        f"\nworst ratio outside/in range: {worst:.2f} (target >= 0.5); load average "
        f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} after the run"
    )


if __name__ == "__main__":
    main()
