"""The deep import paths of 0.1 that moved in the pipeline layout still import (CHANGELOG.md):
each names the very module at its new path, packages' submodules included, and nothing is
executed twice under the old name."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import precision_lab as pl


@pytest.mark.parametrize("old", sorted(pl.MOVED))
def test_old_path_is_the_new_module(old):
    if old == "strategies":
        pytest.importorskip("hypothesis")
    if old in ("sweep", "grid"):
        pytest.importorskip("dask")
    new = importlib.import_module(f"precision_lab.{pl.MOVED[old]}")
    assert importlib.import_module(f"precision_lab.{old}") is new
    assert new.__spec__.name == f"precision_lab.{pl.MOVED[old]}"  # its own spec, not the alias's
    assert getattr(pl, old) is new


def test_submodules_of_moved_packages_run_once():
    """``precision_lab.ops.elementwise`` (a module of a moved package, asked for by its old
    path in a fresh interpreter) is the module at the new path: no second copy of it."""
    code = (
        "import sys\n"
        "from precision_lab.ops.elementwise import add\n"
        "import precision_lab.native.kernels as k\n"
        "import precision_lab.arith.ops.elementwise as e\n"
        "import precision_lab.backends.native.kernels as k2\n"
        "assert add is e.add and k is k2\n"
        "print(sorted(m for m in sys.modules if m.startswith('precision_lab.ops.')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['precision_lab.ops.elementwise']"
