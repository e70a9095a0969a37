"""Backends: the compiled C++ and CUDA code that computes the core's bits, and the dispatch.

Holds :mod:`.dispatch` (validated options in, the backend that serves them out;
``backend_info``, ``use_backend``), :mod:`.native` (the C++ extensions: build sources, loader,
staleness check; :mod:`.native.kernels` for the GEMM, INT and block kernels), ``cuda/`` (the
``__host__ __device__`` headers ``pl_round.cuh`` and ``pl_gemm.cuh`` shared by the CUDA kernels
and the C++ extension), :mod:`.kernel_sources` (how a format is passed to a kernel, the CUDA
sources) and :mod:`.gpu` (the CuPy backend of the casts, compiled with NVRTC at first use).

May import: :mod:`precision_lab.core` only.

Where a new thing goes: a new cast kernel goes into ``cuda/pl_round.cuh`` (its arithmetic, as
host-and-device functions) with an entry point in ``native/core.cpp`` and ``cuda/pl_round.cu``; a
new GEMM or block kernel into ``cuda/pl_gemm.cuh`` and ``native/*.inc``; a new C++ file is listed
in ``native/sources.py`` (it is hashed into the build, so a stale build is noticed).

>>> from precision_lab.backends import backend_info
>>> sorted(backend_info())[:2]
['cupy arrays', 'decode']
"""

from .dispatch import BACKENDS, backend_info, use_backend

__all__ = ["BACKENDS", "backend_info", "use_backend"]
