"""torch is optional: without it precision_lab imports and works, and precision_lab.torch raises a
one-line ImportError that says how to install it. (Run in a subprocess that hides torch, so the
test runs where torch is installed too; it needs no torch itself.)"""

from __future__ import annotations

import subprocess
import sys

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


def test_everything_else_works_without_torch():
    r = _run(
        "import precision_lab as pl, numpy as np\n"
        "import precision_lab.training, precision_lab.studies, precision_lab.verify\n"
        "print(float(pl.round_to(np.float32(0.3), 'bf16')))\n"
        "assert 'torch' not in sys.modules\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0.30078125"


def test_precision_lab_torch_says_how_to_install():
    r = _run(
        "try:\n"
        "    import precision_lab.torch\n"
        "except ImportError as e:\n"
        "    print(repr(str(e)))\n"
        "else:\n"
        "    print('imported')\n"
    )
    assert r.returncode == 0, r.stderr
    msg = r.stdout.strip()
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
