"""Every CUDA source of the package compiles for real GPU targets (sm_80 and sm_90).

- nvcc (when installed): each ``precision_lab/backends/cuda/*.cu`` to a fatbin of sm_80 and sm_90
cubins (``-Werror all-warnings``; the host side of the headers is compiled by
tests/backends/test_cuda_host.py);
- NVRTC (when a libnvrtc is found: the CUDA toolkit, or the ``nvidia-cuda-nvrtc`` wheel that
  CuPy uses): the exact self-contained source that :mod:`precision_lab.backends.gpu` hands to CuPy,
  with its options, to PTX for sm_90 (compute_90). NVRTC has no standard headers, so this catches
  what nvcc would not.

Each check skips, saying why, where its compiler is missing. No GPU is needed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from precision_lab.backends.gpu import CUDA_DIR, NVRTC_OPTIONS, kernel_source

SOURCES = sorted(p.name for p in CUDA_DIR.glob("*.cu"))
ARCHS = ("sm_80", "sm_90")


def test_there_are_sources() -> None:
    assert "pl_round.cu" in SOURCES
    assert (CUDA_DIR / "pl_round.cuh").is_file()


# ----- nvcc ----------------------------------------------------------------------------------
def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and Path(home, "bin", "nvcc").is_file():
            return str(Path(home, "bin", "nvcc"))
    return None


def _nvcc_job(nvcc: str, tmp: str, name: str) -> subprocess.CompletedProcess[str]:
    """Device code of one source for every arch (a fatbin: no host pass, g++ checks that)."""
    # one front-end pass (PTX for compute_80), then ptxas for each real arch (-O1: a compile
    # check, resource limits such as shared memory included, not a performance build)
    gencode = f"-gencode=arch=compute_{ARCHS[0][3:]},code=[{','.join(ARCHS)}]"
    cmd = [
        nvcc,
        gencode,
        "-Xptxas",
        "-O1",
        "-std=c++17",
        "-ftz=false",
        "-fmad=false",
        "-Werror",
        "all-warnings",
        f"-I{CUDA_DIR}",
        "--fatbin",
        str(CUDA_DIR / name),
        "-o",
        str(Path(tmp, name + ".fatbin")),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str], Any]:
    """Every compile job at once (nvcc per source, NVRTC per source), on all cores."""
    nvcc, nvrtc = _nvcc(), _find_nvrtc()
    tmp = tempfile.mkdtemp(prefix="pl_nvcc_")
    jobs: dict[tuple[str, str], Any] = {}
    try:
        with ThreadPoolExecutor(max_workers=2 * len(SOURCES)) as pool:
            for name in SOURCES:
                if nvcc is not None:
                    jobs["nvcc", name] = pool.submit(_nvcc_job, nvcc, tmp, name)
                if nvrtc is not None:
                    opts = [*NVRTC_OPTIONS, "--gpu-architecture=compute_90"]
                    jobs["nvrtc", name] = pool.submit(
                        _nvrtc_compile, nvrtc, kernel_source(name), name, opts
                    )
            out = {key: fut.result() for key, fut in jobs.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if nvcc is None:
        out["nvcc", "skip"] = "nvcc not found (PATH, $CUDA_HOME, /usr/local/cuda)"
    if nvrtc is None:
        out["nvrtc", "skip"] = "libnvrtc not found (CUDA toolkit or the nvidia-cuda-nvrtc wheel)"
    return out


@pytest.mark.parametrize("name", SOURCES)
def test_nvcc_compiles(results, name: str) -> None:
    if ("nvcc", "skip") in results:
        pytest.skip(results["nvcc", "skip"])
    res = results["nvcc", name]
    assert res.returncode == 0, (
        f"nvcc failed on {name} for {', '.join(ARCHS)}:\n{res.stdout}\n{res.stderr}"
    )


# ----- NVRTC -----------------------------------------------------------------------------------
def _find_nvrtc() -> ctypes.CDLL | None:
    candidates: list[str] = []
    for prefix in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib"):
            candidates += sorted(glob.glob(os.path.join(prefix, sub, "libnvrtc.so*")))
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            candidates += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")))
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    for cand in candidates:
        if "builtins" in cand or "alt" in Path(cand).name:
            continue
        # NVRTC dlopens its builtins library by name: load it first from the same folder
        for builtins in sorted(
            glob.glob(os.path.join(os.path.dirname(cand), "libnvrtc-builtins.so*"))
        ):
            if "alt" not in Path(builtins).name:
                try:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass
        try:
            return ctypes.CDLL(cand)
        except OSError:
            continue
    return None


def _nvrtc_compile(lib: ctypes.CDLL, source: str, name: str, options: list[str]) -> tuple[int, str]:
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    assert rc == 0, f"nvrtcCreateProgram failed with {rc}"
    try:
        opts = [o.encode() for o in options]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        return rc, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@pytest.mark.parametrize("name", SOURCES)
def test_nvrtc_compiles_what_cupy_gets(results, name: str) -> None:
    """The self-contained source and options of precision_lab.backends.gpu.module, to PTX for
    sm_90."""
    if ("nvrtc", "skip") in results:
        pytest.skip(results["nvrtc", "skip"])
    rc, log = results["nvrtc", name]
    assert rc == 0, f"NVRTC failed on {name} (rc {rc}):\n{log}"
    assert "warning" not in log.lower(), log
