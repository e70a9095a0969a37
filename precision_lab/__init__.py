"""precision_lab: bit-exact emulation of low-precision number formats, and what they do to
real computations (GEMMs, loss scaling, quantization, training).

Main entry points (all at the top level, ``import precision_lab as pl``):

* formats: ``pl.get_format("e4m3")`` (``.max``, ``.eps``, ``.values()`` ...), ``pl.FloatFormat``,
  ``pl.IntFormat``, ``pl.FORMATS``, ``pl.known_formats()``, ``pl.formats_table()`` (the table
  ``precision-lab formats`` prints; ``pl.format_rows()`` its ``--json``)
* casts: ``pl.round_to(x, fmt, rounding=..., overflow=..., subnormals=..., seed=...)``,
  ``pl.encode`` / ``pl.decode`` (values <-> codes), ``pl.cvt_rs`` (the PTX ``cvt.rs``
  stochastic conversions replayed from a kernel's random bits)
* quantization: ``pl.quantize`` / ``pl.dequantize`` / ``pl.calibrate`` (INT8 ...),
  ``pl.round_to_blocks`` / ``pl.quantize_blocks`` / ``pl.dequantize_blocks`` (MX, NVFP4 ...),
  ``pl.convert_blocks`` (MXFP4 -> NVFP4 and other conversions between block formats),
  ``pl.hadamard`` (blockwise random Hadamard rotations), ``pl.get_recipe`` / ``pl.Recipe`` and
  ``pl.apply_recipe`` / ``pl.recipe_gemm`` (FP4/FP8 training recipes per GEMM role)
* GEMM: ``pl.gemm(a, b, input_format=..., accumulator=...)``, ``pl.Accumulator``,
  ``pl.tensor_core("h100", "e4m3")``, ``pl.blockwise_gemm`` (1x128 / 128x128 FP8 GEMMs in
  cuBLAS's or CUTLASS's scale order)
* analysis: ``pl.underflow_stats``, ``pl.pick_loss_scale``, ``pl.error_stats``,
  ``pl.gamma_n``, ``pl.sqrt_n_u``
* scaling: ``pl.scaling.DynamicLossScaler`` (``.preset("deepspeed")`` ...),
  ``pl.scaling.DelayedScaling``, ``pl.scaling.simulate`` / ``pl.scaling.diagnose``
* emulated arithmetic: ``pl.ops.add(x, y, fmt, rounding=...)`` ..., ``pl.emulate(x, "bf16")``
* policies: ``pl.get_policy("mixed_float16")``, ``pl.Policy``, ``pl.POLICIES``
* command line: ``precision-lab`` (``python -m precision_lab``; ``precision-lab --help`` lists
  the commands)

The package is laid out as the pipeline; each subpackage imports only from those before it
(checked by import-linter in ``make test``), and its docstring says where a new thing of its kind
goes:

* :mod:`~precision_lab.core`: formats, the rounding core, codes, exact sums, random words,
  worker pool, input conversion
* :mod:`~precision_lab.backends`: the dispatch, the compiled C++ backend and the CUDA headers it
  shares with the CuPy backend
* :mod:`~precision_lab.quant`: integer quantization and calibration, block-scaled formats
* :mod:`~precision_lab.gemm`: accumulators, GEMM (numpy reference, native, CuPy), tensor-core
  models, GEMM on block-quantized operands
* :mod:`~precision_lab.arith`: correctly rounded operations (``pl.ops``) and ``pl.emulate``
* :mod:`~precision_lab.analysis`: underflow statistics, loss-scale choice, error measures, bounds
* :mod:`~precision_lab.scaling`: loss scalers, FP8 scaling recipes, simulation over gradients,
  gradient populations (``pl.gradients``)
* :mod:`~precision_lab.training`: the digits MLP under emulated precision, precision policies,
  INT8 post-training quantization and quantization-aware training
* :mod:`~precision_lab.torch`: real PyTorch models (optional extra ``[torch]``): autograd-aware
  casts, gradient capture, ``simulate(model, policy)``, loss scalers driving a torch optimizer
* :mod:`~precision_lab.verify`: hypothesis strategies, oracles, exhaustive sweeps and experiment
  grids on Dask
* :mod:`~precision_lab.studies`: the experiments behind the figures and the report
* :mod:`~precision_lab.figures`: the figure jobs and ``figures/REPORT.md``
* :mod:`~precision_lab.cli`: the ``precision-lab`` command line

>>> import precision_lab as pl
>>> pl.get_format("e4m3").max
448.0
>>> float(pl.round_to(0.3, "bf16"))
0.30078125
"""

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

from . import analysis, scaling
from .analysis import error_stats, gamma_n, pick_loss_scale, sqrt_n_u, underflow_stats
from .arith import Emulated, emulate, ops
from .backends import backend_info, use_backend
from .core import (
    FORMATS,
    P3109_BLOCK_OPS,
    P3109_ROUNDING_MODES,
    P3109_SATURATION_MODES,
    ROUNDING_MODES,
    FloatFormat,
    IntFormat,
    cvt_rs,
    decode,
    encode,
    format_rows,
    formats_table,
    get_format,
    known_formats,
    p3109,
    p3109_block_decode,
    p3109_block_dot,
    p3109_block_op,
    p3109_block_project,
    p3109_block_reduce_add,
    p3109_block_reduce_multiply,
    p3109_convert_to_block,
    p3109_project,
    p3109_scaled_op,
    round_to,
)
from .core.version import __version__
from .gemm import (
    Accumulator,
    ProbeResult,
    apply_recipe,
    blockwise_gemm,
    gemm,
    gemm_blocks,
    probe_gemm,
    recipe_gemm,
    tensor_core,
)
from .quant import (
    BlockFormat,
    Calibration,
    QuantizedBlocks,
    Recipe,
    calibrate,
    convert_blocks,
    dequantize,
    dequantize_blocks,
    get_block_format,
    get_recipe,
    hadamard,
    quantize,
    quantize_blocks,
    round_to_blocks,
)
from .scaling import gradients
from .training import POLICIES, Policy, get_policy

__all__ = [
    "FORMATS",
    "P3109_BLOCK_OPS",
    "P3109_ROUNDING_MODES",
    "P3109_SATURATION_MODES",
    "POLICIES",
    "ROUNDING_MODES",
    "Accumulator",
    "BlockFormat",
    "Calibration",
    "Emulated",
    "FloatFormat",
    "IntFormat",
    "Policy",
    "ProbeResult",
    "QuantizedBlocks",
    "Recipe",
    "__version__",
    "analysis",
    "apply_recipe",
    "backend_info",
    "blockwise_gemm",
    "calibrate",
    "convert_blocks",
    "cvt_rs",
    "decode",
    "dequantize",
    "dequantize_blocks",
    "emulate",
    "encode",
    "error_stats",
    "format_rows",
    "formats_table",
    "gamma_n",
    "gemm",
    "gemm_blocks",
    "get_block_format",
    "get_format",
    "get_policy",
    "get_recipe",
    "gradients",
    "hadamard",
    "known_formats",
    "ops",
    "p3109",
    "p3109_block_decode",
    "p3109_block_dot",
    "p3109_block_op",
    "p3109_block_project",
    "p3109_block_reduce_add",
    "p3109_block_reduce_multiply",
    "p3109_convert_to_block",
    "p3109_project",
    "p3109_scaled_op",
    "pick_loss_scale",
    "probe_gemm",
    "quantize",
    "quantize_blocks",
    "recipe_gemm",
    "round_to",
    "round_to_blocks",
    "scaling",
    "sqrt_n_u",
    "tensor_core",
    "underflow_stats",
    "use_backend",
]

#: Module paths of 0.1 that moved in the pipeline layout (CHANGELOG.md, 0.2.0) -> where they are
#: now. They stay importable (``from precision_lab.gradients import lognormal``) through
#: :class:`_MovedModules`, which hands out the module at its new path: the same module object,
#: loaded only when first asked for (``strategies`` needs hypothesis, ``sweep`` and ``grid``
#: dask only when they run).
MOVED = {
    "formats": "core.formats",
    "rounding": "core.rounding",
    "codec": "core.codec",
    "dispatch": "backends.dispatch",
    "native": "backends.native",
    "native_kernels": "backends.native.kernels",
    "gpu": "backends.gpu",
    "quantization": "quant.integer",
    "blocks": "quant.blocks",
    "ops": "arith.ops",
    "emulated": "arith.emulated",
    "bounds": "analysis.bounds",
    "gradients": "scaling.gradients",
    "policy": "training.policy",
    "ptq": "training.ptq",
    "qat": "training.qat",
    "strategies": "verify.strategies",
    "oracles": "verify.oracles",
    "sweep": "verify.sweep",
    "grid": "verify.grid",
    "experiments_policy": "studies.policy",
    "experiments_emulated": "studies.emulated",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``precision_lab.<old name>`` (and modules below it) at their new path."""

    def __init__(self) -> None:
        self._specs: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        head, _, rest = fullname.partition(".")
        if head != __name__ or not rest:
            return None
        first = rest.partition(".")[0]
        if first not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        rest = spec.name.split(".", 1)[1]
        first, _, tail = rest.partition(".")
        new = f"{__name__}.{MOVED[first]}" + (f".{tail}" if tail else "")
        module = importlib.import_module(new)
        self._specs[new] = module.__spec__  # importlib sets __spec__ to the alias's next
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module ran at its new path already; give it back its own spec."""
        module.__spec__ = self._specs.pop(module.__name__, module.__spec__)


# first: a moved package's submodules must resolve at their new path, not be found again by the
# path finder under the parent alias's __path__ (which would run them a second time)
sys.meta_path.insert(0, _MovedModules())


def __dir__() -> list[str]:
    """The public names (``__all__``), the moved modules and the subpackages loaded so far; not
    the helpers this module imports for itself (``sys``, ``importlib``, ``Any`` ...)."""
    loaded = [
        n
        for n, v in globals().items()
        if isinstance(v, ModuleType) and v.__name__.startswith(f"{__name__}.")
    ]
    return sorted({*__all__, *MOVED, *loaded})


def __getattr__(name: str) -> ModuleType:
    """``pl.sweep``, ``pl.strategies`` ...: the moved modules, imported when first used."""
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{MOVED[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
