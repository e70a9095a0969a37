"""The benchmark scripts' verdicts on a machine like this one (no GPU, loaded CPUs)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_gpu_check_without_cupy_says_nothing_was_checked(tmp_path):
    report = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), str(report)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "nothing checked: no GPU / no CuPy" in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert data["verdict"]["status"] == "nothing checked"
    assert "no GPU / no CuPy" in data["verdict"]["reason"]
    assert "traceback" not in report.read_text().lower()
    assert set(data) >= {"environment", "verdict", "finished"}


@pytest.fixture
def bench_cast(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_cast

    return bench_cast


def test_bench_cast_verdicts_follow_the_load_rule(bench_cast):
    v = bench_cast.verdict
    assert v(3.2, 3.0, load=0.2, cores=2) == "ok"
    assert v(2.0, 3.0, load=0.9, cores=2) == "MISSED"  # quiet: 0.9 <= 0.5 * 2
    assert v(2.0, 3.0, load=1.5, cores=2) == "unreliable (load 1.50)"
    assert v(3.5, 3.0, load=7.0, cores=2) == "ok"  # met under load is still met
    assert v(1.2, 2.0, load=0.0, cores=2, below=True) == "ok"
    assert v(2.5, 2.0, load=0.0, cores=2, below=True) == "MISSED"
    assert v(1.5, 2.0, load=9.0, cores=16) == "unreliable (load 9.00)"


@pytest.mark.parametrize(("load", "word"), [(100.0, "unreliable (load 100.00)"), (0.0, None)])
def test_bench_cast_prints_the_load_and_never_fails_targets_under_load(
    bench_cast, monkeypatch, capsys, load, word
):
    monkeypatch.setattr(bench_cast.os, "getloadavg", lambda: (load, load, load))
    bench_cast.main(["--n", "4096", "--repeat", "1"])
    out = capsys.readouterr().out
    assert f"load average {load:.2f} (1 min)" in out and "rule: above 0.5 x cores" in out
    table = out[out.index("ratio") :].splitlines()[1:]
    assert len(table) >= 12
    if word:
        assert "MISSED" not in out and "THIS RUN WAS TAKEN UNDER LOAD" in out
        assert all(ln.endswith(("ok", word)) for ln in table)
    else:
        assert "unreliable (load" not in out and "UNDER LOAD" not in out


def test_bench_range_prints_every_case_and_the_load(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_range

    bench_range.main(["--n", "4096", "--repeat", "1"])
    out = capsys.readouterr().out
    assert "load average" in out and "after the run" in out
    for name in ("e5m2", "e4m3", "fp16"):
        for case in ("in range", "tiny", "huge saturate", "encode tiny"):
            assert f"{name} {case}" in out
    assert "100% low" in out and "worst ratio outside/in range" in out


@pytest.mark.parametrize("backend", ["auto", "numpy"])
def test_wheel_smoke_passes_on_native_and_refuses_numpy(backend):
    """The wheels' smoke test (cibuildwheel's test-command) passes where the compiled backend
    serves the casts and the GEMMs, and fails, in one line, where it does not."""
    env = {**os.environ, "PRECISION_LAB_BACKEND": backend}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "wheel_smoke.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    if backend == "auto":
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("wheel_smoke: precision_lab ") and "OK" in proc.stdout
    else:
        assert proc.returncode == 1
        assert "the compiled backend is not in use" in proc.stderr
    assert "Traceback" not in proc.stderr
