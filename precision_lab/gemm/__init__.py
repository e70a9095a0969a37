"""GEMM with a configurable accumulator: the inner-product model, the numpy reference, and
models of real tensor cores.

* :class:`Accumulator` (:mod:`.accumulator`): the model of one inner product, and the exact
  specification every backend follows.
* :func:`gemm` (:mod:`.reference`): ``c + a @ b`` under a model; numpy on the CPU, CuPy on the GPU.
* :func:`tensor_core` (:mod:`.tensor_core`): models of NVIDIA tensor cores, checked bit for bit
  against measurements.

>>> import numpy as np, precision_lab as pl
>>> a = np.array([[1.0]]); b = np.array([[1.0]]); c = np.array([[-(1 - 2.0**-24)]])
>>> float(pl.gemm(a, b, c, input_format="fp16", accumulator=pl.tensor_core("v100", "fp16"))[0, 0])
1.1920928955078125e-07
>>> float(pl.gemm(a, b, c, input_format="fp16", accumulator=pl.tensor_core("a100", "fp16"))[0, 0])
5.960464477539063e-08
"""

from .accumulator import ORDERS, Accumulator
from .reference import gemm
from .tensor_core import GPUS, tensor_core, tensor_core_formats

__all__ = ["GPUS", "ORDERS", "Accumulator", "gemm", "tensor_core", "tensor_core_formats"]
