"""Check every tensor-core preset against the real GPU measurements, bit for bit.

With ../shared/data/tensor-core-validation present (the full data, 5000 cases per set) every
archive is read as it is; otherwise the 500-case subset shipped in tests/gemm/data/tensor_core is
used. Prints one line per (set, output format) and a summary; exits 1 if a set that the presets
claim to reproduce has a mismatch.

    python benchmarks/verify_tensor_cores.py [--data DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from precision_lab.gemm.tensor_core import APPROXIMATE, GPUS
from precision_lab.gemm.validation import check_set, load_archive, load_subset

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data" / "tensor-core-validation"
SUBSET = ROOT / "tests" / "gemm" / "data" / "tensor_core" / "measurements_500.npz"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=SHARED, help="folder of GPU_FORMAT.tgz")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    archives = sorted(args.data.glob("*.tgz")) if args.data.is_dir() else []
    if archives:
        sets = [load_archive(p) for p in archives]
        source = f"{args.data} (full data)"
    else:
        sets = load_subset(SUBSET)
        source = f"{SUBSET} (500-case subset; ../shared not found)"
    print(f"tensor-core measurements: {source}")
    failed = []
    exact = approx = 0
    for s in sets:
        for out in sorted(s.d):
            r = check_set(s, out)
            known = APPROXIMATE.get((GPUS[s.gpu.lower()], s.fmt.lower(), out))
            ok = r.matches == r.cases
            tag = "exact" if ok else ("approximate model: " + known if known else "MISMATCH")
            print(f"  {s.name:10s} -> {out}: {r.matches:5d}/{r.cases}  {tag}")
            if ok:
                exact += 1
            elif known:
                approx += 1
            else:
                failed.append(str(r))
    took = time.perf_counter() - t0
    print(
        f"{exact} sets bit-exact, {approx} known approximate, {len(failed)} failed ({took:.1f} s)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
