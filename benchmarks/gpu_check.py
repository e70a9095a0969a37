"""The one script to run on a GPU machine (H100/H200 class): checks and timings, as JSON.

    python benchmarks/gpu_check.py [report.json]      # default: $OUT/gpu_check.json, else ./

Sections (each in try/except, recorded in the report, which is rewritten after every section so
that a run cut short still leaves what it did; the whole run stays under about 5 minutes):

1. ``environment``: versions, the GPU, its compute capability;
2. ``compile``: NVRTC compile time of the two kernel modules (CuPy caches them on disk);
3. ``pytest``: ``pytest -m gpu tests/backends/test_gpu.py`` (kernels against the numpy reference);
4. ``elementwise``: round_to / encode / decode on the GPU against the CPU core, bit for bit, for
   every registry format, every rounding mode, both overflow modes, float32 and float64 random
   and edge inputs;
5. ``gemm``: pl.gemm on the GPU against the numpy reference, bit for bit, for every kind of model
   and every tensor-core preset, on random inputs, large inputs (overflow) and special values;
6. ``timing``: each GEMM kernel in emulated multiply-adds per second, next to cuBLAS SGEMM
   (``cupy.matmul`` on float32) in the same run (median of 5 after a warm-up); the elementwise
   kernels in elements per second next to a device copy.

``verdict`` sums it up: ``ok`` (exit 0), ``failed`` with the problems (exit 1: a section's
error or skip, results not bit-exact, pytest failing), or, without CuPy or a visible GPU,
``nothing checked`` with the reason, on stderr too (exit 2, and no section is attempted).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "backends"))

#: PL_GPU_CHECK_SMALL=1: tiny shapes, for a dry run of the script on an emulated CuPy
SMALL = os.environ.get("PL_GPU_CHECK_SMALL") == "1"
START = time.monotonic()
BUDGET_S = 285.0
REPORT: dict[str, Any] = {"script": "benchmarks/gpu_check.py", "started": time.ctime()}


def _out_path() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    out = os.environ.get("OUT")
    return Path(out, "gpu_check.json") if out else Path("gpu_check.json")


OUT_PATH = _out_path()


def left() -> float:
    return BUDGET_S - (time.monotonic() - START)


def save() -> None:
    REPORT["elapsed_s"] = round(time.monotonic() - START, 2)
    OUT_PATH.parent.mkdir(parents=True, exist_ok=True)
    OUT_PATH.write_text(json.dumps(REPORT, indent=2, default=str))


def section(name: str, need_s: float = 10.0):
    """Decorator: run a section, record its result or its error, save the report."""

    def deco(fn):
        def run() -> None:
            t0 = time.monotonic()
            if left() < need_s:
                REPORT[name] = {"skipped": f"not enough time left ({left():.0f} s)"}
            else:
                try:
                    REPORT[name] = fn()
                except Exception as exc:
                    REPORT[name] = {"error": f"{type(exc).__name__}: {exc}",
                                    "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            if isinstance(REPORT[name], dict):
                REPORT[name]["seconds"] = round(time.monotonic() - t0, 2)
            save()
            print(f"[{time.monotonic() - START:6.1f} s] {name}: "
                  f"{json.dumps(REPORT[name], default=str)[:300]}", flush=True)  # fmt: skip

        return run

    return deco


def bits_equal(got: Any, want: Any) -> tuple[int, list[int]]:
    """Number of elements whose bits differ, and the first few flat indices."""
    import numpy as np

    g = got.get() if hasattr(got, "get") else np.asarray(got)
    w = np.asarray(want)
    if g.dtype != w.dtype or g.shape != w.shape:
        return -1, []
    ut = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
    bad = np.flatnonzero(g.view(ut[g.itemsize]).ravel() != w.view(ut[w.itemsize]).ravel())
    return int(bad.size), bad[:5].tolist()


def gemm_equal(got: Any, want: Any) -> tuple[int, list[int], int]:
    """Like bits_equal but NaN signs are not compared (numpy's NaN propagation picks either
    operand's NaN by array length, so the reference's NaN signs are not reproducible); NaN
    positions are. Also returns how many NaNs differ in sign only."""
    import numpy as np

    g = (got.get() if hasattr(got, "get") else np.asarray(got)).copy()
    w = np.array(want)
    if g.dtype != w.dtype or g.shape != w.shape:
        return -1, [], 0
    nan_w, nan_g = np.isnan(w), np.isnan(g)
    sign_only = int((nan_w & nan_g & (np.signbit(w) != np.signbit(g))).sum())
    both = nan_w & nan_g
    g[both] = w[both] = 0
    n, idx = bits_equal(g, w)
    return n, idx, sign_only


def median_time(cp: Any, fn, repeats: int = 5) -> float:
    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return statistics.median(times)


# ----- sections --------------------------------------------------------------------------------
@section("environment", need_s=1)
def environment() -> dict[str, Any]:
    import numpy as np

    info: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__,
                            "machine": platform.machine()}  # fmt: skip
    import cupy as cp

    info["cupy"] = cp.__version__
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    info["device"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    info["compute_capability"] = dev.compute_capability
    info["sm_count"] = props.get("multiProcessorCount")
    info["memory_gib"] = round(props.get("totalGlobalMem", 0) / 2**30, 1)
    info["driver"] = cp.cuda.runtime.driverGetVersion()
    info["runtime"] = cp.cuda.runtime.runtimeGetVersion()
    try:
        info["nvrtc"] = cp.cuda.nvrtc.getVersion()
    except Exception as exc:  # pragma: no cover
        info["nvrtc"] = repr(exc)
    return info


@section("compile", need_s=20)
def compile_modules() -> dict[str, Any]:
    from precision_lab.backends import gpu

    out: dict[str, Any] = {}
    for name, kernel in (("pl_round.cu", "pl_round_f32"), ("pl_gemm.cu", "pl_gemm_generic_f32")):
        t0 = time.monotonic()
        gpu.module(name).get_function(kernel)
        out[name + "_s"] = round(time.monotonic() - t0, 2)
    return out


@section("pytest", need_s=60)
def pytest_gpu() -> dict[str, Any]:
    timeout = max(30.0, min(150.0, left() - 100.0))
    cmd = [sys.executable, "-m", "pytest", "tests/backends/test_gpu.py", "-m", "gpu", "-q", "-rfEs",
           "-p", "no:cacheprovider", "-o", "addopts="]  # fmt: skip
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                             check=False)  # fmt: skip
        out = res.stdout + res.stderr
        summary = [ln for ln in out.splitlines() if " passed" in ln or " failed" in ln
                   or " skipped" in ln or " error" in ln]  # fmt: skip
        return {"returncode": res.returncode, "summary": summary[-1:] if summary else [],
                "tail": out[-6000:]}  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-6000:]
        return {
            "returncode": None,
            "timeout_s": timeout,
            "tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail,
        }


@section("elementwise", need_s=30)
def elementwise() -> dict[str, Any]:
    import cupy as cp
    import numpy as np

    import precision_lab as pl
    from precision_lab import FORMATS, FloatFormat

    rng = np.random.default_rng(0)
    codes16 = np.arange(1 << 16, dtype=np.uint32)
    x32 = np.concatenate([
        codes16.astype(np.uint16).view(np.float16).astype(np.float32),
        (codes16 << np.uint32(16)).view(np.float32),
        (rng.standard_normal(50000) * np.exp2(rng.integers(-30, 30, 50000))).astype(np.float32),
    ])  # fmt: skip
    x64 = np.concatenate([
        np.ldexp(1 + rng.random(60000), rng.integers(-140, 140, 60000))
        * rng.choice([-1, 1], 60000),
        rng.integers(0, 2**63, 20000, dtype=np.int64).view(np.float64),
        [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 1e308, 448.0, 464.0, 57344.0, 61440.0],
    ])  # fmt: skip
    total, bad, failures = 0, 0, []
    for name, fmt in FORMATS.items():
        modes = pl.ROUNDING_MODES
        for x in (x32, x64):
            xd = cp.asarray(x)
            for mode in modes:
                for overflow in ("ieee", "saturate"):
                    kw = {"rounding": mode, "seed": 12345, "random_bits": None}
                    if isinstance(fmt, FloatFormat):
                        kw["overflow"] = overflow
                    elif overflow == "saturate":
                        continue
                    n, idx = bits_equal(pl.round_to(xd, fmt, **kw), pl.round_to(x, fmt, **kw))
                    total += 1
                    if n:
                        bad += 1
                        failures.append(f"round_to {name} {x.dtype} {kw}: {n} differ at {idx}")
                    xs = x[~np.isnan(x)] if not getattr(fmt, "has_nan", False) else x
                    n, idx = bits_equal(pl.encode(cp.asarray(xs), fmt, **kw),
                                        pl.encode(xs, fmt, **kw))  # fmt: skip
                    total += 1
                    if n:
                        bad += 1
                        failures.append(f"encode {name} {x.dtype} {kw}: {n} differ at {idx}")
        if fmt.bits <= 16:
            codes = np.arange(1 << fmt.bits, dtype=np.uint64).astype(fmt.code_dtype)
        else:
            codes = rng.integers(0, 1 << fmt.bits, 100000, dtype=np.uint64).astype(fmt.code_dtype)
        n, idx = bits_equal(pl.decode(cp.asarray(codes), fmt), pl.decode(codes, fmt))
        total += 1
        if n:
            bad += 1
            failures.append(f"decode {name}: {n} differ at {idx}")
    return {"checks": total, "mismatching_checks": bad, "bit_exact": bad == 0,
            "failures": failures[:40]}  # fmt: skip


def _gemm_configs() -> list[tuple[str, str, Any, str]]:
    import test_gpu

    return test_gpu.gemm_configs()


@section("gemm", need_s=40)
def gemm_agreement() -> dict[str, Any]:
    import cupy as cp
    import numpy as np

    import precision_lab as pl

    rng = np.random.default_rng(1)
    nb, m, n, k = (1, 6, 9, 40) if SMALL else (2, 64, 96, 512)
    base = [rng.standard_normal((nb, m, k)), rng.standard_normal((nb, k, n)),
            rng.standard_normal((nb, m, n))]  # fmt: skip
    big = [v * 300.0 for v in base]
    special = [v.copy() for v in base]
    special[0][0, 1, 3], special[0][0, 2, 5], special[1][-1, 4, 7] = np.inf, np.nan, -np.inf
    special[2][0, 5, 5], special[0][-1, 3, 6] = np.inf, np.inf
    import test_gpu  # block-scaled MMA without groups: E8M0 scales on blocks of 32

    # (label, keyword arguments of pl.gemm, input classes: (name, (a, b, c)))
    runs = [
        (label, {"input_format": fmt, "accumulator": acc, "out_format": out},
         (("random", base), ("large", big), ("special", special)))
        for label, fmt, acc, out in _gemm_configs()
    ]  # fmt: skip
    bshape = (1, 6, 9, 64) if SMALL else (2, 64, 96, 512)
    for label, fmt, acc in test_gpu.block_scaled_configs():
        for kind in ("random", "wide"):
            a, b, c, sa, sb = test_gpu.block_scaled_inputs(len(label), bshape, kind == "wide")
            kw = {"input_format": fmt, "accumulator": acc, "out_format": "fp32",
                  "scale_a": sa, "scale_b": sb, "scale_block": 32}  # fmt: skip
            runs.append((f"block-scaled {label} {kind}", kw, (("random", (a, b, c)),)))
    results, failures, total, bad = {}, [], 0, 0
    for label, kw, inputs in runs:
        if left() < 25:
            failures.append("stopped early: time budget")
            break
        row = {}
        for kind, (a, b, c) in inputs:
            want = pl.gemm(a, b, c, backend="numpy", **kw)
            got = pl.gemm(cp.asarray(a), cp.asarray(b), cp.asarray(c), **kw)
            nbad, idx, sign_only = gemm_equal(got, want)
            total += 1
            row[kind] = nbad
            if sign_only:
                row[kind + "_nan_sign_only"] = sign_only
            if nbad:
                bad += 1
                failures.append(f"{label} {kind}: {nbad} of {want.size} differ at {idx}")
        results[label] = row
    return {"shape": [nb, m, n, k], "checks": total, "mismatching_checks": bad,
            "bit_exact": bad == 0 and total > 0, "per_config": results,
            "failures": failures[:40]}  # fmt: skip


@section("timing", need_s=30)
def timing() -> dict[str, Any]:
    import cupy as cp

    import precision_lab as pl
    from precision_lab.backends import gpu
    from precision_lab.gemm import cupy_backend as cb

    out: dict[str, Any] = {"unit": "emulated multiply-adds per second (M*N*K / kernel time)"}

    def kernel_rate(label: str, fmt: str, acc: Any, out_fmt: str, shape: tuple[int, int, int]):
        m, n, k = shape
        f = pl.get_format(fmt)
        a = pl.round_to(cp.random.standard_normal((m, k), dtype=cp.float32), f).astype(cp.float64)
        b = pl.round_to(cp.random.standard_normal((k, n), dtype=cp.float32), f).astype(cp.float64)
        plan = cb.kernel_plan((m, k), (k, n), fa=f, fb=f, acc=acc,
                              out_fmt=pl.get_format(out_fmt), has_c=False, has_special=False,
                              scales=None)  # fmt: skip
        fn = gpu.module("pl_gemm.cu").get_function(plan.kernel)
        d = cp.empty((1, m, n), dtype=plan.out_dtype)
        params = cp.asarray(plan.params)
        if plan.fma:
            args = (a.astype(cp.float32), b.astype(cp.float32), cp.zeros(1, cp.float32), d, params)
        else:
            one = cp.ones(1, cp.float64)
            args = (a, b, cp.zeros(1, cp.float64), one, one, d, params)
        t = median_time(cp, lambda: fn(plan.grid, plan.block, args))
        rate = m * n * k / t
        out[label] = {"kernel": plan.kernel, "shape": [m, n, k], "seconds": t,
                      "macs_per_s": rate}  # fmt: skip
        return rate

    # cuBLAS SGEMM in the same run
    s = 64 if SMALL else 4096
    mid = (32,) * 3 if SMALL else (1024,) * 3
    a32 = cp.random.standard_normal((s, s), dtype=cp.float32)
    b32 = cp.random.standard_normal((s, s), dtype=cp.float32)
    t = median_time(cp, lambda: cp.matmul(a32, b32))
    cublas = s**3 / t
    out["cublas_sgemm"] = {"shape": [s, s, s], "seconds": t, "macs_per_s": cublas}
    A = pl.Accumulator
    fma = kernel_rate("fp32 sequential rne, exact products (fma)", "e4m3", A(), "fp32",
                      (s, s, s))  # fmt: skip
    out["fma_over_cublas"] = fma / cublas
    runs = [
        ("fp32 sequential rtz (fma)", "bf16", A(rounding="rtz"), "fp32", (s, s, s)),
        ("fp32 sequential down (generic)", "fp16", A(rounding="down"), "fp32", mid),
        ("bf16 sequential rne", "e4m3", A("bf16"), "fp32", mid),
        ("fp16 sequential rtz", "e4m3", A("fp16", "rtz"), "fp32", mid),
        ("bf16 sequential stochastic", "e4m3", A("bf16", "sr", seed=1), "fp32", mid),
        ("fp16 promoted every 128", "e4m3", A("fp16", promote_every=128), "fp32", mid),
        ("e8m13 pairwise", "e4m3", A(pl.FloatFormat(8, 13), order="pairwise"), "fp32",
         mid),
        ("bf16 blocked 32", "e4m3", A("bf16", order="blocked", block=32), "fp32", mid),
        ("tensor core h100 e4m3 (256x256x4096)", "e4m3", pl.tensor_core("h100", "e4m3"), "fp32",
         (16, 16, 64) if SMALL else (256, 256, 4096)),
        ("tensor core h100 e4m3", "e4m3", pl.tensor_core("h100", "e4m3"), "fp32", mid),
        ("tensor core h100 e4m3 promoted every 128", "e4m3",
         pl.tensor_core("h100", "e4m3").replace(promote_every=128), "fp32", mid),
        ("tensor core h100 e4m3 -> fp16", "e4m3",
         pl.tensor_core("h100", "e4m3", out_format="fp16"), "fp16", mid),
        ("tensor core a100 bf16", "bf16", pl.tensor_core("a100", "bf16"), "fp32", mid),
        ("tensor core b200 e4m3", "e4m3", pl.tensor_core("b200", "e4m3"), "fp32", mid),
        ("tensor core v100 fp16", "fp16", pl.tensor_core("v100", "fp16"), "fp32", mid),
    ]  # fmt: skip
    for label, fmt, acc, out_fmt, shape in runs:
        if left() < 15:
            out["stopped_early"] = "time budget"
            break
        try:
            kernel_rate(label, fmt, acc, out_fmt, shape)
        except Exception as exc:
            out[label] = {"error": f"{type(exc).__name__}: {exc}"}
        save()
    # elementwise kernels
    n = 1 << (12 if SMALL else 26)
    x = cp.random.standard_normal(n, dtype=cp.float32)
    t_copy = median_time(cp, lambda: x.copy())
    out["device_copy_elements_per_s"] = n / t_copy
    for label, fn in (
        ("round_to e4m3 rne", lambda: pl.round_to(x, "e4m3")),
        ("round_to e4m3 stochastic", lambda: pl.round_to(x, "e4m3", rounding="sr", seed=1)),
        ("round_to bf16 rtz", lambda: pl.round_to(x, "bf16", rounding="rtz")),
        ("encode e4m3", lambda: pl.encode(x, "e4m3")),
    ):
        t = median_time(cp, fn)
        out[label] = {"elements_per_s": n / t, "vs_copy": t_copy / t}
    codes = pl.encode(x, "e4m3")
    t = median_time(cp, lambda: pl.decode(codes, "e4m3"))
    out["decode e4m3"] = {"elements_per_s": n / t, "vs_copy": t_copy / t}
    return out


def gpu_missing() -> str | None:
    """Why nothing can be checked here (no CuPy, or no CUDA device); None when there is a GPU."""
    try:
        import cupy as cp
    except Exception as exc:
        return (
            f"no GPU / no CuPy: CuPy does not import ({type(exc).__name__}: {exc}); on a machine "
            "with an NVIDIA GPU: pip install 'precision_lab[gpu]'"
        )
    try:
        n = int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:
        return f"no GPU / no CuPy: CuPy sees no CUDA device ({type(exc).__name__}: {exc})"
    return None if n > 0 else "no GPU / no CuPy: CuPy sees no CUDA device"


SECTIONS = ("environment", "compile", "elementwise", "timing", "gemm", "pytest")


def verdict() -> dict[str, Any]:
    """Which sections failed: an error, a skip, results that are not bit-exact, or pytest
    failing."""
    bad = []
    for name in SECTIONS:
        r = REPORT.get(name)
        if not isinstance(r, dict):
            bad.append(f"{name}: missing")
        elif "error" in r:
            bad.append(f"{name}: {r['error'][:200]}")
        elif "skipped" in r:
            bad.append(f"{name}: skipped ({r['skipped']})")
        elif r.get("bit_exact") is False:
            bad.append(f"{name}: {r.get('mismatching_checks')} checks not bit-exact")
        elif name == "pytest" and r.get("returncode") != 0:
            bad.append(f"pytest: returncode {r.get('returncode')}")
    return {"status": "ok" if not bad else "failed", "problems": bad}


def main() -> int:
    why = gpu_missing()
    if why is not None:  # one verdict, no section tracebacks; non-zero: nothing was checked
        import numpy as np

        REPORT["environment"] = {"python": platform.python_version(), "numpy": np.__version__,
                                 "machine": platform.machine()}  # fmt: skip
        REPORT["verdict"] = {"status": "nothing checked", "reason": why}
        REPORT["finished"] = time.ctime()
        save()
        print(f"gpu_check: nothing checked: {why} (report: {OUT_PATH})", file=sys.stderr)
        return 2
    save()
    for step in (environment, compile_modules, elementwise, timing, gemm_agreement, pytest_gpu):
        step()
    REPORT["verdict"] = verdict()
    REPORT["finished"] = time.ctime()
    save()
    print(f"report written to {OUT_PATH}; verdict: {REPORT['verdict']['status']}")
    for problem in REPORT["verdict"]["problems"]:
        print(f"  {problem}", file=sys.stderr)
    return 0 if REPORT["verdict"]["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
