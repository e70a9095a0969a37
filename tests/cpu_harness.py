"""The ctypes harnesses of tests/gemm/cpu_isa/ (the CPU's own instructions, issue 33): compiled
by the system C++ compiler into a temporary directory (no ``-m`` flags: only their kernels carry
target attributes, so any x86-64 CPU loads them and their CPUID checks say what runs), with a
skip that says why where they cannot be built."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

#: MXCSR values: the default (all exceptions masked, RNE), and round toward zero with FTZ and DAZ
MXCSR_DEFAULT = 0x1F80
MXCSR_ODD = 0x1F80 | (3 << 13) | (1 << 15) | (1 << 6)


def build(tmp_path_factory: pytest.TempPathFactory, source: Path, what: str) -> ctypes.CDLL:
    """``source`` compiled and loaded; a skip naming ``what`` where it cannot be."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"x86-64 Linux only (this is {sys.platform} {platform.machine()})")
    cxx = next((shutil.which(c) for c in (os.environ.get("CXX"), "g++", "c++", "clang++")
                if c and shutil.which(c)), None)  # fmt: skip
    if cxx is None:
        pytest.skip("no C++ compiler found (g++, c++, clang++ or $CXX): cannot build the harness")
    out = tmp_path_factory.mktemp("cpu_isa") / f"{source.stem}.so"
    res = subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-o", str(out), str(source)],
                         capture_output=True, text=True)  # fmt: skip
    if res.returncode:
        pytest.skip(f"the compiler cannot build the {what} harness: {res.stderr[-400:]}")
    return ctypes.CDLL(str(out))


def cpu_flags() -> set[str]:
    """The CPU flags of /proc/cpuinfo; a skip where it has none."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("/proc/cpuinfo has no flags line")


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    """The address of ``a``'s data, for the harness's ``const T*`` arguments."""
    return ctypes.c_void_p(a.ctypes.data)
