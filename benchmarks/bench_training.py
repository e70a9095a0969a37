"""Cost of emulated mixed-precision training, and of underflow_stats.

1. One epoch of the training run's MLP (digits, ``precision_lab.training``) under emulated FP16
   mixed precision -- every GEMM through ``pl.gemm`` with fp32 accumulation modelled by BLAS
   (``Accumulator("fp32", order="blas")``: exact products of the fp16 inputs, float32 sums in BLAS
   order), activations and gradients rounded to fp16, loss scaling, fp32 master weights and Adam
   -- against one FP32 epoch of the same network in plain numpy (float32 matmuls, no rounding).
   Target (issue 4): at most 10x. The same epoch with the exact sequential fp32 accumulator
   (``Accumulator("fp32")``: every addition rounded once from its exact value) is timed beside it
   for the report's network (for the wide one it would take minutes).
   Two widths: the report's network (hidden 64-64-64, tiny GEMMs: fixed per-call costs dominate)
   and a wide one (hidden 1024-1024-1024, the GEMMs dominate).
2. ``underflow_stats`` on 10**7 log-normal gradients against ``round_to`` on them plus one
   histogram (``np.histogram`` of log2|g| in 64 uniform bins). Target: not slower.

Median of ``--repeat`` (>= 5) runs each. BLAS is limited to one thread (the training code does the
same: its GEMMs are small).

Usage: python benchmarks/bench_training.py [--repeat 5] [--n 10000000] [--skip-exact]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits
from timing import median_time

import precision_lab as pl
from precision_lab.scaling.gradients import lognormal
from precision_lab.training import MLP, RUNS, load_digits_split, make_scaler, softmax_xent


def batches(x: np.ndarray, y: np.ndarray, bs: int, seed: int = 0):  # type: ignore[no-untyped-def]
    perm = np.random.default_rng(seed).permutation(len(y))
    for lo in range(0, len(y) - bs + 1, bs):
        idx = perm[lo : lo + bs]
        yield x[idx], y[idx]


class NumpyMLP:
    """The same network and optimizer in plain float32 numpy: the FP32 reference epoch."""

    def __init__(self, sizes: list[int], init_std: float, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.W = [
            (rng.standard_normal((m, n)) * init_std).astype(np.float32)
            for m, n in itertools.pairwise(sizes)
        ]
        self.b = [np.zeros(n, np.float32) for n in sizes[1:]]
        self.m = [np.zeros_like(p) for p in (*self.W, *self.b)]
        self.v = [np.zeros_like(p) for p in (*self.W, *self.b)]
        self.t = 0

    def step(self, x: np.ndarray, y: np.ndarray, lr: float = 0.01) -> None:
        hs, zs = [x], []
        for i, (w, b) in enumerate(zip(self.W, self.b, strict=True)):
            z = hs[-1] @ w + b
            zs.append(z)
            hs.append(np.maximum(z, 0) if i < len(self.W) - 1 else z)
        z = hs[-1] - hs[-1].max(axis=1, keepdims=True)
        e = np.exp(z)
        g = e / e.sum(axis=1, keepdims=True)
        g[np.arange(len(y)), y] -= 1
        g /= np.float32(len(y))
        gW, gb = [None] * len(self.W), [None] * len(self.W)
        for i in range(len(self.W) - 1, -1, -1):
            gW[i] = hs[i].T @ g
            gb[i] = g.sum(axis=0)
            if i:
                g = (g @ self.W[i].T) * (zs[i - 1] > 0)
        self.t += 1
        c1, c2 = 1 - 0.9**self.t, 1 - 0.999**self.t
        params = [*self.W, *self.b]
        for j, (p, gr) in enumerate(zip(params, [*gW, *gb], strict=True)):
            self.m[j] = 0.9 * self.m[j] + 0.1 * gr
            self.v[j] = 0.999 * self.v[j] + 0.001 * gr * gr
            p -= np.float32(lr) * (self.m[j] / c1) / (np.sqrt(self.v[j] / c2) + 1e-8)


def emulated_epoch(cfg, x: np.ndarray, y: np.ndarray) -> Callable[[], None]:  # type: ignore[no-untyped-def]
    sizes = [x.shape[1], *cfg.hidden, 10]
    net = MLP(sizes, cfg, [np.random.default_rng(0)])
    scaler = make_scaler(cfg)

    def run() -> None:
        for xb, yb in batches(x, y, cfg.batch_size):
            logits = net.forward(xb[None], train=True)
            _, p = softmax_xent(logits, yb[None])
            s = scaler.scale
            gW, gb, _ = net.backward(p, yb[None], np.array([s]))
            finite = all(np.isfinite(g).all() for g in (*gW, *gb))
            taken = scaler.update(not finite)
            net.step(gW, gb, np.array([scaler.inv_scale]), cfg.lr, np.array([taken]))

    return run


def bench_epochs(repeat: int, skip_exact: bool) -> None:
    d = load_digits_split(seed=0)
    print("1. one training epoch (digits, 1347 images; batch 512 -> 2 steps)")
    print(
        f"{'network':18s} {'fp32 numpy':>12s} {'fp16 (BLAS acc)':>16s} {'ratio':>7s} "
        f"{'fp16 (exact seq)':>17s} {'ratio':>8s}"
    )
    for hidden in [(64, 64, 64), (1024, 1024, 1024)]:
        base = RUNS["fp16_static"].replace(hidden=hidden)
        sizes = [64, *hidden, 10]
        ref = NumpyMLP(sizes, base.init_std)

        def fp32_epoch(ref: NumpyMLP = ref, bs: int = base.batch_size) -> None:
            for xb, yb in batches(d.x_train, d.y_train, bs):
                ref.step(xb, yb)

        t32 = median_time(fp32_epoch, repeat)
        t16 = median_time(emulated_epoch(base, d.x_train, d.y_train), repeat)
        line = f"{'-'.join(map(str, hidden)):18s} {1e3 * t32:10.1f}ms {1e3 * t16:14.1f}ms "
        line += f"{t16 / t32:6.1f}x"
        if not skip_exact and hidden[0] <= 64:  # sequential over K=1024 would take minutes
            exact = base.replace(accumulator=pl.Accumulator("fp32"))
            tex = median_time(emulated_epoch(exact, d.x_train, d.y_train), repeat)
            line += f" {1e3 * tex:15.1f}ms {tex / t32:7.0f}x"
        elif not skip_exact:
            line += f" {'(not run)':>17s}"
        print(line, flush=True)
    print("   target: fp16 with BLAS-modelled fp32 accumulation <= 10x the fp32 numpy epoch")


def bench_underflow(n: int, repeat: int) -> None:
    g = lognormal(n, mu=-24.0, sigma=4.0, seed=0)
    print(f"\n2. underflow_stats on {n:.0e} float32 log-normal gradients (fp16, scale 2^10)")

    def stats() -> None:
        pl.underflow_stats(g, "fp16", 1024.0)

    def core_and_hist() -> None:
        pl.round_to(g * np.float32(1024.0), "fp16")
        np.histogram(np.log2(np.abs(g)), bins=64, range=(-64.0, 0.0))

    def naive() -> None:  # what one would write by hand: several full passes
        q = pl.round_to(g.astype(np.float64) * 1024.0, "fp16")
        nz = g != 0
        _ = np.mean((q == 0) & nz), np.mean((np.abs(q) < 2.0**-14) & (q != 0))
        np.histogram(np.log2(np.abs(g[nz])), bins=np.arange(-150, 21))
        d = q / 1024.0 - g
        _ = np.abs(d).sum() / np.abs(g).sum(), np.linalg.norm(d) / np.linalg.norm(g)

    ts = median_time(stats, repeat)
    tc = median_time(core_and_hist, repeat)
    tn = median_time(naive, repeat)
    print(f"   underflow_stats                      {1e3 * ts:8.1f} ms")
    print(f"   round_to + np.histogram(log2|g|)     {1e3 * tc:8.1f} ms   ratio {ts / tc:.2f}")
    print(f"   naive numpy (float64, masks, hist)   {1e3 * tn:8.1f} ms   ratio {ts / tn:.2f}")
    print("   target: underflow_stats <= round_to + one histogram (ratio <= 1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--n", type=int, default=10**7)
    parser.add_argument("--skip-exact", action="store_true", help="skip the exact accumulator")
    args = parser.parse_args()
    repeat = max(args.repeat, 5)
    with threadpool_limits(limits=1, user_api="blas"):
        bench_epochs(repeat, args.skip_exact)
    bench_underflow(args.n, repeat)


if __name__ == "__main__":
    main()
