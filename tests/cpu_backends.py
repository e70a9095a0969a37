"""The CPU backends of ``pl.gemm`` as an autouse fixture.

A test module that imports :func:`cpu_backend` runs each of its tests once per CPU backend:
``backend="auto"`` then means numpy, or the native kernels (where the extension is built;
``tests/backends/test_native_kernels.py`` asserts that it is).
"""

from __future__ import annotations

import importlib

import pytest

reference = importlib.import_module("precision_lab.gemm.reference")
native_backend = importlib.import_module("precision_lab.gemm.native_backend")

CPU_BACKENDS = ("numpy", "native")


@pytest.fixture(params=CPU_BACKENDS, autouse=True)
def cpu_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native" and not native_backend.available():
        pytest.skip("precision_lab.backends._native_kernels is not built")
    monkeypatch.setattr(reference, "_AUTO_CPU", request.param)
    return str(request.param)
