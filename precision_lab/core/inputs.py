"""Input conversion: any array the caller passes -> numpy (or CuPy), and the result back.

:func:`as_input` is the one place where the public functions (``round_to``, ``encode``,
``decode``, ``quantize``, ``dequantize``, ``round_to_blocks``, ``gemm``) turn their array
arguments into arrays they compute on, and learn how to hand the result back in the caller's
array type:

* numpy arrays, numpy scalars, Python scalars and nested lists: ``numpy.asarray`` (no copy for
  arrays); results come back as numpy arrays, 0-d arrays included (never numpy scalars);
* CuPy arrays: passed through (the GPU backend takes them);
* anything else that speaks DLPack (``__dlpack__``: torch tensors, JAX arrays, ...): a CPU array
  is read without copying by ``numpy.from_dlpack`` (bfloat16 and float8 tensors, which DLPack
  cannot hand to numpy, through an integer view as ml_dtypes arrays); a CUDA array goes to CuPy
  (``cupy.from_dlpack``; without CuPy a TypeError says so). The result goes back through the
  caller's namespace (``x.__array_namespace__().from_dlpack``, or the ``from_dlpack`` of the
  array type's top-level module, such as ``torch.from_dlpack``), so a torch tensor in gives a
  torch tensor out;
* objects with only ``__array_namespace__`` or ``__array__``: ``numpy.asarray``, and the result
  back through the namespace's ``asarray`` where there is one;
* numpy masked arrays are refused (TypeError): the computation would silently drop the mask.

:func:`as_numpy` is the same conversion for the entry points that compute with numpy on the
CPU and return numpy arrays (``pl.ops``, ``pl.emulate``, ``quantize_blocks``): a GPU array is a
TypeError that says how to bring it to the CPU.

>>> a, restore = as_input(2.5)
>>> a, restore(a * 2)
(array(2.5), array(5.))
>>> as_input(np.ma.masked_array([1.0, 2.0], mask=[0, 1]))
Traceback (most recent call last):
...
TypeError: x is a numpy masked array, whose mask would be ignored: pass x.filled(fill_value) ...
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["as_input", "as_numpy", "is_device_array"]

#: DLPack device types whose memory the CPU reads (kDLCPU, kDLCUDAHost, kDLROCMHost)
_CPU_DEVICES = (1, 3, 11)


def is_device_array(x: Any) -> bool:
    """True for CuPy arrays, which the GPU backend (:mod:`precision_lab.backends.gpu`) handles."""
    return type(x).__module__.split(".")[0] == "cupy"


def _as_numpy_result(r: Any) -> Any:
    return np.asarray(r) if isinstance(r, np.generic) else r


def _namespace_restore(x: Any) -> Callable[[Any], Any]:
    """How to turn a numpy (or CuPy) result into an array of x's type."""
    convert = None
    get_ns = getattr(x, "__array_namespace__", None)
    if get_ns is not None:
        try:
            xp = get_ns()
        except Exception:
            xp = None
        convert = getattr(xp, "from_dlpack", None) or getattr(xp, "asarray", None)
    if convert is None:
        module = sys.modules.get(type(x).__module__.split(".")[0])
        convert = getattr(module, "from_dlpack", None)
    if convert is None:
        return _as_numpy_result

    def restore(r: Any) -> Any:
        if isinstance(r, np.ndarray | np.generic):  # C-contiguous, 0-d kept 0-d
            r = np.asarray(r)
            r = r if r.flags.c_contiguous else r.copy()
        return convert(r)

    return restore


def _ml_dtypes_view(x: Any) -> np.ndarray | None:
    """bfloat16/float8 arrays of another library (torch) as ml_dtypes arrays, without a copy:
    DLPack carries no such numpy dtype, so the data goes through a same-width integer view."""
    name = str(getattr(x, "dtype", "")).rsplit(".", 1)[-1]
    ml = getattr(ml_dtypes, name, None) if name.startswith(("bfloat16", "float8")) else None
    module = sys.modules.get(type(x).__module__.split(".")[0])
    if ml is None or not hasattr(x, "view"):
        return None
    ints = getattr(module, f"int{8 * np.dtype(ml).itemsize}", None)
    try:
        return np.from_dlpack(x.view(ints)).view(ml)  # type: ignore[no-any-return]
    except (BufferError, TypeError, RuntimeError, ValueError, AttributeError):
        return None


def as_input(x: Any, name: str = "x") -> tuple[Any, Callable[[Any], Any]]:
    """``(array, restore)``: x as a numpy array (a CuPy array for GPU data), and the function
    that returns a result in x's array type (see the module docstring)."""
    if is_device_array(x):
        return x, lambda r: r
    if isinstance(x, np.generic):  # numpy scalars: 0-d numpy arrays
        return np.asarray(x), _as_numpy_result
    if isinstance(x, np.ndarray):
        if isinstance(x, np.ma.MaskedArray):
            raise TypeError(
                f"{name} is a numpy masked array, whose mask would be ignored: pass "
                f"{name}.filled(fill_value) (masked entries replaced) or {name}.data (the raw "
                "values) instead"
            )
        return np.asarray(x), _as_numpy_result
    if hasattr(x, "__dlpack__"):
        if getattr(x, "requires_grad", False) is True:
            raise TypeError(
                f"{name} is a {type(x).__module__}.{type(x).__name__} that requires grad: the "
                "numpy API does not record autograd; use precision_lab.torch.round_to (or its "
                "quantize, fake_quantize, round_to_blocks) for a differentiable cast, or pass "
                f"{name}.detach()"
            )
        restore = _namespace_restore(x)
        device = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else 1
        if int(device) in _CPU_DEVICES:
            try:
                return np.from_dlpack(x), restore
            except (BufferError, TypeError, RuntimeError, ValueError):  # a dtype numpy lacks
                a = _ml_dtypes_view(x)
                return (np.asarray(x) if a is None else a), restore
        try:
            import cupy
        except ImportError:
            raise TypeError(
                f"{name} lives on a GPU (DLPack device type {int(device)}): precision_lab needs "
                "CuPy for GPU arrays (pip install precision_lab[gpu]), or move it to the CPU first"
            ) from None
        return cupy.from_dlpack(x), restore
    if hasattr(x, "__array_namespace__"):
        return np.asarray(x), _namespace_restore(x)
    return np.asarray(x), _as_numpy_result


def as_numpy(x: Any, name: str = "x") -> np.ndarray:
    """``x`` as a numpy array through :func:`as_input` (DLPack and array-API arrays, torch
    bfloat16/float8 tensors as ml_dtypes arrays, without a copy where the data allows), for
    the entry points that compute with numpy; GPU arrays are a TypeError naming ``name``.

    >>> as_numpy([1, 2]).dtype
    dtype('int64')
    """
    a, _ = as_input(x, name)
    if is_device_array(a):
        raise TypeError(
            f"{name} is a GPU array ({type(x).__module__}.{type(x).__name__}): this function "
            f"computes on the CPU; pass {name} moved to the CPU (cupy.asnumpy, .cpu())"
        )
    return a  # type: ignore[no-any-return]
