"""Suite-wide settings and fixtures.

* No test asserts on wall-clock time: Hypothesis' per-example deadline (200 ms by default) is a
  wall-clock assertion that fails on a loaded machine; it is switched off here for every test
  (the profile ``precision_lab``).
* ``dask_cluster``: a real dask.distributed LocalCluster (2 worker processes, 1 thread each),
  started once for the scale-out tests (tests/verify/test_sweep.py, tests/verify/test_grid.py) and
  only when they ask for it.
* ``quartet2_numbers`` / ``quartet2_sr_attempts``: precision_lab.studies.fp4's Quartet II error
  studies at their default settings (the report's), computed once per process for
  tests/studies/test_fp4_numbers.py and tests/figures/test_fig_fp4.py.
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


@pytest.fixture(scope="session")
def quartet2_numbers():
    """``fp4.quartet2_numbers()`` (seed 0, 1024 x 1024: the report's settings)."""
    from precision_lab.studies import fp4

    return fp4.quartet2_numbers()


@pytest.fixture(scope="session")
def quartet2_sr_attempts():
    """``fp4.quartet2_sr_attempts()`` (seed 0, 512 x 1024: the report's settings)."""
    from precision_lab.studies import fp4

    return fp4.quartet2_sr_attempts()
