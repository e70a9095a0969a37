"""examples/torch_model.py runs (one epoch) and prints its three parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_model.py"


def test_example_runs(capsys):
    spec = importlib.util.spec_from_file_location("torch_model_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "FP32: test accuracy" in out
    assert "loss scale for fp16: S = 2**" in out
    assert "mixed_float16 on a100" in out and "pp vs FP32" in out


def test_example_runs_a_recipe(capsys):
    spec = importlib.util.spec_from_file_location("torch_model_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--epochs", "1", "--recipe", "te_mxfp8"]) == 0
    out = capsys.readouterr().out
    assert "recipe te_mxfp8: test accuracy" in out and "pp vs FP32" in out
