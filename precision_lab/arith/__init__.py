"""Arithmetic in a format: correctly rounded operations, reductions, and emulated arrays.

Holds :mod:`.ops` (``pl.ops``: elementwise operations and ``sum``/``dot``/``cumsum`` with any
accumulator) and :mod:`.emulated` (``pl.emulate`` and the ``Emulated`` array: numpy code run in
a format through NEP 18).

May import: :mod:`precision_lab.core`, :mod:`precision_lab.backends`, :mod:`precision_lab.quant`
and :mod:`precision_lab.gemm` (reductions and ``@`` are inner products under an accumulator).

Where a new thing goes: a new elementwise operation is a compute function and one factory
call in :mod:`.ops.correctly_rounded`, :mod:`.ops.exact_ops` or :mod:`.ops.faithful` (see
:mod:`.ops.call`; its exact result rounded once by the core), plus its numpy function in the
``Emulated`` table of :mod:`.emulated`; a new reduction goes into :mod:`.ops.reductions`.

>>> import precision_lab as pl
>>> float(pl.ops.mul(3.0, 1.0 / 3.0, "bf16"))
1.0
"""

from . import ops
from .emulated import Emulated, emulate

__all__ = ["Emulated", "emulate", "ops"]
