"""Sphinx configuration of the precision_lab documentation (``make docs``; docs/README.md).

The API reference is generated here, at every build, from ``precision_lab.__all__`` and each
subpackage's (and public module's) ``__all__``: every public name gets a page (autosummary), each
object once, under its shortest public path (``precision_lab.round_to``, not
``precision_lab.core.round_to``). A public function, class or module without a docstring is a
warning (so an error under ``-W``). The notebooks are rendered from the executed copies in
``docs/notebooks/`` (ignored by git; written by ``make docs`` or by tests/repo/test_notebooks.py),
never executed here: a missing copy is a warning too.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

import precision_lab as pl  # noqa: E402

project = "precision_lab"
author = "The precision_lab developers"
copyright = "the precision_lab developers (BSD-3-Clause)"
release = version = pl.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "myst_nb",  # Markdown pages (it loads myst_parser) and the notebooks
    "sphinxarg.ext",  # the CLI reference, from precision_lab.cli.build_parser
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "README.md", "**.ipynb_checkpoints"]
# a copy left in docs/notebooks/ by a notebook since renamed or removed is not rendered
exclude_patterns += [
    f"notebooks/{p.name}"
    for p in (DOCS / "notebooks").glob("*.ipynb")
    if not (ROOT / "notebooks" / p.name).exists()
]
templates_path = ["_templates"]
html_theme = "alabaster"
html_title = f"precision_lab {release}"

# notebooks: rendered with the outputs of the copies executed once by `make docs` (or the tests)
nb_execution_mode = "off"
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3

autosummary_generate = True
autosummary_imported_members = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # dataclass fields: documented once (Attributes + members)
suppress_warnings = ["myst.header"]

#: the API pages: (module, title); each documents the names of the module's ``__all__`` that
#: are not already documented at an earlier (shorter) path
API_MODULES = [
    ("precision_lab.core", "core: formats, rounding, codes"),
    ("precision_lab.backends", "backends: dispatch"),
    ("precision_lab.quant", "quant: integer and block quantization"),
    ("precision_lab.gemm", "gemm: accumulators, GEMM, tensor cores"),
    ("precision_lab.arith", "arith: emulated arithmetic"),
    ("precision_lab.arith.ops", "arith.ops: correctly rounded operations"),
    ("precision_lab.analysis", "analysis: underflow, loss scale, error measures, bounds"),
    ("precision_lab.scaling", "scaling: loss scalers and FP8 recipes"),
    ("precision_lab.scaling.gradients", "scaling.gradients: gradient populations"),
    ("precision_lab.training", "training: the digits MLP, policies, INT8"),
    ("precision_lab.torch", "torch: real PyTorch models (optional extra)"),
    ("precision_lab.verify", "verify: strategies, oracles, sweeps, grids"),
    ("precision_lab.verify.strategies", "verify.strategies"),
    ("precision_lab.verify.oracles", "verify.oracles"),
    ("precision_lab.verify.sweep", "verify.sweep"),
    ("precision_lab.verify.grid", "verify.grid"),
    ("precision_lab.verify.progress", "verify.progress"),
    ("precision_lab.studies", "studies: the experiments behind the report"),
    ("precision_lab.studies.policy", "studies.policy"),
    ("precision_lab.studies.emulated", "studies.emulated"),
    ("precision_lab.studies.text", "studies.text"),
    ("precision_lab.figures", "figures: the figure jobs"),
    ("precision_lab.cli", "cli: the command line"),
]


def _page(mod: str) -> str:
    return mod.removeprefix("precision_lab.")


def _heading(text: str, ch: str = "=") -> str:
    return f"{text}\n{ch * len(text)}\n"


def _write(path: Path, text: str) -> None:
    """Write only when changed (keeps Sphinx's incremental build incremental)."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def _public(mod: types.ModuleType) -> list[str]:
    names = getattr(mod, "__all__", [])
    return [n for n in names if not n.startswith("__")]


def _generate_api() -> int:
    """Write docs/api/*.rst; return how many objects get a page."""
    out = DOCS / "api"
    out.mkdir(exist_ok=True)
    seen: dict[int, str] = {}  # id(object) -> its documented path
    module_pages = {m: _page(m) for m, _ in API_MODULES}
    entries = 0

    def block(modname: str, title: str, names: list[str]) -> str:
        nonlocal entries
        mod = importlib.import_module(modname)
        own, also, submods = [], [], []
        for n in names:
            obj = getattr(mod, n)
            full = f"{modname}.{n}"
            if isinstance(obj, types.ModuleType):
                submods.append(obj.__name__)
            elif id(obj) in seen and not isinstance(obj, (str, int, float, tuple, dict)):
                also.append(seen[id(obj)])
            else:
                seen.setdefault(id(obj), full)
                own.append(full)
        # the function precision_lab.gemm shadows the module's name: the module is not indexed
        noindex = "   :no-index:\n" if modname == "precision_lab.gemm" else ""
        text = _heading(title) + f"\n.. automodule:: {modname}\n   :no-members:\n{noindex}\n"
        text += f".. currentmodule:: {modname}\n\n"
        if own:
            entries += len(own)
            text += ".. autosummary::\n   :toctree: generated\n   :nosignatures:\n\n"
            text += "".join(f"   {n.rsplit('.', 1)[1]}\n" for n in own) + "\n"
        if submods:
            text += (
                "Modules: "
                + ", ".join(
                    f":doc:`{s} <{module_pages[s]}>`" if s in module_pages else f":mod:`{s}`"
                    for s in submods
                )
                + "\n\n"
            )
        if also:
            text += (
                "Also here (documented at its shorter path): "
                + ", ".join(f":obj:`{a}`" for a in also)
                + "\n"
            )
        return text

    _write(out / "precision_lab.rst", block("precision_lab", "precision_lab", _public(pl)))
    for modname, title in API_MODULES:
        mod = importlib.import_module(modname)
        _write(out / f"{module_pages[modname]}.rst", block(modname, title, _public(mod)))
    toc = "\n".join(f"   {module_pages[m]}" for m, _ in API_MODULES)
    _write(
        out / "index.rst",
        _heading("API reference")
        + "\nEvery public name: ``precision_lab.*`` first, then each subpackage's ``__all__``"
        " (a name already at the top level is documented there once).\n\n"
        + ".. toctree::\n   :maxdepth: 1\n\n   precision_lab\n"
        + toc
        + "\n",
    )
    return entries


API_ENTRIES = _generate_api()


def _whole_first_paragraph_if_cut(extract: Any) -> Any:
    """autosummary cuts a summary at the first ``. `` even inside a literal (``0 .. 255``), which
    leaves an open literal (a docutils warning): then the summary is the whole first paragraph."""

    def extract_summary(doc: list[str], document: Any) -> str:
        summary: str = extract(doc, document)
        if summary.count("``") % 2:
            para = []
            for line in doc:
                if not line.strip() and para:
                    break
                para.append(line.strip())
            summary = " ".join(p for p in para if p)
        return summary

    return extract_summary


import sphinx.ext.autosummary as _autosummary  # noqa: E402

_autosummary.extract_summary = _whole_first_paragraph_if_cut(_autosummary.extract_summary)


def _check_docstring(
    app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """A public function, class, method or module without a docstring is a warning."""
    from sphinx.util import logging

    if (
        what in ("data", "attribute")
        and lines
        and "\n".join(lines).strip() == (inspect.getdoc(type(obj)) or "").strip()
    ):
        lines[:] = []  # a constant (dict, tuple ...): not the docstring of its type
        return
    if what not in ("function", "class", "method", "module", "exception"):
        return
    if name.rsplit(".", 1)[-1].startswith("_"):
        return
    if not any(line.strip() for line in lines) and not inspect.getdoc(obj):
        logging.getLogger("precision_lab.docs").warning(f"{what} {name} has no docstring")


def _check_notebooks(app: Any) -> None:
    """Every notebook in notebooks/ has an executed copy in docs/notebooks/ with outputs."""
    import json

    from sphinx.util import logging

    log = logging.getLogger("precision_lab.docs")
    for src in sorted((ROOT / "notebooks").glob("*.ipynb")):
        copy = DOCS / "notebooks" / src.name
        if not copy.exists():
            log.warning(
                f"notebook {src.name} has no executed copy in docs/notebooks/ "
                "(`make docs` executes them; so does tests/repo/test_notebooks.py)"
            )
            continue
        if copy.stat().st_mtime < src.stat().st_mtime:
            log.warning(f"docs/notebooks/{src.name} is older than notebooks/{src.name}: re-execute")
            continue
        cells = json.loads(copy.read_text(encoding="utf-8"))["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        if any(c.get("execution_count") is None for c in code):
            log.warning(f"docs/notebooks/{src.name} is not executed (a code cell has no count)")


def _check_guide_reference(app: Any, env: Any, node: Any, contnode: Any) -> None:
    """A Python cross-reference in a hand-written page (the guide, not the generated API pages)
    that resolves to nothing is a warning. (The docstrings also name private modules and
    external types that this site does not document, so ``nitpicky`` stays off for them.)"""
    from sphinx.util import logging

    doc = node.get("refdoc", "")
    if node.get("refdomain") == "py" and not doc.startswith("api/"):
        logging.getLogger("precision_lab.docs").warning(
            f"{doc}: broken cross-reference {node.get('reftype')} {node.get('reftarget')!r}",
            location=node,
        )


def setup(app: Any) -> dict[str, Any]:
    app.connect("missing-reference", _check_guide_reference)
    app.connect("autodoc-process-docstring", _check_docstring)
    app.connect("builder-inited", _check_notebooks)
    return {"parallel_read_safe": True}
