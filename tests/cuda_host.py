"""The CUDA GEMM kernels run on the CPU: the host build of ``pl_gemm.cu`` / ``pl_gemm.cuh``.

``tests/backends/cuda_harness/host_gemm.cpp`` (every CUDA thread a fiber, ``cuda_emul.h``) is
compiled with the system C++ compiler once per source digest (cached under
``tests/backends/_build/``) and loaded through ctypes. A test module that imports
:func:`gemm_lib` gets the library as a session fixture (skipped, with the reason, where no C++
compiler is found); :func:`emu_gemm` runs :func:`precision_lab.gemm.cupy_backend.run` over
numpy with those kernels. Shared by ``tests/backends/test_cuda_host.py`` and
``tests/gemm/test_backend_differential.py``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from precision_lab.backends.gpu import CUDA_DIR

HARNESS_DIR = Path(__file__).resolve().parent / "backends" / "cuda_harness"
BUILD = HARNESS_DIR.parent / "_build"
GEMM_HARNESS = HARNESS_DIR / "host_gemm.cpp"
GEMM_FLAGS = [
    "-O2",
    "-std=c++20",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-shared",
    "-fPIC",
    "-Wno-unknown-pragmas",
]


def compiler() -> str | None:
    """The C++ compiler of the harnesses ($CXX, g++, c++ or clang++), or None."""
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


@pytest.fixture(scope="session")
def gemm_lib() -> ctypes.CDLL:
    cxx = compiler()
    if cxx is None:
        pytest.skip("no C++ compiler found (g++, c++, clang++ or $CXX): cannot build the harness")
    srcs = [GEMM_HARNESS, HARNESS_DIR / "cuda_emul.h", *sorted(CUDA_DIR.glob("pl_*"))]
    digest = hashlib.sha256(
        b"".join(p.read_bytes() for p in srcs) + " ".join([cxx, *GEMM_FLAGS]).encode()
    ).hexdigest()[:16]
    out = BUILD / f"host_gemm_{digest}.so"
    if not out.exists():
        BUILD.mkdir(exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [
            cxx,
            *GEMM_FLAGS,
            f"-I{CUDA_DIR}",
            f"-I{GEMM_HARNESS.parent}",
            str(GEMM_HARNESS),
            "-o",
            str(tmp),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert res.returncode == 0, f"compiling the harness failed:\n{' '.join(cmd)}\n{res.stderr}"
        os.replace(tmp, out)
    return ctypes.CDLL(str(out))


def emu_gemm(lib: ctypes.CDLL, a: Any, b: Any, c: Any = None, **kw: Any) -> tuple[Any, list[str]]:
    """precision_lab.gemm.cupy_backend.run over numpy, its kernels run by the CPU emulation:
    (the result, the names of the kernels launched)."""
    from precision_lab.gemm.cupy_backend import run

    launched: list[str] = []

    def launch(name, grid, block, args):
        launched.append(name)
        fn = getattr(lib, f"emu_{name}")
        ptrs = []
        for arg in args:
            assert arg.flags.c_contiguous
            ptrs.append(ptr(arg))
        fn(*[ctypes.c_uint(v) for v in (*grid, *block)], *ptrs)

    out = run(np, launch, a, b, c, **kw)
    return out, launched
