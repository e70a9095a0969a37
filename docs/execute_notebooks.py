"""Execute every notebook in notebooks/ once into docs/notebooks/ (ignored by git), for Sphinx.

``make docs`` runs this, then ``sphinx-build -W``; the docs only render these copies
(``nb_execution_mode = "off"``). tests/repo/test_notebooks.py writes the same copies while it
executes the notebooks, so the test suite's docs build needs no second execution.

The kernel is this very interpreter (a kernelspec written to a temporary ``JUPYTER_PATH``), so the
notebooks see the same precision_lab as the command that built the docs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "notebooks"
TARGET = ROOT / "docs" / "notebooks"
KERNEL_NAME = "precision_lab_this_python"
HANG_TIMEOUT_S = 1800  # only ends a hung kernel


def main() -> int:
    import nbformat
    from nbclient import NotebookClient

    TARGET.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "kernels" / KERNEL_NAME
        spec.mkdir(parents=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        spec_json = {"argv": argv, "display_name": "precision_lab docs", "language": "python"}
        (spec / "kernel.json").write_text(json.dumps(spec_json), encoding="utf-8")
        os.environ["JUPYTER_PATH"] = tmp
        os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = str(Path(tmp) / "hypothesis")
        for path in sorted(SOURCE.glob("*.ipynb")):
            print(f"executing {path.relative_to(ROOT)}", flush=True)
            nb = nbformat.read(path, as_version=4)
            NotebookClient(
                nb,
                timeout=HANG_TIMEOUT_S,
                kernel_name=KERNEL_NAME,
                resources={"metadata": {"path": str(SOURCE)}},
                allow_errors=False,
            ).execute()
            nbformat.write(nb, TARGET / path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
