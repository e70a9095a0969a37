"""The benchmark scripts' verdicts on a machine like this one (no GPU, loaded CPUs)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
