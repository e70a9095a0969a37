"""Build of precision_lab's optional C++ extensions; the metadata lives in pyproject.toml.

The extensions (precision_lab/backends/native/sources.py lists them) are the compiled CPU backend.
They are optional: if the compiler fails, the package installs anyway, runs on its numpy backend,
and says so once at import (``precision_lab.backend_info()`` tells why). Flags are portable (no
-march=native): -O3, -ffp-contract=off and no fast-math, since the arithmetic must be exact.
Each extension gets the hash of its sources compiled in, so an import notices a stale build.

Build commands: ``pip install .`` / ``pip install -e .``, or in a source checkout
``make native`` (the same ``pip install -e .`` in the venv).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "_pl_sources", HERE / "precision_lab" / "backends" / "native" / "sources.py"
)
assert _spec is not None and _spec.loader is not None
sources = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sources)

GCC_FLAGS = [
    "-O3",
    "-g0",
    "-std=c++17",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fvisibility=hidden",
    # value-safe: no errno from libm, and FP exception flags (never read) may be ignored, so the
    # compiler can turn selects between doubles into vector blends
    "-fno-math-errno",
    "-fno-trapping-math",
]
# GCC: no second, narrower vectorised copy of each loop's remainder. The loops run over blocks of
# 1024 elements, so the remainders are short; with it core.cpp (then one translation unit) took
# 168 s to compile, without 125.
GCC_ONLY_FLAGS = ["--param", "vect-epilogues-nomask=0"]
MSVC_FLAGS = ["/O2", "/std:c++17", "/fp:precise"]


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when an extension does not compile."""

    def build_extensions(self) -> None:
        msvc = self.compiler.compiler_type == "msvc"
        flags = list(MSVC_FLAGS if msvc else GCC_FLAGS)
        if not msvc and self._accepts(GCC_ONLY_FLAGS):
            flags += GCC_ONLY_FLAGS
        for ext in self.extensions:
            ext.extra_compile_args = flags
        # the extensions compile at the same time (setuptools' own parallel build_ext), and so do
        # the translation units of one extension (_native has four: round_to's passes, encode's
        # for float32 and for float64, the rest; _native_kernels four: one per instruction set,
        # each with all kernels), in the order sources.py lists them (longest first): on 2 cores
        # the build's wall time is its CPU time / 2, no unit being much longer than the others
        self.parallel = self.parallel or os.cpu_count() or 1
        self._compile_sources_in_parallel(self.parallel)
        super().build_extensions()

    def _compile_sources_in_parallel(self, workers: int) -> None:
        """Make the compiler's ``compile`` build each source file in its own thread."""
        one_by_one = self.compiler.compile

        def compile_all(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
            if len(sources) < 2 or workers < 2:
                return one_by_one(sources, *args, **kwargs)
            with ThreadPoolExecutor(min(workers, len(sources))) as pool:
                parts = pool.map(lambda src: one_by_one([src], *args, **kwargs), sources)
                return [obj for part in parts for obj in part]

        self.compiler.compile = compile_all  # type: ignore[method-assign]

    def _accepts(self, flags: list[str]) -> bool:
        """Whether the compiler takes these flags (clang, for one, does not know GCC's params)."""
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "probe.cpp"
            src.write_text("int main() { return 0; }\n")
            try:
                args = ["-Werror", *flags]
                self.compiler.compile([str(src)], output_dir=tmp, extra_postargs=args)
            except Exception:
                return False
        return True

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all, broken toolchain
            self._skip("all extensions", exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # a compile or link error
            self._skip(ext.name, exc)

    @staticmethod
    def _skip(what: str, exc: Exception) -> None:
        print(
            f"WARNING: precision_lab: could not build {what} ({type(exc).__name__}: {exc}); "
            "the package will use its numpy backend",
            file=sys.stderr,
        )


def extension(name: str, files: list[str]) -> Extension:
    digest = sources.source_hash(files, HERE / "precision_lab" / "backends")
    return Extension(
        name,
        sources=[f"precision_lab/backends/{f}" for f in files if f.endswith(".cpp")],
        depends=[f"precision_lab/backends/{f}" for f in files if not f.endswith(".cpp")],
        define_macros=[("PL_SOURCE_HASH", f'"{digest}"')],
        language="c++",
    )


setup(
    ext_modules=[extension(name, files) for name, files in sources.EXTENSIONS.items()],
    cmdclass={"build_ext": OptionalBuildExt},
)
