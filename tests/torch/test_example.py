"""examples/torch_model.py runs (one epoch) and prints its three parts."""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

import pytest

pytest.importorskip(
    "torch", reason="precision_lab.torch needs PyTorch: pip install 'precision_lab[torch]'"
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_model.py"


@pytest.fixture(scope="module")
def printed() -> str:
    """One run of the example with a recipe: parts 1-3 (FP32 with the gradients captured, the
    loss scale, the policy emulated on the tensor-core model) are the run without ``--recipe``,
    part 4 follows them; the two tests read its output (one run instead of parts 1-3 twice)."""
    spec = importlib.util.spec_from_file_location("torch_model_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert mod.main(["--epochs", "1", "--recipe", "te_mxfp8"]) == 0
    return out.getvalue()


def test_example_runs(printed):
    assert "FP32: test accuracy" in printed
    assert "loss scale for fp16: S = 2**" in printed
    assert "mixed_float16 on a100" in printed and "pp vs FP32" in printed


def test_example_runs_a_recipe(printed):
    assert "recipe te_mxfp8: test accuracy" in printed
    recipe = printed.split("recipe te_mxfp8: test accuracy", 1)[1]
    assert "pp vs FP32" in recipe
