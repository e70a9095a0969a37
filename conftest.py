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
    collect_ignore += [
        "precision_lab/torch",
        "precision_lab/studies/language_model.py",
        "precision_lab/figures/fig_language_model.py",
    ]


#: the test files that take longest (CPU seconds on 2 cores), in this order at the head of the
#: collection. ``make test`` runs ``--dist loadfile --no-loadscope-reorder``: each file goes
#: whole to one worker in collection order, so the longest chain (tests/repo/test_notebooks.py:
#: the notebooks, then the docs build that renders them; one worker, in order) starts first
#: instead of last. xdist's default order (files by number of tests, most first) put these
#: files, with few tests each, at the end of the run, where the other worker sat idle.
HEAVY_FIRST = (
    "tests/repo/test_notebooks.py",
    "tests/figures/test_fig_fp4.py",
    "tests/backends/test_cuda_compile.py",
    "tests/figures/test_figures.py",
    "tests/training/test_ptq_qat.py",
    "tests/training/test_training.py",
    "tests/torch/test_example.py",
    "tests/training/test_recipe_model.py",
)


def pytest_collection_modifyitems(config, items):
    """Move the files of :data:`HEAVY_FIRST` to the front, in its order (a stable sort: the
    order inside each file and of every other file is kept)."""
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
