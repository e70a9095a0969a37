"""README.md cannot go stale: every ```python block followed by an output block must print exactly
that output. Blocks that import an optional package that is not installed (cupy, torch, pychop,
hypothesis ...) are skipped; a block marked with a ``# readme: no-run`` line is never run."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import itertools
import re
from pathlib import Path

import matplotlib
import pytest

import precision_lab as pl

README = Path(__file__).resolve().parents[2] / "README.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def examples(path: Path = README) -> list[tuple[str, str, int]]:
    """(code, expected output, line number) of each python block followed by an output block."""
    text = path.read_text()
    blocks = [(m.group(1), m.group(2), m.start(), m.end()) for m in _FENCE.finditer(text)]
    found = []
    for (lang, code, start, end), (lang2, out, start2, _) in itertools.pairwise(blocks):
        if lang == "python" and lang2 in ("", "text") and not text[end:start2].strip():
            found.append((code, out, text.count("\n", 0, start) + 1))
    return found


def _imports(code: str) -> set[str]:
    mods = set()
    for line in code.splitlines():
        m = re.match(r"\s*(?:import|from)\s+([\w.]+(?:\s*,\s*[\w.]+)*)", line)
        if m:
            for name in m.group(1).split(","):
                mods.add(name.strip().split(".")[0])
    return mods


EXAMPLES = examples()


def test_readme_has_examples_with_output():
    assert len(EXAMPLES) >= 10, [line for _, _, line in EXAMPLES]


@pytest.mark.parametrize(
    ("code", "expected", "line"), EXAMPLES, ids=[f"README.md:{line}" for _, _, line in EXAMPLES]
)
def test_readme_example_prints_what_the_readme_says(code, expected, line):
    if "# readme: no-run" in code:
        pytest.skip(f"README line {line}: marked no-run")
    missing = sorted(m for m in _imports(code) if importlib.util.find_spec(m) is None)
    if missing:
        pytest.skip(f"README line {line} needs {', '.join(missing)}")
    matplotlib.use("Agg")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
    got = [ln.rstrip() for ln in buf.getvalue().strip("\n").splitlines()]
    want = [ln.rstrip() for ln in expected.strip("\n").splitlines()]
    assert got == want, f"README.md line {line}: the example prints something else"


def test_readme_lists_every_notebook():
    text = README.read_text()
    for nb in sorted((README.parent / "notebooks").glob("*.ipynb")):
        assert f"`{nb.stem}`" in text, nb.name


def test_readme_lists_every_subcommand():
    """The README's list of precision-lab commands is the parser's (issue 32 item 8: it missed
    tensor-cores, conform and probe)."""
    import argparse
    import re

    from precision_lab.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(README.read_text().split())
    listed = re.search(r"command line tool `precision-lab` \(([^;]*);", text)
    assert listed is not None
    assert re.findall(r"`([\w-]+)`", listed.group(1)) == list(sub.choices)


def test_package_docstring_names_every_module():
    import pkgutil

    for info in pkgutil.iter_modules(pl.__path__):
        if not info.name.startswith("_"):
            assert f"precision_lab.{info.name}`" in (pl.__doc__ or ""), info.name


def test_docs_examples_are_readme_examples():
    """The guide pages of docs/ show README examples with their output; the README tests above
    run them, so a page must show exactly a README pair (update both together)."""
    readme = {(code, out) for code, out, _ in EXAMPLES}
    pages = sorted((README.parent / "docs").glob("*.md"))
    shown = [(page.name, line, code, out) for page in pages for code, out, line in examples(page)]
    assert len(shown) >= 8, [(name, line) for name, line, _, _ in shown]
    stale = [f"{name}:{line}" for name, line, code, out in shown if (code, out) not in readme]
    assert not stale, f"examples that are not README examples (or differ from them): {stale}"
