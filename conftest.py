"""The doctests of the optional Dask modules need the [dask] extra: skip them without it."""

import importlib.util

collect_ignore = []
if importlib.util.find_spec("dask") is None:
    collect_ignore += [
        "precision_lab/verify/sweep.py",
        "precision_lab/verify/grid.py",
        "precision_lab/verify/progress.py",
    ]
