"""Cost of ``precision_lab.torch.simulate`` against FP32 torch, and the bits it computes (issue 34).

The model: a 2-layer character GPT (``precision_lab.studies.language_model.CharGPT``: d = 128,
4 heads, context 64, batch 8; blocks of ``F.scaled_dot_product_attention`` (``--model sdpa``)
or ``nn.TransformerEncoderLayer`` (``--model encoder``), one forward + backward of the
cross-entropy loss per step. Contenders: FP32 torch (the model itself), ``simulate`` under the
policies ``float32``, ``mixed_bfloat16``, ``mixed_float16`` and the recipes ``te_mxfp8`` and
``te_nvfp4`` (their default tensor-core accumulators), and the recipes with
``accumulator=Accumulator("fp32")``. Each round times one step of every contender, in turn
(interleaved, so a load change hits all of them alike); the report is the median over the rounds
of each contender's time divided by FP32 torch's in the same round. Goals (issue 34): policies
within 2x, recipes within 5x.

``--hashes FILE`` writes, and ``--check FILE`` compares, the SHA-256 of the outputs and of
every parameter gradient of one fixed seeded step per contender (the bits a speed change must
keep).

Usage: python benchmarks/bench_simulate.py [--rounds 7] [--model sdpa] [--only te_nvfp4 ...]
       python benchmarks/bench_simulate.py --hashes before.json   (then --check before.json)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

# the checkout this file lives in, not whatever precision_lab is installed (an editable install
# of another worktree would otherwise be the one measured and hashed)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import precision_lab as pl
import precision_lab.torch as plt
from precision_lab.studies.language_model import CharGPT

VOCAB, D, HEADS, LAYERS, CONTEXT, BATCH = 96, 128, 4, 2, 64, 8

#: name -> (policy or recipe, accumulator)
CONTENDERS: dict[str, tuple[str | None, Any]] = {
    "fp32 torch": (None, None),
    "float32": ("float32", None),
    "mixed_bfloat16": ("mixed_bfloat16", None),
    "mixed_float16": ("mixed_float16", None),
    "te_mxfp8": ("te_mxfp8", None),
    "te_nvfp4": ("te_nvfp4", None),
    "te_mxfp8 fp32-acc": ("te_mxfp8", pl.Accumulator("fp32")),
    "te_nvfp4 fp32-acc": ("te_nvfp4", pl.Accumulator("fp32")),
}


def build(model: str, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The model and one batch (token ids and targets), seeded."""
    net = CharGPT(vocab=VOCAB, d=D, heads=HEADS, layers=LAYERS, context=CONTEXT,
                  attention=model, seed=seed)  # fmt: skip
    rng = np.random.default_rng(seed + 1)
    tokens = torch.from_numpy(rng.integers(0, VOCAB, size=(BATCH, CONTEXT + 1)))
    return net, tokens[:, :-1], tokens[:, 1:]


def stepper(name: str, model: str) -> Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]:
    """One forward + backward of contender ``name`` on a fresh seeded model: returns a
    function that runs the step and gives the logits and the parameter gradients."""
    net, x, y = build(model)
    policy, acc = CONTENDERS[name]
    run = net if policy is None else plt.simulate(net, policy, accumulator=acc, seed=5)

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        net.zero_grad(set_to_none=True)
        logits = run(x)
        F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)).backward()
        return logits.detach(), [p.grad for p in net.parameters()]

    return step


def hashes(model: str, names: list[str]) -> dict[str, str]:
    """SHA-256 of the logits and every parameter gradient of one step per contender."""
    out = {}
    for name in names:
        if CONTENDERS[name][0] is None:
            continue  # FP32 torch: BLAS, machine dependent
        torch.manual_seed(0)
        logits, grads = stepper(name, model)()
        h = hashlib.sha256(logits.numpy().tobytes())
        for g in grads:
            h.update(b"none" if g is None else g.numpy().tobytes())
        out[f"{model}/{name}"] = h.hexdigest()
    return out


def bench(model: str, names: list[str], rounds: int) -> dict[str, list[float]]:
    steps = {n: stepper(n, model) for n in names}
    for s in steps.values():  # warm up (pools, caches, delayed-scaling history)
        s()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            t0 = time.perf_counter()
            steps[n]()
            times[n].append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--model", choices=("sdpa", "encoder", "both"), default="both")
    p.add_argument("--only", action="append", help="contender name (repeatable); FP32 torch "
                   "always runs")  # fmt: skip
    p.add_argument("--hashes", help="write the contenders' output/gradient hashes to this file")
    p.add_argument("--check", help="compare the hashes with this file (exit 1 if any differs)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = list(CONTENDERS)
    if args.only:
        unknown = set(args.only) - set(names)
        if unknown:
            p.error(f"unknown contender(s) {sorted(unknown)}; known: {names}")
        names = ["fp32 torch", *[n for n in names if n in args.only and n != "fp32 torch"]]
    models = ["sdpa", "encoder"] if args.model == "both" else [args.model]
    load = os.getloadavg()
    print(f"# torch {torch.__version__}, {args.threads} torch thread(s), precision_lab pool "
          f"workers {pl.core.pool.WORKERS}, load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}, {os.cpu_count()} CPUs; precision_lab from "
          f"{os.path.dirname(pl.__file__)}")  # fmt: skip
    if args.hashes or args.check:
        found: dict[str, str] = {}
        for m in models:
            try:
                found.update(hashes(m, names))
            except NotImplementedError as e:
                print(f"{m}: not emulated here ({e})")
        if args.hashes:
            with open(args.hashes, "w") as f:
                json.dump(found, f, indent=1, sort_keys=True)
            print(f"wrote {len(found)} hashes to {args.hashes}")
        if args.check:
            with open(args.check) as f:
                want = json.load(f)
            bad = [k for k in want if k in found and found[k] != want[k]]
            missing = sorted(set(want) - set(found))
            for k in sorted(want):
                state = "MISSING" if k in missing else ("DIFFERS" if k in bad else "same")
                print(f"{k:32s} {state}")
            return 1 if bad or missing else 0
        return 0
    for m in models:
        try:
            times = bench(m, names, args.rounds)
        except NotImplementedError as e:
            print(f"\n{m}: not emulated here ({e})")
            continue
        base = times["fp32 torch"]
        print(f"\nmodel {m!r}: {LAYERS} layers, d = {D}, {HEADS} heads, L = {CONTEXT}, batch "
              f"{BATCH}, forward + backward; {args.rounds} rounds, interleaved")  # fmt: skip
        print(f"{'contender':22s} {'median ms':>10s} {'min ms':>8s} {'median ratio':>13s}")
        for n in names:
            ratio = statistics.median(t / b for t, b in zip(times[n], base, strict=True))
            print(f"{n:22s} {statistics.median(times[n]) * 1e3:10.1f} "
                  f"{min(times[n]) * 1e3:8.1f} {ratio:12.2f}x")  # fmt: skip
    load = os.getloadavg()
    print(f"# load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
