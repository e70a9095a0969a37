"""The doctests of the optional Dask modules need the [dask] extra, those of precision_lab.torch
the [torch] extra: skip them without it."""

import importlib.util

collect_ignore = []
if importlib.util.find_spec("dask") is None:
    collect_ignore += [
        "precision_lab/verify/sweep.py",
        "precision_lab/verify/grid.py",
        "precision_lab/verify/progress.py",
    ]
if importlib.util.find_spec("torch") is None:
    collect_ignore += ["precision_lab/torch"]
