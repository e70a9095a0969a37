"""The dispatch layer: which backend serves round_to, encode and decode.

Three backends compute the same bits:

- ``numpy``: the readable reference in :mod:`precision_lab.core.rounding` and
  :mod:`precision_lab.core.codec`, and the fallback;
- ``native``: the compiled C++ extension (:mod:`precision_lab.backends.native`), the default on
  the CPU when it is built;
- ``cupy``: the CUDA kernels (:mod:`precision_lab.backends.gpu`), for CuPy arrays, whatever is
  selected.

The public functions (:func:`precision_lab.round_to`, :func:`~precision_lab.encode`,
:func:`~precision_lab.decode`) validate their options
(:func:`precision_lab.core.rounding.check_options`) and hand them to :func:`serve`, which this
module installs as ``precision_lab.core.rounding.route`` when the package loads. So the layers
import downward only: formats <- rounding <- codec <- gpu, native <- dispatch.

Choosing the CPU backend: ``"auto"`` (native where built, else numpy), ``"native"`` (an error
where it is not built) or ``"numpy"``, from the context manager :func:`use_backend` (per thread
and async task), else the environment variable ``PRECISION_LAB_BACKEND``, else ``"auto"``.

>>> import precision_lab as pl
>>> with pl.use_backend("numpy"):
...     pl.backend_info()["round_to"]
'numpy (selected by use_backend)'
>>> sorted(pl.backend_info())[:4]
['cupy arrays', 'decode', 'dequantize', 'encode']
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..core import rounding
from ..core.formats import FloatFormat, IntFormat
from ..core.rounding import (
    CORE_ONLY_MODES,
    RoundingOptions,
    check_choice,
    is_device_array,
    word_bits,
)
from . import gpu, native
from .native import BACKEND_ENV, BACKENDS
from .native import kernels as native_kernels

__all__ = ["BACKENDS", "BACKEND_ENV", "OPERATIONS", "backend_info", "serve", "use_backend"]

#: the operations this layer dispatches
OPERATIONS = ("round_to", "encode", "decode")
#: the operations of the kernels extension (their modules choose native or numpy themselves)
KERNEL_OPERATIONS = ("gemm", "quantize", "dequantize", "round_to_blocks", "quantize_blocks")
#: what the kernels leave to numpy, where an operation states it (see precision_lab.quant.blocks)
_KERNEL_GAPS = dict.fromkeys(
    ("round_to_blocks", "quantize_blocks"),
    "stochastic rounding of padded blocks and integer elements other than 8-bit",
)


def _choice() -> tuple[str, str]:
    """(selected backend, where the choice comes from)."""
    return native.choice()


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run the block with CPU backend ``name`` (``"auto"``, ``"native"`` or ``"numpy"``; case and
    surrounding spaces do not matter, as in ``PRECISION_LAB_BACKEND``).

    >>> import numpy as np, precision_lab as pl
    >>> with pl.use_backend("numpy"):
    ...     pl.round_to(np.float32(0.3), "e4m3")
    array(0.3125, dtype=float32)
    >>> with pl.use_backend("NumPy"):
    ...     pl.backend_info()["round_to"]
    'numpy (selected by use_backend)'
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in BACKENDS:
        check_choice("backend", name, BACKENDS)  # the error names the value as given
    token = native.SELECTED.set(key)
    try:
        yield
    finally:
        native.SELECTED.reset(token)


def serve(op: str, x: Any, fmt: FloatFormat | IntFormat, options: RoundingOptions | None) -> Any:
    """Result of ``op`` on the backend that serves it, or None when the numpy reference does."""
    core_only = options is not None and options.mode in CORE_ONLY_MODES
    if is_device_array(x):
        if core_only:  # no mode number in the CUDA header (rounding.CORE_ONLY_MODES)
            assert options is not None
            raise ValueError(
                f"rounding={options.mode!r} is computed by the numpy reference only; "
                "pass a numpy array (e.g. cupy.asnumpy(x))"
            )
        return _on_device(op, x, fmt, options)
    chosen, _ = _choice()
    if chosen == "numpy" or core_only:  # core-only modes: numpy serves, whatever is selected
        return None
    if native.ext is None:
        if chosen == "native":
            raise RuntimeError(f"backend 'native' was selected, but {native.WHY}")
        return None
    if op == "decode":
        return native.decode(x, fmt)
    assert options is not None
    return native.round_to(x, fmt, options) if op == "round_to" else native.encode(x, fmt, options)


def _on_device(op: str, x: Any, fmt: FloatFormat | IntFormat, o: RoundingOptions | None) -> Any:
    if op == "decode":
        return gpu.decode(x, fmt)
    assert o is not None
    return getattr(gpu, op)(
        x,
        fmt,
        rounding=o.mode,
        overflow=o.overflow,
        subnormals=o.subnormals,
        seed=o.seed,
        random_bits=word_bits(o.mode, o.random_bits),
    )


def backend_info() -> dict[str, str]:
    """Which backend serves each operation on CPU arrays, and why; and CuPy arrays' backend.

    Values are ``"native"``, or ``"numpy (<why>)"``: selected explicitly, or the extension is
    not built or stale (with the command that rebuilds it).
    """
    chosen, source = _choice()
    if chosen == "numpy":
        cpu = f"numpy (selected by {source})"
    elif native.ext is None:
        cpu = f"numpy ({native.WHY})"
    else:
        cpu = "native"
    info = dict.fromkeys(OPERATIONS, cpu)
    # GEMM models, INT quantization and block formats: the kernels extension, where it covers
    # the configuration (else numpy; see precision_lab.gemm.native_backend.covers)
    if chosen == "numpy":
        kernels = cpu
    elif native_kernels.ext is None:
        kernels = f"numpy ({native_kernels.WHY})"
    else:
        kernels = f"native ({native_kernels.isa()}; numpy for what it does not cover)"
    for op in KERNEL_OPERATIONS:
        gap = _KERNEL_GAPS.get(op) if kernels.startswith("native") else None
        info[op] = kernels.replace("what it does not cover", gap) if gap else kernels
    info["cupy arrays"] = "cupy" if gpu.available() else "cupy (not available: no CuPy or no GPU)"
    return info


rounding.route = serve
