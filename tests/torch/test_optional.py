"""torch is optional: without it precision_lab imports and works, and precision_lab.torch raises a
one-line ImportError that says how to install it. (Run in a subprocess that hides torch, so the
test runs where torch is installed too; it needs no torch itself.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

HIDE_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch' (hidden by the test)", name="torch")
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HIDE_TORCH + code], capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def without_torch() -> list[str]:
    """One subprocess (one import of precision_lab, ~1.3 s) for both torch tests: first
    everything else, with torch still absent from ``sys.modules``, then the import of
    precision_lab.torch."""
    r = _run(
        "import precision_lab as pl, numpy as np\n"
        "import precision_lab.training, precision_lab.studies, precision_lab.verify\n"
        "print(float(pl.round_to(np.float32(0.3), 'bf16')))\n"
        "print('torch' in sys.modules)\n"
        "try:\n"
        "    import precision_lab.torch\n"
        "except ImportError as e:\n"
        "    print(repr(str(e)))\n"
        "else:\n"
        "    print('imported')\n"
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3, r.stdout
    return lines


def test_everything_else_works_without_torch(without_torch):
    assert without_torch[0] == "0.30078125"
    assert without_torch[1] == "False", "importing precision_lab imported torch"


def test_precision_lab_torch_says_how_to_install(without_torch):
    msg = without_torch[2]
    assert "pip install 'precision_lab[torch]'" in msg and "\\n" not in msg, msg


def test_precision_lab_strategies_says_how_to_install_hypothesis():
    """The same for hypothesis (issue 32 item 9): one line naming the package, not a bare
    ModuleNotFoundError."""
    hide = HIDE_TORCH.replace("torch", "hypothesis").replace("_Nohypothesis", "_NoHypothesis")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            hide + "try:\n"
            "    from precision_lab import strategies\n"
            "except ImportError as e:\n"
            "    print(type(e).__name__, repr(str(e)))\n",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    msg = r.stdout.strip()
    assert msg.startswith("ImportError ") and "pip install hypothesis" in msg, msg
