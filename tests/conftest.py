"""A real dask.distributed LocalCluster (2 worker processes, 1 thread each), started once for the
scale-out tests (tests/test_sweep.py, tests/test_grid.py) and only when they ask for it."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="session")
def dask_cluster():
    """``(cluster, client)``; skips where the [dask] extra is not installed."""
    distributed = pytest.importorskip(
        "distributed", reason='needs the [dask] extra: pip install "precision_lab[dask]"'
    )
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield cluster, client
