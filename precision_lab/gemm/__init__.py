"""GEMM with a configurable accumulator: the inner-product model, the numpy reference, and
models of real tensor cores.

* :class:`Accumulator` (:mod:`.accumulator`): the model of one inner product, and the exact
  specification every backend follows.
* :func:`gemm` (:mod:`.reference`): ``c + a @ b`` under a model; numpy on the CPU, CuPy on the GPU.
* :func:`tensor_core` (:mod:`.tensor_core`): models of NVIDIA tensor cores and AMD matrix cores
  per instruction, checked bit for bit against measurements (:mod:`.validation` reads the
  measured data sets) or taken from published bit-accurate models; ``tensor_core.list()`` is
  the table of presets and their evidence.
* :func:`probe_gemm` (:mod:`.probe`): recover the accumulation model of a black-box matmul.
* :func:`gemm_blocks` (:mod:`.blocks`): GEMM on block-quantized operands (MX, NVFP4, FP8 tiles).
* :func:`apply_recipe` (:mod:`.recipes`): the three GEMMs of a linear layer under a training
  recipe (:mod:`precision_lab.quant.recipes`), and :func:`recipe_gemm`, one of them (any batch).
* :mod:`.native_backend` and :mod:`.cupy_backend`: the same models on the C++ kernels and on CUDA.

May import: :mod:`precision_lab.core`, :mod:`precision_lab.backends` and
:mod:`precision_lab.quant` (the block formats of ``gemm_blocks``).

Where a new thing goes: a new accumulator behaviour is a field of :class:`Accumulator`, followed
by the numpy reference (:mod:`.reference`), the shared header ``backends/cuda/pl_gemm.cuh`` (CUDA
and native) and the test matrix; a new tensor-core preset is an entry of the tables in
:mod:`.tensor_core`, with its evidence (a measured data set or a published model) in the entry.

>>> import numpy as np, precision_lab as pl
>>> a = np.array([[1.0]]); b = np.array([[1.0]]); c = np.array([[-(1 - 2.0**-24)]])
>>> float(pl.gemm(a, b, c, input_format="fp16", accumulator=pl.tensor_core("v100", "fp16"))[0, 0])
1.1920928955078125e-07
>>> float(pl.gemm(a, b, c, input_format="fp16", accumulator=pl.tensor_core("a100", "fp16"))[0, 0])
5.960464477539063e-08
"""

from .accumulator import ORDERS, Accumulator
from .blocks import gemm_blocks
from .blockwise import blockwise_gemm
from .probe import ProbeResult, probe_gemm
from .recipes import LinearGemms, apply_recipe, recipe_gemm
from .reference import gemm
from .tensor_core import GPUS, tensor_core, tensor_core_formats, tensor_core_list

__all__ = [
    "GPUS",
    "ORDERS",
    "Accumulator",
    "LinearGemms",
    "ProbeResult",
    "apply_recipe",
    "blockwise_gemm",
    "gemm",
    "gemm_blocks",
    "probe_gemm",
    "recipe_gemm",
    "tensor_core",
    "tensor_core_formats",
    "tensor_core_list",
]
