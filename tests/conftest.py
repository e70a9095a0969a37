"""Suite-wide settings and fixtures.

* No test asserts on wall-clock time: Hypothesis' per-example deadline (200 ms by default) is a
  wall-clock assertion that fails on a loaded machine; it is switched off here for every test
  (the profile ``precision_lab``).
* ``dask_cluster``: a real dask.distributed LocalCluster (2 worker processes, 1 thread each),
  started once for the scale-out tests (tests/verify/test_sweep.py, tests/verify/test_grid.py) and
  only when they ask for it.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import settings

settings.register_profile("precision_lab", deadline=None)
settings.load_profile("precision_lab")


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
