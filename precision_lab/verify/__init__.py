"""Verification: hypothesis strategies, independent oracles, exhaustive sweeps and experiment grids.

Holds :mod:`.strategies` (the hypothesis strategies we ship: values of a format, ties, codes;
needs hypothesis), :mod:`.oracles` (fast independent oracles of the casts: an exact referee,
ml_dtypes, torch), :mod:`.sweep` (``verify_exhaustive``: every input bit pattern against an
oracle, checkpointed, on Dask) and :mod:`.grid` (experiment grids of training runs and GEMM
errors as Dask tasks).

May import every layer up to :mod:`precision_lab.training`; not :mod:`precision_lab.studies`
(a sibling). The modules are imported on use (``pl.sweep``, ``pl.grid``, ``pl.strategies``):
strategies needs hypothesis, the sweeps' scale-out needs the ``[dask]`` extra.

Where a new thing goes: a new oracle is a function in :mod:`.oracles` registered in
``ORACLES``; a new kind of grid run an entry of ``KINDS`` in :mod:`.grid`; a new strategy a
function of :mod:`.strategies`.

>>> import precision_lab as pl
>>> pl.sweep.verify_exhaustive.__name__
'verify_exhaustive'
"""
