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


#: id(object) -> the path it is documented at (filled by :func:`_generate_api`)
DOCUMENTED: dict[int, str] = {}


def _generate_api() -> int:
    """Write docs/api/*.rst; return how many objects get a page."""
    out = DOCS / "api"
    out.mkdir(exist_ok=True)
    seen = DOCUMENTED
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
    _write(out / "modules.rst", _modules_page(set(module_pages) | {"precision_lab"}))
    toc = "\n".join(f"   {module_pages[m]}" for m, _ in API_MODULES) + "\n   modules"
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


def _own_members(mod: types.ModuleType) -> list[str]:
    """Public-looking names a module defines: functions and classes defined there, and constants
    with a ``#:`` comment."""
    from sphinx.pycode import ModuleAnalyzer

    attr_docs = {attr for (_, attr) in ModuleAnalyzer.for_module(mod.__name__).find_attr_docs()}
    return [
        n
        for n, o in vars(mod).items()
        if not n.startswith("_")
        and (n in attr_docs or getattr(o, "__module__", None) == mod.__name__)
    ]


def _modules_page(documented: set[str]) -> str:
    """Every other module of the package, by its docstring only (what it holds; the accumulator
    and tensor-core specifications live there), so that ``:mod:`` references to the layout
    resolve. Its public names are documented at their public paths."""
    import pkgutil

    text = _heading("Modules") + (
        "\nThe package layout: every module not already documented above, with its docstring. "
        "Names are documented at their public paths (``precision_lab.*`` and the "
        "subpackages).\n\n"
    )
    for info in sorted(pkgutil.walk_packages(pl.__path__, "precision_lab."), key=lambda m: m.name):
        name = info.name
        if name in documented or any(p.startswith("_") for p in name.split(".")[1:]):
            continue
        try:
            importlib.import_module(name)
        except ImportError:  # an optional extra (precision_lab.torch) that is not installed
            continue
        mod = importlib.import_module(name)
        public = [n for n, o in vars(mod).items() if id(o) in DOCUMENTED]
        exclude = f"   :exclude-members: {', '.join(sorted(public))}\n" if public else ""
        parent, _, leaf = name.rpartition(".")
        if getattr(importlib.import_module(parent), leaf, mod) is mod:
            text += f".. automodule:: {name}\n   :members:\n   :ignore-module-all:\n{exclude}\n"
            continue
        # a module shadowed by the public function of its name (precision_lab.scaling.simulate):
        # its docstring without a module target (the name means the function), its other
        # members indexed one by one
        text += f".. automodule:: {name}\n   :no-index:\n\n.. currentmodule:: {name}\n\n"
        for member in _own_members(mod):
            if member not in public:
                kind = (
                    "autoclass"
                    if inspect.isclass(getattr(mod, member))
                    else ("autofunction" if callable(getattr(mod, member)) else "autodata")
                )
                members = "   :members:\n" if kind == "autoclass" else ""
                text += f".. {kind}:: {member}\n{members}\n"
    return text


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
from sphinx.ext.napoleon import docstring as _napoleon  # noqa: E402


def _prose_attribute(self: Any) -> tuple[str, list[str]]:
    """A constant's or property's docstring is prose (``#: x range of the panel: ...``); its type
    is the annotation, never the text before a colon (napoleon's inline-type rule)."""
    lines = [self._lines.next(), *self._dedent(self._consume_to_end())]
    return "", self.__class__(lines, self._config).lines()


_napoleon.GoogleDocstring._consume_inline_attribute = _prose_attribute  # type: ignore[method-assign]

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


#: targets outside the package: no inventory of theirs is loaded (the build is offline), so they
#: render as plain names; everything else must resolve
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(numpy|np|collections|pathlib|os|math|fractions|typing|json|hypothesis|dask"
        r"|distributed|torch|cupy|ml_dtypes|matplotlib|sklearn|argparse|concurrent|io|types"
        r"|dataclasses|contextvars)(\..*)?",
    ),
    (r"py:class", r"(.*\.)?_\w+"),  # type variables and private types in annotations
    (
        r"py:class",
        r"(int|float|str|bool|bytes|dict|list|tuple|object|type|callable|None"
        r"|Callable|Any|Sequence|Iterable|Iterator|Mapping|ArrayLike|DTypeLike|Path)",
    ),
]


def _object_at(path: str) -> Any:
    """What the dotted path names once the package is imported (an attribute before a submodule
    of the same name: ``precision_lab.gemm.tensor_core`` is the function), or None."""
    head, *rest = path.split(".")
    try:
        obj: Any = importlib.import_module(head)
    except ImportError:
        return None
    for i, part in enumerate(rest):
        if not hasattr(obj, part) and not isinstance(obj, types.ModuleType):
            # a function shadowing its package (precision_lab.gemm): go on in the package
            obj = sys.modules.get(".".join([head, *rest[:i]]), obj)
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join([head, *rest[: i + 1]]))
        except ImportError:
            return None
    return obj


def _resolve_any_path(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """A reference to a documented object by another of its paths (``round_to`` inside
    ``precision_lab.core.rounding``, ``precision_lab.core.rounding.round_to``) goes to the page
    where it is documented (its public path)."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip("~")
    context = node.get("py:module") or ""
    candidates = [target.lstrip(".")]
    if context:
        pkg = context
        while pkg:
            candidates.append(f"{pkg}.{target.lstrip('.')}")
            pkg = pkg.rpartition(".")[0]
    domain = env.get_domain("py")
    for cand in candidates:
        if not cand.startswith("precision_lab"):
            continue
        obj = _object_at(cand)
        if obj is None:
            continue
        if isinstance(obj, types.ModuleType):
            where, typ = obj.__name__, "mod"
        else:
            parts = cand.split(".")
            for cut in range(len(parts), 0, -1):  # the longest prefix documented elsewhere
                head = _object_at(".".join(parts[:cut]))
                if head is not None and id(head) in DOCUMENTED:
                    where = ".".join([DOCUMENTED[id(head)], *parts[cut:]])
                    break
            else:
                continue
            typ = "obj"
        if where == cand and typ == node.get("reftype"):
            continue  # the domain looked for it already
        return domain.resolve_xref(
            env, node.get("refdoc", ""), app.builder, typ, where, node, contnode
        )
    # a name documented once in the package (the modules page), wherever the reference is made
    name = target.lstrip(".")
    matches = domain.find_obj(env, None, None, name, node.get("reftype"), 1)
    found = {
        full
        for full, entry in matches
        if full.startswith("precision_lab") and not getattr(entry, "aliased", False)
    }
    if len(found) == 1:
        return domain.resolve_xref(
            env, node.get("refdoc", ""), app.builder, "obj", found.pop(), node, contnode
        )
    return None


def setup(app: Any) -> dict[str, Any]:
    app.connect("missing-reference", _resolve_any_path)
    app.connect("autodoc-process-docstring", _check_docstring)
    app.connect("builder-inited", _check_notebooks)
    return {"parallel_read_safe": True}
