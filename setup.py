"""Build of precision_lab's optional C++ extensions (pyproject.toml holds the metadata).

The extensions are optional: where a compiler is missing or fails, setuptools warns and the
package works on its numpy code. Flags are portable (no -march=native); floating-point
contraction and fast-math stay off, since every kernel must give the numpy reference's bits.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

GCC_FLAGS = [
    "-O3",
    "-std=c++17",
    "-ffp-contract=off",
    "-fno-fast-math",
    # value-safe: no errno from libm, and FP exception flags (unused here) may be ignored, so
    # the compiler can turn selects between doubles into vector blends
    "-fno-math-errno",
    "-fno-trapping-math",
]
MSVC_FLAGS = ["/O2", "/std:c++17", "/fp:precise"]

native_kernels = Extension(
    "precision_lab._native_kernels",
    sources=[
        "precision_lab/native/module.cpp",
        "precision_lab/native/kernels_base.cpp",
        "precision_lab/native/kernels_avx2.cpp",
    ],
    depends=[
        "precision_lab/native/kernels.h",
        "precision_lab/native/kernels.inc",
        "precision_lab/native/quant.inc",
        "precision_lab/native/blocks.inc",
        "precision_lab/cuda/pl_round.cuh",
        "precision_lab/cuda/pl_gemm.cuh",
    ],
    language="c++",
    optional=True,
)


class BuildExt(build_ext):
    """Compiler-specific flags; a failed optional extension leaves the numpy package working."""

    def build_extensions(self) -> None:
        flags = MSVC_FLAGS if self.compiler.compiler_type == "msvc" else GCC_FLAGS
        for ext in self.extensions:
            ext.extra_compile_args = list(flags)
        super().build_extensions()


setup(ext_modules=[native_kernels], cmdclass={"build_ext": BuildExt})
