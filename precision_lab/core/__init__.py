"""The rounding core: number formats, rounding, codes, and what every layer above builds on.

Holds :mod:`.formats` (formats as dataclasses and their registry), :mod:`.rounding` (the one
rounding core: ``round_to`` and its numpy reference), :mod:`.codec` (values <-> codes),
:mod:`.exact` (sums of several terms rounded once from their exact value), :mod:`.random_words`
(the counter-based Philox words of stochastic rounding), :mod:`.pool` (the worker pool and
chunking), :mod:`.scratch` (per-thread scratch arrays for temporaries), :mod:`.inputs` (input
conversion: ml_dtypes, DLPack and array-API arrays) and :mod:`.shapes`; :mod:`.ptx` replays the
PTX ``cvt.rs`` conversions from a kernel's random bits.

May import: nothing else of the package (numpy and ml_dtypes only). The compiled and CuPy
backends plug in from above: :mod:`precision_lab.backends.dispatch` installs itself as
``rounding.route`` when the package loads, so the numpy reference here never imports them.

Where a new thing goes: a new named format is an entry of ``FORMATS`` in :mod:`.formats` (a new
family, like P3109, a constructor there too); a new rounding mode is a name in
``ROUNDING_MODES`` and a branch of the numpy reference in :mod:`.rounding`, then the same mode in
the shared header ``backends/cuda/pl_round.cuh`` (``PL_*`` mode constants and ``pl_round_bits``)
so the native and CUDA backends follow; the test suite compares all three bit for bit.

>>> from precision_lab.core import get_format, round_to
>>> float(round_to(0.3, get_format("e4m3")))
0.3125
"""

from .codec import decode, encode
from .formats import (
    FORMATS,
    FloatFormat,
    Format,
    IntFormat,
    format_rows,
    formats_table,
    get_format,
    known_formats,
    p3109,
)
from .p3109_block_ops import (
    P3109_BLOCK_OPS,
    p3109_block_dot,
    p3109_block_op,
    p3109_block_reduce_add,
    p3109_block_reduce_multiply,
    p3109_scaled_op,
)
from .p3109_blocks import p3109_block_decode, p3109_block_project, p3109_convert_to_block
from .ptx import cvt_rs
from .rounding import (
    P3109_ROUNDING_MODES,
    P3109_SATURATION_MODES,
    ROUNDING_MODES,
    STOCHASTIC_MODES,
    p3109_project,
    round_to,
)

__all__ = [
    "FORMATS",
    "P3109_BLOCK_OPS",
    "P3109_ROUNDING_MODES",
    "P3109_SATURATION_MODES",
    "ROUNDING_MODES",
    "STOCHASTIC_MODES",
    "FloatFormat",
    "Format",
    "IntFormat",
    "cvt_rs",
    "decode",
    "encode",
    "format_rows",
    "formats_table",
    "get_format",
    "known_formats",
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
    "round_to",
]
