"""The notebooks in notebooks/ run top to bottom without error and are committed without outputs.

No wall-clock limit is asserted (a loaded machine is not a defect): the notebooks are kept light
(small default sizes, a few seconds each on 2 quiet cores), and the per-cell timeout only catches a
hang.

Executing needs nbclient and ipykernel (the ``test`` extras); without them the execution tests
skip and say so. The kernel is the Python running the tests (its ``sys.executable``), so the
notebooks see the same precision_lab as the test suite.

Each executed notebook is saved to docs/notebooks/ (ignored by git), and the last test builds the
documentation site from those copies with ``sphinx-build -W``: the notebooks run once per suite,
for both. pytest-xdist's ``--dist loadfile`` keeps this module in one worker, in order, and the
root conftest.py puts it first (it is the longest chain of the suite: ``HEAVY_FIRST``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
#: the executed copies the documentation renders (docs/conf.py; ignored by git)
EXECUTED_DIR = ROOT / "docs" / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
#: per-cell timeout: only there to end a hung kernel, never a measure of speed
HANG_TIMEOUT_S = 1800
EXPECTED = {
    "01_format_ranges.ipynb",
    "02_property_testing_casts.ipynb",
    "03_underflow_and_loss_scaling.ipynb",
    "04_gemm_accumulation.ipynb",
    "05_policies_and_int8.ipynb",
    "06_emulated_algorithms.ipynb",
    "07_fp4_recipes.ipynb",
    "08_torch_models.ipynb",
    "09_language_model.ipynb",
}

_MISSING = [m for m in ("nbclient", "nbformat", "ipykernel") if importlib.util.find_spec(m) is None]


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def _read(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        nb: dict[str, Any] = json.load(fh)
    return nb


def test_all_notebooks_present() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert EXPECTED <= names, f"missing notebooks: {sorted(EXPECTED - names)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_committed_without_outputs(path: Path) -> None:
    """Outputs and execution counts stay out of git (small diffs, small repository)."""
    nb = _read(path)
    assert nb.get("nbformat") == 4, f"{path.name}: nbformat {nb.get('nbformat')}, expected 4"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, f"{path.name} has no code cells"
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert cell.get("outputs") == [], f"{path.name} cell {i} has outputs: clear them"
        assert cell.get("execution_count") is None, (
            f"{path.name} cell {i} has execution_count {cell.get('execution_count')}: clear it"
        )
    assert path.stat().st_size < 100_000, f"{path.name} is {path.stat().st_size} bytes"


KERNEL_NAME = "precision_lab_this_python"


def _kernel_spec_dir(root: Path) -> Path:
    """A kernelspec that runs this very interpreter (``sys.executable``), written under ``root``
    (pointed to by ``JUPYTER_PATH``), so no user or system kernelspec can substitute another
    Python and nothing is installed anywhere."""
    d = root / "kernels" / KERNEL_NAME
    d.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "precision_lab tests",
        "language": "python",
    }
    (d / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return root


@pytest.mark.slow  # a few s each on 2 cores; `make test` still runs them (-m "not slow" skips)
@pytest.mark.skipif(
    bool(_MISSING),
    reason=f"notebook execution needs {', '.join(_MISSING)} (pip install -e '.[test]')",
)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    executed = EXECUTED_DIR / path.name
    executed.unlink(missing_ok=True)  # a notebook that fails leaves no copy for the docs
    monkeypatch.setenv("JUPYTER_PATH", str(_kernel_spec_dir(tmp_path / "jupyter")))
    # hypothesis (notebook 02) keeps a cache next to the notebook otherwise
    monkeypatch.setenv("HYPOTHESIS_STORAGE_DIRECTORY", str(tmp_path / "hypothesis"))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=HANG_TIMEOUT_S,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
        allow_errors=False,
    )
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell raised\n{e}", pytrace=False)
    EXECUTED_DIR.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, executed)


_DOCS_MISSING = [
    m for m in ("sphinx", "myst_nb", "sphinxarg") if importlib.util.find_spec(m) is None
]


@pytest.mark.slow  # reuses the notebooks executed above: about 30 s on 2 cores
@pytest.mark.skipif(
    bool(_DOCS_MISSING),
    reason=f"the docs build needs {', '.join(_DOCS_MISSING)} (pip install -e '.[test]')",
)
def test_docs_build_without_warnings(tmp_path: Path) -> None:
    """``sphinx-build -W`` of docs/: a broken cross-reference in a page, a public function, class
    or module without a docstring, a docstring docutils cannot parse, or a notebook without an
    executed copy (a failed notebook above) is an error. The notebooks are not executed again
    (``nb_execution_mode = "off"``); no link check."""
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-j", "1", "-q"]
    cmd += ["-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(tmp_path / "html")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (
        f"sphinx-build -W failed (exit {proc.returncode}):\n"
        f"{proc.stderr[-6000:]}{proc.stdout[-2000:]}"
    )
    assert (tmp_path / "html" / "index.html").exists()
    for nb in EXPECTED:
        page = tmp_path / "html" / "notebooks" / nb.replace(".ipynb", ".html")
        assert page.exists(), f"{page.name}: notebook page missing from the site"
